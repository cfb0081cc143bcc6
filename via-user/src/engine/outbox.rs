//! What the engine's VIs have to send, one place for all of it: the
//! doorbell (VIs whose send queue or read responses wait), the VIs that
//! owe a standalone ACK, and error reports (sent before everything else,
//! so that no ACK covering the message they are about overtakes them).
//! Connection management keeps its own queues: the connection manager,
//! the peer connector and the resolver retransmit what they send.

use crate::workqueue::Doorbell;
use via_wire::HeaderRepr;

#[derive(Default)]
pub struct Outbox {
    doorbell: Doorbell,
    /// VIs that owe an ACK this round (duplicates removed when sent).
    acks: Vec<u16>,
    /// Error reports, as built headers.
    reports: Vec<HeaderRepr>,
}

impl Outbox {
    /// VI `vi` has frames to send.
    #[inline]
    pub fn ring(&mut self, vi: u16) {
        self.doorbell.ring(vi);
    }

    /// VI `vi` owes its peer a standalone ACK (or NAK).
    #[inline]
    pub fn owe_ack(&mut self, vi: u16) {
        self.acks.push(vi);
    }

    /// An error report to send first.
    pub fn report(&mut self, h: HeaderRepr) {
        self.reports.push(h);
    }

    /// Nothing to send.
    #[inline]
    pub fn is_empty(&self) -> bool {
        !self.doorbell.is_rung() && self.acks.is_empty() && self.reports.is_empty()
    }

    /// Does a VI owe an ACK?
    pub fn owes_acks(&self) -> bool {
        !self.acks.is_empty()
    }

    /// VI `vi` is gone or starts over: it owes nothing.
    pub fn forget_vi(&mut self, vi: u16) {
        self.acks.retain(|v| *v != vi);
    }

    /// The VIs rung since the last call, oldest first, into `into`.
    pub fn take_rung(&mut self, into: &mut Vec<u16>) {
        self.doorbell.take(into);
    }

    /// The VIs owing an ACK, each once, in VI order; `give_back` returns
    /// the list (its allocation) once done.
    pub fn take_acks(&mut self) -> Vec<u16> {
        let mut due = std::mem::take(&mut self.acks);
        due.sort_unstable();
        due.dedup();
        due
    }

    /// The list [`Outbox::take_acks`] gave, done with: kept for reuse
    /// unless ACKs were owed again meanwhile.
    pub fn give_back(&mut self, mut due: Vec<u16>) {
        due.clear();
        if self.acks.is_empty() {
            self.acks = due;
        }
    }

    /// The error reports waiting, oldest first.
    pub fn reports(&self) -> &[HeaderRepr] {
        &self.reports
    }

    /// The first `k` reports went out.
    pub fn reports_sent(&mut self, k: usize) {
        self.reports.drain(..k);
    }
}
