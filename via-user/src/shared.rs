//! The state an opened NIC's handles and its progress thread share: the
//! engine behind its lock, the device's descriptor, the threads asleep in
//! a wait and their wake-ups, the notifier, and one round of progress.

use crate::engine::Engine;
use crate::engine_lock::EngineLock;
use crate::notify::Notifier;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use crate::clock::Time;
use std::time::Duration;
use via_kernel_agent::names::NameService;

pub(crate) struct Shared {
    pub(crate) engine: EngineLock<Engine>,
    pub(crate) fd: RawFd,
    pub(crate) spin: Duration,
    pub(crate) name: String,
    pub(crate) names: Mutex<Option<NameService>>,
    /// Counts application entries into the engine; the progress thread
    /// compares it across its naps to tell whether the application is active.
    pub(crate) calls: AtomicU64,
    /// Rounds of progress the background thread ran.
    pub(crate) background_rounds: AtomicU64,
    /// Threads asleep in a wait, and the wake-up eventfd of each (see
    /// [`crate::waker`]): woken when another thread's progress may have
    /// completed what they wait for (that thread drained the device, so its
    /// fd will not wake them), or changed it (a disconnect, a destroy).
    pub(crate) sleepers: AtomicU32,
    pub(crate) sleeper_fds: Mutex<Vec<RawFd>>,
    pub(crate) notifier: Notifier,
}

impl Shared {
    /// One round of progress; wakes sleeping waiters when frames arrived.
    pub(crate) fn run(&self, e: &mut Engine) {
        let now = e.core.clock.now();
        self.run_at(e, now);
    }

    /// [`Shared::run`] with the time already read; true when frames
    /// arrived.
    pub(crate) fn run_at(&self, e: &mut Engine, now: Time) -> bool {
        let got = e.progress_at(now);
        if got {
            self.wake_sleepers();
        }
        self.notifier.collect(e);
        got
    }

    /// Wakes every thread asleep in a wait on this NIC, so it looks again
    /// at what it waits for.
    #[inline]
    pub(crate) fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake_each_sleeper();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_each_sleeper(&self) {
        for &fd in self.sleeper_fds.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            crate::waker::wake(fd);
        }
    }
}

