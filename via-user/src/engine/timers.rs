//! Timers: retransmission timeouts with exponential backoff and a retry
//! limit (exhausting it breaks the connection), and delayed ACKs. One
//! engine-wide deadline (`Core::timer_at`) says when to look; only then are
//! the VIs scanned.

use super::post::Queue;
use super::Core;
use crate::descriptor::status;
use crate::vi::{Expiry, ViPhase};
use std::time::Instant;

impl Core {
    /// Runs the timers that are due at `now`.
    #[inline]
    pub fn run_timers(&mut self, now: Instant) {
        self.cm.on_timer(now);
        self.peers.on_timer(now);
        self.resolver.on_timer(now);
        if self.timer_at.is_some_and(|t| t <= now) {
            self.run_due_timers(now);
        }
    }

    fn run_due_timers(&mut self, now: Instant) {
        self.timer_at = None;
        let (rto_max, limit) = (self.config.rto_max, self.config.retry_limit);
        let mut next: Option<Instant> = None;
        for idx in 0..self.vis.len() {
            let id = idx as u16 + 1;
            let Some(vi) = self.vis[idx].as_mut() else { continue };
            if vi.phase != ViPhase::Connected {
                continue;
            }
            if vi.acks.on_timer(now) {
                self.cx.acks_due.push(id);
            }
            if vi.rtx.expired(now) {
                match vi.rtx.on_expiry(now, vi.tx.outstanding(), rto_max, limit) {
                    Expiry::Idle => {}
                    Expiry::GiveUp => {
                        self.cx.counters.rto_expiries += 1;
                        // The message at the head could not be delivered:
                        // TRANSPORT_ERROR; everything after it is flushed.
                        let head = (vi.sq.done != vi.sq.tail).then(|| *vi.sq.get(vi.sq.done));
                        if head.is_some_and(|e| e.nframes != 0) {
                            self.complete_next(id, Queue::Send, 0, status::TRANSPORT_ERROR, None);
                        }
                        self.break_connection(id);
                        continue;
                    }
                    Expiry::Retry => {
                        self.cx.counters.rto_expiries += 1;
                        vi.tx.read_resume = vi.tx.reads_outstanding > 0;
                        let (una, sent) = (vi.tx.una, vi.tx.unacknowledged());
                        // Selective repeat: the holes go again, then
                        // everything past the highest frame the peer
                        // holds; without a SACK, everything (go-back-N).
                        match vi.sack.on_timeout(sent) {
                            Some(past) => self.seek(id, una.wrapping_add(past)),
                            None if sent != 0 => self.seek(id, una),
                            None => {}
                        }
                        self.cx.doorbell.ring(id);
                    }
                }
            }
            let vi = self.vis[idx].as_ref().unwrap();
            if let Some(t) = vi.next_timer() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if let Some(t) = next {
            self.arm(t);
        }
    }
}
