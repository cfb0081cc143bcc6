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
    /// When this run of timeouts gives up at the latest: the time the
    /// backoff from the initial timeout would take ([`give_up_after`]),
    /// counted from the start of the run (set at its first expiry).
    give_up_at: Time,
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
        Retransmission { at: None, rto: initial, settled: initial, initial, max, retries: 0, give_up_at: Time::default(), rtt: RttEstimator::default(), probe: None, nak_rewound: None }
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
    /// Past `limit` retries, or once the time those retries take from the
    /// initial timeout has passed since the peer last made progress, the
    /// connection is lost; otherwise the timeout doubles (at most the
    /// largest) and the timer runs again, no later than that time.
    ///
    /// The time bound keeps the configured connection timeout when the
    /// estimate has raised the timeout (a loaded machine's round trips):
    /// the count alone would stretch it by the same factor.
    pub fn on_expiry(&mut self, now: Time, outstanding: bool, limit: u32) -> Expiry {
        if !outstanding {
            self.at = None;
            return Expiry::Idle;
        }
        if self.retries == 0 {
            // The run began one timeout before this first expiry.
            let started_plus_rto = self.at.unwrap_or(now);
            self.give_up_at = started_plus_rto.after_nanos(give_up_after(self.initial, self.max, limit).saturating_sub(self.rto));
        }
        self.retries += 1;
        if self.retries > limit || now >= self.give_up_at {
            return Expiry::GiveUp;
        }
        self.rto = self.rto.saturating_mul(2).min(self.max);
        self.at = Some(now.after_nanos(self.rto).min(self.give_up_at));
        self.nak_rewound = None;
        self.probe = None; // what follows is sent twice (Karn)
        Expiry::Retry
    }
}

/// How long timeouts starting at `initial` (nanoseconds), doubling to at
/// most `max`, take to pass `limit` retries: the connection timeout.
pub fn give_up_after(initial: u64, max: u64, limit: u32) -> u64 {
    let (mut total, mut rto) = (initial, initial);
    for retry in 1..=u64::from(limit) {
        rto = rto.saturating_mul(2).min(max);
        if rto == max {
            // This timeout and every further one is the largest.
            return total.saturating_add(max.saturating_mul(u64::from(limit) + 1 - retry));
        }
        total = total.saturating_add(rto);
    }
    total
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
    fn the_connection_timeout_is_the_backoff_from_the_initial_timeout() {
        let ns = |d: Duration| nanos_of(d);
        assert_eq!(give_up_after(ns(2 * MS), ns(5 * MS), 2), ns(11 * MS), "2 + 4 + 5");
        assert_eq!(give_up_after(ns(MS), ns(250 * MS), 8), ns(505 * MS), "1 + 2 + ... + 128, then 250");
        assert_eq!(give_up_after(ns(9 * MS), ns(5 * MS), 1), ns(14 * MS), "the first timeout is the initial one even above the largest");
        assert_eq!(give_up_after(ns(MS), ns(MS), 0), ns(MS));
        assert!(give_up_after(ns(MS), ns(250 * MS), u32::MAX) > 0, "a huge limit neither loops for long nor overflows");
    }

    #[test]
    fn a_raised_estimate_still_gives_up_at_the_connection_timeout() {
        // Round trips of 20 ms (a loaded machine) raise the timeout to
        // 20 ms + 4 deviations; the configured backoff is 1 + 2 + 4 + 8
        // = 15 ms (initial 1 ms, 3 retries, at most 250 ms).
        let t0 = Time::default() + Duration::from_secs(1);
        let mut r = Retransmission::new(MS, 250 * MS);
        r.on_sent(Some(0), t0);
        r.on_acked(1, t0 + 20 * MS);
        let start = t0 + 20 * MS;
        let first = r.on_progress(start, true).expect("outstanding: running");
        assert!(first >= start + 20 * MS, "the estimate raised the timeout");
        assert_eq!(r.on_expiry(first, true, 3), Expiry::GiveUp, "the first expiry is already past the 15 ms the configured backoff takes");
        // Without the raise, the count decides, at the same time.
        let mut plain = Retransmission::new(MS, 250 * MS);
        plain.on_sent(Some(0), t0);
        let mut at = plain.deadline().unwrap();
        for _ in 0..3 {
            assert_eq!(plain.on_expiry(at, true, 3), Expiry::Retry);
            at = plain.deadline().unwrap();
        }
        assert_eq!(at, t0 + 15 * MS, "the last timeout ends at the connection timeout");
        assert_eq!(plain.on_expiry(at, true, 3), Expiry::GiveUp);
    }

    #[test]
    fn a_later_timeout_is_cut_at_the_connection_timeout() {
        // A 6 ms estimate against a 1 + 2 + 4 + 8 = 15 ms budget: the
        // expiries come at 6 and 6 + 12 = 18 > 15, so the second is
        // moved to 15 ms, where the timer gives up.
        let t0 = Time::default() + Duration::from_secs(1);
        let mut r = Retransmission::new(MS, 250 * MS);
        r.on_sent(Some(0), t0);
        r.on_acked(1, t0 + 2 * MS); // srtt 2 ms, deviation 1 ms: 6 ms
        let start = t0 + 2 * MS;
        let first = r.on_progress(start, true).unwrap();
        assert_eq!(r.on_expiry(first, true, 3), Expiry::Retry);
        assert_eq!(r.deadline(), Some(start + 15 * MS), "cut at the budget");
        assert_eq!(r.on_expiry(start + 15 * MS, true, 3), Expiry::GiveUp, "gives up there, one retry short of the limit");
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
