//! Software frame devices for VIA: the NICs a VI provider can run on with no
//! VIA hardware.
//!
//! - [`PacketDevice`] (driver `softnic`) drives a Linux Ethernet interface
//!   through an AF_PACKET socket: frames arrive in a PACKET_MMAP ring
//!   (TPACKET_V2) and are handed out in place; a batch goes out with one
//!   `sendmmsg`, each frame gathered from the engine's header and the user's
//!   registered memory; [`RxFilter`](via_device::RxFilter)s become a
//!   classic BPF program on the socket, so several VIA processes can share
//!   one interface and each sees only frames for its own endpoint. It needs
//!   CAP_NET_RAW.
//! - [`LoopbackDevice`] (driver `loopback`) is an in-process wire for tests:
//!   devices opened on the same wire name in one process exchange frames by
//!   MAC address, with no privileges and no kernel involvement.
//! - [`ShmDevice`] (driver `shm`) connects processes of one host through
//!   a shared-memory segment: rings of frames, an eventfd to wake a sleeper.
//! - [`CompositeDevice`] joins NICs and a shared-memory wire under the
//!   first NIC's MAC: frames for processes attached to the wire go through
//!   it, frames for hosts the hosts file routes through the NIC it names,
//!   the rest through the first NIC.
//!
//! # Device names
//!
//! The crate registers its drivers in via-device's opener table; a program
//! that links it opens these names with `via_device::open_device`:
//!
//! | name               | device                                       |
//! |--------------------|----------------------------------------------|
//! | `/dev/via_lo`      | loopback device on the wire `lo`             |
//! | `loop:<wire>`      | loopback device on the wire `<wire>`         |
//! | `/dev/via_<ifname>`| [`PacketDevice`] on the interface `<ifname>` |
//! | `udp:<ifname>[,port=<n>][,gso=off]` | [`PacketDevice`] on `<ifname>`, VIA in |
//! |                    | UDP/IPv4 datagrams (port [`VIA_UDP_PORT`]),  |
//! |                    | hosts named by IPv4 address ([`udp`])        |
//! | `shm:<wire>[,lend=<bytes>]` | [`ShmDevice`] on the wire `<wire>`  |
//! | `<nic>+shm:<wire>` | [`CompositeDevice`] of the NIC `<nic>` (any  |
//! |                    | name, opened by any registered driver) and   |
//! |                    | the shared-memory wire `<wire>`              |
//! | `<nic>+<nic>[+shm:<wire>]` | [`CompositeDevice`] of several NICs  |
//! |                    | (routes from the hosts file) and the wire    |
//! | `<name>?<faults>`  | the device `<name>` losing, duplicating and  |
//! |                    | reordering frames ([`FaultyDevice`])         |
//!
//! `/dev/via_lo` is the in-process loopback, not the kernel's `lo`
//! interface. An interface is looked up in the network namespace of the
//! opening thread. `VIA_QDISC_BYPASS=0` makes packet devices send through
//! the interface's queueing discipline (for `tc` shaping or netem); by
//! default they bypass it.

mod bpf;
pub mod composite;
pub mod faulty;
pub mod loopback;
pub mod packet;
pub mod shm;
pub mod udp;

pub use composite::CompositeDevice;
pub use faulty::{FaultyDevice, Faults};
pub use loopback::LoopbackDevice;
pub use packet::{PacketDevice, PacketOptions};
pub use udp::VIA_UDP_PORT;
pub use shm::ShmDevice;

use std::io;
use via_device::{interface_of, open_device, DeviceOpener, HostRoute};
use via_device::FrameDevice;

/// Opens `/dev/via_lo` (wire `lo`) and `loop:<wire>` as [`LoopbackDevice`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopbackOpener;

impl LoopbackOpener {
    /// The wire a loopback name designates, if it is one.
    pub fn wire_of(name: &str) -> Option<&str> {
        if name == "/dev/via_lo" {
            Some("lo")
        } else {
            name.strip_prefix("loop:")
        }
    }
}

