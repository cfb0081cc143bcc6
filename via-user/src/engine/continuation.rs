//! The short road for the fragments that continue a message (header
//! prediction): a frame that repeats what the first fragment of the
//! message its VI is reassembling said of itself
//! ([`via_wire::ContinuationKey`]: addresses, endpoints, VIs, generation,
//! kind, message number and length), carries the PSN expected next and
//! the offset reached, and is neither the message's last fragment nor
//! one that asks for an ACK, is placed straight from that state. It
//! skips the dispatch the first fragment passed (addressing, the peer
//! match, the kind, the one-frame path's conditions) and nothing else:
//! its checksum or tag was checked before, its piggybacked ACK is taken,
//! its bytes go where the general path would put them (the same
//! [`Context::place_fragment`]) and it counts towards the next ACK as
//! any accepted frame does. Any frame it does not take goes the general
//! way (`receive.rs`), which alone starts, ends, breaks or refuses a
//! message: a message of many frames (a 64 KiB send at MTU 1500 is 46)
//! costs its middle fragments a few dozen checks less each.

use super::receive::Payload;
use super::Core;
use crate::clock::Time;
use crate::vi::{RxMessage, ViPhase, ViState};
use via_wire::{flags, Frame, Kind};

impl Core {
    /// Takes `f` (checked, trusted, its payload in the frame) if it is a
    /// middle fragment of the message its VI is reassembling; false (and
    /// nothing done) when the general path must.
    #[inline(always)]
    pub(super) fn on_continuation(&mut self, f: &Frame<&[u8]>, now: Time) -> bool {
        let fl = f.flags();
        if fl & flags::FIRST != 0 || !matches!(f.kind(), Some(Kind::Data | Kind::RdmaWrite)) {
            return false; // a message's first frame (or its only one), or no message's
        }
        let Some((cx, vi)) = self.split(f.dst_vi()) else { return false };
        let Some(m) = vi.rx.msg.as_ref() else { return false };
        let payload = f.payload();
        let end = m.got as u64 + payload.len() as u64;
        if fl != vi.rx.msg_key.flags() || !vi.rx.msg_key.repeated_by(f.headers()) || !continues(vi, m, f.psn(), f.offset(), end) {
            return false;
        }
        // As the general path: the piggybacked ACK first.
        let ack = f.ack();
        if fl & flags::ACK != 0 && ack != vi.tx.una {
            cx.on_ack(vi, ack, false, None, now);
        }
        cx.counters.rx_continued += 1;
        vi.rx.expected = vi.rx.expected.wrapping_add(1);
        let ptag = vi.attrs.ptag;
        let ViState { rx, rq, .. } = vi;
        let m = rx.msg.as_mut().expect("checked above");
        // An inline payload is never a lent one that could not be read.
        let _ = cx.place_fragment(m, rq, ptag, Payload::Inline(payload));
        if vi.reliable() {
            cx.accepted(vi, false, now);
        }
        true
    }
}

/// May the frame at `psn`, carrying the message's bytes from `offset` to
/// `end`, continue `m`, the message `vi` is reassembling, on the short
/// road? In sequence, at the offset reached, short of the message's end
/// (its last fragment completes the receive: the general path), on a
/// connected VI with nothing held past a gap.
#[inline(always)]
fn continues(vi: &ViState, m: &RxMessage, psn: u32, offset: u32, end: u64) -> bool {
    psn == vi.rx.expected && offset == m.got && end < u64::from(m.msg_len) && vi.phase == ViPhase::Connected && vi.rx.reorder.is_empty()
}
