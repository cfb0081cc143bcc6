//! What every VFIO NIC driver keeps the same way: its counters (the
//! `FrameDevice::stats` a user compares across NICs) and the bounded spin
//! with which it waits for the NIC (out of reset, done with a descriptor).

use std::time::{Duration, Instant};

/// A NIC driver's frame and event counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Good frames handed to the engine.
    pub rx_frames: u64,
    /// Frames the NIC flagged (errors, too long) and the driver dropped.
    pub rx_bad: u64,
    /// Frames the driver's software filter dropped.
    pub rx_filtered: u64,
    /// Times the NIC found no free receive descriptor for a frame.
    pub rx_no_buffer: u64,
    pub tx_frames: u64,
    /// Frames whose payload went straight from registered memory.
    pub tx_zero_copy: u64,
    /// Frames with a payload copied into the driver's buffers.
    pub tx_copied: u64,
    /// Batches cut short by a full transmit ring.
    pub tx_ring_full: u64,
    /// Interrupts taken (wake-ups through the VFIO eventfd).
    pub interrupts: u64,
}

impl NicCounters {
    /// The counters as `FrameDevice::stats` reports them, with the number
    /// of registered regions mapped for the NIC.
    pub fn stats(&self, dma_mappings: usize) -> Vec<(&'static str, u64)> {
        vec![
            ("rx_frames", self.rx_frames),
            ("rx_bad", self.rx_bad),
            ("rx_filtered", self.rx_filtered),
            ("rx_no_buffer", self.rx_no_buffer),
            ("tx_frames", self.tx_frames),
            ("tx_zero_copy", self.tx_zero_copy),
            ("tx_copied", self.tx_copied),
            ("tx_ring_full", self.tx_ring_full),
            ("interrupts", self.interrupts),
            ("dma_mappings", dma_mappings as u64),
        ]
    }
}

/// Spins until `done` holds, at most `timeout`; whether it came to hold.
/// For waits on the NIC that take microseconds when it works (a reset, a
/// descriptor the NIC is sending from): a NIC that takes longer is stuck.
pub fn spin_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    // Done at once is the common case (the tulip sends a frame during the
    // doorbell's write): no clock read, which in a TCG guest is a system
    // call and an HPET read, an exit to the hypervisor.
    if done() {
        return true;
    }
    let t0 = Instant::now();
    while !done() {
        if t0.elapsed() > timeout {
            return done();
        }
        std::hint::spin_loop();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_ends_when_its_condition_holds_or_at_its_timeout() {
        let mut looks = 0;
        assert!(spin_until(Duration::from_secs(5), || {
            looks += 1;
            looks == 3
        }));
        assert_eq!(looks, 3, "no look past the one that held");
        let t0 = Instant::now();
        assert!(!spin_until(Duration::from_millis(20), || false));
        assert!(t0.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn stats_name_every_counter() {
        let c = NicCounters { rx_frames: 1, tx_zero_copy: 2, interrupts: 3, ..Default::default() };
        let s = c.stats(4);
        let get = |n: &str| s.iter().find(|(k, _)| *k == n).map(|&(_, v)| v);
        assert_eq!((get("rx_frames"), get("tx_zero_copy"), get("interrupts"), get("dma_mappings")), (Some(1), Some(2), Some(3), Some(4)));
        assert_eq!(s.len(), 10);
    }
}
