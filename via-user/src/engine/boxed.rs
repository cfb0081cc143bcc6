//! Boxed sends: a one-frame send to a process on this host's
//! shared-memory wire goes into its ring as a boxed message
//! (`via_device::boxed`: a 40-byte header and the payload) instead of a
//! sequenced frame, and completes when the receiver says that it placed
//! it: in the header of a boxed message it sends back, or in a word of
//! shared memory, read only when no reply said ([`SETTLE_AFTER_NS`]).
//!
//! What it leaves out is what a ring in memory does not need: no packet
//! sequence number, no ACK either way, no header template of 78 bytes,
//! no route looked up per frame. What it keeps is VIA's: a reliable
//! delivery send completes only once placed (a send that met no receive
//! is flushed when the receiver breaks the connection, as a frame's
//! would be); completions stay in posting order; a peer that stops
//! placing them is given up on by the retransmission timer as if frames
//! went unacknowledged.
//!
//! When: a connection whose frames to the peer go by the wire
//! ([`FrameDevice::box_route`]), at unreliable or reliable delivery
//! (reliable reception completes a send only once the receive completed,
//! which the ACK says), without receiver-not-ready mode (which refuses
//! with an ACK) or frame authentication (which tags frames), once the
//! peer was heard on the connection (a boxed message that reached it
//! before it knew itself connected would be dropped as stale, and none
//! is sent twice); a send that is the next to go, one frame long, with
//! nothing of the connection's framed stream unacknowledged ahead of it. Boxed messages and frames
//! share the ring, so the receiver meets them in the order sent. Frames
//! may follow boxed sends at once: their completions wait behind the
//! boxed ones ([`Context::settle_boxes`]).

use super::post::Queue;
use super::receive::{Payload, PlaceError};
use super::{Context, Core};
use crate::clock::Time;
use crate::descriptor::status;
use crate::usermem;
use crate::vi::{Reliability, ViPhase, ViState};
use via_device::{BoxRepr, BoxTemplate, BoxView, FrameDevice, PlacedWord};
use via_wire::seq_le;

/// How long boxed sends may be out before a round of progress reads
/// their placed words.
///
/// The word is read as rarely as the sends' completions allow, because
/// each read pulls its cache line from the receiver, which must take it
/// back to store its next count: in a 64 B ping-pong over the wire
/// (two processes, `via-pingpong`), reading it in every round of
/// progress and at every poll cost 8-10 % of the one-way time. So a
/// reply says in its header what was placed ([`BoxRepr::placed`]: a
/// ping-pong never reads the word); a poll for a completed send
/// (`VipSendDone`, `VipSendWait`, `VipCQDone`, and an armed
/// notification's look after each round) reads it from its second look
/// that finds none ([`Context::box_poll_looks`]); and rounds of progress
/// read it once this long after the first send went out, and this often
/// after, which bounds how late a completion shows to a program that
/// polls nothing (it watches the descriptor's status word).
pub(super) const SETTLE_AFTER_NS: u64 = 2_000;

impl Context {
    /// Fixes whether `vi`'s connection sends boxed (with its fragment
    /// size, [`Context::fix_frag`]): asks the device for a route to the
    /// peer its frames start with `head` for, and starts the count of
    /// what the peer placed.
    pub(super) fn fix_box_route(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState, head: &[u8]) {
        let eligible = self.auth.is_none() && !self.config.rnr && vi.attrs.reliability != Reliability::ReliableReception;
        vi.tx.boxes = if eligible { dev.box_route(head, vi.id) } else { None };
        // (`fix_frag` fixes a path only for a VI with a peer.)
        if let (Some(r), Some(peer)) = (&vi.tx.boxes, &vi.peer) {
            r.placed.set(peer.generation, 0);
            vi.tx.box_head = BoxTemplate::new(&BoxRepr { src_mac: self.mac, dst_vi: peer.vi, src_ep: self.ep, src_vi: vi.id, generation: peer.generation, ..BoxRepr::default() });
        }
    }

