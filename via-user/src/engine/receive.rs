//! The receive side: parsing and dispatching frames, acknowledgement
//! processing for the sender, and reassembly of messages into posted
//! receive descriptors. Nothing that comes off the wire is trusted: every
//! check failure is a counted drop.
//!
//! A payload lent by a sender on this host ([`LentPayload`]) is placed as
//! one in the frame is, except that each copy reads it from the sender's
//! memory: the one copy it makes.

use super::post::Queue;
use crate::reorder::Stored;
use super::{AsyncError, AsyncErrorKind, Context, Core};
use crate::descriptor::status;
use crate::usermem;
use crate::vi::{AckDue, Reliability, RxMessage, ViPhase, ViState};
use crate::workqueue::{CheckedSegment, WorkQueue, WqEntry};
use via_kernel_agent::memory::Ptag;
use crate::clock::Time;
use via_kernel_agent::conn::CmHeader;
use via_wire::{flags, seq_le, seq_lt, ConnRepr, ContinuationKey, Frame, Kind, ANY_ENDPOINT, FRAME_HEADER_LEN};
use via_device::{LentPayload, RxMeta};

/// A frame's payload: in the frame, or lent by its sender.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    Inline(&'a [u8]),
    Lent(&'a LentPayload),
}

/// Why a payload could not be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PlaceError {
    /// Our memory is not registered for it (any more).
    Protection,
    /// A lent payload could not be read: its sender is gone or broke its
    /// promise to keep the memory.
    SourceGone,
}

impl Payload<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Payload::Inline(b) => b.len(),
            Payload::Lent(l) => l.len(),
        }
    }

    /// Copies bytes `[from, from + n)` of the payload to `addr`.
    ///
    /// # Safety
    /// `[addr, addr + n)` must have been checked against the registration
    /// table, and `from + n` must not exceed the payload's length.
    #[inline(always)]
    unsafe fn copy_to(&self, from: usize, addr: usize, n: usize) -> Result<(), PlaceError> {
        match self {
            // SAFETY: the caller checked the destination and the range.
            Payload::Inline(b) => unsafe { usermem::copy_in(addr, &b[from..from + n]) },
            // SAFETY: as above; the kernel checks the sender's side.
            Payload::Lent(l) => unsafe { l.read(from, addr as *mut u8, n) }.map_err(|_| PlaceError::SourceGone)?,
        }
        Ok(())
    }
}

