//! Timers: retransmission timeouts with exponential backoff and a retry
//! limit (exhausting it breaks the connection), and delayed ACKs. One
//! engine-wide deadline (`Core::timer_at`) says when to look; only then are
//! the VIs scanned.

use super::post::Queue;
use crate::reorder;
use super::Core;
use crate::descriptor::status;
use crate::vi::ViPhase;
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
            if vi.ack_at.is_some_and(|t| t <= now) {
                vi.ack_at = None;
                vi.ack_now = true;
                self.acks_due.push(id);
            }
            if vi.rto_at.is_some_and(|t| t <= now) {
                if vi.una == vi.sent_hi && vi.reads_outstanding == 0 {
                    vi.rto_at = None;
                } else {
                    vi.retries += 1;
                    self.counters.rto_expiries += 1;
                    if vi.retries > limit {
                        // The message at the head could not be delivered:
                        // TRANSPORT_ERROR; everything after it is flushed.
                        let head = (vi.sq.done != vi.sq.tail).then(|| *vi.sq.get(vi.sq.done));
                        if head.is_some_and(|e| e.nframes != 0) {
                            self.complete_next(id, Queue::Send, 0, status::TRANSPORT_ERROR, None);
                        }
                        self.break_connection(id);
                        continue;
                    }
                    vi.rto = (vi.rto * 2).min(rto_max);
                    vi.rto_at = Some(now + vi.rto);
                    vi.nak_rewound = None;
                    vi.rtt_probe = None; // what follows is sent twice (Karn)
                    vi.read_resume = vi.reads_outstanding > 0;
                    if vi.sacked != 0 {
                        // Selective repeat: the holes go again, then
                        // everything past the highest frame the peer holds.
                        vi.resend = reorder::holes(vi.sacked, vi.sent_hi.wrapping_sub(vi.una));
                        vi.resent = vi.resend;
                        let past = vi.una.wrapping_add(64 - vi.sacked.leading_zeros());
                        self.seek(id, past);
                    } else if vi.una != vi.sent_hi {
                        (vi.resend, vi.resent) = (0, 0);
                        let una = vi.una;
                        self.seek(id, una);
                    }
                    self.doorbell.ring(id);
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
