//! The retransmission timer of a reliable VI's sender: the timeout (RFC
//! 6298's estimate from [`RttEstimator`] once measured), exponential
//! backoff and the retry count on expiry, the one frame being timed
//! (never a retransmitted one: Karn), and the go-back-N rewind a NAK may
//! cause once per acknowledged position.

use crate::rtt::RttEstimator;
use crate::clock::{nanos_of, Time};
use std::time::Duration;

/// Timer, backoff and round-trip timing of one VI's sender.
#[derive(Clone, Debug)]
pub struct Retransmission {
    /// When the oldest unacknowledged frame times out.
    at: Option<Time>,
    /// The timeouts, in nanoseconds (the engine's clock counts them: no
    /// conversion on the path of a message). The current one:
    rto: u64,
    /// The timeout after progress: from the estimate, within
    /// `initial..=max` (recomputed when a sample comes, not per ACK).
    settled: u64,
    initial: u64,
    max: u64,
    /// Consecutive timeouts without progress.
    retries: u32,
    rtt: RttEstimator,
    /// The frame being timed: its PSN and when it went out.
    probe: Option<(u32, Time)>,
    /// The oldest unacknowledged PSN a NAK already rewound to.
    nak_rewound: Option<u32>,
}

/// What an expired timer asks of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Nothing was outstanding: the timer stopped.
    Idle,
    /// The retry limit is exhausted: the connection is lost.
    GiveUp,
    /// Send again what is unacknowledged; the timer runs again, backed off.
    Retry,
}

impl Retransmission {
    /// A stopped timer whose timeouts start at `initial` and back off to
    /// at most `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let (initial, max) = (nanos_of(initial), nanos_of(max));
        Retransmission { at: None, rto: initial, settled: initial, initial, max, retries: 0, rtt: RttEstimator::default(), probe: None, nak_rewound: None }
    }

    /// When the timer expires, if it runs.
    pub fn deadline(&self) -> Option<Time> {
        self.at
    }

    /// The smoothed round trip, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// Timeouts since the peer last made progress.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Stops the timer (the connection ended).
    pub fn stop(&mut self) {
        self.at = None;
    }

    /// Frames went out, the first never sent before being `first_new`:
    /// it is timed unless another is, and the timer starts unless it runs
    /// (at least the initial timeout). Returns the deadline to arm, when it
    /// started.
    #[inline]
    pub fn on_sent(&mut self, first_new: Option<u32>, now: Time) -> Option<Time> {
        if self.probe.is_none() {
            self.probe = first_new.map(|psn| (psn, now));
        }
        if self.at.is_some() {
            return None;
        }
        let t = now.after_nanos(self.rto.max(self.initial));
        self.at = Some(t);
        Some(t)
    }

    /// The peer acknowledged everything before `ack`: the timed frame, if
    /// among it, gives a round-trip sample; a later NAK may rewind again.
    #[inline(always)]
    pub fn on_acked(&mut self, ack: u32, now: Time) {
        if let Some((_, sent)) = self.probe.filter(|&(psn, _)| via_wire::seq_lt(psn, ack)) {
            self.rtt.sample(now.nanos_since(sent));
            self.settled = self.rtt.rto(self.initial, self.max);
            self.probe = None;
        }
        self.nak_rewound = None;
    }

    /// The peer made progress: retries and timeout start over (from the
    /// round-trip estimate, within the initial and the largest timeout),
    /// and the timer runs from `now` while anything is `outstanding`.
    /// Returns its deadline.
    #[inline]
    pub fn on_progress(&mut self, now: Time, outstanding: bool) -> Option<Time> {
        self.retries = 0;
        self.rto = self.settled;
        self.at = outstanding.then(|| now.after_nanos(self.rto));
        self.at
    }

    /// What follows is sent twice: it must not be timed (Karn).
    pub fn forget_probe(&mut self) {
        self.probe = None;
    }

    /// A NAK at `una` asks for go-back-N: true the first time for `una`.
    pub fn rewind_once(&mut self, una: u32) -> bool {
        if self.nak_rewound == Some(una) {
            return false;
        }
        self.nak_rewound = Some(una);
        true
    }

    /// Has the timer expired at `now`?
    pub fn expired(&self, now: Time) -> bool {
        self.at.is_some_and(|t| t <= now)
    }

    /// The timer expired; `outstanding`: frames or reads are unanswered.
    /// Past `limit` retries the connection is lost; otherwise the timeout
    /// doubles (at most the largest) and the timer runs again.
    pub fn on_expiry(&mut self, now: Time, outstanding: bool, limit: u32) -> Expiry {
        if !outstanding {
            self.at = None;
            return Expiry::Idle;
        }
        self.retries += 1;
        if self.retries > limit {
            return Expiry::GiveUp;
        }
        self.rto = self.rto.saturating_mul(2).min(self.max);
        self.at = Some(now.after_nanos(self.rto));
        self.nak_rewound = None;
        self.probe = None; // what follows is sent twice (Karn)
        Expiry::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backs_off_then_gives_up() {
        let t0 = Time::default() + Duration::from_secs(1);
        let mut r = Retransmission::new(2 * MS, 5 * MS);
        assert_eq!(r.on_sent(Some(0), t0), Some(t0 + 2 * MS), "the first send starts the timer");
        assert_eq!(r.on_sent(Some(1), t0), None, "already running");
        assert!(!r.expired(t0 + MS) && r.expired(t0 + 2 * MS));
        let t1 = t0 + 2 * MS;
        assert_eq!(r.on_expiry(t1, true, 2), Expiry::Retry);
        assert_eq!(r.deadline(), Some(t1 + 4 * MS), "doubled");
        assert_eq!(r.on_expiry(t1, true, 2), Expiry::Retry);
        assert_eq!(r.deadline(), Some(t1 + 5 * MS), "at most the maximum");
        assert_eq!(r.on_expiry(t1, true, 2), Expiry::GiveUp, "the third expiry is past 2 retries");
        assert_eq!(r.on_expiry(t1, false, 2), Expiry::Idle);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn times_one_new_frame_and_never_a_resent_one() {
        let t0 = Time::default() + Duration::from_secs(1);
        let mut r = Retransmission::new(2 * MS, 5 * MS);
        r.on_sent(Some(5), t0);
        r.on_acked(5, t0 + MS);
        assert_eq!(r.srtt(), None, "PSN 5 is not yet acknowledged");
        r.on_acked(6, t0 + MS);
        assert_eq!(r.srtt(), Some(MS));
        r.on_sent(Some(6), t0 + MS);
        r.forget_probe(); // a NAK: 6 goes again
        r.on_acked(7, t0 + 9 * MS);
        assert_eq!(r.srtt(), Some(MS), "a resent frame gives no sample");
        assert_eq!(r.on_progress(t0, true), Some(t0 + 3 * MS), "the estimate: srtt 1 ms + 4 x 0.5 ms");
        assert_eq!(r.retries(), 0);
        assert_eq!(r.on_progress(t0, false), None, "nothing outstanding: stopped");
        let mut slow = Retransmission::new(4 * MS, 9 * MS);
        slow.on_sent(Some(0), t0);
        slow.on_acked(1, t0 + MS);
        assert_eq!(slow.on_progress(t0, true), Some(t0 + 4 * MS), "at least the initial timeout");
    }

    #[test]
    fn a_nak_rewinds_once_per_position() {
        let mut r = Retransmission::new(MS, MS);
        assert!(r.rewind_once(3));
        assert!(!r.rewind_once(3));
        r.on_acked(4, Time::default() + Duration::from_secs(1));
        assert!(r.rewind_once(4), "progress allows the next rewind");
    }
}
