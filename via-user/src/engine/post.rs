//! Posting descriptors to work queues, completing them in order, flushing
//! them, and handing completed ones back (`Done`).

use super::{vi_at, Context, Core, MAX_SEGMENTS};
use crate::descriptor::{control, status, DESCRIPTOR_ALIGNMENT};
use crate::error::{Result, ViaError, VipReturn};
use crate::usermem;
use crate::vi::{ViAttributes, ViPhase, ViState};
use crate::workqueue::{CheckedSegment, WqEntry, INLINE_SEGMENTS};
use via_kernel_agent::memory::{MemError, RegistrationTable};

/// Which queue of a VI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    Send,
    Recv,
}

impl Queue {
    fn op_status(self) -> u32 {
        match self {
            Queue::Send => status::OP_SEND,
            Queue::Recv => status::OP_RECEIVE,
        }
    }
}

/// The wire's code for the atomic a descriptor's control bits ask for
/// (`Kind::AtomicReq`'s `imm`, [`via_wire::atomic_op`]): None unless
/// exactly one atomic bit is set.
pub(crate) fn atomic_code(control: u16) -> Option<u32> {
    match control & (control::ATOMIC_FETCH_ADD | control::ATOMIC_CMP_SWAP) {
        control::ATOMIC_FETCH_ADD => Some(via_wire::atomic_op::FETCH_ADD),
        control::ATOMIC_CMP_SWAP => Some(via_wire::atomic_op::CMP_SWAP),
        _ => None,
    }
}

/// What recent posts found valid, so that a descriptor posted again
/// unchanged is not checked against the registration table again: work-
/// queue entries as validation built them, in a table indexed by the
/// descriptor's address (direct-mapped, no hashing), each for one
/// descriptor, VI (number and serial) and queue at one registration
/// epoch. A record is taken only if it is that descriptor's (address and
/// memory handle), for the same VI, attributes and queue, at the epoch that
/// still stands (nothing deregistered, no protection tag changed), and the
/// descriptor still says what validation read (its control word, segment
/// count and segments, a send's length and immediate data, an RDMA op's
/// address segment): read again, compared, not looked up. So a program that rewrites its descriptors between posts (a C
/// program may, anywhere) is checked as before, and one that posts the same
/// ones again skips the registration checks. Only validations that found
/// nothing wrong and kept their segments in the entry are recorded, and
/// none of an atomic (checked at every post).
#[derive(Default)]
pub struct Kept {
    /// Made at the first record kept (a NIC that never posts has none);
    /// indexed by [`slot`], which is always inside it.
    records: Option<Box<[Option<KeptRecord>; KEPT]>>,
}

#[derive(Clone, Copy)]
struct KeptRecord {
    entry: WqEntry,
    on: PostedOn,
    /// What the descriptor said, as the words a post reads again.
    image: Image,
}

/// A validated descriptor as the words [`usermem::read_control_words`]
/// and [`usermem::read_segment_word`] read: compared whole, where field by
/// field took some forty instructions more a post.
#[derive(Clone, Copy)]
struct Image {
    /// `SegCount | Control << 16`.
    control: u32,
    /// `ImmediateData | Length << 32`; a send's (a receive's are written
    /// at completion, not read).
    send: u64,
    /// The checked data segments whole: address, handle, length.
    segs: [u128; INLINE_SEGMENTS],
}

impl Image {
    /// The words of the descriptor validation made `e` from, with its
    /// checked segments `segs`.
    fn of(e: &WqEntry, segs: &[CheckedSegment]) -> Image {
        let mut image = Image { control: u32::from(e.segs) | u32::from(e.control) << 16, send: u64::from(e.imm) | u64::from(e.len) << 32, segs: [0; INLINE_SEGMENTS] };
        for (w, k) in image.segs.iter_mut().zip(segs) {
            *w = u128::from(k.addr) | u128::from(k.handle) << 64 | u128::from(k.len) << 96;
        }
        image
    }
}

/// Where a descriptor was posted: the VI under its attributes (its
/// `rules`, unique in the process: a VI made later, or these attributes
/// changed, draw another) and the queue.
#[derive(Clone, Copy, PartialEq)]
struct PostedOn {
    rules: u64,
    queue: Queue,
}

/// Records kept (a power of two): a few tens of kilobytes per NIC.
const KEPT: usize = 256;

fn slot(addr: usize) -> usize {
    (addr / DESCRIPTOR_ALIGNMENT) & (KEPT - 1)
}

