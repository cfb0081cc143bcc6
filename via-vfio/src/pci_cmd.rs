//! The PCI command register (config space offset 4, PCI Local Bus
//! Specification 3.0 §6.2.2): I/O and memory decoding, bus mastering.
//!
//! The order every driver keeps: decoding on and bus mastering off at
//! open, mastering on only after the NIC was reset (a NIC left running by
//! a killed process holds ring addresses of the dead process's container),
//! mastering off again at teardown.

use crate::device::VfioDevice;
use std::io;

const COMMAND: u64 = 4;
/// I/O space and memory space decoding.
const IO_MEMORY: u16 = 0x3;
/// Bus master enable.
const MASTER: u16 = 0x4;

/// Turns register decoding on and bus mastering off.
pub fn decode_without_mastering(vfio: &VfioDevice) -> io::Result<()> {
    let cmd = vfio.config_read16(COMMAND)?;
    vfio.config_write16(COMMAND, (cmd | IO_MEMORY) & !MASTER)
}

/// Lets the (reset) NIC master the bus.
pub fn allow_mastering(vfio: &VfioDevice) -> io::Result<()> {
    let cmd = vfio.config_read16(COMMAND)?;
    vfio.config_write16(COMMAND, cmd | MASTER)
}

/// Stops the NIC mastering the bus.
pub fn stop_mastering(vfio: &VfioDevice) -> io::Result<()> {
    let cmd = vfio.config_read16(COMMAND)?;
    vfio.config_write16(COMMAND, cmd & !MASTER)
}
