//! The engine's clock: the system's monotonic clock, read at most about
//! once every few microseconds. Between two readings the last one is used
//! again, its age told by the processor's time-stamp counter, a register
//! read (~10 ns here) where the system clock costs ~27 ns in a VM and a
//! fair part of the engine's cost per message (a wait that spins reads
//! the clock at every turn: with a microsecond's window, 5 % of a
//! shared-memory ping-pong went to the system clock). The engine's timers
//! (a 200 us delayed ACK, a retransmission timeout of milliseconds, at
//! least the configured 2 ms even when the measured round trip is
//! shorter) do not notice a few microseconds.
//!
//! Where the processor says the counter runs at a constant rate in every
//! state (CPUID's invariant TSC), its word alone decides. Elsewhere (an
//! older processor, or QEMU's TCG, whose `-cpu max` has no invariant TSC
//! and whose guest kernel then keeps time with the HPET) the counter may
//! slow down, stop in a sleep state or differ between cores, so a reading
//! is also used again only while the kernel's coarse clock (its last
//! tick, `CLOCK_MONOTONIC_COARSE`, read from the vDSO without touching
//! any clock hardware) has not moved since it was taken: at worst a
//! reading is a tick old (1-10 ms; the retransmission timeout is at least
//! 2 ms). There the system clock is a system call and an HPET read that
//! exits to the hypervisor, and the engine read it several times per
//! message (with the tulip's send no longer reading the clock when the
//! NIC is done at once, `via_vfio::spin_until`: seven alternating pairs of
//! `qemu/run.sh --boot tulip:2 --only bench`, VIA/raw bandwidth medians
//! 0.272 before, 0.447 after, higher in 6 of 7 pairs). On other
//! architectures every call reads the system clock.
//!
//! The engine's times are [`Time`]s: nanoseconds since its clock began, so
//! that arming a timer is one addition and a round-trip sample one
//! subtraction (`Instant` arithmetic normalises seconds and nanoseconds
//! at every step and checks for overflow). `Instant`s appear only where
//! the engine meets the outside: a wait's sleep, connection management.

use std::ops::{Add, AddAssign, Sub};
use std::time::{Duration, Instant};

/// A moment on an engine's clock: nanoseconds since the clock began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// How long after `earlier` this is (zero when it is not after).
    #[inline]
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `ns` nanoseconds later (saturating).
    #[inline]
    pub fn after_nanos(self, ns: u64) -> Time {
        Time(self.0.saturating_add(ns))
    }

    /// Nanoseconds after `earlier` (0 when it is not after).
    #[inline]
    pub fn nanos_since(self, earlier: Time) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// The earlier of two optional instants (a timer that is not armed is
/// `None`): when the first of two timers is due.
#[inline]
pub fn earlier(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A duration in whole nanoseconds (saturating: about 584 years).
#[inline]
pub fn nanos_of(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    #[inline]
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(nanos_of(d)))
    }
}

impl AddAssign<Duration> for Time {
    #[inline]
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    #[inline]
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(nanos_of(d)))
    }
}

/// Counter ticks a reading is used for: at most ~10 us at a 1 GHz
/// counter, ~3 us at the usual 3 GHz.
const FRESH_TICKS: u64 = 10_000;

/// The clock of one engine (read under its lock).
#[derive(Debug)]
pub struct Clock {
    /// Where [`Time`] 0 is, as an `Instant` and on the monotonic clock.
    origin: Instant,
    origin_ns: u64,
    /// The last reading.
    at: Time,
    /// The counter at `at`.
    tsc: u64,
    /// [`FRESH_TICKS`], or 0 when the counter is not to be trusted.
    fresh: u64,
    /// The counter is not invariant: a reading is used again only while
    /// the coarse clock still says what it said at the reading (`coarse`).
    bounded: bool,
    coarse: u64,
}

impl Default for Clock {
    fn default() -> Self {
        // Time 0 lies a second before the clock began, so that a time a
        // little before a reading (a test's `now - d`) is still after it.
        // (The two origins are read a few nanoseconds apart: what an
        // `Instant` converted to a `Time` may be off by.)
        let now = Instant::now();
        let now_ns = monotonic_ns();
        let back = Duration::from_secs(1).min(Duration::from_nanos(now_ns));
        let origin = now.checked_sub(back).unwrap_or(now);
        let origin_ns = now_ns - nanos_of(back);
        // (CPUID, asked once: in a VM each one exits to the hypervisor.)
        let invariant = invariant_tsc();
        let bounded = !invariant && coarse_ns().is_some();
        let fresh = if invariant || bounded { fresh_ticks() } else { 0 };
        Clock { origin, origin_ns, at: Time(now_ns - origin_ns), tsc: 0, fresh, bounded, coarse: 0 }
    }
}