impl Kept {
    /// The entry recorded for the descriptor at `addr` (`handle`) posted
    /// `on`, if it stands at `epoch` and the descriptor still says what it
    /// said (see the type's doc).
    #[inline(always)]
    fn find(&self, addr: usize, handle: u32, on: &PostedOn, epoch: u64) -> Option<&WqEntry> {
        let r = self.records.as_ref()?[slot(addr)].as_ref()?;
        let e = &r.entry;
        if e.desc != addr || e.desc_handle != handle || e.checked_epoch != epoch || r.on != *on {
            return None;
        }
        // SAFETY: the record was made for this descriptor (address and
        // handle) by a validation that checked its control segment and its
        // `segs` segments against the registration table at `epoch`, which
        // still stands, so that memory is still registered; the engine
        // lock is held.
        let (control, send) = unsafe { usermem::read_control_words(addr) };
        if control != r.image.control || (on.queue == Queue::Send && send != r.image.send) {
            return None;
        }
        if e.seg0 >= 1 {
            // SAFETY: as above; an RDMA op's address segment is segment 0.
            let a = unsafe { usermem::read_address_segment(addr) };
            if a.data.address_bits != e.raddr || a.handle != e.rhandle {
                return None;
            }
        }
        // Records are kept only with their segments checked, at most
        // INLINE_SEGMENTS of them (`keep`).
        let n = usize::from(e.segs - e.seg0).min(INLINE_SEGMENTS);
        for (i, &want) in r.image.segs.iter().enumerate().take(n) {
            // SAFETY: as above; seg0 + i < segs.
            if unsafe { usermem::read_segment_word(addr, usize::from(e.seg0) + i) } != want {
                return None;
            }
        }
        Some(e)
    }

    /// Records what validation found for the descriptor in `e`, whose
    /// checked segments are `segs`.
    fn keep(&mut self, e: &WqEntry, segs: &[CheckedSegment], on: PostedOn) {
        let records = self.records.get_or_insert_with(|| Box::new([None; KEPT]));
        records[slot(e.desc)] = Some(KeptRecord { entry: *e, on, image: Image::of(e, segs) });
    }
}