impl Core {
    /// Handles one received Ethernet frame; `meta.lent`: its payload, lent
    /// by a sender on this host (the frame then holds the headers alone);
    /// `meta.vouched`: it came by a path that cannot corrupt it;
    /// `meta.boxed`: it is not a frame but a boxed message
    /// (`engine::boxed`), with the word its sender reads.
    pub fn on_frame(&mut self, bytes: &[u8], meta: RxMeta<'_>, now: Time) {
        if let Some(placed) = meta.boxed {
            return self.on_boxed(bytes, placed, now);
        }
        let lent = meta.lent;
        self.cx.counters.rx_frames += 1;
        let parsed = match lent {
            None => Frame::new_checked(bytes),
            Some(l) => Frame::new_checked_lent(bytes, l.len()),
        };
        let Ok(f) = parsed else {
            self.cx.counters.rx_malformed += 1;
            return;
        };
        // The first frames of a connection whose answer its program has
        // not polled yet settle that request (connect.rs), before they
        // would be refused for want of its keys or as stale.
        if self.requests_out() && f.dst_ep() == self.ep && f.kind().is_some_and(|k| !k.is_connection_management()) {
            self.settle_answered_by(&f);
        }
        // Its checksum or MAC (authenticate.rs): a counted drop when wrong.
        if !self.frame_trusted(&f, lent.is_some(), meta.vouched, meta.ahead) {
            return;
        }
        // Longer than its header says: no sender pads a VIA frame (its
        // headers alone exceed the Ethernet minimum), so the bytes past the
        // payload (and its tag) are not ours to guess about.
        if lent.is_none() && bytes.len() != FRAME_HEADER_LEN + f.payload().len() + f.trailer_len() {
            self.cx.counters.rx_malformed += 1;
            return;
        }
        // A middle fragment of the message its VI is reassembling takes the
        // short road (continuation.rs).
        if lent.is_none() && self.on_continuation(&f, now) {
            return;
        }
        let payload = match lent {
            None => Payload::Inline(f.payload()),
            Some(l) => Payload::Lent(l),
        };
        let dst = f.dst_mac();
        if (dst != self.mac && !dst.is_broadcast()) || (f.dst_ep() != self.ep && f.dst_ep() != ANY_ENDPOINT) {
            self.cx.counters.rx_not_for_us += 1;
            return;
        }
        let kind = f.kind().expect("checked by new_checked");
        if (f.dst_ep() == ANY_ENDPOINT || dst.is_broadcast()) && !for_anyone(kind) {
            // Addressed to anyone, but not a request anyone may answer: a
            // Disconnect (or data) to every process is for none of them.
            self.cx.counters.rx_not_for_us += 1;
            return;
        }
        if lent.is_some() && !matches!(kind, Kind::Data | Kind::RdmaWrite | Kind::RdmaReadResp) {
            self.cx.counters.rx_malformed += 1; // only data is ever lent
            return;
        }
        if kind == Kind::Disconnect {
            self.on_disconnect(&f, now);
            return;
        }
        if kind.is_connection_management() {
            match ConnRepr::parse(f.payload()) {
                Ok(c) => {
                    let (mac, ep, vi) = (f.src_mac(), f.src_ep(), f.src_vi());
                    // Answers to our requests count only from the host
                    // asked (`rx_cm_foreign` otherwise).
                    let mut foreign = false;
                    match kind {
                        Kind::PeerRequest => self.peers.on_request(mac, ep, vi, c),
                        Kind::NameQuery => {
                            if self.resolver.on_query(mac, ep, &c, dst.is_broadcast()).is_err() {
                                self.cx.counters.rx_query_refused += 1;
                            }
                        }
                        Kind::NameReply => self.resolver.on_reply(mac, &c),
                        Kind::PeerAccept => foreign = self.peers.on_answer(kind, mac, ep, vi, f.generation(), f.imm(), c).is_err(),
                        _ => {
                            if kind == Kind::ConnReject {
                                foreign = self.peers.on_answer(kind, mac, ep, vi, f.generation(), f.imm(), c.clone()).is_err();
                            }
                            let h = CmHeader { kind, src_mac: mac, src_ep: ep, src_vi: vi, dst_vi: f.dst_vi(), generation: f.generation(), imm: f.imm() };
                            let at = self.clock.instant(now);
                            foreign |= self.cm.on_frame(h, c, at).is_err();
                        }
                    }
                    if foreign {
                        self.cx.counters.rx_cm_foreign += 1;
                    }
                }
                Err(_) => self.cx.counters.rx_malformed += 1,
            }
            return;
        }
        if f.dst_ep() != self.ep {
            self.cx.counters.rx_not_for_us += 1;
            return;
        }
        let Some((cx, vi)) = self.split(f.dst_vi()) else {
            self.cx.counters.rx_no_vi += 1;
            return;
        };
        let matches_peer = vi.phase == ViPhase::Connected
            && vi.peer.as_ref().is_some_and(|p| p.mac == f.src_mac() && p.ep == f.src_ep() && p.vi == f.src_vi() && p.generation == f.generation());
        if !matches_peer {
            cx.counters.rx_stale += 1;
            return;
        }
        vi.tx.peer_heard = true;
        let fl = f.flags();
        if kind == Kind::Ack && fl & flags::ERROR != 0 {
            cx.on_error_report(vi, &f, now);
            return;
        }
        if fl & flags::ACK != 0 {
            // A standalone ACK carries the SACK bitmap in its RDMA address
            // field; with ACK_REQ it is a NAK (a gap at `ack`).
            let (nak, sack) = if kind == Kind::Ack { (fl & flags::ACK_REQ != 0, Some(f.rdma_addr())) } else { (false, None) };
            cx.on_ack(vi, f.ack(), nak, sack, now);
            if kind == Kind::Ack && fl & flags::RNR != 0 {
                cx.on_rnr(vi, f.ack(), now);
            }
        }
        match kind {
            Kind::Data | Kind::RdmaWrite | Kind::RdmaReadReq | Kind::AtomicReq => cx.on_sequenced(vi, kind, &f, payload, now),
            Kind::RdmaReadResp => cx.on_read_response(vi, &f, payload, false, now),
            Kind::AtomicResp => cx.on_read_response(vi, &f, payload, true, now),
            Kind::Ack => {}
            _ => cx.counters.rx_malformed += 1,
        }
    }

    /// The peer disconnected: what it acknowledged completes, then the
    /// connection is lost.
    /// Anything else (another host, VI or generation) is counted and dropped.
    fn on_disconnect<T: AsRef<[u8]>>(&mut self, f: &Frame<T>, now: Time) {
        let id = f.dst_vi();
        let Ok(vi) = self.vi(id) else {
            self.cx.counters.rx_no_vi += 1;
            return;
        };
        let ours = vi.phase == ViPhase::Connected
            && vi.peer.as_ref().is_some_and(|p| p.mac == f.src_mac() && p.ep == f.src_ep() && p.vi == f.src_vi() && p.generation == f.generation());
        if !ours {
            self.cx.counters.rx_stale += 1;
            return;
        }
        let (cx, vi) = self.split(id).expect("looked up above");
        if f.flags() & flags::ACK != 0 && vi.reliable() {
            cx.on_ack(vi, f.ack(), false, None, now);
        }
        // What it placed of our boxed sends completes too (it said so
        // before it sent this).
        cx.settle_boxes(vi, now);
        cx.connection_lost(vi);
    }


}

impl Context {
    /// Puts `vi` into the Error state: its connection is gone.
    pub fn connection_lost(&mut self, vi: &mut ViState) {
        self.enter_error(vi, AsyncErrorKind::ConnLost);
    }

