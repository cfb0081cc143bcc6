//! What the receiving side of a reliable VI owes the sender: an ACK after
//! every `ack_every` accepted frames, once the flow pauses (`ack_idle`
//! after the last accepted frame, no frame of ours having carried it), at
//! the latest `ack_delay` after the first unacknowledged one, at once for a
//! duplicate or a frame that asks for one, and a NAK (with the SACK bitmap)
//! when a gap opens. Any frame we send carries the ACK, so a transmission
//! settles what is owed: a reply that follows within `ack_idle` takes it
//! along, and a sender whose peer does not reply (a blocking send, whose
//! completion waits for the ACK) has it soon after its last frame rather
//! than after `ack_delay`.

use crate::clock::{earlier, Time};
use std::time::Duration;

/// When a receiver acknowledges, from the engine's [`crate::Config`],
/// in the clock's nanoseconds (converted once, not per frame).
#[derive(Clone, Copy, Debug)]
pub struct AckTiming {
    /// An ACK at least every this many accepted frames.
    pub every: u32,
    /// The longest an ACK waits for a frame of ours to ride on.
    pub delay_ns: u64,
    /// How long it waits once the peer's frames stop coming.
    pub idle_ns: u64,
}

impl AckTiming {
    pub fn new(every: u32, delay: Duration, idle: Duration) -> AckTiming {
        AckTiming { every, delay_ns: crate::clock::nanos_of(delay), idle_ns: crate::clock::nanos_of(idle) }
    }
}

/// The ACK duty of one VI's receiver.
#[derive(Clone, Debug, Default)]
pub struct AckScheduler {
    /// Frames accepted since the last ACK went out.
    count: u32,
    /// When a delayed ACK is due.
    at: Option<Time>,
    /// When the flow will have paused: the last accepted frame's time plus
    /// the idle delay (moved on by every frame; the engine's timer,
    /// armed at the first, finds it later and waits again).
    idle_at: Option<Time>,
    /// An ACK (or, with `nak`, a NAK) must go out in this progress round.
    now: bool,
    nak: bool,
    /// The expected PSN a NAK was last sent for.
    nak_sent_for: Option<u32>,
    /// Over a device that reorders: when the gap that frames are held past
    /// is NAKed if it still stands (a full delay after it opened, whatever
    /// ACKs go meanwhile).
    gap_at: Option<Time>,
}

/// What accepting a frame asks of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckDue {
    /// Send an ACK this round.
    Now,
    /// Send an ACK this round: `every` frames came without one (the
    /// first frame that made it owed so; the engine counts these).
    Counted,
    /// Wake the engine at this instant for a delayed ACK.
    At(Time),
    /// Nothing new: a delayed ACK is already armed.
    Armed,
}

impl AckScheduler {
    /// Is any acknowledgement owed?
    pub fn owed(&self) -> bool {
        self.count > 0 || self.now || self.nak
    }

    /// Is the ACK owed a NAK?
    pub fn nak_owed(&self) -> bool {
        self.nak
    }

    /// When the delayed ACK, the pause's, or the wait for a gap, is due,
    /// if armed.
    pub fn deadline(&self) -> Option<Time> {
        earlier(earlier(self.at, self.idle_at), self.gap_at)
    }

    /// A frame was accepted in order; `requested`: it asked for an ACK.
    #[inline(always)]
    pub fn on_accepted(&mut self, now: Time, t: &AckTiming, requested: bool) -> AckDue {
        self.count += 1;
        if self.count >= t.every || requested {
            // The every-N rule's is counted once, at the frame that made
            // it owed.
            let counted = !requested && !self.now;
            self.now = true;
            return if counted { AckDue::Counted } else { AckDue::Now };
        }
        let idle = now.after_nanos(t.idle_ns);
        self.idle_at = Some(idle);
        if self.at.is_none() {
            let delayed = now.after_nanos(t.delay_ns);
            self.at = Some(delayed);
            AckDue::At(delayed.min(idle))
        } else {
            AckDue::Armed
        }
    }

    /// A duplicate came: the sender missed our ACK; send one this round.
    pub fn on_duplicate(&mut self) {
        self.now = true;
    }

    /// A frame past a gap was held; `new_hole`: it opened a hole the
    /// sender has not been told about, so a NAK is owed.
    pub fn on_held(&mut self, new_hole: bool) {
        self.nak |= new_hole;
    }

    /// A frame past a gap was held on a device that reorders: the gap may
    /// fill by itself, so nothing is sent now; `delay` after the gap
    /// opened the timer fires, and the engine NAKs if it still stands.
    pub fn on_held_waiting(&mut self, now: Time, delay: Duration) -> AckDue {
        if self.gap_at.is_some() {
            return AckDue::Armed;
        }
        let t = now + delay;
        self.gap_at = Some(t);
        AckDue::At(t)
    }

    /// The frames held past a gap were all placed: no wait for it.
    pub fn on_gap_filled(&mut self) {
        self.gap_at = None;
    }

    /// The gap at `expected` stands (frames are held past it, or one came
    /// that could not be held): a NAK is owed unless one was sent for it.
    /// Returns whether one now is.
    pub fn on_gap_at(&mut self, expected: u32) -> bool {
        if self.nak_sent_for == Some(expected) {
            return false;
        }
        self.nak = true;
        true
    }

    /// The delayed ACK's time, or a gap's, came: true when an ACK is now
    /// owed this round (the engine makes it a NAK if a gap stands).
    pub fn on_timer(&mut self, now: Time) -> bool {
        let mut due = false;
        for t in [&mut self.at, &mut self.idle_at, &mut self.gap_at] {
            if t.is_some_and(|t| t <= now) {
                *t = None;
                due = true;
            }
        }
        self.now |= due;
        due
    }

