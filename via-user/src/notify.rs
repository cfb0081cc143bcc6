//! Notifications: `VipSendNotify`, `VipRecvNotify`, `VipCQNotify` and
//! `VipErrorCallback`.
//!
//! A queue notification is one-shot: it is armed on a send queue, receive
//! queue or CQ, and the next completion there is taken off the queue (as
//! `Done` would) and handed to the callback. The error callback sees every
//! asynchronous error from the moment it is set.
//!
//! Whoever runs progress — an application call or the progress thread —
//! collects what became ready under the engine lock ([`Notifier::collect`]);
//! the callbacks run later, after the lock is released
//! ([`Notifier::deliver`]), so a callback may call back into the API.

use crate::engine::post::Queue;
use crate::engine::{AsyncError, Engine};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Where a notification is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotifyTarget {
    Send(u16),
    Recv(u16),
    Cq(u16),
}

/// What a notification delivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A descriptor taken off a VI's queue: its address.
    Descriptor(usize),
    /// A completion taken off a CQ: (VI, receive queue?).
    Completion(u16, bool),
}

type QueueCallback = Box<dyn FnOnce(Notice) + Send>;
type ErrorCallback = Box<dyn FnMut(AsyncError) + Send>;

/// The callbacks of one NIC and what is ready for them.
#[derive(Default)]
pub(crate) struct Notifier {
    /// Armed queue notifications, plus one while an error callback is set:
    /// the only thing progress looks at when nothing is armed.
    armed: AtomicUsize,
    callbacks: Mutex<HashMap<NotifyTarget, QueueCallback>>,
    error: Mutex<Option<ErrorCallback>>,
    ready: Mutex<Vec<Ready>>,
    has_ready: AtomicBool,
}

enum Ready {
    Queue(NotifyTarget, Notice),
    Error(AsyncError),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Notifier {
    /// Arms a one-shot notification (replacing one armed there before).
    pub(crate) fn arm(&self, target: NotifyTarget, f: QueueCallback) {
        if lock(&self.callbacks).insert(target, f).is_none() {
            self.armed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Disarms the notifications of a VI or CQ that is going away.
    pub(crate) fn disarm(&self, targets: &[NotifyTarget]) {
        let mut c = lock(&self.callbacks);
        for t in targets {
            if c.remove(t).is_some() {
                self.armed.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn set_error_callback(&self, f: Option<ErrorCallback>) {
        let mut e = lock(&self.error);
        match (e.is_some(), f.is_some()) {
            (false, true) => {
                self.armed.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.armed.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        *e = f;
    }

    /// Nothing is armed: a round of progress has nothing to collect.
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        self.armed.load(Ordering::Relaxed) == 0
    }

    /// Takes what became ready off the engine's queues. Called with the
    /// engine locked, after each round of progress.
    #[inline]
    pub(crate) fn collect(&self, e: &mut Engine) {
        if self.armed.load(Ordering::Relaxed) != 0 {
            self.collect_armed(e);
        }
    }

    fn collect_armed(&self, e: &mut Engine) {
        let mut ready = Vec::new();
        {
            let targets: Vec<NotifyTarget> = lock(&self.callbacks).keys().copied().collect();
            for t in targets {
                let got = match t {
                    NotifyTarget::Send(vi) => e.core.send_done(vi).ok().and_then(|(_, d)| d).map(Notice::Descriptor),
                    NotifyTarget::Recv(vi) => e.core.done(vi, Queue::Recv).ok().and_then(|(_, d)| d).map(Notice::Descriptor),
                    NotifyTarget::Cq(cq) => e.core.cq_done(cq).ok().and_then(|(_, c)| c).map(|(vi, r)| Notice::Completion(vi, r)),
                };
                if let Some(n) = got {
                    ready.push(Ready::Queue(t, n));
                }
            }
        }
        if lock(&self.error).is_some() {
            ready.extend(e.core.async_errors.drain(..).map(Ready::Error));
        }
        if !ready.is_empty() {
            lock(&self.ready).extend(ready);
            self.has_ready.store(true, Ordering::Release);
        }
    }

    /// Runs the callbacks of what is ready. Called without the engine lock.
    #[inline]
    pub(crate) fn deliver(&self) {
        if self.has_ready.load(Ordering::Acquire) {
            self.deliver_ready();
        }
    }

    fn deliver_ready(&self) {
        let ready = {
            let mut r = lock(&self.ready);
            self.has_ready.store(false, Ordering::Release);
            std::mem::take(&mut *r)
        };
        for r in ready {
            match r {
                Ready::Queue(t, n) => {
                    let f = lock(&self.callbacks).remove(&t);
                    if let Some(f) = f {
                        self.armed.fetch_sub(1, Ordering::Relaxed);
                        f(n);
                    }
                }
                Ready::Error(err) => {
                    if let Some(f) = lock(&self.error).as_mut() {
                        f(err);
                    }
                }
            }
        }
    }
}