    /// Puts `vi` into the Error state, reporting `why`; everything
    /// outstanding completes as flushed.
    pub fn enter_error(&mut self, vi: &mut ViState, why: AsyncErrorKind) {
        if vi.phase == ViPhase::Error {
            return;
        }
        vi.phase = ViPhase::Error;
        self.counters.connections_lost += 1;
        self.async_errors.push(AsyncError { vi: vi.id, kind: why });
        self.flush_vi(vi);
    }

    /// The sender learns that the peer expects `ack` next and (`sack`, from
    /// a standalone ACK) which frames past it the peer holds; with `nak`,
    /// that the peer saw a gap: the holes below the highest frame it holds
    /// go again (selective repeat), or, when it holds none, everything from
    /// `ack` (go-back-N).
    #[inline(always)]
    pub(super) fn on_ack(&mut self, vi: &mut ViState, ack: u32, nak: bool, sack: Option<u64>, now: Time) {
        // Older than what we know, or acknowledging frames never sent: ignore.
        if !seq_le(vi.tx.una, ack) || !seq_le(ack, vi.tx.sent_hi) {
            return;
        }
        if ack != vi.tx.una {
            vi.sack.slide(ack.wrapping_sub(vi.tx.una));
            vi.tx.una = ack;
            vi.tx.rnr_refusals = 0;
            vi.rtx.on_acked(ack, now);
            let outstanding = vi.tx.outstanding();
            let behind = seq_lt(vi.tx.psn, ack);
            self.restart_rto(vi, now, outstanding);
            if behind {
                // Frames sent before a rewind got through: skip past them.
                // After a timeout's burst this is F-RTO's test (RFC 5682):
                // frames that never went again are acknowledged, so the
                // timeout was spurious and sending resumes past the
                // highest frame sent.
                let to = if vi.tx.burst_end.is_some() { vi.tx.sent_hi } else { ack };
                vi.seek(to);
            }
            // The first ACK that moves the window ends a burst; when it
            // did not skip past it, the loss was real and the rest goes
            // again as the window allows (go-back-N).
            vi.tx.burst_end = None;
            self.complete_acked(vi);
            if vi.tx.idx != vi.sq.tail {
                self.outbox.ring(vi.id); // the window opened
            }
        }
        let sent = vi.tx.unacknowledged();
        if let Some(s) = sack {
            // The peer's bit i is PSN ack + 1 + i; only frames we sent count.
            vi.sack.on_sack(s, sent);
        }
        if !nak {
            return;
        }
        vi.rtx.forget_probe(); // what follows is sent twice (Karn)
        if vi.sack.holds_any() {
            if vi.sack.on_nak(sent) {
                self.outbox.ring(vi.id);
            }
        } else if sent != 0 && vi.rtx.rewind_once(vi.tx.una) {
            let una = vi.tx.una;
            vi.seek(una);
            self.outbox.ring(vi.id);
        }
    }

    /// The peer refused the message at `ack` for want of a receive
    /// (receiver-not-ready mode): nothing from there is sent again until
    /// a back-off passes (doubling with each refusal in a row), and past
    /// the retry limit the message fails with TRANSPORT_ERROR and the
    /// connection breaks. The retransmission timer stops meanwhile. (Rare:
    /// kept out of line, so that the ACK path it sits on stays small.)
    #[cold]
    #[inline(never)]
    pub(super) fn on_rnr(&mut self, vi: &mut ViState, ack: u32, now: Time) {
        if ack != vi.tx.una || vi.tx.unacknowledged() == 0 || vi.phase != ViPhase::Connected {
            return; // stale: about frames already acknowledged
        }
        self.counters.rnr_refusals_received += 1;
        vi.tx.rnr_refusals += 1;
        if vi.tx.rnr_refusals > self.config.rnr_retry_limit {
            if vi.sq.done != vi.sq.tail && vi.sq.get(vi.sq.done).nframes != 0 {
                self.complete_next(vi, Queue::Send, 0, status::TRANSPORT_ERROR, None);
            }
            self.break_connection(vi);
            return;
        }
        let (first, longest) = (crate::clock::nanos_of(super::RNR_BACKOFF.0), crate::clock::nanos_of(super::RNR_BACKOFF.1));
        let wait = first.saturating_mul(1 << (vi.tx.rnr_refusals - 1).min(20)).min(longest);
        let until = now.after_nanos(wait);
        vi.seek(ack);
        vi.rtx.forget_probe();
        vi.rtx.on_progress(now, false);
        vi.tx.rnr_until = Some(until);
        self.arm(until);
    }

    /// The peer made progress on `vi` (an ACK moved, or a read
    /// response came): the retries and the RTO start over, and the
    /// retransmission timer runs again from `now` while anything is
    /// `outstanding`.
    pub(super) fn restart_rto(&mut self, vi: &mut ViState, now: Time, outstanding: bool) {
        if let Some(t) = vi.rtx.on_progress(now, outstanding) {
            self.arm(t);
        }
    }

