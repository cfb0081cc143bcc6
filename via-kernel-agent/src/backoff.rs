//! The retransmission schedule shared by every control-plane request
//! (connection requests, peer requests, name queries): send at once, then
//! again after an interval that doubles up to a ceiling, until a deadline
//! ([`Backoff`]); and the table of requests retried on it that each of
//! the three state machines keeps ([`RetryTable`]).

use std::time::{Duration, Instant};

/// When a request goes out next, and when it gives up.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    next_send: Instant,
    interval: Duration,
    max: Duration,
    deadline: Instant,
}

impl Backoff {
    /// A schedule whose first send is due at `now`, with intervals from
    /// `first` doubling to `max`, ending at `deadline`.
    pub fn new(now: Instant, deadline: Instant, first: Duration, max: Duration) -> Self {
        Backoff { next_send: now, interval: first, max, deadline }
    }

    /// Lowers the ceiling of the interval to `max`.
    pub fn cap(&mut self, max: Duration) {
        self.max = self.max.min(max);
        self.interval = self.interval.min(self.max);
    }

    /// Has the deadline passed at `now`?
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    /// Is a send due at `now`? When it is, the next one is scheduled.
    pub fn send_due(&mut self, now: Instant) -> bool {
        if now < self.next_send {
            return false;
        }
        self.next_send = now + self.interval;
        self.interval = (self.interval * 2).min(self.max);
        true
    }

    /// The next instant this schedule needs attention.
    pub fn next_event(&self) -> Instant {
        self.next_send.min(self.deadline)
    }
}

/// A request a [`RetryTable`] retries: does it still wait for an answer?
/// (Settled requests stay until polled, unretried.)
pub trait Retried {
    fn in_progress(&self) -> bool;
}

/// What a request in progress needs at a timer tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Its deadline passed: settle it (it gave up).
    Expired,
    /// A retransmission is due: send it again.
    Send,
}

/// The requests one state machine retries, in the order they began, each
/// with its schedule.
#[derive(Debug)]
pub struct RetryTable<T> {
    entries: Vec<(Backoff, T)>,
}

impl<T> Default for RetryTable<T> {
    fn default() -> Self {
        RetryTable { entries: Vec::new() }
    }
}

impl<T: Retried> RetryTable<T> {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Starts retrying `r` on `schedule`, after dropping the entries
    /// `replaces` picks (the request it supersedes).
    pub fn start(&mut self, schedule: Backoff, r: T, replaces: impl Fn(&T) -> bool) {
        self.entries.retain(|(_, e)| !replaces(e));
        self.entries.push((schedule, r));
    }

    /// Drops the entries `f` picks.
    pub fn remove_where(&mut self, f: impl Fn(&T) -> bool) {
        self.entries.retain(|(_, e)| !f(e));
    }

    /// The first entry `f` picks, to look at.
    pub fn find(&self, f: impl Fn(&T) -> bool) -> Option<&T> {
        self.entries.iter().map(|(_, e)| e).find(|e| f(e))
    }

    /// The first entry `f` picks.
    pub fn find_mut(&mut self, f: impl Fn(&T) -> bool) -> Option<&mut T> {
        self.find_scheduled_mut(f).map(|(_, e)| e)
    }

    /// The first entry `f` picks, with its schedule.
    pub fn find_scheduled_mut(&mut self, f: impl Fn(&T) -> bool) -> Option<(&mut Backoff, &mut T)> {
        self.entries.iter_mut().find(|(_, e)| f(e)).map(|(b, e)| (b, e))
    }

    /// The first request in progress `f` picks.
    pub fn find_in_progress_mut(&mut self, f: impl Fn(&T) -> bool) -> Option<&mut T> {
        self.entries.iter_mut().map(|(_, e)| e).find(|e| e.in_progress() && f(e))
    }

    /// What `state` says of the first entry `f` picks, if any; a settled
    /// entry is forgotten once asked.
    pub fn poll<S>(&mut self, f: impl Fn(&T) -> bool, state: impl Fn(&T) -> S) -> Option<S> {
        let i = self.entries.iter().position(|(_, e)| f(e))?;
        let s = state(&self.entries[i].1);
        if !self.entries[i].1.in_progress() {
            self.entries.remove(i);
        }
        Some(s)
    }

