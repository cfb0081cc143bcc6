//! The transmit side: turning rung send queues, owed ACKs and connection
//! management into batches of frames, handing each batch to the device with
//! one doorbell, and accounting for what the device accepted.
//!
//! Fragmentation is deterministic: fragment `k` of a message carries bytes
//! `[k * frag, (k + 1) * frag)` and PSN `first_psn + k`, so any PSN maps back
//! to a send-queue entry and offset, which is all go-back-N retransmission
//! and a partially accepted batch need ([`ViState::seek`]). `frag` is fixed
//! per connection, at its first send, from the device's path to the peer
//! (`FrameDevice::path_to`): larger to a process on this host that a
//! composite device reaches through shared memory, and then without a CRC.
//!
//! Frames whose payload is registered memory that stays put until the
//! peer has it (reliable sends and RDMA writes, RDMA read responses) are
//! marked lendable, so that a device between processes may lend it.

use super::post::Queue;
use super::{Context, Engine, BATCH};
use crate::vi::{ViPhase, ViState};
use crate::workqueue::WqEntry;
use via_kernel_agent::memory::{Ptag, RegistrationTable};
use crate::descriptor::control;
use crate::usermem;
use crate::clock::Time;
use via_kernel_agent::conn::{CmFrame, Peer};
use via_device::MAX_GATHER;
use via_kernel_agent::auth::Keyring;
use via_wire::tag::Key;
use via_kernel_agent::conn::RejectReason;
use via_wire::{flags, mark_authenticated, seal, seal_authenticated, seq_lt, Frame, HeaderRepr, HeaderTemplate, Kind, StreamRepr, FRAME_HEADER_LEN, TAG_LEN, VIA_HEADER_LEN};
use std::mem::MaybeUninit;
use via_device::{FrameDevice, TxFrame};

/// Where one built frame's payload lives: up to [`MAX_GATHER`] ranges of
/// registered (or engine-owned bounce) memory.
#[derive(Clone, Copy, Default)]
pub struct Spec {
    pieces: [(usize, usize); MAX_GATHER],
    n: usize,
    psn: u32,
    /// Read-response frames: payload bytes (the job advances by them once
    /// the device took the frame).
    resp: Option<u32>,
    /// The pieces may be lent ([`TxFrame::lendable`]).
    lendable: bool,
}

/// Room for one control frame's payload.
const CTL_PAYLOAD: usize = 192;

impl Engine {
    /// Transmits everything queued: control frames, data of rung VIs, ACKs.
    #[inline]
    pub(super) fn flush(&mut self, now: Time) {
        if self.core.nothing_queued() {
            return; // the common idle case: nothing to build
        }
        self.flush_queued(now);
    }

    /// Sends what VI `id` has to send, now, when nothing else is queued
    /// ahead of it (the common case after a post: the one VI, no error
    /// report that must precede its ACKs, no connection management); else
    /// rings its doorbell and flushes everything in order. The clock is
    /// read once the frame or boxed message is on its way (for the timer
    /// it arms), not before: a read is a counter read, ~10 ns in a VM,
    /// that the message would otherwise wait for.
    pub(super) fn transmit_now(&mut self, id: u16) {
        let Engine { dev, core, hdrs, specs, .. } = self;
        if core.nothing_queued() {
            if let Some((cx, vi)) = core.split(id) {
                cx.transmit_vi(dev.as_mut(), vi, hdrs, specs, None);
            }
            return;
        }
        let now = core.clock.now();
        core.outbox.ring(id);
        self.flush_queued(now);
    }

    fn flush_queued(&mut self, now: Time) {
        let Engine { dev, core, hdrs, specs, .. } = self;
        let specs: &mut [Spec; BATCH] = specs;

        // Error reports go first: they must reach the peer before any ACK
        // that covers the message they are about.
        while !core.outbox.reports().is_empty() {
            let take = core.outbox.reports().len().min(BATCH);
            for (i, h) in core.outbox.reports().iter().take(take).enumerate() {
                h.emit(&mut hdrs[i]);
                specs[i] = Spec::default();
            }
            let k = send_batch(dev.as_mut(), hdrs, core.sealer(), &specs[..take]);
            core.counters.tx_frames += k as u64;
            core.outbox.reports_sent(k);
            if k < take {
                core.counters.tx_ring_full += 1;
                break;
            }
        }

        // Peer-connection and name-service frames go out with the
        // connection manager's (rare: only moved when there are any).
        if !core.peers.outgoing().is_empty() {
            let frames = std::mem::take(core.peers.outgoing());
            core.cm.outgoing().extend(frames);
        }
        if !core.resolver.outgoing().is_empty() {
            let frames = std::mem::take(core.resolver.outgoing());
            core.cm.outgoing().extend(frames);
        }
        while !core.cm.outgoing().is_empty() {
            let n = core.build_control(hdrs, specs);
            let k = send_batch(dev.as_mut(), hdrs, core.sealer(), &specs[..n]);
            core.counters.tx_frames += k as u64;
            // Only what the device took leaves the queue: the rest go with
            // the next progress (a full ring, or a next hop still being
            // resolved). A lost answer is not always asked for again.
            core.cm.outgoing().drain(..k);
            if k < n {
                core.counters.tx_ring_full += 1;
                break;
            }
        }

        let mut ready = std::mem::take(&mut core.ready);
        core.outbox.take_rung(&mut ready);
        for &id in &ready {
            let Some((cx, vi)) = core.split(id) else { continue };
            cx.transmit_vi(dev.as_mut(), vi, hdrs, specs, Some(now));
        }
        core.ready = ready;

        if core.outbox.owes_acks() {
            let due = core.outbox.take_acks();
            for chunk in due.chunks(BATCH) {
                let mut n = 0;
                for &id in chunk {
                    let Some((cx, vi)) = core.split(id) else { continue };
                    if cx.build_ack(vi, &mut hdrs[n]) {
                        specs[n] = Spec::default();
                        n += 1;
                    }
                }
                let k = send_batch(dev.as_mut(), hdrs, core.sealer(), &specs[..n]);
                core.counters.tx_frames += k as u64;
                core.counters.acks_sent += k as u64;
                for (i, &id) in chunk.iter().enumerate().take(n) {
                    if i >= k {
                        core.outbox.owe_ack(id); // retry next round
                    }
                }
            }
            core.outbox.give_back(due);
        }
    }
}