    /// Sends the entry at `vi`'s transmit position boxed, if it may go so
    /// (module comment; the caller checked that it is a send, not an RDMA
    /// operation): Some(true) when it went, Some(false) when the ring was
    /// full (it goes with the next doorbell), None when it must go as a
    /// frame.
    #[inline(never)]
    pub(super) fn send_boxed(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState, now: Option<Time>) -> Option<bool> {
        let route = vi.tx.boxes?;
        // Not before the peer is known to be connected (a boxed message
        // it took for stale would be lost: nothing is sent twice), nor
        // past framed data not yet acknowledged (which may go again).
        if !vi.tx.peer_heard || vi.tx.in_flight() != 0 || vi.tx.unacknowledged() != 0 || vi.tx.reads_outstanding != 0 || !self.one_message_ready(vi) {
            return None;
        }
        let idx = vi.tx.idx;
        let epoch = self.mem.epoch();
        let reliable = vi.reliable();
        let e = vi.sq.get_mut(idx);
        // One the wire would not lend, its segment checked at post.
        if e.len > route.max_len {
            return None;
        }
        let Some(&[seg]) = e.checked_segments(epoch) else { return None };
        let imm = (e.control & crate::descriptor::control::IMMEDIATE != 0).then_some(e.imm);
        // It carries the ACK of the peer's framed stream, as a frame would,
        // and what we placed of the peer's boxed sends (reliable ones
        // complete by it).
        let ack = reliable.then_some(vi.rx.expected);
        let placed = reliable.then_some(vi.rx.boxes_placed);
        let header = vi.tx.box_head.header(imm, e.len, ack, placed);
        // SAFETY: the segment was checked against the registration table
        // at post and nothing was deregistered since (its epoch stands);
        // the device copies it before the engine lock is released.
        let payload = unsafe { usermem::bytes(seg.addr as usize, e.len as usize) };
        match dev.transmit_boxed(&route, &header, payload) {
            Ok(true) => {}
            Ok(false) => {
                self.counters.tx_ring_full += 1;
                self.outbox.ring(vi.id);
                return Some(false);
            }
            Err(_) => {
                // The device gave the route but cannot carry it now: frames.
                vi.tx.boxes = None;
                return None;
            }
        }
        vi.tx.boxes_sent = vi.tx.boxes_sent.wrapping_add(1);
        e.boxed = true;
        e.msg_seq = vi.tx.boxes_sent;
        let len = e.len;
        vi.tx.idx = idx.wrapping_add(1);
        self.counters.tx_boxed += 1;
        if reliable {
            vi.acks.carried();
            let now = self.time(now);
            // What the peer said it placed completes now, after the send
            // is on its way (the receive path left it: `on_boxed`).
            self.settle_told(vi, Some(now));
            vi.tx.boxes_out += 1;
            self.box_polls = 0;
            if self.boxes_out == 0 {
                self.settle_at = now.after_nanos(SETTLE_AFTER_NS);
            }
            self.boxes_out += 1;
            // A peer that never places it is given up on as frames are.
            if let Some(t) = vi.rtx.on_sent(None, now) {
                self.arm(t);
            }
        } else {
            // Unreliable sends complete once they are on the wire.
            self.complete_next(vi, Queue::Send, len, 0, None);
        }
        Some(true)
    }

    /// Should a poll for a completed send that found none read the placed
    /// words of the boxed sends out? Not the first since the last boxed
    /// send went (an application that reaps right after it sends, as a
    /// ping-pong's server does, would pull the word's line from the
    /// receiver about to store it: [`SETTLE_AFTER_NS`]); every one after.
    #[inline]
    pub(super) fn box_poll_looks(&mut self) -> bool {
        self.box_polls = self.box_polls.saturating_add(1);
        self.box_polls > 1
    }

