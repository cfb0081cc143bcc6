//! The retransmission schedule shared by every control-plane request
//! (connection requests, peer requests, name queries): send at once, then
//! again after an interval that doubles up to a ceiling, until a deadline.

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
}