impl Core {
    /// Validates the descriptor at `addr` for a VI with `attrs` into `e`,
    /// the queue's next slot (so the entry is built where it stays).
    /// Errors the descriptor itself can carry are put in `pre_status`;
    /// errors that leave nowhere to write a status are returned.
    #[inline(always)]
    pub(super) fn validate(mem: &RegistrationTable, attrs: &ViAttributes, addr: usize, handle: u32, q: Queue, e: &mut WqEntry) -> Result<()> {
        if addr == 0 || !addr.is_multiple_of(DESCRIPTOR_ALIGNMENT) {
            return Err(ViaError::new(VipReturn::DescriptorError, format!("descriptor address {addr:#x} is not {DESCRIPTOR_ALIGNMENT}-byte aligned")));
        }
        *e = WqEntry { desc: addr, desc_handle: handle, ..Default::default() };
        let cs = match usermem::read_control(mem, addr, handle, attrs.ptag) {
            Ok(cs) => cs,
            Err(MemError::PtagMismatch) => {
                e.pre_status = status::PROTECTION_ERROR;
                return Ok(());
            }
            Err(MemError::OutOfBounds) if mem.lookup(handle).is_ok_and(|r| r.contains(addr, 32)) => {
                e.pre_status = status::FORMAT_ERROR; // its segments run past the region
                return Ok(());
            }
            Err(MemError::OutOfBounds) => return Err(ViaError::invalid("descriptor does not lie in the memory its handle names")),
            Err(e) => return Err(ViaError::invalid(format!("descriptor memory handle: {e}"))),
        };
        e.segs = cs.seg_count;
        e.control = cs.control;
        e.imm = cs.immediate_data;
        let op = cs.control & control::OP_MASK;
        // The extension's remote atomic reuses the reserved operation
        // code with bits VIA 1.0 reserves: only there are they allowed.
        let atomic = q == Queue::Send && op == control::OP_ATOMIC;
        let reserved = if atomic { cs.control & !control::ATOMIC_ALLOWED } else { cs.control & control::RESERVED };
        if reserved != 0 || cs.seg_count as usize > MAX_SEGMENTS {
            e.pre_status = status::FORMAT_ERROR;
            return Ok(());
        }
        let rdma = op == control::OP_RDMAWRITE || op == control::OP_RDMAREAD || atomic;
        let bad_op = match q {
            Queue::Recv => op != control::OP_SENDRECV || cs.control & control::QFENCE != 0,
            Queue::Send if atomic => atomic_code(cs.control).is_none() || cs.seg_count != 3 || !attrs.reliability.is_reliable(),
            Queue::Send => op == control::OP_RESERVED || (op == control::OP_RDMAREAD && (cs.control & control::IMMEDIATE != 0 || !attrs.reliability.is_reliable())),
        };
        if bad_op || (rdma && cs.seg_count == 0) {
            e.pre_status = status::FORMAT_ERROR; // reserved op, RDMA on a receive queue, read or atomic on an unreliable VI
            return Ok(());
        }
        if rdma {
            // SAFETY: read_control checked the descriptor with its
            // seg_count (>= 1 here) segments, under the engine lock.
            let a = unsafe { usermem::read_address_segment(addr) };
            e.seg0 = 1;
            e.raddr = a.data.address_bits;
            e.rhandle = a.handle;
        }
        if atomic {
            // SAFETY: as above, with seg_count 3.
            let o = unsafe { usermem::read_atomic_operands(addr) };
            e.operands[..8].copy_from_slice(&o.compare_add.to_le_bytes());
            e.operands[8..].copy_from_slice(&o.swap.to_le_bytes());
            e.imm = atomic_code(cs.control).unwrap_or(0);
            e.seg0 = 2;
            if !e.raddr.is_multiple_of(8) {
                e.pre_status = status::FORMAT_ERROR; // the target must be 8-byte aligned
                return Ok(());
            }
        }
        let mut total: u64 = 0;
        let keep = (cs.seg_count - e.seg0) as usize <= INLINE_SEGMENTS;
        for i in e.seg0 as usize..cs.seg_count as usize {
            // SAFETY: as above; i < seg_count.
            let s = unsafe { usermem::read_segment(addr, i) };
            if keep {
                e.inline[i - e.seg0 as usize] = CheckedSegment { addr: s.data.address_bits, len: s.length, handle: s.handle };
            }
            if s.length == 0 {
                continue;
            }
            if mem.check(s.handle, s.data.address_bits as usize, s.length as usize, attrs.ptag).is_err() {
                e.pre_status = status::PROTECTION_ERROR;
                return Ok(());
            }
            total += s.length as u64;
        }
        e.checked_epoch = mem.epoch();
        if total > attrs.max_transfer_size as u64 {
            e.pre_status = status::LENGTH_ERROR;
            return Ok(());
        }
        e.len = total as u32;
        if q == Queue::Send && cs.length as u64 != total {
            e.pre_status = status::FORMAT_ERROR;
        }
        if atomic && total != 8 {
            e.pre_status = status::FORMAT_ERROR; // the old value's 8 bytes, no more
        }
        Ok(())
    }

    /// `VipPostSend` / `VipPostRecv` on VI `id`; a send's frames leave
    /// with the next flush (its doorbell is rung).
    pub fn post(&mut self, id: u16, addr: usize, handle: u32, q: Queue) -> Result<()> {
        if self.post_unrung(id, addr, handle, q)? {
            self.outbox.ring(id);
        }
        Ok(())
    }

    /// [`Core::post`] without the doorbell: true when it posted a send
    /// that is to be transmitted.
    #[inline(always)]
    pub(super) fn post_unrung(&mut self, id: u16, addr: usize, handle: u32, q: Queue) -> Result<bool> {
        let Core { vis, cx } = self;
        let Context { mem, counters, kept, .. } = cx;
        let vi = vi_at(vis, id).ok_or_else(|| super::no_vi(id))?;
        let phase = vi.phase;
        let allowed = match q {
            Queue::Send => phase == ViPhase::Connected || phase == ViPhase::Error,
            Queue::Recv => true,
        };
        if !allowed {
            return Err(ViaError::state(format!("cannot post a send on a VI in state {phase:?} (connect it first)")));
        }
        if q == Queue::Recv && vi.srq.is_some() {
            return Err(ViaError::state("this VI takes its receives from a shared receive queue: post them there"));
        }
        let rules = vi.rules;
        let wq = match q {
            Queue::Send => &mut vi.sq,
            Queue::Recv => &mut vi.rq,
        };
        let capacity = wq.capacity();
        let Some(e) = wq.vacant() else {
            return Err(ViaError::resource(format!("{q:?} queue full ({capacity} descriptors posted)")));
        };
        // (Records are made only for descriptors that passed validation,
        // so an address that fails its checks never finds one.)
        let epoch = mem.epoch();
        let on = PostedOn { rules, queue: q };
        match kept.find(addr, handle, &on, epoch) {
            Some(k) => {
                *e = *k;
                counters.posts_kept += 1;
            }
            None => {
                Self::validate(mem, &vi.attrs, addr, handle, q, e)?;
                // Not an atomic's: its entry's `imm` is the operation, not
                // the descriptor's word, so `find` would never take it.
                if e.pre_status == 0 && e.seg0 != 2 {
                    if let Some(segs) = e.checked_segments(epoch) {
                        kept.keep(e, segs, on);
                    }
                }
            }
        }
        if phase == ViPhase::Error {
            e.pre_status = status::DESC_FLUSHED_ERROR;
        }
        let pre_status = e.pre_status;
        // Clear the completion fields before the descriptor becomes visible
        // (its memory was just validated, or the post was refused above).
        // SAFETY: `validate` checked the control segment (read_control)
        // under the engine lock we hold, or did so at an earlier post of
        // the same descriptor at the registration epoch that still stands.
        unsafe { usermem::clear_completion(addr) };
        wq.commit();
        if pre_status != 0 {
            self.pre_errored += 1;
            self.complete_pre_errored(id, q);
            return Ok(false);
        }
        Ok(q == Queue::Send)
    }

