//! What the peer told us about our sends, settled off the receive path.
//!
//! A message of the peer's says how far it got with ours: a frame's
//! piggybacked ACK (the next PSN it expects), a boxed message's count of
//! our boxed sends it placed. Acting on it (completing our sends, the
//! RTT sample, the timer) is work the message the application waits for
//! need not wait behind. So the receive path only notes it
//! ([`Sender::ack_told`](crate::vi::Sender), [`Sender::placed_told`](crate::vi::Sender))
//! and places the message; what was told is settled at the next look
//! that needs it:
//! - our next send on the VI, once its frame or boxed message is on its way;
//! - a poll for a completed send or a CQ entry that finds none;
//! - the start of the next round of progress (a poll that would skip a
//!   quiet round runs it while something told waits, and a sleeping wait
//!   wakes at once for it: [`Engine::next_deadline`](super::Engine::next_deadline));
//! - anything else that reads the sender's state: another ACK, the
//!   retransmission timer, an error report, a disconnect, a flush.
//!
//! Only a plain cumulative ACK on a data frame is deferred, and only
//! while nothing of the VI waits to go out (the ACK could open the
//! window for it); a standalone ACK (with its SACK, NAK or RNR) is acted
//! on at once, after what was told before it.

use super::{Context, Core};
use crate::clock::Time;
use crate::vi::ViState;
use via_wire::seq_le;

impl Context {
    /// Notes the cumulative ACK `ack` that a data frame of the peer's
    /// carried at `now`, to settle off the receive path. One older than
    /// what we know, or about frames never sent, is ignored as the ACK
    /// path ignores it.
    #[inline]
    pub(super) fn note_ack(&mut self, vi: &mut ViState, ack: u32, now: Time) {
        if ack == vi.tx.una || !seq_le(vi.tx.una, ack) || !seq_le(ack, vi.tx.sent_hi) {
            return;
        }
        match vi.tx.ack_told {
            // A later ACK covers the earlier; the earlier's time stays
            // (the RTT sample is of the first that covered the probe).
            Some((told, at)) => {
                if seq_le(told, ack) {
                    vi.tx.ack_told = Some((ack, at));
                }
            }
            None => {
                self.told_vis += u32::from(vi.tx.placed_told.is_none());
                vi.tx.ack_told = Some((ack, now));
            }
        }
    }

    /// Notes the count of our boxed sends the peer said it placed
    /// (`engine::boxed`).
    #[inline]
    pub(super) fn note_placed(&mut self, vi: &mut ViState, placed: u32) {
        if !vi.tx.has_told() {
            self.told_vis += 1;
        }
        vi.tx.placed_told = Some(placed);
    }

    /// Settles what the peer told about `vi`'s sends and was noted: the
    /// ACK first (framed sends complete by it), then the placed count.
    /// The clock is read (when `now` is None) only if something stays
    /// outstanding.
    #[inline(always)]
    pub(super) fn settle_told(&mut self, vi: &mut ViState, now: Option<Time>) {
        if !vi.tx.has_told() {
            return;
        }
        self.told_vis = self.told_vis.saturating_sub(1);
        if vi.tx.ack_told.is_some() {
            self.apply_told_ack(vi);
        }
        if let Some(n) = vi.tx.placed_told.take() {
            self.settle_boxes_upto(vi, n, now);
        }
    }

    /// Settles a noted ACK of `vi`'s before an ACK, SACK or NAK that came
    /// after it is acted on.
    #[inline]
    pub(super) fn settle_ack_told(&mut self, vi: &mut ViState) {
        if vi.tx.ack_told.is_some() {
            if vi.tx.placed_told.is_none() {
                self.told_vis = self.told_vis.saturating_sub(1);
            }
            self.apply_told_ack(vi);
        }
    }

    /// Acts on `vi`'s noted ACK, as of when it came. (Out of line: the
    /// ACK path is large, and the boxed path's settles never need it.)
    #[inline(never)]
    fn apply_told_ack(&mut self, vi: &mut ViState) {
        if let Some((ack, at)) = vi.tx.ack_told.take() {
            self.apply_ack(vi, ack, false, None, at);
        }
    }
}

impl Core {
    /// [`Context::settle_told`] for every VI: a round of progress, or a
    /// poll that found nothing, while something told waits. The count of
    /// such VIs is taken again.
    #[inline(never)]
    pub(super) fn settle_all_told(&mut self) {
        let Core { vis, cx } = self;
        for vi in vis.iter_mut().flatten().filter(|v| v.tx.has_told()) {
            cx.settle_told(vi, None);
        }
        cx.told_vis = 0;
    }
}
