//! Intel 82574 (e1000e) driver over VFIO: a user-space
//! [`FrameDevice`](via_device::FrameDevice) for the 82574L, the NIC on
//! many boards and the one QEMU models as `-device e1000e`.
//!
//! | module     | owns                                                         |
//! |------------|--------------------------------------------------------------|
//! | [`regs`]   | register offsets and bits                                    |
//! | [`desc`]   | legacy receive and transmit descriptors                      |
//! | [`device`] | [`E1000eDevice`]: bring-up, rings, transmit, receive, teardown |
//!
//! What any VFIO NIC needs (the VFIO device, DMA memory, IOMMU mappings,
//! BAR access) is `via_vfio`'s.
//!
//! # Device names
//!
//! `e1000e:<pci address>` (e.g. `e1000e:0000:00:03.0`) and
//! `/dev/via_e1000e<N>`, the N-th 82574 by PCI address. The device must be
//! bound to vfio-pci first (`via-agent bind <pci address>`).

pub mod desc;
pub mod device;
pub mod regs;

pub use device::E1000eDevice;

use std::io;
use via_device::{pci, FrameDevice};
use via_device::{DeviceOpener, HostRoute};

/// The driver's name: the prefix of its device names and its entry in
/// `via_device::pci::NIC_DRIVERS`.
pub const DRIVER: &str = "e1000e";

/// Opens `e1000e:<pci>` and `/dev/via_e1000e<N>` as [`E1000eDevice`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct E1000eOpener;

impl E1000eOpener {
    /// The PCI address an e1000e device name designates: `Some(Ok(addr))`,
    /// `Some(Err(..))` for an e1000e name that resolves to nothing, `None`
    /// when the name is not an e1000e name.
    pub fn address_of(name: &str) -> Option<io::Result<String>> {
        if let Some(a) = name.strip_prefix("e1000e:") {
            return Some(Ok(pci::normalize_address(a)));
        }
        let n = name.strip_prefix("/dev/via_e1000e")?;
        let Ok(n) = n.parse::<usize>() else { return None };
        let nics: Vec<_> = pci::list().unwrap_or_default().into_iter().filter(|d| d.via_driver() == Some(DRIVER)).collect();
        Some(nics.get(n).map(|d| d.address.clone()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("there are {} e1000e NICs; {name} needs at least {} (see `via-agent list`)", nics.len(), n + 1))
        }))
    }
}

impl DeviceOpener for E1000eOpener {
    fn driver(&self) -> &'static str {
        DRIVER
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let addr = Self::address_of(name)?;
        Some(addr.and_then(|a| E1000eDevice::open(&a)).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

// Names of its own: tried before the softnic's catch-all `/dev/via_<ifname>`.
via_device::register_drivers!(E1000E_DRIVERS = [(21, &E1000eOpener)]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(E1000eOpener::address_of("e1000e:0000:00:03.0").unwrap().unwrap(), "0000:00:03.0");
        assert_eq!(E1000eOpener::address_of("e1000e:00:03.0").unwrap().unwrap(), "0000:00:03.0");
        assert!(E1000eOpener::address_of("/dev/via_eth0").is_none());
        assert!(E1000eOpener::address_of("tulip:00:03.0").is_none());
        assert!(E1000eOpener::address_of("/dev/via_e1000eX").is_none());
    }

    #[test]
    fn numbered_names_are_the_82574s_in_address_order() {
        // Whatever this machine has (none on a test host, some in the QEMU
        // guest): /dev/via_e1000eN is the N-th by PCI address, and the
        // name one past the last is a clear error.
        let nics: Vec<String> = pci::list().expect("listing the PCI network devices").into_iter().filter(|d| d.via_driver() == Some(DRIVER)).map(|d| d.address).collect();
        for (n, address) in nics.iter().enumerate() {
            let got = E1000eOpener::address_of(&format!("/dev/via_e1000e{n}")).expect("an e1000e name").expect("a present NIC");
            assert_eq!(&got, address, "/dev/via_e1000e{n}");
        }
        let past = format!("/dev/via_e1000e{}", nics.len());
        let e = E1000eOpener::address_of(&past).expect("an e1000e name").expect_err("one past the last");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains(&format!("there are {} e1000e NICs", nics.len())), "{e}");
    }
}
