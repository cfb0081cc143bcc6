//! The turnaround probe: where a reply's time goes between the moment
//! user space first sees a frame and the system call that sends the
//! answer, on the real path (the kernel's work between messages leaves
//! the caches cold, which the in-memory `engine_cost` bench does not
//! show).
//!
//! Built only with the `probe` feature (`scripts/turnaround.sh` builds
//! and runs it); without it every function here is empty and inlined
//! away. The first sighting of a frame ([`seen`]: a waiting thread's
//! watched word turning, or a device's ring slot) starts the clock;
//! [`mark`] notes how far along the reply is at each [`Stage`];
//! [`sending`] ends the turnaround. Times are time-stamp counter ticks,
//! kept per stage in a histogram of 25-tick buckets, and [`report`]
//! prints the medians, in nanoseconds. One process, one thread making
//! replies (the ping-pong server): the counts are shared atomics, not
//! per thread.

/// The points of a reply's path that are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A waiting thread took the engine's lock after its watch turned.
    Locked = 0,
    /// A round of progress began.
    Round,
    /// The device looked at the frame's slot.
    DeviceSeen,
    /// The frame was handed over and dealt with (the engine placed it,
    /// or the raw baseline copied it).
    Delivered,
    /// The wait returned to the application.
    WaitReturned,
    /// The application posted its reply.
    Posted,
    /// The engine checked the reply's descriptor.
    Validated,
    /// The reply's frames go to the kernel (the end).
    Sending,
}

// (Read only by the probe's report: unused without the feature.)
#[cfg_attr(not(all(feature = "probe", target_arch = "x86_64")), allow(dead_code))]
const STAGES: usize = Stage::Sending as usize + 1;
#[cfg_attr(not(all(feature = "probe", target_arch = "x86_64")), allow(dead_code))]
const NAMES: [&str; STAGES] = ["locked", "round", "device_seen", "delivered", "wait_returned", "posted", "validated", "sending"];

#[cfg(all(feature = "probe", target_arch = "x86_64"))]
mod on {
    use super::{Stage, NAMES, STAGES};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::time::{Duration, Instant};

    const BUCKET: u64 = 25;
    const BUCKETS: usize = 400; // up to 10,000 ticks; later ones are not counted

    static START: AtomicU64 = AtomicU64::new(0);
    static HIST: [[AtomicU64; BUCKETS]; STAGES] = [const { [const { AtomicU64::new(0) }; BUCKETS] }; STAGES];

    fn ticks() -> u64 {
        // SAFETY: reads the time-stamp counter; no memory is touched.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[inline(never)]
    pub fn seen() {
        if START.load(Relaxed) == 0 {
            START.store(ticks(), Relaxed);
        } else {
            mark(Stage::DeviceSeen);
        }
    }

    /// Realtime nanoseconds from the kernel's stamp to now, in 25 ns buckets.
    static STAMPED: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];

    #[inline(never)]
    pub fn stamped(kernel_ns: u64) {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        if let Some(h) = STAMPED.get((now.saturating_sub(kernel_ns) / BUCKET) as usize) {
            h.fetch_add(1, Relaxed);
        }
    }

    #[inline(never)]
    pub fn mark(stage: Stage) {
        let start = START.load(Relaxed);
        if start == 0 {
            return;
        }
        let b = (ticks().saturating_sub(start) / BUCKET) as usize;
        if let Some(h) = HIST[stage as usize].get(b) {
            h.fetch_add(1, Relaxed);
        }
    }

    /// When the last `sendmmsg` began, and how long each took (ticks).
    static SEND_AT: AtomicU64 = AtomicU64::new(0);
    static SYSCALL: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];

    #[inline(never)]
    pub fn sending() {
        mark(Stage::Sending);
        START.store(0, Relaxed);
        SEND_AT.store(ticks(), Relaxed);
    }

    #[inline(never)]
    pub fn sent() {
        let at = SEND_AT.swap(0, Relaxed);
        if at != 0 {
            if let Some(h) = SYSCALL.get((ticks().saturating_sub(at) / BUCKET) as usize) {
                h.fetch_add(1, Relaxed);
            }
        }
    }

    /// The middle of a histogram's counts (its bucket's centre) and their
    /// number; None when it counted nothing.
    fn median_of(h: &[AtomicU64; BUCKETS]) -> Option<(u64, u64)> {
        let n: u64 = h.iter().map(|b| b.load(Relaxed)).sum();
        if n == 0 {
            return None;
        }
        let mut acc = 0;
        let b = h.iter().position(|b| {
            acc += b.load(Relaxed);
            acc * 2 >= n
        })?;
        Some((b as u64 * BUCKET + BUCKET / 2, n))
    }

    /// Time-stamp counter ticks per nanosecond, measured against the clock.
    fn ticks_per_ns() -> f64 {
        let (t0, i0) = (ticks(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        (ticks() - t0) as f64 / i0.elapsed().as_nanos() as f64
    }

    pub fn report(label: &str) {
        let per_ns = ticks_per_ns();
        let mut line = format!("turnaround {label}: median ns from the frame seen:");
        for (k, h) in HIST.iter().enumerate() {
            if let Some((median, n)) = median_of(h) {
                line += &format!(" {} {:.0} (n {n})", NAMES[k], median as f64 / per_ns);
            }
        }
        if let Some((median, n)) = median_of(&SYSCALL) {
            line += &format!("; sendmmsg {:.0} ns (n {n})", median as f64 / per_ns);
        }
        if let Some((median, n)) = median_of(&STAMPED) {
            line += &format!("; the kernel's stamp to device_seen {median} ns (n {n})");
        }
        eprintln!("{line}");
    }
}

#[cfg(all(feature = "probe", target_arch = "x86_64"))]
pub use on::{mark, report, seen, sending, sent, stamped};

/// Whether the probe is built in (callers skip the work of its
/// arguments otherwise).
pub const ENABLED: bool = cfg!(all(feature = "probe", target_arch = "x86_64"));

/// A frame was seen (the first sighting starts the turnaround).
#[cfg(not(all(feature = "probe", target_arch = "x86_64")))]
#[inline(always)]
pub fn seen() {}

/// The turnaround reached `stage`.
#[cfg(not(all(feature = "probe", target_arch = "x86_64")))]
#[inline(always)]
pub fn mark(_stage: Stage) {}

/// The reply goes to the kernel: the turnaround ends.
#[cfg(not(all(feature = "probe", target_arch = "x86_64")))]
#[inline(always)]
pub fn sending() {}

/// The send's system call returned.
#[cfg(not(all(feature = "probe", target_arch = "x86_64")))]
#[inline(always)]
pub fn sent() {}

/// A device saw a frame the kernel stamped at `kernel_ns` (realtime).
#[cfg(not(all(feature = "probe", target_arch = "x86_64")))]
#[inline(always)]
pub fn stamped(_kernel_ns: u64) {}

/// Prints each stage's median (stderr); nothing without the feature.
#[cfg(not(all(feature = "probe", target_arch = "x86_64")))]
pub fn report(_label: &str) {}

#[cfg(test)]
mod tests {
    /// The probe is a diagnostic build: nothing the workspace builds by
    /// default turns it on (through feature unification, one crate's
    /// `via-device/probe` would put its marks on every message's path,
    /// and this test with them would fail).
    #[test]
    fn the_default_build_carries_no_probe() {
        assert!(!super::ENABLED);
    }
}
