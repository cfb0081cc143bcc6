//! The opener table: every driver linked into the program registers its
//! openers here at link time, and [`open_device`] asks them in turn which
//! one recognises a VIA device name.
//!
//! A driver crate registers with [`register_drivers!`](crate::register_drivers)
//! (a `linkme` distributed slice, so nothing names the driver: linking its
//! crate is enough). A Rust program links a crate it names (`use
//! via_softnic as _;`); a C program linking a static archive takes only
//! the archive members something refers to, so a static library names each
//! driver's registration once (vipl's `drivers.rs` does).

use crate::{FrameDevice, MacAddr};
use std::io;

/// A route of a composite device: the host whose identity (its engine's
/// MAC) is `identity` is reached through member `device` (named as in the
/// composite's name) at `there`, its address on that member's network.
/// The hosts file says so (`name MAC DEVICE=MAC`); whoever opens the
/// device reads it and hands the routes down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoute {
    pub identity: MacAddr,
    pub device: String,
    pub there: MacAddr,
}

/// A driver that can open devices whose VIA name it recognises.
pub trait DeviceOpener: Sync {
    /// A short name for error messages ("softnic", "loopback", "tulip").
    fn driver(&self) -> &'static str;

    /// `None` when `name` is not one of this driver's names; otherwise the
    /// result of opening it. `routes` are the hosts file's routes, for
    /// drivers that join other devices (a composite); others ignore them.
    fn open(&self, name: &str, routes: &[HostRoute]) -> Option<io::Result<Box<dyn FrameDevice>>>;
}

/// A registered driver: its opener and its place in the order names are
/// tried, lowest first. Drivers that wrap or join other devices (names
/// with `?` or `+`) take 0-9, drivers with names of their own 10-99, and
/// catch-alls (`/dev/via_<any interface>`) 100 and up, so that
/// `/dev/via_tulip0` reaches the tulip driver before the softnic takes it
/// for an interface name.
#[derive(Clone, Copy)]
pub struct Driver {
    pub rank: u8,
    pub opener: &'static dyn DeviceOpener,
}

/// The table: one entry per driver crate, each a list of its drivers.
#[linkme::distributed_slice]
pub static DRIVERS: [&'static [Driver]];

/// Registers a driver crate's openers in [`DRIVERS`] under `$name` (a
/// public static, which a static library may name to keep it linked):
///
/// ```ignore
/// via_device::register_drivers!(SOFTNIC_DRIVERS = [(10, &LoopbackOpener), (100, &PacketOpener)]);
/// ```
#[macro_export]
macro_rules! register_drivers {
    ($name:ident = [$(($rank:expr, $opener:expr)),* $(,)?]) => {
        #[$crate::linkme::distributed_slice($crate::DRIVERS)]
        #[linkme(crate = $crate::linkme)]
        pub static $name: &'static [$crate::Driver] = &[$($crate::Driver { rank: $rank, opener: $opener }),*];
    };
}

/// The registered drivers in the order names are tried.
pub fn drivers() -> Vec<Driver> {
    let mut all: Vec<Driver> = DRIVERS.iter().flat_map(|c| c.iter().copied()).collect();
    all.sort_by_key(|d| (d.rank, d.opener.driver()));
    all
}

/// Opens the device called `name` with the first registered driver that
/// recognises it. Names follow M-VIA: `/dev/via_<ifname>` for an Ethernet
/// interface, `/dev/via_lo` for the in-process loopback; drivers add their
/// own (`tulip:<pci address>`, `shm:<wire>`).
pub fn open_device(name: &str, routes: &[HostRoute]) -> io::Result<Box<dyn FrameDevice>> {
    let drivers = drivers();
    for d in &drivers {
        if let Some(r) = d.opener.open(name, routes) {
            return r.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{} device {name:?}: {e}", d.opener.driver()),
                )
            });
        }
    }
    if drivers.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no driver is linked into this program to open {name:?} (a program links a driver by naming its crate, e.g. `use via_softnic as _;`)"),
        ));
    }
    let known: Vec<_> = drivers.iter().map(|d| d.opener.driver()).collect();
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no driver recognises device name {name:?} (drivers: {}); try /dev/via_<interface> or /dev/via_lo", known.join(", ")),
    ))
}