/// The per-frame header fields of fragment `[off, off + len)` of the
/// posted message `e`, sent as `psn` carrying our ACK `ack` (the general
/// path's and the one-frame path's alike). On a reliable VI, the fragment
/// that `fills_window` asks for an ACK.
#[inline(always)]
fn fragment_fields(e: &WqEntry, reliable: bool, psn: u32, ack: u32, off: u32, len: u32, fills_window: bool) -> StreamRepr {
    let fl = fragment_flags(e, reliable, off, len, fills_window);
    let kind = match e.op() {
        control::OP_RDMAWRITE => Kind::RdmaWrite,
        control::OP_RDMAREAD => Kind::RdmaReadReq,
        control::OP_ATOMIC => Kind::AtomicReq,
        _ => Kind::Data,
    };
    StreamRepr {
        kind: kind as u8,
        flags: fl,
        psn,
        ack,
        msg_len: e.len,
        offset: off,
        imm: e.imm,
        rdma_addr: e.raddr,
        rdma_handle: e.rhandle,
        msg_seq: e.msg_seq,
        payload_len: if e.awaits_response() { request_payload_len(e) } else { via_wire::lent_payload_len(len as usize) },
    }
}

/// The flags of the fragment `[off, off + len)` of the posted message
/// `e` ([`fragment_fields`]).
#[inline(always)]
fn fragment_flags(e: &WqEntry, reliable: bool, off: u32, len: u32, fills_window: bool) -> u16 {
    let mut fl = if off == 0 { flags::FIRST } else { 0 };
    if e.awaits_response() || off + len == e.len {
        fl |= flags::LAST;
    }
    if e.control & control::IMMEDIATE != 0 {
        fl |= flags::IMMEDIATE;
    }
    if reliable {
        fl |= flags::ACK | flags::RELIABLE;
        if fills_window {
            fl |= flags::ACK_REQ;
        }
    }
    fl
}

/// The payload bytes of the request of `e`, an RDMA read (none) or an
/// atomic (its operands).
fn request_payload_len(e: &WqEntry) -> u16 {
    if e.is_atomic() { e.operands.len() as u16 } else { 0 }
}

/// Points `spec` at the payload of the request of `e` (an RDMA read's
/// has none; an atomic's is its operands, kept in the queue's entry,
/// which stays put, so it is not lent); returns its length.
fn request_payload(e: &WqEntry, spec: &mut Spec) -> u16 {
    let len = request_payload_len(e);
    spec.n = usize::from(len != 0);
    spec.pieces[0] = (e.operands.as_ptr() as usize, len as usize);
    spec.lendable = false;
    len
}

/// Header slots of one batch: Ethernet + VIA header of each frame.
pub type Headers = [[u8; FRAME_HEADER_LEN]; BATCH];

/// Fills `spec` with the pieces of `[off, off + len)` of the message
/// described by the descriptor at `desc`, copying into the bounce buffer
/// when it needs more than [`MAX_GATHER`] pieces (and then the frame may
/// not be lent: the bounce slot is reused by the next batch).
#[allow(clippy::too_many_arguments)]
fn gather(mem: &RegistrationTable, bounce_buf: &mut Vec<u8>, frag: usize, e: &WqEntry, ptag: Ptag, off: u32, len: u32, slot: usize, spec: &mut Spec, max_pieces: usize) -> bool {
    let segs = e.segs as usize;
    // The segments as checked at post, while nothing was deregistered
    // since; otherwise read from the descriptor and checked again.
    let checked = e.checked_segments(mem.epoch());
    if let Some(&[seg]) = checked {
        // One segment (the common case, and every fragment of a large
        // message from one buffer): the piece is where the offset says.
        if off as u64 + len as u64 > seg.len as u64 {
            return false;
        }
        spec.pieces[0] = (seg.addr as usize + off as usize, len as usize);
        spec.n = usize::from(len != 0);
        spec.resp = None;
        spec.lendable = true;
        return true;
    }
    if checked.is_none() && !usermem::descriptor_registered(mem, e.desc, e.desc_handle, segs, ptag) {
        return false; // its segment list was deregistered since posting
    }
    spec.n = 0;
    spec.resp = None;
    // Pieces go straight into `spec`; past MAX_GATHER they are copied
    // into this frame's bounce slot instead (rare: many tiny segments).
    let mut bounce: Option<(usize, usize)> = None; // (slot base, bytes copied)
    let mut skip = off as usize;
    let mut want = len as usize;
    for i in e.seg0 as usize..segs {
        if want == 0 {
            break;
        }
        // SAFETY: without `checked`, descriptor_registered checked the
        // descriptor with its `segs` segments above, under the engine
        // lock; i < segs.
        let s = unsafe { e.segment(checked, i) };
        let sl = s.len as usize;
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let take = (sl - skip).min(want);
        let addr = s.addr as usize + skip;
        if checked.is_none() && mem.check(s.handle, addr, take, ptag).is_err() {
            return false;
        }
        skip = 0;
        want -= take;
        if bounce.is_none() && spec.n == max_pieces {
            // Move what we have into the bounce slot and continue there.
            if bounce_buf.len() < frag * BATCH {
                *bounce_buf = vec![0u8; frag * BATCH];
            }
            let base = bounce_buf.as_mut_ptr() as usize + slot * frag;
            let mut at = 0;
            for &(a, l) in &spec.pieces[..spec.n] {
                // SAFETY: sources were checked; the slot holds `frag` >= len bytes.
                unsafe { std::ptr::copy_nonoverlapping(a as *const u8, (base + at) as *mut u8, l) };
                at += l;
            }
            bounce = Some((base, at));
        }
        match bounce.as_mut() {
            Some((base, at)) => {
                // SAFETY: source checked above; destination stays inside
                // this frame's bounce slot (total <= len <= frag).
                unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, (*base + *at) as *mut u8, take) };
                *at += take;
            }
            None => {
                spec.pieces[spec.n] = (addr, take);
                spec.n += 1;
            }
        }
    }
    if want != 0 {
        return false;
    }
    spec.lendable = bounce.is_none();
    if let Some((base, at)) = bounce {
        spec.pieces[0] = (base, at);
        spec.n = 1;
    }
    true
}