    /// Completes `vi`'s sends in order while they can: boxed ones the
    /// peer says it placed, framed ones acknowledged. A framed send
    /// after boxed ones waits for them (its ACK may come first).
    pub(super) fn settle_boxes(&mut self, vi: &mut ViState, now: Time) {
        let Some(route) = vi.tx.boxes else { return };
        vi.tx.placed_told = None; // the word says as much or more
        self.counters.placed_reads += 1;
        let Some(placed) = vi.peer.as_ref().and_then(|p| route.placed.placed(p.generation)) else { return };
        self.settle_boxes_upto(vi, placed, Some(now));
    }

    /// Completes `vi`'s sends the peer said it placed in the header of a
    /// boxed message ([`Sender::placed_told`](crate::vi::Sender)), if it said
    /// more than was settled: no shared word is read. The clock is read
    /// (when `now` is None) only if something stays outstanding.
    #[inline]
    pub(super) fn settle_told(&mut self, vi: &mut ViState, now: Option<Time>) {
        if let Some(n) = vi.tx.placed_told.take() {
            self.settle_boxes_upto(vi, n, now);
        }
    }

    /// [`Context::settle_boxes`] with the count the peer placed as it said
    /// it (in its placed word, or in the header of a boxed message).
    fn settle_boxes_upto(&mut self, vi: &mut ViState, placed: u32, now: Option<Time>) {
        let mut settled = false;
        while vi.tx.boxes_out != 0 && vi.sq.done != vi.sq.tail {
            let e = vi.sq.get(vi.sq.done);
            if !e.boxed {
                let before = vi.sq.done;
                self.complete_acked(vi);
                if vi.sq.done == before {
                    break;
                }
                continue;
            }
            if !seq_le(e.msg_seq, placed) {
                break;
            }
            let len = e.len;
            vi.tx.boxes_out -= 1;
            self.boxes_out = self.boxes_out.saturating_sub(1);
            self.complete_next(vi, Queue::Send, len, 0, None);
            settled = true;
        }
        if settled {
            // Framed sends that waited behind them, then the timer.
            self.complete_acked(vi);
            // The timer restarts from now if anything stays out, and
            // stops otherwise (no clock needed then).
            let outstanding = vi.tx.outstanding();
            let now = if outstanding { self.time(now) } else { now.unwrap_or_default() };
            self.restart_rto(vi, now, outstanding);
        }
    }

    /// Places a boxed message for `vi` (its connection checked): into the
    /// next receive, as a one-frame send is placed, and tells the sender
    /// in `placed`. A message that meets no receive breaks a reliable
    /// connection, and is dropped on an unreliable one.
    fn place_boxed(&mut self, vi: &mut ViState, h: &BoxView<'_>, placed: PlacedWord) {
        let payload = h.payload();
        let reliable = vi.reliable();
        if vi.rx.msg.is_some() {
            // Boxed messages go only behind acknowledged frames, so a
            // message being reassembled lost its end (unreliable).
            self.counters.rx_bad_offset += u64::from(reliable);
            vi.rx.msg = None;
        }
        if !self.has_receive(vi) {
            if reliable {
                // Not placed: the count does not cover it, so the sender
                // flushes it when the Disconnect comes.
                self.no_receive_breaks(vi);
            }
            return;
        }
        let len = payload.len() as u32;
        let mut bits = self.length_error(vi, len);
        if bits == 0 {
            let e = vi.rq.get(vi.rq.done);
            let payload = Payload::Inline(payload);
            let placed = self.copy_whole(e, payload).unwrap_or_else(|| self.scatter(e, vi.attrs.ptag, &mut (e.seg0, 0), payload));
            if let Err(PlaceError::Protection | PlaceError::SourceGone) = placed {
                bits = status::PROTECTION_ERROR;
            }
        }
        let done = if bits == status::LENGTH_ERROR { 0 } else { len };
        self.complete_next(vi, Queue::Recv, done, bits, h.imm());
        vi.rx.boxes_placed = vi.rx.boxes_placed.wrapping_add(1);
        if reliable {
            placed.set(h.generation(), vi.rx.boxes_placed);
        }
    }
}

