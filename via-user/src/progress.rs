//! The background progress thread: it drives the engine while no
//! application thread does, so that a process busy computing still
//! acknowledges what it received, retransmits, and answers connection
//! requests — the work a NIC with its own processor would do.
//!
//! It stays out of the way of active callers: while application threads
//! keep entering the engine, the thread only naps (1 ms, doubling to
//! 16 ms). Once the application is idle it runs progress, then sleeps until
//! the next timer, or on the device's fd when nothing is pending. It holds
//! only a weak reference, and ends when the NIC is closed (the last handle
//! wakes it and joins it).

use crate::shared::Shared;
use crate::waker::sleep_on;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How long the application must stay out of the engine before the thread
/// takes over (at most twice this in practice).
pub const IDLE_AFTER: Duration = Duration::from_millis(1);
/// Longest nap between looks while the application is active. A passive
/// peer's ACKs may wait this long; the sender's retransmission timer covers it.
const MAX_NAP: Duration = Duration::from_millis(16);
/// Longest sleep, so the thread notices the NIC closing.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Makes closing a NIC synchronous although the progress thread may hold a
/// reference for a moment: the application's last handle waits until the
/// thread has let go, so the device is closed (and can be opened again)
/// when `drop` returns, not a moment later on the progress thread; then it
/// wakes the thread and joins it, so nothing of the NIC runs any more.
#[derive(Default)]
pub(crate) struct CloseGate {
    /// Does the progress thread hold a strong reference now?
    held: Mutex<bool>,
    released: Condvar,
    thread: Mutex<Option<std::thread::ThreadId>>,
    /// The progress thread, joined by the last handle.
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The progress thread's wake-up eventfd while it runs (cleared, under
    /// this lock, before the thread ends and its eventfd closes).
    stop_fd: Mutex<Option<std::os::fd::RawFd>>,
}

impl CloseGate {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops an application handle; if it was the last one, waits until
    /// the progress thread has dropped its own (so the NIC is closed).
    pub(crate) fn drop_handle(&self, shared: Arc<Shared>) {
        let mut held = self.lock();
        let last = Arc::strong_count(&shared) == 1 + usize::from(*held);
        drop(shared);
        let on_progress_thread = *self.thread.lock().unwrap_or_else(|p| p.into_inner()) == Some(std::thread::current().id());
        if last && !on_progress_thread {
            while *held {
                held = self.released.wait(held).unwrap_or_else(|p| p.into_inner());
            }
            drop(held);
            self.stop_thread();
        }
    }

    /// Wakes the progress thread (it finds the NIC gone and ends) and
    /// joins it.
    fn stop_thread(&self) {
        let Some(handle) = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        if let Some(fd) = *self.stop_fd.lock().unwrap_or_else(|p| p.into_inner()) {
            crate::waker::wake(fd);
        }
        let _ = handle.join();
    }

    fn take(&self, weak: &Weak<Shared>) -> Option<Arc<Shared>> {
        let mut held = self.lock();
        let s = weak.upgrade()?;
        *held = true;
        Some(s)
    }

    fn give_back(&self, shared: Arc<Shared>) {
        let mut held = self.lock();
        drop(shared);
        *held = false;
        self.released.notify_all();
    }
}

/// Starts the progress thread of `shared`.
pub(crate) fn start(shared: Weak<Shared>, gate: Arc<CloseGate>) -> std::io::Result<()> {
    let g = Arc::clone(&gate);
    let handle = std::thread::Builder::new().name("via-progress".into()).spawn(move || run(shared, &g))?;
    *gate.handle.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    Ok(())
}

fn run(weak: Weak<Shared>, gate: &CloseGate) {
    *gate.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
    // Without its own eventfd the thread still ends, at its next look.
    let stop = crate::waker::thread_fd().ok();
    *gate.stop_fd.lock().unwrap_or_else(|p| p.into_inner()) = stop;
    run_rounds(&weak, gate, stop.unwrap_or(-1));
    *gate.stop_fd.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// Runs progress while the NIC is open; sleeps wake early on `stop`.
fn run_rounds(weak: &Weak<Shared>, gate: &CloseGate, stop: std::os::fd::RawFd) {
    let mut seen = u64::MAX;
    let mut nap = IDLE_AFTER;
    loop {
        let Some(shared) = gate.take(weak) else { return };
        let calls = shared.calls.load(Ordering::Relaxed);
        if calls != seen {
            // The application entered the engine since we last looked: it
            // drives progress itself. Look less often the longer it stays
            // busy, so that a spinning application is seldom interrupted.
            seen = calls;
            gate.give_back(shared);
            sleep_on(&[stop], Some(nap));
            crate::waker::drain();
            nap = (nap * 2).min(MAX_NAP);
            continue;
        }
        nap = IDLE_AFTER;
        let round = match shared.engine.try_lock() {
            Some(mut e) => {
                shared.run(&mut e);
                // Sleep on the device only if it was told (and saw nothing
                // come meanwhile); otherwise look again at once.
                let sleep = e.prepare_sleep();
                Some((sleep.is_some().then(|| e.wait_fd()), sleep, e.next_deadline()))
            }
            None => None,
        };
        let Some((fd, device_sleep, next)) = round else {
            gate.give_back(shared);
            std::thread::sleep(IDLE_AFTER);
            continue;
        };
        shared.notifier.deliver();
        shared.background_rounds.fetch_add(1, Ordering::Relaxed);
        gate.give_back(shared);
        let Some(fd) = fd else {
            continue; // frames came as we were about to sleep
        };
        let now = Instant::now();
        let sleep = next.map_or(MAX_SLEEP, |t| t.saturating_duration_since(now).min(MAX_SLEEP));
        sleep_on(&[fd, stop], Some(sleep));
        drop(device_sleep); // awake: said to the device at once
        crate::waker::drain();
    }
}