    /// VI `id`'s [`Context::complete_pre_errored`].
    #[inline]
    pub(super) fn complete_pre_errored(&mut self, id: u16, q: Queue) {
        if self.pre_errored != 0 {
            if let Some((cx, vi)) = self.split(id) {
                cx.complete_pre_errored(vi, q);
            }
        }
    }

    /// VI `id`'s [`Context::flush_vi`].
    pub fn flush_vi(&mut self, id: u16) {
        if let Some((cx, vi)) = self.split(id) {
            cx.flush_vi(vi);
        }
    }

    /// `VipSendDone` / `VipRecvDone`: the oldest completed descriptor,
    /// and the serial of the VI that answered (a wait notices by it that
    /// the VI was replaced under the same number).
    pub fn done(&mut self, id: u16, q: Queue) -> Result<(u64, Option<usize>)> {
        let vi = self.vi_mut(id)?;
        let wq = match q {
            Queue::Send => &mut vi.sq,
            Queue::Recv => &mut vi.rq,
        };
        Ok((vi.serial, wq.pop_completed().map(|e| e.desc)))
    }

    /// Has VI `id` nothing posted on `q` that it has not handed back (so
    /// that no round of progress can complete anything there)? False for
    /// a VI that draws its receives from a shared queue, and for an id
    /// that names no VI.
    #[inline]
    pub fn nothing_posted(&self, id: u16, q: Queue) -> bool {
        self.vi(id).is_ok_and(|vi| match q {
            Queue::Send => vi.sq.head == vi.sq.tail,
            Queue::Recv => vi.rq.head == vi.rq.tail && vi.srq.is_none(),
        })
    }

    /// [`Core::done`] of the send queue as the application polls it
    /// (`VipSendDone`, `VipSendWait`): a repeated poll that finds none
    /// while boxed sends are out reads whether the peer placed them
    /// (`engine::boxed`).
    #[inline]
    pub fn send_done(&mut self, id: u16) -> Result<(u64, Option<usize>)> {
        let (serial, d) = self.done(id, Queue::Send)?;
        if d.is_none() && self.cx.boxes_out != 0 {
            return Ok((serial, self.done_boxed(id)));
        }
        Ok((serial, d))
    }

    /// `VipCQDone`: the oldest completion of CQ `cq` as (VI, is receive
    /// queue), and the CQ's serial.
    pub fn cq_done(&mut self, cq: u16) -> Result<(u64, Option<(u16, bool)>)> {
        let c = self.cq_mut(cq)?;
        let (serial, mut next) = (c.serial, c.pop());
        if next.is_none() && self.cx.told_pending {
            // Placed counts said in headers and not yet settled.
            self.settle_all_told();
            next = self.cq_mut(cq)?.pop();
        }
        if next.is_none() && self.cx.boxes_out != 0 && self.cx.box_poll_looks() {
            // As `send_done`: boxed sends out may have been placed.
            let now = self.cx.clock.now();
            self.settle_all_boxes(now);
            next = self.cq_mut(cq)?.pop();
        }
        Ok((serial, next))
    }
}