impl Clock {
    /// Now, give or take a few microseconds.
    #[inline]
    pub fn now(&mut self) -> Time {
        if let Some(t) = tsc() {
            if t.wrapping_sub(self.tsc) < self.fresh && (!self.bounded || coarse_ns() == Some(self.coarse)) {
                return self.at;
            }
            self.tsc = t;
        }
        self.read()
    }

    /// Now, read from the system clock.
    fn read(&mut self) -> Time {
        if self.bounded {
            self.coarse = coarse_ns().unwrap_or(0);
        }
        self.at = Time(monotonic_ns().saturating_sub(self.origin_ns));
        self.at
    }

    /// The `Instant` that `t` is.
    pub fn instant(&self, t: Time) -> Instant {
        self.origin + Duration::from_nanos(t.0)
    }

    /// The [`Time`] that `i` is (0 for an instant before the clock's origin).
    pub fn time_of(&self, i: Instant) -> Time {
        Time(nanos_of(i.saturating_duration_since(self.origin)))
    }
}

/// The monotonic clock (`Instant`'s on Linux) in nanoseconds: read
/// directly, it needs none of the seconds-and-nanoseconds arithmetic an
/// `Instant` difference does.
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// The kernel's coarse monotonic clock (the time at its last tick), in
/// nanoseconds: the vDSO serves it from memory whatever the clock source.
/// None where it cannot be read.
fn coarse_ns() -> Option<u64> {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// Clock `id` in nanoseconds; None where it cannot be read.
#[inline]
fn clock_ns(id: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid place for the kernel (or the vDSO) to write.
    let r = unsafe { libc::clock_gettime(id, &mut ts) };
    (r == 0).then(|| (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64))
}

/// [`FRESH_TICKS`], or `VIA_CLOCK_FRESH_TICKS` where a measurement sets
/// it: under callgrind a program runs some 50 times slower while the
/// counter keeps real time, so every reading would look stale and the
/// instruction count would include system-clock reads a native run does
/// not make (`scripts/engine-instructions.sh` sets it 50 times larger).
fn fresh_ticks() -> u64 {
    std::env::var("VIA_CLOCK_FRESH_TICKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FRESH_TICKS)
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
            // A reading is reused for at most FRESH_TICKS ticks (~10 us
            // at 1 GHz); allow for a preempted thread in between.
            assert!(Instant::now().duration_since(c.instant(t)) < Duration::from_millis(50));
            last = t;
        }
    }

    #[test]
    fn time_moves_on() {
        let mut c = Clock::default();
        let t0 = c.now();
        let until = Instant::now() + Duration::from_millis(2);
        while Instant::now() < until {}
        assert!(
            c.now().since(t0) >= Duration::from_millis(2),
            "a reading older than a microsecond is not reused"
        );
    }

    #[test]
    fn without_an_invariant_counter_a_reading_lasts_at_most_a_tick() {
        // A counter that seems to stand still (stopped in a sleep state, or
        // read on another core): only the coarse clock ends its readings.
        let mut c = Clock { bounded: true, fresh: u64::MAX, ..Clock::default() };
        let t0 = c.now();
        let until = Instant::now() + Duration::from_millis(40);
        while Instant::now() < until {}
        // A tick is 1-10 ms (HZ 1000 to 100).
        assert!(c.now().since(t0) >= Duration::from_millis(25), "a reading outlived the kernel's tick");
    }

    #[test]
    fn times_and_instants_convert_both_ways() {
        let mut c = Clock::default();
        let t = c.now();
        let i = c.instant(t);
        assert_eq!(c.time_of(i), t);
        assert_eq!(
            c.time_of(i + Duration::from_millis(3)),
            t + Duration::from_millis(3)
        );
        assert_eq!(
            (t + Duration::from_micros(5)).since(t),
            Duration::from_micros(5)
        );
        assert_eq!(
            t.since(t + Duration::from_micros(5)),
            Duration::ZERO,
            "not after: zero"
        );
        assert!(
            t - Duration::from_millis(500) < t,
            "a little before a reading is still a time"
        );
    }
}