    /// Completes send descriptors whose every frame is acknowledged.
    #[inline(always)]
    pub(super) fn complete_acked(&mut self, vi: &mut ViState) {
        loop {
            if vi.sq.done == vi.sq.tail {
                return;
            }
            let e = vi.sq.get(vi.sq.done);
            if e.nframes == 0 || !seq_le(e.first_psn.wrapping_add(e.nframes), vi.tx.una) {
                return;
            }
            if e.awaits_response() && !e.read_done && e.remote_status == 0 {
                return; // the request arrived; the data has not yet
            }
            let (len, bits) = if e.remote_status != 0 { (0, e.remote_status) } else { (e.len, 0) };
            self.complete_next(vi, Queue::Send, len, bits, None);
        }
    }

    /// A frame of the peer's sequenced stream (send or RDMA write
    /// fragment, RDMA read request) for `vi`; then, on a reliable VI,
    /// the frames held past the gap it filled.
    #[inline]
    pub(super) fn on_sequenced<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, kind: Kind, f: &Frame<T>, payload: Payload<'_>, now: Time) {
        self.sequenced(vi, kind, f, payload, now);
        if !vi.rx.reorder.is_empty() {
            self.replay_held(vi, now);
        }
    }

    /// Replays, in order, the frames held past a gap that has filled. If a
    /// gap remains with frames held past it, the sender is told at once (a
    /// NAK with the SACK bitmap), so that it sends the next holes.
    fn replay_held(&mut self, vi: &mut ViState, now: Time) {
        loop {
            if vi.phase != ViPhase::Connected {
                vi.rx.reorder.clear();
                return;
            }
            let expected = vi.rx.expected;
            let Some(bytes) = vi.rx.reorder.take(expected) else {
                if vi.rx.reorder.is_empty() {
                    vi.acks.on_gap_filled();
                } else {
                    self.on_gap_standing(vi, now);
                }
                return;
            };
            // Parsed and checked when it arrived.
            if let Ok(f) = Frame::new_checked(&bytes[..]) {
                if let Some(kind) = f.kind() {
                    self.sequenced(vi, kind, &f, Payload::Inline(f.payload()), now);
                }
            }
            vi.rx.reorder.recycle(bytes);
        }
    }

    /// A gap stands at `vi.rx.expected` with frames held past it. Over a
    /// device that may reorder (a composite striping over several NICs)
    /// the frame may only be late: a wait of the delayed-ACK time is armed
    /// from the gap's opening, and its timer NAKs if the gap stands then. Otherwise the sender is told at
    /// once (unless it already was, for this gap).
    #[cold]
    fn on_gap_standing(&mut self, vi: &mut ViState, now: Time) {
        if self.reorders {
            if let AckDue::At(t) = vi.acks.on_held_waiting(now, self.config.ack_delay) {
                self.arm(t);
            }
        } else if vi.acks.on_gap_at(vi.rx.expected) {
            self.outbox.owe_ack(vi.id);
        }
    }

    /// [`Context::on_sequenced`] of one frame: placed when it is the one
    /// expected, held when it is past a gap (selective repeat), answered
    /// when it is a duplicate.
    #[inline(always)]
    fn sequenced<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, kind: Kind, f: &Frame<T>, payload: Payload<'_>, now: Time) {
        let reliable;
        let psn = f.psn();
        {
            reliable = vi.reliable();
            if reliable {
                if psn != vi.rx.expected {
                    if seq_lt(psn, vi.rx.expected) {
                        self.counters.rx_duplicate += 1;
                        vi.acks.on_duplicate();
                        let again = vi.rx.last_error.filter(|&(first, end, _, _)| seq_le(first, psn) && seq_lt(psn, end));
                        self.outbox.owe_ack(vi.id);
                        if let Some((_, end, seq, bits)) = again {
                            self.queue_report(vi, end, seq, bits, false); // the report was lost
                        } else if kind == Kind::RdmaReadReq {
                            self.on_read_request(vi, f, true); // a response was lost
                        } else if kind == Kind::AtomicReq {
                            self.on_atomic_request(vi, f, payload, true); // its answer was lost
                        }
                        return;
                    }
                    // Past a gap: kept (a copy) until the gap fills, unless
                    // lent (a lent payload is read once, in order) or too
                    // far ahead; the sender learns of each new hole.
                    let stored = match payload {
                        Payload::Inline(_) => vi.rx.reorder.store(vi.rx.expected, psn, f.as_bytes()),
                        Payload::Lent(_) => Stored::OutOfSpan,
                    };
                    match stored {
                        Stored::Duplicate => self.counters.rx_duplicate += 1,
                        Stored::Kept { new_hole } => {
                            self.counters.rx_out_of_order += 1;
                            if self.reorders {
                                return self.on_gap_standing(vi, now);
                            }
                            vi.acks.on_held(new_hole);
                        }
                        Stored::OutOfSpan => {
                            self.counters.rx_out_of_order += 1;
                            vi.acks.on_gap_at(vi.rx.expected);
                        }
                    }
                    self.outbox.owe_ack(vi.id);
                    return;
                }
                vi.rx.expected = psn.wrapping_add(1);
            } else {
                if self.auth.is_some() && seq_lt(psn, vi.rx.expected) {
                    // With frame authentication, a tagged frame from before
                    // the one expected is a replay (or a late copy): never
                    // placed again. (Without it, a spoofer may have taken
                    // the peer's sequence number, and the peer's frames
                    // that follow must still be taken.)
                    self.counters.rx_duplicate += 1;
                    return;
                }
                if psn != vi.rx.expected {
                    // Unreliable: a gap loses the rest of the message being
                    // reassembled; a descriptor it had consumed completes
                    // PARTIAL. The frames it skips are counted as lost.
                    if seq_lt(vi.rx.expected, psn) {
                        self.counters.rx_lost += psn.wrapping_sub(vi.rx.expected) as u64;
                    }
                    self.abandon_partial(vi);
                }
                vi.rx.expected = psn.wrapping_add(1);
            }
        }
        let alive = match kind {
            Kind::RdmaReadReq => reliable && self.on_read_request(vi, f, false),
            Kind::AtomicReq => reliable && self.on_atomic_request(vi, f, payload, false),
            // The one-frame message, inlined here; the rest (reassembly,
            // RDMA writes) apart.
            _ => self.place_whole_message(vi, kind, f, payload) || self.place(vi, kind, f, payload),
        };
        if !alive {
            return; // the VI broke
        }
        if reliable {
            self.accepted(vi, f.flags() & flags::ACK_REQ != 0, now);
        }
    }

    /// A frame of reliable `vi`'s sequenced stream was accepted (placed,
    /// or served): the ACK it makes owed now, or later by the timer.
    #[inline(always)]
    pub(super) fn accepted(&mut self, vi: &mut ViState, requested: bool, now: Time) {
        match vi.acks.on_accepted(now, &self.ack_timing, requested) {
            AckDue::Now => self.outbox.owe_ack(vi.id),
            AckDue::Counted => {
                self.counters.acks_by_count += 1;
                self.outbox.owe_ack(vi.id)
            }
            AckDue::At(t) => self.arm(t),
            AckDue::Armed => {}
        }
    }

    /// Unreliable VI: the message being reassembled lost a fragment. If it
    /// had consumed a receive descriptor, that completes with PARTIAL_ERROR
    /// and the bytes placed so far.
    fn abandon_partial(&mut self, vi: &mut ViState) {
        let Some(m) = vi.rx.msg.take() else { return };
        if m.entry.is_some() {
            let op = if m.rdma.is_some() { status::OP_REMOTE_RDMA_WRITE } else { 0 };
            self.complete_next(vi, Queue::Recv, m.got, m.error | status::PARTIAL_ERROR | op, m.imm);
        }
    }

    /// The peer reports that our message `msg_seq` failed there.
    pub(super) fn on_error_report<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, f: &Frame<T>, now: Time) {
        let (seq, bits, fatal) = (f.msg_seq(), f.imm() & status::ERROR_MASK, f.flags() & flags::FATAL != 0);
        let mut idx = vi.sq.done;
        while idx != vi.sq.tail {
            let e = vi.sq.get_mut(idx);
            if e.nframes != 0 && e.msg_seq == seq {
                e.remote_status |= bits;
                break;
            }
            idx = idx.wrapping_add(1);
        }
        if vi.reliable() {
            self.on_ack(vi, f.ack(), false, None, now);
        }
        if fatal {
            // The failed message is at the head now: it completes with its
            // error, everything after it is flushed.
            if vi.sq.done != vi.sq.tail {
                let e = *vi.sq.get(vi.sq.done);
                if e.nframes != 0 && e.msg_seq == seq {
                    self.complete_next(vi, Queue::Send, 0, e.remote_status, None);
                }
            }
            self.connection_lost(vi);
        }
    }

    /// Starts reassembling a message whose first fragment is `f`: takes a
    /// receive descriptor for a send or an RDMA write with immediate data,
    /// checks an RDMA write's target. Returns the message (with neither a
    /// descriptor nor a target when it is to be dropped), or None when the
    /// VI broke or (receiver-not-ready mode) the message was refused. The caller keeps it in `vi.rx.msg` while more fragments follow.
    fn begin_message<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, kind: Kind, f: &Frame<T>) -> Option<RxMessage> {
        let fl = f.flags();
        let reliable = vi.reliable();
        if vi.rx.msg.is_some() && reliable {
            self.counters.rx_bad_offset += 1;
        }
        let mut m = RxMessage { entry: None, msg_seq: f.msg_seq(), msg_len: f.msg_len(), got: 0, error: 0, imm: None, seg: 0, seg_off: 0, first_psn: f.psn(), rdma: None };
        if fl & flags::IMMEDIATE != 0 {
            m.imm = Some(f.imm());
        }
        if kind == Kind::RdmaWrite {
            match self.rdma_target(vi, f.rdma_addr(), f.rdma_handle(), f.msg_len(), true) {
                Some(addr) => m.rdma = Some((addr, f.rdma_handle())),
                None => return self.rdma_violation(vi, m.first_psn, m.msg_seq, AsyncErrorKind::RdmaWriteProt).then_some(m),
            }
        }
        if kind == Kind::Data || m.imm.is_some() {
            if !self.has_receive(vi) {
                if reliable && self.config.rnr {
                    // Receiver not ready: not taken (the next frame
                    // expected is this one again), and the sender told.
                    vi.rx.expected = m.first_psn;
                    vi.rx.rnr_owed = true;
                    self.counters.rnr_refused += 1;
                    self.outbox.owe_ack(vi.id);
                    return None;
                }
                if reliable {
                    // Not delivered: the Disconnect's ACK must not cover it.
                    vi.rx.expected = m.first_psn;
                    self.no_receive_breaks(vi);
                    return None;
                }
                m.rdma = None;
                return Some(m); // unreliable: the message is dropped and counted
            }
            m.entry = Some(vi.rq.done);
            if kind == Kind::Data {
                m.error = self.length_error(vi, m.msg_len);
            }
        }
        Some(m)
    }

    /// Is a receive posted for `vi`'s next message (drawn from its shared
    /// receive queue if it uses one)? Counted when not.
    #[inline(always)]
    pub(super) fn has_receive(&mut self, vi: &mut ViState) -> bool {
        if vi.rq.done == vi.rq.tail && !self.refill_from_srq(vi) {
            self.counters.rx_no_receive_posted += 1;
            return false;
        }
        true
    }

    /// A message met no receive on reliable `vi`: RECVQ_EMPTY, and the
    /// connection breaks (the sender's send is flushed).
    pub(super) fn no_receive_breaks(&mut self, vi: &mut ViState) {
        self.async_errors.push(AsyncError { vi: vi.id, kind: AsyncErrorKind::RecvQueueEmpty });
        self.break_connection(vi);
    }

    /// LENGTH_ERROR (counted) when a message of `len` bytes is longer
    /// than `vi`'s next receive or its MaxTransferSize, else 0.
    #[inline(always)]
    pub(super) fn length_error(&mut self, vi: &ViState, len: u32) -> u32 {
        if len > vi.rq.get(vi.rq.done).len || len > vi.attrs.max_transfer_size {
            self.counters.length_errors += 1;
            return status::LENGTH_ERROR;
        }
        0
    }

    /// Places an in-sequence fragment of a send or RDMA write; false when
    /// the VI broke. The message being reassembled is updated where it is
    /// kept (`vi.rx.msg`), not copied out and back per fragment.
    #[inline]
    fn place<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, kind: Kind, f: &Frame<T>, payload: Payload<'_>) -> bool {
        let fl = f.flags();
        if fl & flags::FIRST != 0 {
            match self.begin_message(vi, kind, f) {
                Some(m) => vi.rx.msg = Some(m),
                None => return false,
            }
            if fl & flags::LAST == 0 {
                // Fragments follow: what they repeat (continuation.rs).
                vi.rx.msg_key = ContinuationKey::of_first(f.headers());
            }
        }
        let reliable = vi.reliable();
        let ptag = vi.attrs.ptag;
        let ViState { rx, rq, .. } = vi;
        let Some(m) = rx.msg.as_mut() else {
            // A middle fragment with no message: its start was lost.
            if reliable {
                self.counters.rx_bad_offset += 1;
            }
            return true;
        };
        let end = m.got as u64 + payload.len() as u64;
        let last = fl & flags::LAST != 0;
        let same_kind = (kind == Kind::RdmaWrite) == m.rdma.is_some() || (m.entry.is_none() && m.rdma.is_none());
        if !same_kind || f.msg_seq() != m.msg_seq || f.msg_len() != m.msg_len || f.offset() != m.got || end > m.msg_len as u64 || last != (end == m.msg_len as u64) {
            self.counters.rx_bad_offset += 1;
            if reliable {
                vi.rx.msg = None;
                self.break_connection(vi);
                return false;
            }
            self.abandon_partial(vi);
            return true;
        }
        if self.place_fragment(m, rq, ptag, payload).is_err() {
            // The sender lent memory it no longer has (or died): the
            // fragment is lost after it was accepted, so the connection
            // cannot go on.
            self.counters.rx_lent_failed += 1;
            vi.rx.msg = None;
            self.break_connection(vi);
            return false;
        }
        self.count_lent(payload);
        if !last {
            return true;
        }
        let m = vi.rx.msg.take().expect("the message placed into");
        if m.entry.is_some() {
            let len = if m.error == status::LENGTH_ERROR { 0 } else { m.got };
            let op = if m.rdma.is_some() { status::OP_REMOTE_RDMA_WRITE } else { 0 };
            self.complete_next(vi, Queue::Recv, len, m.error | op, m.imm);
        }
        if m.error != 0 {
            self.report_receive_error(vi, &m);
        }
        true
    }

    /// Places the fragment `payload` of message `m` at the offset it has
    /// reached (`m.got`, which it then passes): into the RDMA write's
    /// target, or into the receive's segments from the scatter cursor on;
    /// nowhere when the message is being dropped or has failed (`m.error`
    /// is set on a protection error). Err only when a lent payload could
    /// not be read.
    #[inline(always)]
    pub(super) fn place_fragment(&self, m: &mut RxMessage, rq: &WorkQueue, ptag: Ptag, payload: Payload<'_>) -> Result<(), PlaceError> {
        if m.error == 0 {
            let placed = if let Some((base, handle)) = m.rdma {
                let addr = base + m.got as usize; // inside the range checked at the first fragment
                match self.mem.check(handle, addr, payload.len(), ptag) {
                    // SAFETY: [addr, addr + len) was just checked against the table.
                    Ok(_) => unsafe { payload.copy_to(0, addr, payload.len()) },
                    Err(_) => Err(PlaceError::Protection), // deregistered meanwhile
                }
            } else if let Some(entry) = m.entry {
                let mut cur = (m.seg, m.seg_off);
                let r = self.scatter(rq.get(entry), ptag, &mut cur, payload);
                (m.seg, m.seg_off) = cur;
                r
            } else {
                Ok(())
            };
            match placed {
                Ok(()) => {}
                Err(PlaceError::Protection) => m.error = status::PROTECTION_ERROR,
                Err(e @ PlaceError::SourceGone) => return Err(e),
            }
        }
        m.got += payload.len() as u32;
        Ok(())
    }

    /// The one-frame path tried before [`Context::place`], for the common
    /// case: a send that is one frame, nothing being reassembled, a
    /// receive posted with segments that were checked at post (at most
    /// [`crate::workqueue::INLINE_SEGMENTS`]) and hold it. Placed and
    /// completed as the general path would (same copy, same completion),
    /// without the reassembly state. False (nothing done) otherwise:
    /// `place` then takes the frame.
    #[inline(always)]
    fn place_whole_message<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, kind: Kind, f: &Frame<T>, payload: Payload<'_>) -> bool {
        let fl = f.flags();
        let whole = flags::FIRST | flags::LAST;
        if kind != Kind::Data || fl & whole != whole || vi.rx.msg.is_some() || vi.rq.done == vi.rq.tail {
            return false;
        }
        let len = payload.len();
        if f.offset() != 0 || f.msg_len() as usize != len || len > vi.attrs.max_transfer_size as usize {
            return false;
        }
        let e = vi.rq.get(vi.rq.done);
        // A lent payload that could not be read, or a length error: the
        // general path says so.
        if !matches!(self.copy_whole(e, payload), Some(Ok(()))) {
            return false;
        }
        self.count_lent(payload);
        let imm = (fl & flags::IMMEDIATE != 0).then(|| f.imm());
        self.complete_next(vi, Queue::Recv, len as u32, 0, imm);
        true
    }

    /// Copies a whole message's `payload` into the receive `e`, when it
    /// kept its segments as checked at post (one or two) and they hold
    /// it: Some(how the copy went); None when the general path must
    /// place it (`scatter`).
    #[inline(always)]
    pub(super) fn copy_whole(&self, e: &WqEntry, payload: Payload<'_>) -> Option<Result<(), PlaceError>> {
        let len = payload.len();
        // SAFETY (every copy): the segments were checked against the
        // registration table at post and nothing was deregistered since
        // (the epoch is the same); each copy stays inside its segment and
        // the payload.
        match e.checked_segments(self.mem.epoch()) {
            Some(&[seg]) if len <= seg.len as usize => Some(unsafe { payload.copy_to(0, seg.addr as usize, len) }),
            Some(&[a, b]) if len as u64 <= a.len as u64 + b.len as u64 => {
                let head = len.min(a.len as usize);
                Some(unsafe { payload.copy_to(0, a.addr as usize, head) }.and_then(|()| if head < len { unsafe { payload.copy_to(head, b.addr as usize, len - head) } } else { Ok(()) }))
            }
            _ => None,
        }
    }

    /// On Reliable Reception, tells the sender that the receive of message
    /// `m` failed: its descriptor completes with REMOTE_DESC_ERROR.
    fn report_receive_error(&mut self, vi: &mut ViState, m: &RxMessage) {
        if vi.attrs.reliability == Reliability::ReliableReception {
            // The sender's descriptor learns that ours failed.
            let end = vi.rx.expected;
            vi.rx.last_error = Some((m.first_psn, end, m.msg_seq, status::REMOTE_DESC_ERROR));
            self.queue_report(vi, end, m.msg_seq, status::REMOTE_DESC_ERROR, false);
        }
    }

    pub(super) fn count_lent(&mut self, payload: Payload<'_>) {
        if let Payload::Lent(_) = payload {
            self.counters.rx_lent += 1;
        }
    }

    /// Copies `payload` into the segments of the posted descriptor `e`
    /// from the scatter cursor `cur` (segment, offset in it) on. Its
    /// segment list and every range written are checked against the
    /// registration table first: the application may have deregistered
    /// (and unmapped) them since posting, and then nothing is written.
    #[inline]
    pub(super) fn scatter(&self, e: &WqEntry, ptag: Ptag, cur: &mut (u16, u32), payload: Payload<'_>) -> Result<(), PlaceError> {
        match e.checked_segments(self.mem.epoch()) {
            Some(&[seg]) => {
                // One segment checked at post (the common case): the bytes
                // go at the cursor's offset, if they fit.
                let n = payload.len();
                let at = cur.1 as usize;
                if cur.0 != e.seg0 || at + n > seg.len as usize {
                    return if n == 0 { Ok(()) } else { Err(PlaceError::Protection) };
                }
                // SAFETY: the segment was checked against the registration
                // table at post and nothing was deregistered since (its
                // epoch stands); [at, at + n) lies inside it.
                unsafe { payload.copy_to(0, seg.addr as usize + at, n) }?;
                cur.1 += n as u32;
                return Ok(());
            }
            Some(_) => {}
            None if !usermem::descriptor_registered(&self.mem, e.desc, e.desc_handle, e.segs as usize, ptag) => return Err(PlaceError::Protection),
            None => {}
        }
        self.scatter_registered(e, ptag, cur, payload)
    }

    /// [`Context::scatter`] once the descriptor's registration was checked.
    fn scatter_registered(&self, e: &WqEntry, ptag: Ptag, cur: &mut (u16, u32), payload: Payload<'_>) -> Result<(), PlaceError> {
        let segs = e.segs as usize;
        // The segments as checked at post, while nothing was deregistered
        // since; otherwise read from the descriptor and checked again.
        let checked = e.checked_segments(self.mem.epoch());
        let mut from = 0;
        while from < payload.len() {
            if cur.0 as usize >= segs {
                return Err(PlaceError::Protection);
            }
            // SAFETY: without `checked`, the caller checked the descriptor
            // with its `segs` segments (scatter, scatter_at) under the
            // engine lock; cur.0 < segs.
            let s = unsafe { e.segment(checked, cur.0 as usize) };
            let room = s.len.saturating_sub(cur.1) as usize;
            if room == 0 {
                cur.0 += 1;
                cur.1 = 0;
                continue;
            }
            let n = room.min(payload.len() - from);
            let addr = s.addr as usize + cur.1 as usize;
            if checked.is_none() && self.mem.check(s.handle, addr, n, ptag).is_err() {
                return Err(PlaceError::Protection);
            }
            // SAFETY: [addr, addr + n) was just checked against the table;
            // from + n stays within the payload.
            unsafe { payload.copy_to(from, addr, n) }?;
            from += n;
            cur.1 += n as u32;
        }
        Ok(())
    }

    /// [`Context::scatter`] of `payload` as bytes `off..` of the message
    /// (an RDMA read response).
    pub(super) fn scatter_at(&self, e: &WqEntry, ptag: Ptag, off: u32, payload: Payload<'_>) -> Result<(), PlaceError> {
        // The segments as checked at post, while nothing was deregistered
        // since (nothing read from the descriptor); otherwise read from it
        // and checked again.
        let checked = e.checked_segments(self.mem.epoch());
        if checked.is_none() && !usermem::descriptor_registered(&self.mem, e.desc, e.desc_handle, e.segs as usize, ptag) {
            return Err(PlaceError::Protection);
        }
        // SAFETY: without `checked`, descriptor_registered just checked the
        // descriptor with its segments.
        let mut cur = unsafe { segment_cursor(e, checked, off) };
        self.scatter_registered(e, ptag, &mut cur, payload)
    }


    /// Breaks a reliable connection from our side: the peer is told.
    pub fn break_connection(&mut self, vi: &mut ViState) {
        if let Some(p) = vi.peer.clone() {
            self.queue_disconnect(vi, &p);
        }
        self.connection_lost(vi);
    }
}

/// The kinds a frame addressed to any endpoint (or broadcast) may be:
/// requests that any process may answer. Everything else must name our
/// endpoint and MAC.
fn for_anyone(kind: Kind) -> bool {
    matches!(kind, Kind::ConnRequest | Kind::PeerRequest | Kind::NameQuery)
}

/// The scatter cursor (segment, offset in it) for byte `off` of the data
/// segments of `e`, as [`WqEntry::segment`] gives them.
///
/// # Safety
/// As [`WqEntry::segment`]'s: without `checked`, the descriptor with its
/// segments was checked against the registration table under the engine
/// lock held since.
unsafe fn segment_cursor(e: &WqEntry, checked: Option<&[CheckedSegment]>, mut off: u32) -> (u16, u32) {
    for i in e.seg0 as usize..e.segs as usize {
        // SAFETY: the caller's promise; i < segs.
        let len = unsafe { e.segment(checked, i) }.len;
        if off < len {
            return (i as u16, off);
        }
        off -= len;
    }
    (e.segs, off)
}