/// How the frames of a batch are sealed before they leave.
#[derive(Clone, Copy)]
pub(super) enum Sealer<'a> {
    /// The device vouches for what it delivers.
    Nothing,
    /// Each frame carries its CRC-32C (the device cannot vouch for it).
    Checksum,
    /// Each frame carries the MAC of its key: a VI's frames its
    /// connection's, connection management the cluster's.
    Mac(&'a Keyring),
}

impl Sealer<'_> {
    /// Payload pieces a frame may gather: one gather entry is the tag's
    /// when frames are authenticated.
    pub(super) fn max_pieces(self) -> usize {
        match self {
            Sealer::Mac(_) => MAX_GATHER - 1,
            _ => MAX_GATHER,
        }
    }
}

/// The key the frame whose headers are `h` is authenticated with: its
/// VI's connection key, or the cluster's for connection management (and
/// for the refusal of an unauthenticated request, which goes out plain:
/// `None`).
fn frame_key<'a>(keys: &'a Keyring, h: &[u8; FRAME_HEADER_LEN]) -> Option<&'a Key> {
    let f = Frame::of_headers(h);
    match f.kind() {
        Some(kind) if kind.is_connection_management() => {
            let plain_refusal = kind == Kind::ConnReject && f.imm() == RejectReason::Authentication as u32;
            (!plain_refusal).then_some(&keys.cm)
        }
        // A VI that lost its keys (it was torn down meanwhile) sends with
        // the cluster key: the peer refuses the frame, as it should.
        _ => Some(keys.vi(f.src_vi()).map_or(&keys.cm, |k| &k.tx)),
    }
}

/// Is all the memory of the posted descriptor `e` (its segment list and
/// its local data segments) still registered under `ptag`? Asked before
/// its first frame goes out.
fn message_registered(mem: &RegistrationTable, e: &WqEntry, ptag: Ptag) -> bool {
    let segs = e.segs as usize;
    if !usermem::descriptor_registered(mem, e.desc, e.desc_handle, segs, ptag) {
        return false;
    }
    (e.seg0 as usize..segs).all(|i| {
        // SAFETY: checked with its `segs` segments just above; i < segs.
        let s = unsafe { usermem::read_segment(e.desc, i) };
        s.length == 0 || mem.check(s.handle, s.data.address_bits as usize, s.length as usize, ptag).is_ok()
    })
}

/// The payload pieces of the built frame `s`, as bytes.
fn pieces_of(s: &Spec) -> impl Iterator<Item = &[u8]> + Clone {
    // SAFETY: every piece was checked against the registration table (or
    // lies in our own bounce buffer) when built, and the frame is
    // transmitted before the engine lock is released.
    s.pieces[..s.n].iter().map(|&(addr, len)| unsafe { usermem::bytes(addr, len) })
}