impl DeviceOpener for LoopbackOpener {
    fn driver(&self) -> &'static str {
        "loopback"
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let wire = Self::wire_of(name)?;
        if wire.is_empty() {
            return Some(Err(io::Error::new(io::ErrorKind::InvalidInput, "empty wire name (want loop:<wire>)")));
        }
        Some(LoopbackDevice::open(wire).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

/// Opens `/dev/via_<ifname>` as a [`PacketDevice`] on `<ifname>`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PacketOpener;

impl DeviceOpener for PacketOpener {
    fn driver(&self) -> &'static str {
        "softnic"
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let ifname = interface_of(name)?;
        Some(PacketDevice::open(ifname).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

/// Opens `udp:<ifname>[,port=<n>]` as a [`PacketDevice`] carrying VIA in
/// UDP/IPv4 datagrams.
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpOpener;

impl UdpOpener {
    /// The interface, port and segmentation offload a `udp:` name
    /// designates, if it is one.
    pub fn parse(name: &str) -> Option<io::Result<(&str, u16, bool)>> {
        let spec = name.strip_prefix("udp:")?;
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("device {name:?}: {why}"));
        let (ifname, opts) = spec.split_once(',').unwrap_or((spec, ""));
        let (mut port, mut gso) = (VIA_UDP_PORT, true);
        for opt in opts.split(',').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                Some(("gso", "on")) => gso = true,
                Some(("gso", "off")) => gso = false,
                Some(("port", n)) => match n.parse::<u16>() {
                    Ok(p) if p != 0 => port = p,
                    _ => return Some(Err(bad(format!("port={n}: want a UDP port, 1-65535")))),
                },
                _ => return Some(Err(bad(format!("unknown option {opt:?} (known: port=<n>, gso=on|off)")))),
            }
        }
        if ifname.is_empty() {
            return Some(Err(bad("want udp:<ifname>[,port=<n>][,gso=on|off]".into())));
        }
        Some(Ok((ifname, port, gso)))
    }
}

impl DeviceOpener for UdpOpener {
    fn driver(&self) -> &'static str {
        "udp"
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        Some(Self::parse(name)?.and_then(|(ifname, port, gso)| PacketDevice::open_udp(ifname, port, gso)).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

/// Opens `shm:<wire>` as a [`ShmDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmOpener;

impl DeviceOpener for ShmOpener {
    fn driver(&self) -> &'static str {
        "shm"
    }

    fn open(&self, name: &str, _routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let wire = name.strip_prefix("shm:")?;
        Some(ShmDevice::open(wire, None).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

/// Opens `<name>?<faults>` as a [`FaultyDevice`] around the device
/// `<name>` (opened by whichever driver recognises it).
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultyOpener;

impl DeviceOpener for FaultyOpener {
    fn driver(&self) -> &'static str {
        "faulty"
    }

    fn open(&self, name: &str, routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let (base, spec) = name.split_once('?')?;
        let open = || {
            let faults = Faults::parse(spec)?; // a bad spec opens nothing
            Ok(Box::new(FaultyDevice::new(open_device(base, routes)?, faults)?) as Box<dyn FrameDevice>)
        };
        Some(open())
    }
}

/// Opens members joined by `+` (`<nic>+shm:<wire>`, `<nic>+<nic>`) as a
/// [`CompositeDevice`], each member by whichever driver recognises it,
/// routed as `routes` say.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompositeOpener;

impl DeviceOpener for CompositeOpener {
    fn driver(&self) -> &'static str {
        "composite"
    }

    fn open(&self, name: &str, routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>> {
        if !name.contains('+') {
            return None;
        }
        let c = CompositeDevice::open(name, routes, |member| open_device(member, routes));
        Some(c.map(|c| Box::new(c) as Box<dyn FrameDevice>).map_err(|e| io::Error::new(e.kind(), format!("joining {name:?}: {e}"))))
    }
}

via_device::register_drivers!(
    SOFTNIC_DRIVERS = [(0, &FaultyOpener), (1, &CompositeOpener), (10, &LoopbackOpener), (10, &ShmOpener), (10, &UdpOpener), (100, &PacketOpener)]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pick_the_driver() {
        assert_eq!(LoopbackOpener::wire_of("/dev/via_lo"), Some("lo"));
        assert_eq!(LoopbackOpener::wire_of("loop:t7"), Some("t7"));
        assert_eq!(LoopbackOpener::wire_of("/dev/via_lo0"), None);
        assert_eq!(LoopbackOpener::wire_of("/dev/via_eth0"), None);
        assert!(PacketOpener.open("loop:x", &[]).is_none());
        assert!(PacketOpener.open("eth0", &[]).is_none());
        assert_eq!(UdpOpener::parse("udp:eth0").unwrap().unwrap(), ("eth0", VIA_UDP_PORT, true));
        assert_eq!(UdpOpener::parse("udp:eth0,port=4000,gso=off").unwrap().unwrap(), ("eth0", 4000, false));
        for bad in ["udp:", "udp:eth0,port=0", "udp:eth0,port=x", "udp:eth0,mtu=9000"] {
            assert_eq!(UdpOpener::parse(bad).unwrap().unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
        assert!(UdpOpener::parse("/dev/via_eth0").is_none());
        let names: Vec<_> = via_device::drivers().iter().map(|d| d.opener.driver()).collect();
        assert_eq!(names, ["faulty", "composite", "loopback", "shm", "udp", "softnic"], "this crate's drivers, registered in the order names are tried");
    }

    #[test]
    fn opens_loopback_devices_by_name() {
        let open = |name: &str| open_device(name, &[]);
        let mut a = open("loop:lib-names").unwrap();
        let mut b = open("loop:lib-names").unwrap();
        let mut h = [0u8; 20];
        h[..6].copy_from_slice(&b.mac().0);
        assert_eq!(a.transmit(&[via_device::TxFrame::new(&h)]).unwrap(), 1);
        assert_eq!(b.receive(8, &mut |f| assert_eq!(f, h)).unwrap(), 1);
        assert!(open("/dev/via_lo").is_ok());
        assert_eq!(open("loop:").err().unwrap().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn unknown_names_are_not_found() {
        let e = open_device("eth0", &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("no driver"), "{e}");
    }
}
