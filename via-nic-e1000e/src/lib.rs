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
//! `/dev/via_e1000e<N>`, the N-th 82574 by PCI address, each optionally
//! followed by `,mtu=<bytes>` (1500 by default; up to 9000, jumbo frames:
//! every host on the link must take them). The device must be bound to
//! vfio-pci first (`via-agent bind <pci address>`).

pub mod desc;
pub mod device;
pub mod regs;

pub use device::{E1000eDevice, MAX_MTU, MTU};

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
    /// when the name is not an e1000e name. Options after a comma are not
    /// part of the address ([`E1000eOpener::parse`]).
    pub fn address_of(name: &str) -> Option<io::Result<String>> {
        pci::address_of_name(DRIVER, name.split(',').next().unwrap_or_default())
    }

    /// The address and MTU of an e1000e device name (`<name>[,mtu=N]`);
    /// None when the name is not an e1000e name.
    pub fn parse(name: &str) -> Option<io::Result<(String, usize)>> {
        let address = Self::address_of(name)?;
        let mut mtu = MTU;
        for option in name.split(',').skip(1) {
            let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: {why} (options: mtu=<68..={MAX_MTU}>)"));
            match option.split_once('=') {
                Some(("mtu", v)) => match v.parse::<usize>() {
                    Ok(m) if (68..=MAX_MTU).contains(&m) => mtu = m,
                    _ => return Some(Err(bad(format!("MTU {v:?} is not a number in 68..={MAX_MTU}")))),
                },
                _ => return Some(Err(bad(format!("unknown option {option:?}")))),
            }
        }
        Some(address.map(|a| (a, mtu)))
    }
}

impl DeviceOpener for E1000eOpener {
    fn driver(&self) -> &'static str {
        DRIVER
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let parsed = Self::parse(name)?;
        Some(parsed.and_then(|(a, mtu)| E1000eDevice::open(&a, mtu)).map(|d| Box::new(d) as Box<dyn FrameDevice>))
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
    fn the_mtu_option() {
        assert_eq!(E1000eOpener::parse("e1000e:00:03.0").unwrap().unwrap(), ("0000:00:03.0".to_string(), 1500));
        assert_eq!(E1000eOpener::parse("e1000e:00:03.0,mtu=9000").unwrap().unwrap(), ("0000:00:03.0".to_string(), 9000));
        for bad in ["e1000e:00:03.0,mtu=9001", "e1000e:00:03.0,mtu=", "e1000e:00:03.0,mtu=x", "e1000e:00:03.0,jumbo"] {
            let e = E1000eOpener::parse(bad).unwrap().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
            assert!(e.to_string().contains(bad) && e.to_string().contains("mtu=<68..=9000>"), "{e}");
        }
        assert!(E1000eOpener::parse("tulip:00:03.0,mtu=9000").is_none());
    }

    #[test]
    fn layouts_pin_the_same_receive_bytes_whatever_the_mtu() {
        let std = device::Layout::for_mtu(1500);
        let jumbo = device::Layout::for_mtu(9000);
        assert_eq!((std.rx_ring, std.rx_buf, std.rctl_size), (1024, 2048, 0), "the reset values: 2 KiB buffers, no long packets");
        assert_eq!((jumbo.rx_ring, jumbo.rx_buf), (128, 16384));
        assert!(jumbo.rx_buf >= 9000 + 14 + 4, "a whole jumbo frame in one buffer");
        assert_eq!(jumbo.rctl_size, regs::rctl::LPE | regs::rctl::BSEX | regs::rctl::BSIZE_16384);
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