/// Hands the built frames `specs` (headers in `hdrs`) to the device with
/// one doorbell; returns how many it accepted. Each frame is sealed as
/// `sealer` says first. Only the frames in use are initialised: nothing is
/// allocated or cleared per batch.
fn send_batch(dev: &mut dyn FrameDevice, hdrs: &mut Headers, sealer: Sealer<'_>, specs: &[Spec]) -> usize {
    if specs.is_empty() {
        return 0;
    }
    // Tags are written only for the frames that get one (`tagged` bit i):
    // an unauthenticated batch clears nothing.
    const _: () = assert!(BATCH <= 64);
    let mut tags: [MaybeUninit<[u8; TAG_LEN]>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
    let mut tagged = 0u64;
    if let Sealer::Mac(keys) = sealer {
        seal_with_keys(keys, hdrs, specs, &mut tags, &mut tagged);
    } else if let Sealer::Checksum = sealer {
        for (s, h) in specs.iter().zip(hdrs.iter_mut()) {
            seal(h, pieces_of(s));
        }
    }
    let mut buf: [MaybeUninit<TxFrame<'_>>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
    for (i, (slot, (s, h))) in buf.iter_mut().zip(specs.iter().zip(hdrs.iter())).enumerate() {
        let h: &[u8] = h;
        let mut t = TxFrame::new(h);
        // A lent payload would leave the tag behind: authenticated frames
        // are copied.
        let has_tag = tagged & (1 << i) != 0;
        t.lendable = s.lendable && !has_tag;
        for p in pieces_of(s) {
            t.push(p);
        }
        if has_tag {
            // SAFETY: bit i of `tagged` is set only where tags[i] was written.
            let pushed = t.push(unsafe { tags[i].assume_init_ref() });
            debug_assert!(pushed, "gather leaves one piece for the tag");
        }
        slot.write(t);
    }
    // SAFETY: the first `specs.len()` (<= BATCH) entries were written above.
    let frames = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<TxFrame<'_>>(), specs.len()) };
    dev.transmit(frames).unwrap_or(0)
}

/// Seals the frames `specs` (headers in `hdrs`) with their keys' tags,
/// written into `tags` (bit i of `tagged` set for each): four frames alike
/// at a time where they can be ([`tag_four`]), else one by one (plain, with
/// the CRC, the refusal of an unauthenticated request).
#[inline(never)]
fn seal_with_keys(keys: &Keyring, hdrs: &mut Headers, specs: &[Spec], tags: &mut [MaybeUninit<[u8; TAG_LEN]>; BATCH], tagged: &mut u64) {
    let mut i = 0;
    while i < specs.len() {
        let s = &specs[i];
        match frame_key(keys, &hdrs[i]) {
            Some(key) => {
                if let Some(four) = tag_four(keys, key, hdrs, specs, i) {
                    for (j, t) in four.into_iter().enumerate() {
                        tags[i + j].write(t);
                    }
                    *tagged |= 0b1111 << i;
                    i += 4;
                    continue;
                }
                tags[i].write(seal_authenticated(&mut hdrs[i], key, pieces_of(s)));
                *tagged |= 1 << i;
            }
            None => seal(&mut hdrs[i], pieces_of(s)),
        }
        i += 1;
    }
}

/// Marks frames `i..i + 4` of the batch authenticated and returns their
/// tags under `key`, computed together (`via_wire::tag::frame_tags4`),
/// when they can be: four frames under that one key, each payload in one
/// piece (or none), all of one length (a message's fragments). On `None`
/// each is tagged alone (its header may be marked already, as it would
/// be then).
fn tag_four(keys: &Keyring, key: &Key, hdrs: &mut Headers, specs: &[Spec], i: usize) -> Option<[[u8; TAG_LEN]; 4]> {
    if !via_wire::tag::lanes::lanes_available() {
        return None; // (not even the three keys' lookups)
    }
    let four = specs.get(i..i + 4)?;
    fn payload(s: &Spec) -> Option<&[u8]> {
        match s.n {
            0 => Some(&[]),
            1 => pieces_of(s).next(),
            _ => None,
        }
    }
    let len = payload(&four[0])?.len();
    if len >= via_wire::tag::WIDE_FROM {
        return None;
    }
    for (j, s) in four.iter().enumerate().skip(1) {
        if payload(s)?.len() != len || !std::ptr::eq(frame_key(keys, &hdrs[i + j])?, key) {
            return None;
        }
    }
    for h in &mut hdrs[i..i + 4] {
        mark_authenticated(h);
    }
    let heads: [&[u8]; 4] = std::array::from_fn(|j| &hdrs[i + j][..]);
    let payloads: [&[u8]; 4] = std::array::from_fn(|j| payload(&four[j]).expect("checked above"));
    via_wire::tag::frame_tags4(key, heads, payloads)
}

/// [`send_batch`] of one frame whose payload is one piece of registered
/// memory (`payload`, possibly empty): the one-frame path's send, without
/// the batch's arrays. True when the device took it. An authenticated
/// frame (its tag is one more piece) goes through [`send_batch`].
#[inline(always)]
fn send_one(dev: &mut dyn FrameDevice, hdrs: &mut Headers, sealer: Sealer<'_>, specs: &mut [Spec; BATCH], payload: &[u8], lendable: bool) -> bool {
    let h = &mut hdrs[0];
    match sealer {
        Sealer::Mac(_) => {
            let spec = &mut specs[0];
            spec.pieces[0] = (payload.as_ptr() as usize, payload.len());
            spec.n = usize::from(!payload.is_empty());
            spec.psn = 0;
            spec.resp = None;
            spec.lendable = lendable;
            return send_batch(dev, hdrs, sealer, &specs[..1]) == 1;
        }
        Sealer::Checksum => seal(h, [payload]),
        Sealer::Nothing => {}
    }
    let mut t = TxFrame::new(&h[..]);
    t.lendable = lendable;
    if !payload.is_empty() {
        t.push(payload);
    }
    dev.transmit(std::slice::from_ref(&t)).unwrap_or(0) == 1
}

impl Context {
    /// Is the outbox empty: no doorbell rung, no error report, ACK,
    /// connection-management, peer-connection or name-service frame?
    pub(super) fn nothing_queued(&mut self) -> bool {
        self.outbox.is_empty() && self.cm.outgoing().is_empty() && self.peers.outgoing().is_empty() && self.resolver.outgoing().is_empty()
    }

    /// How this engine's frames are sealed.
    pub(super) fn sealer(&self) -> Sealer<'_> {
        self.sealer_with(self.checksum)
    }

    /// How `vi`'s data frames are sealed: no CRC on a path that cannot
    /// corrupt them ([`Context::fix_frag`]).
    fn sealer_for(&self, vi: &ViState) -> Sealer<'_> {
        self.sealer_with(vi.tx.checksum)
    }

    fn sealer_with(&self, checksum: bool) -> Sealer<'_> {
        match (&self.auth, checksum) {
            (Some(keys), _) => Sealer::Mac(keys),
            (None, true) => Sealer::Checksum,
            (None, false) => Sealer::Nothing,
        }
    }

    /// Sends what `vi` has to send: responses to the peer's RDMA reads,
    /// the holes selective repeat found, then its send queue from the
    /// transmit position while the window is open. Rings its doorbell
    /// again when the device took less than offered.
    /// (`now`: the time if the caller read it, else None: read when first
    /// needed, after the device took what went, [`Context::time`].)
    #[inline(always)]
    fn transmit_vi(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH], now: Option<Time>) {
        if vi.tx.frag == 0 {
            self.fix_frag(dev, vi);
        }
        // A send (not an RDMA operation) to a process on this host's wire
        // may go boxed: then it went, or goes so with the next doorbell.
        if vi.tx.boxes.is_some() && vi.sq.get(vi.tx.idx).seg0 == 0 && self.send_boxed(dev, vi, now).is_some() {
            return;
        }
        if self.send_one_frame(dev, vi, hdrs, specs, now) {
            return;
        }
        self.transmit_batches(dev, vi, hdrs, specs, now);
    }

    /// [`Context::transmit_vi`] past the one-frame path: everything in
    /// batches, in order.
    fn transmit_batches(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH], now: Option<Time>) {
        let now = self.time(now);
        while has_side_work(vi) {
            let n = self.build_side(vi, hdrs, specs);
            if n == 0 {
                break;
            }
            let k = send_batch(dev, hdrs, self.sealer_for(vi), &specs[..n]);
            self.after_side(vi, specs, n, k);
            if k < n {
                self.outbox.ring(vi.id);
                break;
            }
        }
        self.resend_holes(dev, vi, hdrs, specs, now);
        // Nothing posted past the transmit position (a flush for read
        // responses or ACKs alone): no batch to build.
        while vi.tx.idx != vi.sq.tail {
            let n = self.build_data(vi, hdrs, specs, BATCH);
            if n == 0 {
                break;
            }
            let k = send_batch(dev, hdrs, self.sealer_for(vi), &specs[..n]);
            self.after_transmit(vi, specs, n, k, now);
            if k < n {
                self.outbox.ring(vi.id);
                break;
            }
            if n < BATCH {
                break; // the queue ran dry or the window closed: nothing more now
            }
        }
    }

    /// The one-frame path, for the common case: the send queue holds one
    /// message not yet started, a send or RDMA write that fits in one
    /// frame, its segment checked at post; nothing is to be resent or
    /// answered first and the window is open. Its frame is built from the
    /// connection's header template and sent without the general path's
    /// fragment and batch bookkeeping (what it would do, it does: the same
    /// frame, PSN, message number, ACK and timer). False when the general
    /// path must send.
    #[inline(always)]
    fn send_one_frame(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH], now: Option<Time>) -> bool {
        let idx = vi.tx.idx;
        let reliable = vi.reliable();
        if !self.one_message_ready(vi) {
            return false;
        }
        let epoch = self.mem.epoch();
        let e = vi.sq.get_mut(idx);
        let Some(&[seg]) = e.checked_segments(epoch) else { return false };
        let psn = vi.tx.psn;
        e.first_psn = psn;
        e.nframes = 1;
        e.msg_seq = vi.tx.next_msg_seq;
        vi.tx.next_msg_seq = vi.tx.next_msg_seq.wrapping_add(1);
        // The window has room past this frame (checked above): no ACK_REQ.
        fragment_fields(e, reliable, psn, vi.rx.expected, 0, e.len, false).emit(&vi.tx.head, &mut hdrs[0]);
        // SAFETY: the segment was checked against the registration table
        // at post and nothing was deregistered since (its epoch stands);
        // the frame is handed over before the engine lock is released.
        let payload = unsafe { usermem::bytes(seg.addr as usize, e.len as usize) };
        if !send_one(dev, hdrs, self.sealer_for(vi), specs, payload, reliable) {
            // The position stays: the next doorbell sends it.
            self.counters.tx_ring_full += 1;
            self.outbox.ring(vi.id);
            return true;
        }
        self.counters.tx_frames += 1;
        vi.tx.psn = psn.wrapping_add(1);
        vi.tx.sent_hi = vi.tx.psn;
        vi.tx.idx = idx.wrapping_add(1);
        if reliable {
            vi.acks.carried();
            let now = self.time(now);
            if let Some(t) = vi.rtx.on_sent(Some(psn), now) {
                self.arm(t);
            }
        } else {
            // Unreliable sends complete once they are on the wire.
            while vi.sq.done != vi.tx.idx {
                let len = vi.sq.get(vi.sq.done).len;
                self.complete_next(vi, Queue::Send, len, 0, None);
            }
        }
        true
    }

    /// `now` where the caller read it, else the clock, read now.
    #[inline(always)]
    pub(super) fn time(&mut self, now: Option<Time>) -> Time {
        match now {
            Some(t) => t,
            None => self.clock.now(),
        }
    }

    /// Is the next send of `vi` one whole message for the one-frame path
    /// (or a boxed one): the only one not yet started, nothing to resend
    /// or answer first, the window open; not started, no error found at
    /// post, no response awaited, one fragment long, not held by a fence.
    /// (A descriptor that passed validation is a send, an RDMA write, an
    /// RDMA read or an atomic; the last two take the general path.)
    #[inline(always)]
    pub(super) fn one_message_ready(&self, vi: &ViState) -> bool {
        let idx = vi.tx.idx;
        if vi.phase != ViPhase::Connected
            || vi.tx.frag == 0
            || idx.wrapping_add(1) != vi.sq.tail
            || vi.tx.off != 0
            || vi.tx.psn != vi.tx.sent_hi
            || has_side_work(vi)
            || vi.sack.pending()
            || vi.tx.rnr_until.is_some()
            || (vi.reliable() && vi.tx.in_flight() + 1 >= self.window)
        {
            return false;
        }
        let e = vi.sq.get(idx);
        !(e.pre_status != 0 || e.awaits_response() || e.nframes != 0 || e.len > vi.tx.frag || (e.control & control::QFENCE != 0 && vi.tx.reads_outstanding != 0))
    }

    /// Fixes `vi`'s path for its connection, if not yet done (asked with
    /// the start of a frame to the peer: destination and endpoint): the
    /// fragment size, the payload the device carries to the peer (at most
    /// what the header's 16-bit payload length can say), and whether its
    /// frames need a CRC (not over shared memory, which cannot corrupt).
    fn fix_frag(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState) {
        let (mac, ep, core_frag, id) = (self.mac, self.ep, self.frag, vi.id);
        let tag = if self.auth.is_some() { TAG_LEN } else { 0 };
        let Some(peer) = vi.peer.as_ref().filter(|_| vi.tx.frag == 0) else { return };
        let conn = HeaderRepr { dst_mac: peer.mac, src_mac: mac, kind: Kind::Data as u8, dst_ep: peer.ep, src_ep: ep, dst_vi: peer.vi, src_vi: id, generation: peer.generation, ..HeaderRepr::default() };
        let mut head = [0u8; FRAME_HEADER_LEN];
        conn.emit(&mut head);
        let path = dev.path_to(&head);
        vi.tx.head = HeaderTemplate::new(&conn);
        // The path's MTU, below the device's too: a composite's is its
        // smallest NIC's, and the shared-memory wire's slots may be smaller
        // than a NIC's frames (veth at 65,535 bytes against 65,472), which
        // the wire would refuse for good; and at most what the peer said
        // its device takes (0: it did not say), unless the path's MTU
        // holds at both ends (the wire). The device's if the path says 0.
        let peer_mtu = peer.attrs.mtu as usize;
        let mtu = if path.both_ends || peer_mtu == 0 { path.mtu } else { path.mtu.min(peer_mtu) };
        let from_path = mtu.saturating_sub(VIA_HEADER_LEN + tag) as u32;
        vi.tx.frag = if from_path == 0 { core_frag } else { from_path }.min(u16::MAX as u32);
        vi.tx.checksum = self.checksum && !path.checksummed;
        // Whole messages lent where the path lends (never with a tag or
        // a CRC, which would have to follow a payload that is not sent).
        vi.tx.lends_from = path.lends_from.filter(|_| tag == 0 && !vi.tx.checksum).map(|n| n.min(u32::MAX as usize) as u32);
        self.fix_box_route(dev, vi, &head);
    }

    /// Transmits again, one frame each, the holes selective repeat found
    /// (`resend`), then returns the transmit position to where it was.
    fn resend_holes(&mut self, dev: &mut dyn FrameDevice, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH], now: Time) {
        loop {
            if vi.phase != ViPhase::Connected {
                return;
            }
            // A run of holes goes in one batch, as the frames went the
            // first time (a device may carry the run as one datagram, and
            // one by one each would risk the loss that took them).
            let Some((bit, len)) = vi.sack.next_run(BATCH as u32) else { return };
            let psn = vi.tx.una.wrapping_add(bit);
            if !seq_lt(psn, vi.tx.sent_hi) {
                continue;
            }
            let len = len.min(vi.tx.sent_hi.wrapping_sub(psn));
            let resume = vi.tx.psn;
            vi.seek(psn);
            let n = self.build_data(vi, hdrs, specs, len as usize);
            let k = send_batch(dev, hdrs, self.sealer_for(vi), &specs[..n]);
            self.after_transmit(vi, specs, n, k, now);
            vi.seek(resume);
            if k < len as usize {
                // Not now (a fence, a full ring): the next doorbell or
                // timeout sends the rest.
                vi.sack.put_back_run(bit + k as u32, len - k as u32);
                if k < n {
                    self.outbox.ring(vi.id);
                }
                return;
            }
        }
    }

    /// Builds up to `limit` (at most [`BATCH`]) data fragments of `vi`
    /// from its transmit position; returns how many.
    fn build_data(&mut self, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH], limit: usize) -> usize {
        let mut refused = false;
        let n = self.build_data_frames(vi, hdrs, specs, limit, &mut refused);
        if refused {
            self.complete_pre_errored(vi, Queue::Send); // in order, when at the head
        }
        n
    }

    /// [`Context::build_data`]'s frames. A descriptor whose memory was
    /// deregistered since it was posted is marked, before any of it is
    /// sent, to complete with a protection error (`refused` set); the ones
    /// after it go on.
    fn build_data_frames(&mut self, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH], limit: usize, refused: &mut bool) -> usize {
        let max_pieces = self.sealer().max_pieces();
        let Context { mem, bounce, window, pre_errored, .. } = self;
        // After a timeout only a burst goes before the peer answers.
        let window = vi.tx.burst_end.map_or(*window, |end| (*window).min(end.wrapping_sub(vi.tx.una)));
        if vi.phase != ViPhase::Connected || vi.peer.is_none() || vi.tx.rnr_until.is_some() {
            return 0; // (receiver not ready: data waits out the back-off)
        }
        let frag = vi.tx.frag;
        let reliable = vi.reliable();
        let ptag = vi.attrs.ptag;
        let mut n = 0;
        while n < limit && vi.tx.idx != vi.sq.tail {
            if reliable && vi.tx.in_flight() >= window {
                break;
            }
            let en = vi.sq.get_mut(vi.tx.idx);
            if en.pre_status != 0 {
                vi.tx.idx = vi.tx.idx.wrapping_add(1);
                vi.tx.off = 0;
                continue;
            }
            let (fenced, is_read) = (en.control & control::QFENCE != 0, en.awaits_response());
            if fenced && vi.tx.off == 0 && reads_pending(vi) {
                break; // QFENCE: wait until the earlier RDMA reads complete
            }
            let en = vi.sq.get_mut(vi.tx.idx);
            if en.nframes == 0 && en.checked_segments(mem.epoch()).is_none() && !message_registered(mem, en, ptag) {
                en.pre_status = crate::descriptor::status::PROTECTION_ERROR;
                *pre_errored += 1;
                *refused = true;
                vi.tx.idx = vi.tx.idx.wrapping_add(1);
                vi.tx.off = 0;
                continue;
            }
            if en.nframes == 0 {
                en.first_psn = vi.tx.psn;
                // A message the path lends goes whole, as one frame, if
                // its segments were checked at post (so its pieces are
                // few and never copied to a bounce slot: `gather`).
                en.lent_whole = reliable && !is_read && vi.tx.lends_from.is_some_and(|from| en.len >= from && en.len > frag) && en.checked_segments(mem.epoch()).is_some();
                en.nframes = if is_read || en.lent_whole { 1 } else { en.len.div_ceil(frag).max(1) };
                en.msg_seq = vi.tx.next_msg_seq;
                vi.tx.next_msg_seq = vi.tx.next_msg_seq.wrapping_add(1);
                if is_read {
                    vi.tx.reads_outstanding += 1;
                }
            }
            let e: &WqEntry = en;
            let frag = if e.lent_whole { e.len } else { frag };
            debug_assert_eq!(e.first_psn.wrapping_add(vi.tx.off / frag), vi.tx.psn);
            let off = vi.tx.off;
            let len = if is_read { 0 } else { frag.min(e.len - off) };
            let fills_window = vi.tx.in_flight() + 1 == window;
            if off != 0 && n > 0 {
                // The previous frame of this batch is this message's
                // previous fragment: its headers, the per-fragment fields
                // written again (the ACK is the batch's).
                hdrs[n] = hdrs[n - 1];
                via_wire::next_fragment(&mut hdrs[n], fragment_flags(e, reliable, off, len, fills_window), vi.tx.psn, off, via_wire::lent_payload_len(len as usize));
            } else {
                fragment_fields(e, reliable, vi.tx.psn, vi.rx.expected, off, len, fills_window).emit(&vi.tx.head, &mut hdrs[n]);
            }
            specs[n].resp = None;
            if is_read {
                request_payload(e, &mut specs[n]);
            } else if !gather(mem, bounce, frag as usize, e, ptag, off, len, n, &mut specs[n], max_pieces) {
                // The memory went away under a descriptor part of which the
                // peer already has: its message cannot be finished.
                self.break_connection(vi);
                return 0;
            }
            specs[n].lendable &= reliable;
            specs[n].psn = vi.tx.psn;
            vi.tx.psn = vi.tx.psn.wrapping_add(1);
            vi.tx.off += len;
            if is_read || vi.tx.off >= e.len {
                vi.tx.idx = vi.tx.idx.wrapping_add(1);
                vi.tx.off = 0;
            }
            n += 1;
        }
        n
    }

    /// Accounts for a batch of `n` fragments of `vi` of which the device
    /// accepted the first `k`.
    fn after_transmit(&mut self, vi: &mut ViState, specs: &[Spec; BATCH], n: usize, k: usize, now: Time) {
        self.counters.tx_frames += k as u64;
        let retrans = specs[..k].iter().filter(|s| seq_lt(s.psn, vi.tx.sent_hi)).count();
        // The first new frame, to be timed (never one sent before: Karn).
        let first_new = specs[..k].iter().find(|s| !seq_lt(s.psn, vi.tx.sent_hi)).map(|s| s.psn);
        if k > 0 {
            let last = specs[k - 1].psn.wrapping_add(1);
            if seq_lt(vi.tx.sent_hi, last) {
                vi.tx.sent_hi = last;
            }
        }
        if k < n {
            self.counters.tx_ring_full += 1;
            vi.seek(specs[k].psn);
        }
        self.counters.retransmits += retrans as u64;
        if k == 0 {
            return;
        }
        // The frames carried our ACK.
        if vi.reliable() {
            vi.acks.carried();
            if let Some(t) = vi.rtx.on_sent(first_new, now) {
                self.arm(t);
            }
        } else {
            // Unreliable sends complete once they are on the wire.
            while vi.sq.done != vi.tx.idx && vi.sq.done != vi.sq.tail {
                let len = vi.sq.get(vi.sq.done).len;
                self.complete_next(vi, Queue::Send, len, 0, None);
            }
        }
    }

    /// Writes a standalone ACK (or NAK) for `vi` into `hdr`;
    /// false when nothing is owed.
    fn build_ack(&mut self, vi: &mut ViState, hdr: &mut [u8; FRAME_HEADER_LEN]) -> bool {
        let (mac, ep, id) = (self.mac, self.ep, vi.id);
        if vi.phase != crate::vi::ViPhase::Connected || !(vi.acks.owed() || vi.rx.rnr_owed) {
            return false;
        }
        let Some(peer) = vi.peer.as_ref() else { return false };
        let nak = vi.acks.nak_owed();
        let mut fl = flags::ACK | flags::RELIABLE;
        if nak {
            fl |= flags::ACK_REQ;
        }
        if std::mem::take(&mut vi.rx.rnr_owed) {
            fl |= flags::RNR;
        }
        let mut h = ack_header(mac, ep, id, peer, vi.tx.psn, vi.rx.expected, fl);
        // Selective acknowledgement: the frames held past the gap.
        h.rdma_addr = vi.rx.reorder.bitmap(vi.rx.expected);
        if vi.acks.sent(vi.rx.expected) {
            self.counters.naks_sent += 1;
        }
        h.emit(hdr);
        true
    }

    /// Builds the first [`BATCH`] (at most) queued control frames into
    /// header slots; they stay queued until the device takes them.
    fn build_control(&mut self, hdrs: &mut Headers, specs: &mut [Spec; BATCH]) -> usize {
        if self.bounce.len() < BATCH * CTL_PAYLOAD.max(self.frag as usize) {
            self.bounce = vec![0u8; BATCH * CTL_PAYLOAD.max(self.frag as usize)];
        }
        let take = self.cm.outgoing().len().min(BATCH);
        let frames: Vec<CmFrame> = self.cm.outgoing()[..take].to_vec();
        for (i, f) in frames.iter().enumerate() {
            let at = i * CTL_PAYLOAD;
            let n = f.conn.emit(&mut self.bounce[at..at + CTL_PAYLOAD]);
            let h = HeaderRepr {
                dst_mac: f.dst_mac,
                src_mac: self.mac,
                kind: f.kind as u8,
                dst_ep: f.dst_ep,
                src_ep: self.ep,
                dst_vi: f.dst_vi,
                src_vi: f.src_vi,
                generation: f.generation,
                imm: f.imm,
                flags: if f.ack.is_some() { flags::ACK } else { 0 },
                ack: f.ack.unwrap_or(0),
                payload_len: n as u16,
                ..HeaderRepr::default()
            };
            h.emit(&mut hdrs[i]);
            specs[i] = Spec { n: 1, ..Spec::default() };
            specs[i].pieces[0] = (self.bounce.as_ptr() as usize + at, n);
        }
        take
    }
}