    /// A frame carrying our ACK went out (data, or a standalone ACK).
    #[inline]
    pub fn carried(&mut self) {
        self.count = 0;
        self.at = None;
        self.idle_at = None;
        self.now = false;
    }

    /// A standalone ACK for `expected` went out: returns whether it was a
    /// NAK (which is then no longer owed for that gap).
    pub fn sent(&mut self, expected: u32) -> bool {
        self.carried();
        let nak = std::mem::take(&mut self.nak);
        if nak {
            self.nak_sent_for = Some(expected);
        }
        nak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_every_n_frames_or_after_the_delay() {
        let (t0, d) = (Time::default() + Duration::from_secs(1), Duration::from_micros(200));
        // No pause counted here: an idle delay as long as the delay.
        let t = AckTiming::new(3, d, d);
        let mut a = AckScheduler::default();
        assert!(!a.owed());
        assert_eq!(a.on_accepted(t0, &t, false), AckDue::At(t0 + d), "the first frame arms the delay");
        assert_eq!(a.on_accepted(t0, &t, false), AckDue::Armed);
        assert!(a.owed() && a.deadline() == Some(t0 + d));
        assert!(!a.on_timer(t0), "not yet");
        assert_eq!(a.on_accepted(t0, &t, false), AckDue::Counted, "the third frame");
        assert_eq!(a.on_accepted(t0, &t, false), AckDue::Now, "owed already: counted once");
        a.carried();
        assert!(!a.owed() && a.deadline().is_none(), "a transmission settles it");
        assert_eq!(a.on_accepted(t0, &t, true), AckDue::Now, "asked for");
        a.carried();
        a.on_accepted(t0, &t, false);
        assert!(a.on_timer(t0 + d), "the delay ran out");
        assert!(a.owed() && a.deadline().is_none());
    }

    #[test]
    fn a_pause_in_the_flow_is_acknowledged_before_the_delay() {
        let (t0, d, idle) = (Time::default() + Duration::from_secs(1), Duration::from_micros(200), Duration::from_micros(20));
        let us = Duration::from_micros;
        let (every_100, every_1000) = (AckTiming::new(100, d, idle), AckTiming::new(1000, d, idle));
        let mut a = AckScheduler::default();
        assert_eq!(a.on_accepted(t0, &every_100, false), AckDue::At(t0 + idle), "the first frame arms the pause's wait");
        // Frames keep coming: the pause moves on with the last of them.
        for k in 1..=10 {
            assert_eq!(a.on_accepted(t0 + us(5 * k), &every_100, false), AckDue::Armed);
        }
        assert_eq!(a.deadline(), Some(t0 + us(50) + idle));
        assert!(!a.on_timer(t0 + idle), "the engine's timer at the first frame's pause finds none");
        assert_eq!(a.deadline(), Some(t0 + us(70)), "and waits again");
        assert!(a.on_timer(t0 + us(70)), "20 us without a frame: an ACK is owed");
        assert!(a.owed());
        a.carried();
        assert!(a.deadline().is_none());
        // A frame that never pauses long is still acknowledged by the delay.
        a.on_accepted(t0 + us(100), &every_1000, false);
        for k in 1..=30 {
            a.on_accepted(t0 + us(100 + 10 * k), &every_1000, false);
        }
        assert_eq!(a.deadline(), Some(t0 + us(100) + d));
        assert!(a.on_timer(t0 + us(100) + d));
        // A frame of ours carries what is owed: nothing waits.
        a.carried();
        a.on_accepted(t0 + us(500), &every_100, false);
        a.carried();
        assert!(!a.owed() && a.deadline().is_none());
    }

    #[test]
    fn a_gap_is_naked_once() {
        let mut a = AckScheduler::default();
        assert!(a.on_gap_at(7), "never NAKed at 7");
        assert!(a.sent(7), "the ACK sent was a NAK");
        assert!(!a.nak_owed() && !a.owed());
        assert!(!a.on_gap_at(7), "already NAKed at 7");
        a.on_held(false);
        assert!(!a.nak_owed(), "a frame that opened no hole");
        a.on_held(true);
        assert!(a.nak_owed(), "a new hole past 7");
        assert!(a.sent(7));
        assert!(a.on_gap_at(9), "a gap at 9 is new");
        a.on_duplicate();
        assert!(a.sent(9) && !a.owed());
    }

    /// Over a device that reorders, a gap waits its full delay from when it
    /// opened, ACKs sent meanwhile or not, and no wait once it filled.
    #[test]
    fn a_gap_on_a_reordering_device_waits_its_delay() {
        let (t0, d) = (Time::default() + Duration::from_secs(1), Duration::from_micros(200));
        let mut a = AckScheduler::default();
        assert_eq!(a.on_held_waiting(t0, d), AckDue::At(t0 + d));
        assert_eq!(a.on_held_waiting(t0 + d / 2, d), AckDue::Armed, "the same gap's wait");
        a.on_accepted(t0, &AckTiming::new(1, d, d), false);
        assert!(!a.sent(3), "a plain ACK went, not a NAK");
        assert_eq!(a.deadline(), Some(t0 + d), "the gap's wait survives the ACK");
        assert!(!a.on_timer(t0 + d / 2));
        assert!(a.on_timer(t0 + d), "the wait ran out: an ACK (the engine's NAK) is owed");
        assert!(a.deadline().is_none());
        a.on_held_waiting(t0 + d, d);
        a.on_gap_filled();
        assert!(a.deadline().is_none() && !a.on_timer(t0 + 3 * d), "filled: no wait");
    }
}
