//! A device for loss tests: another device's frames, less the transmitted
//! ones a test picks (by their headers), which are "sent" and lost on the
//! wire.

use std::io;
use std::os::fd::RawFd;
use via_device::{Capabilities, FrameDevice, MacAddr, RxFilter, Sleep, TxFrame};

/// `inner`, losing every transmitted frame whose header `drops` picks.
pub struct DroppingDevice {
    pub inner: Box<dyn FrameDevice>,
    pub drops: Box<dyn FnMut(&[u8]) -> bool + Send>,
}

impl FrameDevice for DroppingDevice {
    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }
    fn mtu(&self) -> usize {
        self.inner.mtu()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn wait_fd(&self) -> RawFd {
        self.inner.wait_fd()
    }
    fn prepare_sleep(&mut self) -> Option<Sleep> {
        self.inner.prepare_sleep()
    }
    fn set_filter(&mut self, f: RxFilter) -> io::Result<()> {
        self.inner.set_filter(f)
    }
    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.inner.receive(budget, sink)
    }
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            if (self.drops)(f.header) {
                continue; // "sent", and lost on the wire
            }
            if self.inner.transmit(std::slice::from_ref(f))? == 0 {
                return Ok(i);
            }
        }
        Ok(frames.len())
    }
}