/// The header of a standalone `Ack` frame from our VI `id` to `peer`.
fn ack_header(mac: via_wire::MacAddr, ep: u32, id: u16, peer: &Peer, psn: u32, ack: u32, flags: u16) -> HeaderRepr {
    HeaderRepr {
        dst_mac: peer.mac,
        src_mac: mac,
        kind: Kind::Ack as u8,
        flags,
        dst_ep: peer.ep,
        src_ep: ep,
        dst_vi: peer.vi,
        src_vi: id,
        generation: peer.generation,
        psn,
        ack,
        ..HeaderRepr::default()
    }
}

/// Does the send queue hold an RDMA read, before the transmit position,
/// that has not completed? (What a QFENCE descriptor waits for.)
fn reads_pending(vi: &crate::vi::ViState) -> bool {
    if vi.tx.reads_outstanding == 0 {
        return false;
    }
    let mut idx = vi.sq.done;
    while idx != vi.tx.idx {
        let e = vi.sq.get(idx);
        if e.awaits_response() && e.nframes != 0 && !e.read_done && e.remote_status == 0 {
            return true;
        }
        idx = idx.wrapping_add(1);
    }
    false
}

/// Does `vi` have frames to send outside its sequenced stream?
#[inline]
fn has_side_work(vi: &ViState) -> bool {
    !vi.served.jobs.is_empty() || vi.tx.read_resume
}

