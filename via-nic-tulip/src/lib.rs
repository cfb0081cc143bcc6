//! DEC 2114x ("tulip") driver over VFIO: a user-space
//! [`FrameDevice`](via_device::FrameDevice) for the 21140/21143 and
//! for QEMU's emulated 21143.
//!
//! | module     | owns                                                        |
//! |------------|-------------------------------------------------------------|
//! | [`regs`]   | CSR offsets and bits                                        |
//! | [`desc`]   | descriptor encoding                                         |
//! | [`setup`]  | the setup frame (address filter)                            |
//! | [`srom`]   | reading the serial ROM (station address)                    |
//! | [`device`] | [`TulipDevice`]: bring-up, rings, transmit, receive, teardown |
//!
//! What any VFIO NIC needs (the VFIO device, DMA memory, IOMMU mappings,
//! BAR access) is `via_vfio`'s.
//!
//! # Device names
//!
//! `tulip:<pci address>` (e.g. `tulip:0000:00:03.0`) and `/dev/via_tulip<N>`,
//! the N-th tulip by PCI address. The device must be bound to vfio-pci
//! first (`via-agent bind <pci address>`).

pub mod desc;
pub mod device;
pub mod regs;
pub mod setup;
pub mod srom;

pub use device::TulipDevice;

use std::io;
use via_device::{DeviceOpener, HostRoute};
use via_device::{pci, FrameDevice};

/// Opens `tulip:<pci>` and `/dev/via_tulip<N>` as [`TulipDevice`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct TulipOpener;

impl TulipOpener {
    /// The PCI address a tulip device name designates: `Some(Ok(addr))`,
    /// `Some(Err(..))` for a tulip name that resolves to nothing, `None`
    /// when the name is not a tulip name.
    pub fn address_of(name: &str) -> Option<io::Result<String>> {
        pci::address_of_name("tulip", name)
    }
}

impl DeviceOpener for TulipOpener {
    fn driver(&self) -> &'static str {
        "tulip"
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let addr = Self::address_of(name)?;
        Some(addr.and_then(|a| TulipDevice::open(&a)).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

// Names of its own: tried before the softnic's catch-all `/dev/via_<ifname>`.
via_device::register_drivers!(TULIP_DRIVERS = [(20, &TulipOpener)]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(TulipOpener::address_of("tulip:0000:00:03.0").unwrap().unwrap(), "0000:00:03.0");
        assert_eq!(TulipOpener::address_of("tulip:00:03.0").unwrap().unwrap(), "0000:00:03.0");
        assert!(TulipOpener::address_of("/dev/via_eth0").is_none());
        assert!(TulipOpener::address_of("/dev/via_tulipX").is_none());
    }

    #[test]
    fn numbered_names_are_the_tulips_in_address_order() {
        // Whatever this machine has (none on a test host, two or four in
        // the QEMU guest): /dev/via_tulipN is the N-th tulip by PCI
        // address, and the name one past the last is a clear error.
        let tulips: Vec<String> = pci::list().expect("listing the PCI network devices").into_iter().filter(|d| d.is_tulip()).map(|d| d.address).collect();
        for (n, address) in tulips.iter().enumerate() {
            let got = TulipOpener::address_of(&format!("/dev/via_tulip{n}")).expect("a tulip name").expect("a present tulip");
            assert_eq!(&got, address, "/dev/via_tulip{n}");
        }
        let past = format!("/dev/via_tulip{}", tulips.len());
        let e = TulipOpener::address_of(&past).expect("a tulip name").expect_err("one past the last tulip");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let want = format!("there are {} tulip NICs; {past} needs at least {}", tulips.len(), tulips.len() + 1);
        assert!(e.to_string().contains(&want), "{e}");
    }
}
