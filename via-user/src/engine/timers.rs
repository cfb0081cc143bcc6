//! Timers: retransmission timeouts with exponential backoff and a retry
//! limit (exhausting it breaks the connection), and delayed ACKs. One
//! engine-wide deadline (`Context::timer_at`) says when to look; only then
//! are the VIs scanned.

use super::post::Queue;
use super::{Context, Core};
use crate::descriptor::status;
use crate::vi::{Expiry, ViPhase, ViState};
use crate::clock::Time;

impl Core {
    /// Is no timer due at `now` (nothing [`Core::run_timers`] would do)?
    #[inline]
    pub fn timers_quiet(&self, now: Time) -> bool {
        self.cm.timers_idle() && self.peers.timers_idle() && self.resolver.timers_idle() && self.timer_at.is_none_or(|t| t > now)
    }

    /// Runs the timers that are due at `now`.
    #[inline]
    pub fn run_timers(&mut self, now: Time) {
        // Connection management keeps `Instant`s: converted only when
        // it has something timed.
        if !(self.cm.timers_idle() && self.peers.timers_idle() && self.resolver.timers_idle()) {
            let at = self.clock.instant(now);
            self.cm.on_timer(at);
            self.peers.on_timer(at);
            self.resolver.on_timer(at);
        }
        if self.timer_at.is_some_and(|t| t <= now) {
            self.run_due_timers(now);
        }
    }

    fn run_due_timers(&mut self, now: Time) {
        let Core { vis, cx } = self;
        cx.timer_at = None;
        let mut next: Option<Time> = None;
        for vi in vis.iter_mut().flatten() {
            if vi.phase != ViPhase::Connected {
                continue;
            }
            cx.run_vi_timers(vi, now);
            if vi.phase != ViPhase::Connected {
                continue; // it broke: no timer of its runs again
            }
            if let Some(t) = vi.next_timer() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if let Some(t) = next {
            cx.arm(t);
        }
    }
}

impl Context {
    /// The timers of connected `vi` that are due at `now`.
    fn run_vi_timers(&mut self, vi: &mut ViState, now: Time) {
        if vi.acks.on_timer(now) {
            if !vi.rx.reorder.is_empty() {
                // A gap stands at the deadline (the device reorders and
                // its wait ran out, or a NAK went for it already): a loss,
                // NAKed once.
                vi.acks.on_gap_at(vi.rx.expected);
            }
            self.outbox.owe_ack(vi.id);
        }
        if vi.tx.rnr_until.is_some_and(|t| t <= now) {
            vi.tx.rnr_until = None; // the receiver-not-ready back-off passed: send again
            self.outbox.ring(vi.id);
        }
        if !vi.rtx.expired(now) {
            return;
        }
        match vi.rtx.on_expiry(now, vi.tx.outstanding(), self.config.retry_limit) {
            Expiry::Idle => {}
            Expiry::GiveUp => {
                self.counters.rto_expiries += 1;
                self.settle_boxes(vi, now); // what the peer did place
                // The message at the head could not be delivered:
                // TRANSPORT_ERROR; everything after it is flushed.
                let head = (vi.sq.done != vi.sq.tail).then(|| vi.sq.get(vi.sq.done)).map(|e| e.nframes != 0 || e.boxed);
                if head == Some(true) {
                    self.complete_next(vi, Queue::Send, 0, status::TRANSPORT_ERROR, None);
                }
                self.break_connection(vi);
            }
            Expiry::Retry => {
                self.counters.rto_expiries += 1;
                vi.tx.read_resume = vi.tx.reads_outstanding > 0;
                let (una, sent) = (vi.tx.una, vi.tx.unacknowledged());
                // Selective repeat: the holes go again, then everything
                // past the highest frame the peer holds; without a SACK,
                // everything (go-back-N).
                match vi.sack.on_timeout(sent) {
                    Some(past) => vi.seek(una.wrapping_add(past)),
                    None if sent != 0 => vi.seek(una),
                    None => {}
                }
                // Until the peer answers, only a burst goes again, its
                // last frame asking for an ACK: a timeout that was
                // spurious (a descheduled receiver, a late ACK) costs
                // that much, and a lost tail goes on at the answer.
                if sent != 0 {
                    vi.tx.start_burst();
                }
                self.outbox.ring(vi.id);
            }
        }
    }
}