impl Context {
    /// Builds up to [`BATCH`] frames of `vi` outside its sequenced
    /// stream: responses to the peer's RDMA reads, and requests for the
    /// rest of our stalled reads. Returns how many.
    fn build_side(&mut self, vi: &mut ViState, hdrs: &mut Headers, specs: &mut [Spec; BATCH]) -> usize {
        let Context { mem, mac, ep, .. } = self;
        let (mac, ep, id) = (*mac, *ep, vi.id);
        if !has_side_work(vi) {
            return 0; // the usual case: no RDMA read traffic
        }
        let frag = vi.tx.frag;
        let Some(peer) = vi.peer.as_ref().filter(|_| vi.phase == ViPhase::Connected) else { return 0 };
        let base = HeaderRepr {
            dst_mac: peer.mac,
            src_mac: mac,
            dst_ep: peer.ep,
            src_ep: ep,
            dst_vi: peer.vi,
            src_vi: id,
            generation: peer.generation,
            ack: vi.rx.expected,
            ..HeaderRepr::default()
        };
        let ptag = vi.attrs.ptag;
        let mut n = 0;
        // Responses, front job first; `off` runs ahead of the jobs, which
        // advance only by what the device takes (after_side).
        let mut j = 0;
        let mut off = vi.served.jobs.front().map_or(0, |job| job.off);
        while n < BATCH && j < vi.served.jobs.len() {
            let job = vi.served.jobs[j];
            // The rest of a response goes whole where the path lends it.
            let rest = job.len - off;
            let len = if vi.tx.lends_from.is_some_and(|from| rest >= from) { rest } else { frag.min(rest) };
            let mut fl = flags::RELIABLE | flags::ACK;
            if off == 0 {
                fl |= flags::FIRST;
            }
            if off + len == job.len {
                fl |= flags::LAST;
            }
            if let Some(value) = vi.served.jobs[j].value.as_ref() {
                // An atomic's answer: the value it found, kept in the job.
                let fl = flags::RELIABLE | flags::ACK | flags::FIRST | flags::LAST;
                HeaderRepr { kind: Kind::AtomicResp as u8, flags: fl, psn: job.psn, msg_len: job.len, msg_seq: job.msg_seq, payload_len: value.len() as u16, ..base }.emit(&mut hdrs[n]);
                specs[n] = Spec { n: 1, resp: Some(job.len), lendable: false, ..Spec::default() };
                specs[n].pieces[0] = (value.as_ptr() as usize, value.len());
                n += 1;
                j += 1;
                off = vi.served.jobs.get(j).map_or(0, |x| x.off);
                continue;
            }
            let addr = job.addr + off as usize;
            if len > 0 && mem.check(job.handle, addr, len as usize, ptag).is_err() {
                // Deregistered since the request: nothing more of it is sent
                // (the requester's read times out).
                vi.served.jobs.remove(j);
                off = vi.served.jobs.get(j).map_or(0, |x| x.off);
                continue;
            }
            HeaderRepr { kind: Kind::RdmaReadResp as u8, flags: fl, psn: job.psn, msg_len: job.len, offset: off, msg_seq: job.msg_seq, payload_len: via_wire::lent_payload_len(len as usize), ..base }.emit(&mut hdrs[n]);
            specs[n] = Spec { n: usize::from(len > 0), resp: Some(len), lendable: true, ..Spec::default() };
            specs[n].pieces[0] = (addr, len as usize);
            n += 1;
            off += len;
            if off == job.len {
                j += 1;
                off = vi.served.jobs.get(j).map_or(0, |x| x.off);
            }
        }
        // Stalled reads whose request was acknowledged: ask for the rest.
        if vi.tx.read_resume {
            vi.tx.read_resume = false;
            let mut idx = vi.sq.done;
            while idx != vi.tx.idx && n < BATCH {
                let e = vi.sq.get(idx);
                idx = idx.wrapping_add(1);
                if !e.awaits_response() || e.nframes == 0 || e.read_done || e.remote_status != 0 || !seq_lt(e.first_psn, vi.tx.una) {
                    continue;
                }
                let fl = flags::RELIABLE | flags::ACK | flags::FIRST | flags::LAST;
                // An atomic is asked again with its operands: the target
                // answers from what the atomic gave, never running it twice.
                let kind = if e.is_atomic() { Kind::AtomicReq } else { Kind::RdmaReadReq };
                specs[n] = Spec::default();
                let payload_len = request_payload(e, &mut specs[n]);
                HeaderRepr { kind: kind as u8, flags: fl, psn: e.first_psn, msg_len: e.len, offset: e.got, imm: e.imm, rdma_addr: e.raddr, rdma_handle: e.rhandle, msg_seq: e.msg_seq, payload_len, ..base }.emit(&mut hdrs[n]);
                n += 1;
            }
        }
        n
    }