    /// A timer tick at `now` for every request in progress: `due(r,
    /// Expired)` once its deadline passed; otherwise `check(r)` (the
    /// machine's own rules, which may settle it), then `due(r, Send)`
    /// when it is still in progress and a retransmission is due.
    pub fn on_timer(&mut self, now: Instant, mut check: impl FnMut(&mut T), mut due: impl FnMut(&mut T, Due)) {
        for (schedule, r) in self.entries.iter_mut().filter(|(_, r)| r.in_progress()) {
            if schedule.expired(now) {
                due(r, Due::Expired);
                continue;
            }
            check(r);
            if r.in_progress() && schedule.send_due(now) {
                due(r, Due::Send);
            }
        }
    }

    /// The next instant a request in progress needs a tick: its schedule's,
    /// or what `also` adds for it, whichever is sooner.
    pub fn next_deadline(&self, also: impl Fn(&T) -> Option<Instant>) -> Option<Instant> {
        self.entries.iter().filter(|(_, r)| r.in_progress()).map(|(b, r)| also(r).map_or(b.next_event(), |t| t.min(b.next_event()))).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_ceiling_and_expires() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Backoff::new(t0, t0 + ms(100), ms(5), ms(20));
        assert!(b.send_due(t0));
        assert!(!b.send_due(t0 + ms(4)));
        assert!(b.send_due(t0 + ms(5)));
        assert_eq!(b.next_event(), t0 + ms(15));
        assert!(b.send_due(t0 + ms(15)));
        assert_eq!(b.next_event(), t0 + ms(35));
        assert!(b.send_due(t0 + ms(35)));
        assert_eq!(b.next_event(), t0 + ms(55)); // the ceiling: 20 ms
        assert!(!b.expired(t0 + ms(99)));
        assert!(b.expired(t0 + ms(100)));
        assert_eq!(Backoff::new(t0, t0 + ms(1), ms(5), ms(20)).next_event(), t0);
    }

    struct R {
        id: u32,
        done: Option<&'static str>,
    }

    impl Retried for R {
        fn in_progress(&self) -> bool {
            self.done.is_none()
        }
    }

    #[test]
    fn the_table_retries_what_is_in_progress_and_forgets_what_settled_once_polled() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = RetryTable::default();
        let b = |end| Backoff::new(t0, t0 + ms(end), ms(5), ms(5));
        let r = |id| R { id, done: None };
        t.start(b(100), r(1), |_| false);
        t.start(b(7), r(2), |_| false);
        t.start(b(100), r(9), |_| false);
        t.start(b(100), r(1), |e| e.id == 1); // replaces the first
        let mut sent = Vec::new();
        t.on_timer(t0, |e| if e.id == 9 { e.done = Some("settled by the machine") }, |e, d| sent.push((e.id, d)));
        assert_eq!(sent, [(2, Due::Send), (1, Due::Send)], "sent at once, in order; 9 settled before its send");
        sent.clear();
        t.on_timer(t0 + ms(5), |_| {}, |e, d| sent.push((e.id, d)));
        assert_eq!(sent, [(2, Due::Send), (1, Due::Send)]);
        sent.clear();
        t.on_timer(t0 + ms(7), |_| {}, |e, d| {
            sent.push((e.id, d));
            e.done = Some("timed out");
        });
        assert_eq!(sent, [(2, Due::Expired)]);
        assert_eq!(t.next_deadline(|_| None), Some(t0 + ms(10)), "1's next send; 2 and 9 settled");
        assert_eq!(t.next_deadline(|e| (e.id == 1).then_some(t0 + ms(8))), Some(t0 + ms(8)));
        assert!(t.find_in_progress_mut(|e| e.id == 2).is_none() && t.find_mut(|e| e.id == 2).is_some());
        assert_eq!(t.poll(|e| e.id == 2, |e| e.done), Some(Some("timed out")));
        assert_eq!(t.poll(|e| e.id == 2, |e| e.done), None, "forgotten once polled");
        assert_eq!(t.poll(|e| e.id == 1, |e| e.done), Some(None));
        assert_eq!(t.poll(|e| e.id == 1, |e| e.done), Some(None), "in progress: kept");
        t.remove_where(|e| e.id == 1);
        t.remove_where(|e| e.id == 9);
        assert!(t.is_empty());
    }
}