impl Context {
    /// Completes the next outstanding descriptor of `vi`'s `q` with `bits`,
    /// then any descriptors after it that failed validation when posted.
    #[inline(always)]
    pub fn complete_next(&mut self, vi: &mut ViState, q: Queue, length: u32, bits: u32, imm: Option<u32>) {
        let id = vi.id;
        let wq = match q {
            Queue::Send => &mut vi.sq,
            Queue::Recv => &mut vi.rq,
        };
        if wq.done == wq.tail {
            return;
        }
        let e = wq.get(wq.done);
        let (desc, desc_handle, started) = (e.desc, e.desc_handle, e.nframes != 0);
        // A reserved operation without the extension's bits completes as a send.
        let op_bits = if e.is_atomic() && atomic_code(e.control).is_none() { control::OP_SENDRECV } else { e.op() };
        let checked = e.checked_epoch == self.mem.epoch();
        wq.done = wq.done.wrapping_add(1);
        let cq = match q {
            Queue::Send => vi.send_cq,
            Queue::Recv => vi.recv_cq,
        };
        let op = match (q, op_bits) {
            (Queue::Send, control::OP_RDMAWRITE) => status::OP_RDMA_WRITE,
            (Queue::Send, control::OP_RDMAREAD | control::OP_ATOMIC) => {
                if started {
                    vi.tx.reads_outstanding = vi.tx.reads_outstanding.saturating_sub(1);
                    if vi.tx.idx != vi.sq.tail {
                        self.outbox.ring(id); // a QFENCE may wait for this read
                    }
                }
                if op_bits == control::OP_ATOMIC {
                    status::OP_ATOMIC
                } else {
                    status::OP_RDMA_READ
                }
            }
            _ => q.op_status(),
        };
        let imm_bit = if imm.is_some() { status::IMMEDIATE } else { 0 };
        let st = bits | status::DONE | op | imm_bit;
        if checked {
            // SAFETY: the control segment passed its check at post and
            // nothing was deregistered since (the epoch stands); we hold
            // the engine lock.
            unsafe { usermem::write_completion_unchecked(desc, length, st, imm) };
        } else {
            usermem::write_completion(&self.mem, desc, desc_handle, length, st, imm);
        }
        if let Some(cq) = cq {
            self.push_completion(cq, id, q);
        }
        self.complete_pre_errored(vi, q);
    }

    /// Records on CQ `cq` that VI `id` completed a descriptor on `q`.
    fn push_completion(&mut self, cq: u16, id: u16, q: Queue) {
        let Ok(c) = self.cq_mut(cq) else { return };
        let before = c.overflows;
        c.push(id, q == Queue::Recv);
        let (over, entries, len) = (c.overflows != before, c.capacity(), c.len());
        if over {
            self.counters.cq_overflows += 1;
            if len == entries + 1 {
                // Once each time it goes past (none is dropped).
                self.async_errors.push(super::AsyncError { vi: id, kind: super::AsyncErrorKind::CqOverflow { cq, entries } });
            }
        }
    }

    /// Completes, in order, descriptors at the head of the outstanding part
    /// of `vi`'s `q` that carry errors from posting.
    #[inline]
    pub(super) fn complete_pre_errored(&mut self, vi: &mut ViState, q: Queue) {
        if self.pre_errored != 0 {
            self.complete_pre_errored_slow(vi, q); // some descriptor failed validation
        }
    }

    fn complete_pre_errored_slow(&mut self, vi: &mut ViState, q: Queue) {
        loop {
            let wq = match q {
                Queue::Send => &vi.sq,
                Queue::Recv => &vi.rq,
            };
            if wq.done == wq.tail || wq.get(wq.done).pre_status == 0 {
                return;
            }
            let bits = wq.get(wq.done).pre_status;
            if q == Queue::Send && vi.tx.idx == vi.sq.done {
                vi.tx.idx = vi.tx.idx.wrapping_add(1);
                vi.tx.off = 0;
            }
            self.pre_errored = self.pre_errored.saturating_sub(1);
            self.complete_next(vi, q, 0, bits, None);
        }
    }

    /// Completes everything outstanding on both queues of `vi` with
    /// DESC_FLUSHED.
    pub fn flush_vi(&mut self, vi: &mut ViState) {
        // Sends the peer said it placed complete as such, not flushed.
        self.settle_told(vi, None);
        for q in [Queue::Send, Queue::Recv] {
            loop {
                let wq = if q == Queue::Send { &vi.sq } else { &vi.rq };
                if wq.done == wq.tail {
                    break;
                }
                self.complete_next(vi, q, 0, status::DESC_FLUSHED_ERROR, None);
            }
        }
        vi.tx.idx = vi.sq.done;
        vi.tx.off = 0;
        vi.tx.rnr_until = None;
        vi.rx.msg = None;
        vi.rtx.stop();
        vi.tx.reads_outstanding = 0;
        vi.tx.read_resume = false;
        vi.tx.boxes_out = 0;
        vi.served.jobs.clear();
    }
}