    /// Accounts for `n` side frames of VI `id` of which the device took `k`.
    fn after_side(&mut self, vi: &mut ViState, specs: &[Spec; BATCH], n: usize, k: usize) {
        self.counters.tx_frames += k as u64;
        if k > 0 && vi.reliable() {
            // They carried our ACK (build_side): none is owed on its own.
            vi.acks.carried();
        }
        for s in &specs[..k] {
            let Some(len) = s.resp else { continue };
            if let Some(job) = vi.served.jobs.front_mut() {
                job.off += len;
                if job.off >= job.len {
                    vi.served.jobs.pop_front();
                }
            }
        }
        if specs[k..n].iter().any(|s| s.resp.is_none()) {
            vi.tx.read_resume = true; // a resume request was refused: again next round
        }
    }

}

/// Disconnect frames sent for one `VipDisconnect`. The Disconnect is the
/// last frame the peer hears from us: nothing acknowledges or repeats it,
/// and a peer with nothing outstanding has no timer that would find the
/// connection gone, so a lost one left the peer's VI connected for good
/// (and its last send, the one our Disconnect acknowledges, pending until
/// its retry limit: two minutes under MTTL). Copies after the first are
/// taken by the peer as frames for a VI no longer connected (`rx_stale`).
/// Under 1 % independent loss all three are lost once in a million.
const DISCONNECT_COPIES: usize = 3;

