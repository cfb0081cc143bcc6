//! The background progress thread: it drives the engine while no
//! application thread does, so that a process busy computing still
//! acknowledges what it received, retransmits, and answers connection
//! requests — the work a NIC with its own processor would do.
//!
//! It stays out of the way of active callers: while application threads
//! keep entering the engine, the thread only naps (1 ms, doubling to
//! 16 ms). Once the application is idle it runs progress, then sleeps until
//! the next timer, or on the device's fd when nothing is pending. It holds
//! only a weak reference, and ends when the NIC is closed.

use crate::nic::{sleep_on, Shared};
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

/// How long the application must stay out of the engine before the thread
/// takes over (at most twice this in practice).
pub const IDLE_AFTER: Duration = Duration::from_millis(1);
/// Longest nap between looks while the application is active. A passive
/// peer's ACKs may wait this long; the sender's retransmission timer covers it.
const MAX_NAP: Duration = Duration::from_millis(16);
/// Longest sleep, so the thread notices the NIC closing.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Starts the progress thread of `shared`.
pub(crate) fn start(shared: Weak<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new().name("via-progress".into()).spawn(move || run(shared)).map(|_| ())
}

fn run(weak: Weak<Shared>) {
    let mut seen = u64::MAX;
    let mut nap = IDLE_AFTER;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let calls = shared.calls.load(Ordering::Relaxed);
        if calls != seen {
            // The application entered the engine since we last looked: it
            // drives progress itself. Look less often the longer it stays
            // busy, so that a spinning application is seldom interrupted.
            seen = calls;
            drop(shared);
            std::thread::sleep(nap);
            nap = (nap * 2).min(MAX_NAP);
            continue;
        }
        nap = IDLE_AFTER;
        let (fd, next) = {
            let Ok(mut e) = shared.engine.try_lock() else {
                drop(shared);
                std::thread::sleep(IDLE_AFTER);
                continue;
            };
            shared.run(&mut e);
            (e.wait_fd(), e.next_deadline())
        };
        shared.notifier.deliver();
        shared.background_rounds.fetch_add(1, Ordering::Relaxed);
        drop(shared);
        let now = Instant::now();
        let sleep = next.map_or(MAX_SLEEP, |t| t.saturating_duration_since(now).min(MAX_SLEEP));
        sleep_on(&[fd], Some(sleep));
    }
}