impl Core {
    /// A boxed message from the device (`bytes`: its header and payload),
    /// whose receiver says in `placed` what it placed.
    #[inline(never)]
    pub(super) fn on_boxed(&mut self, bytes: &[u8], placed: PlacedWord, now: Time) {
        let Some(h) = BoxView::new_checked(bytes) else {
            self.cx.counters.rx_malformed += 1;
            return;
        };
        let Some((cx, vi)) = self.split(h.dst_vi()) else {
            self.cx.counters.rx_no_vi += 1;
            return;
        };
        let ours = vi.phase == ViPhase::Connected && vi.peer.as_ref().is_some_and(|p| h.is_from(p.mac, p.ep, p.vi, p.generation));
        if !ours {
            cx.counters.rx_stale += 1;
            return;
        }
        vi.tx.peer_heard = true;
        if vi.attrs.reliability == Reliability::ReliableReception {
            cx.counters.rx_malformed += 1; // never sent boxed
            return;
        }
        cx.counters.rx_boxed += 1;
        if let Some(ack) = h.ack().filter(|&a| a != vi.tx.una && vi.reliable()) {
            cx.on_ack(vi, ack, false, None, now);
        }
        // What it placed of ours is noted, and settled off this path, at
        // our next send, poll or flush (`Sender::placed_told`): the
        // message the application waits for is placed first.
        if let Some(n) = h.placed().filter(|_| vi.tx.boxes_out != 0) {
            vi.tx.placed_told = Some(n);
            cx.told_pending = true;
        }
        cx.place_boxed(vi, &h, placed);
    }

    /// A poll for a completed send of VI `id` found none while boxed sends
    /// are out: on a repeated poll, did the peer place them? The oldest
    /// completed send if so.
    #[inline(never)]
    pub(super) fn done_boxed(&mut self, id: u16) -> Option<usize> {
        let (cx, vi) = self.split(id)?;
        if vi.tx.placed_told.is_some() {
            // Said in a header already: no shared word to read.
            cx.settle_told(vi, None);
            if let Some(e) = vi.sq.pop_completed() {
                return Some(e.desc);
            }
        }
        if vi.tx.boxes_out == 0 || !cx.box_poll_looks() {
            return None;
        }
        let now = cx.clock.now();
        cx.settle_boxes(vi, now);
        vi.sq.pop_completed().map(|e| e.desc)
    }

    /// [`Context::settle_told`] for every VI (a CQ poll that found none).
    #[inline(never)]
    pub(super) fn settle_all_told(&mut self) {
        let Core { vis, cx } = self;
        cx.told_pending = false;
        for vi in vis.iter_mut().flatten().filter(|v| v.tx.placed_told.is_some()) {
            cx.settle_told(vi, None);
        }
    }

    /// [`Context::settle_boxes`] for every VI with boxed sends out; the
    /// count of those left is taken again (a flush drops a VI's own), and
    /// rounds of progress look again no sooner than [`SETTLE_AFTER_NS`].
    #[inline(never)]
    pub(super) fn settle_all_boxes(&mut self, now: Time) {
        let Core { vis, cx } = self;
        let mut left = 0;
        for vi in vis.iter_mut().flatten().filter(|v| v.tx.boxes_out != 0) {
            // What a header said first: the word is read only for sends
            // no reply has answered yet.
            cx.settle_told(vi, Some(now));
            if vi.tx.boxes_out != 0 {
                cx.settle_boxes(vi, now);
            }
            left += vi.tx.boxes_out;
        }
        cx.boxes_out = left;
        cx.settle_at = now.after_nanos(SETTLE_AFTER_NS);
    }
}