impl Context {
    /// Queues the Disconnect frames to `peer` on behalf of `vi`
    /// ([`DISCONNECT_COPIES`] of them); on a reliable VI each acknowledges
    /// everything received.
    pub(super) fn queue_disconnect(&mut self, vi: &ViState, peer: &Peer) {
        let ack = vi.reliable().then_some(vi.rx.expected);
        for _ in 0..DISCONNECT_COPIES {
            self.cm.outgoing().push(CmFrame {
                ack,
                dst_mac: peer.mac,
                dst_ep: peer.ep,
                kind: Kind::Disconnect,
                dst_vi: peer.vi,
                src_vi: vi.id,
                generation: peer.generation,
                imm: 0,
                conn: Default::default(),
            });
        }
    }

    /// Queues an error report to `vi`'s peer: message `msg_seq` failed
    /// here with `bits`; everything before PSN `ack` is acknowledged.
    /// `fatal`: we are breaking the connection over it.
    pub(super) fn queue_report(&mut self, vi: &ViState, ack: u32, msg_seq: u32, bits: u32, fatal: bool) {
        let Some(peer) = vi.peer.as_ref() else { return };
        let mut fl = flags::ACK | flags::RELIABLE | flags::ERROR;
        if fatal {
            fl |= flags::FATAL;
        }
        let h = HeaderRepr { imm: bits, msg_seq, ..ack_header(self.mac, self.ep, vi.id, peer, vi.tx.psn, ack, fl) };
        self.outbox.report(h);
    }
}
