//! The engine's clock: the system's monotonic clock, read at most about
//! once a microsecond. Between two readings the last one is used again,
//! its age told by the processor's time-stamp counter, a register read
//! (~10 ns here) where the system clock costs ~27 ns in a VM and a fair
//! part of the engine's cost per message. The engine's timers (a 200 us
//! delayed ACK, a retransmission timeout of milliseconds) and its RTT
//! samples do not notice a microsecond.
//!
//! The counter is trusted only where the processor says it runs at a
//! constant rate in every state (CPUID's invariant TSC); elsewhere, and on
//! other architectures, every call reads the system clock.

use std::time::Instant;

/// Counter ticks a reading is used for: at most ~1 us at a 1 GHz counter,
/// less at the usual 2-4 GHz.
const FRESH_TICKS: u64 = 1000;

/// The clock of one engine (read under its lock).
#[derive(Debug)]
pub struct Clock {
    at: Instant,
    /// The counter at `at`.
    tsc: u64,
    /// [`FRESH_TICKS`], or 0 when the counter is not to be trusted.
    fresh: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock { at: Instant::now(), tsc: 0, fresh: if invariant_tsc() { FRESH_TICKS } else { 0 } }
    }
}

impl Clock {
    /// Now, give or take a microsecond.
    #[inline]
    pub fn now(&mut self) -> Instant {
        if let Some(t) = tsc() {
            if t.wrapping_sub(self.tsc) < self.fresh {
                return self.at;
            }
            self.tsc = t;
        }
        self.at = Instant::now();
        self.at
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn tsc() -> Option<u64> {
    // SAFETY: RDTSC exists on every x86-64 processor and reads a register.
    Some(unsafe { core::arch::x86_64::_rdtsc() })
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn tsc() -> Option<u64> {
    None
}

/// Does the time-stamp counter run at a constant rate in every state
/// (CPUID 8000_0007h, EDX bit 8: invariant TSC)?
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use core::arch::x86_64::__cpuid;
    // Leaf 8000_0007h is asked for only when the highest extended leaf
    // reaches it.
    __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn readings_are_monotonic_and_at_most_a_few_microseconds_old() {
        let mut c = Clock::default();
        let mut last = c.now();
        for _ in 0..100_000 {
            let t = c.now();
            assert!(t >= last, "never backwards");
            // A reading is reused for at most FRESH_TICKS ticks (~1 us
            // at 1 GHz); allow for a preempted thread in between.
            assert!(Instant::now().duration_since(t) < Duration::from_millis(50));
            last = t;
        }
    }

    #[test]
    fn time_moves_on() {
        let mut c = Clock::default();
        let t0 = c.now();
        let until = Instant::now() + Duration::from_millis(2);
        while Instant::now() < until {}
        assert!(c.now().duration_since(t0) >= Duration::from_millis(2), "a reading older than a microsecond is not reused");
    }
}
