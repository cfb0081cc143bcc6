//! Software frame devices for VIA.
//!
//! - [`LoopbackDevice`]: an in-process wire for tests (`/dev/via_lo`,
//!   `loop:<wire>`).
//! - `PacketDevice`: AF_PACKET on a Linux interface (`/dev/via_<ifname>`).

pub mod loopback;

pub use loopback::LoopbackDevice;

use std::io;
use via_kernel_agent::device::{interface_of, open_device, DeviceOpener};
use via_kernel_agent::FrameDevice;

/// Opens `/dev/via_lo` and `loop:<wire>` as loopback devices.
pub struct LoopbackOpener;

impl DeviceOpener for LoopbackOpener {
    fn driver(&self) -> &'static str {
        "loopback"
    }
    fn open(&self, name: &str) -> Option<io::Result<Box<dyn FrameDevice>>> {
        let wire = if name == "/dev/via_lo" { "lo" } else { name.strip_prefix("loop:")? };
        Some(LoopbackDevice::open(wire).map(|d| Box::new(d) as Box<dyn FrameDevice>))
    }
}

/// The drivers of this crate, in the order names are tried.
pub fn drivers() -> Vec<&'static dyn DeviceOpener> {
    vec![&LoopbackOpener]
}

/// Opens a software device by its VIA name.
pub fn open(name: &str) -> io::Result<Box<dyn FrameDevice>> {
    let _ = interface_of;
    open_device(name, &drivers())
}
