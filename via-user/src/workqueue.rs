//! Work queues, the doorbell, and completion queues.
//!
//! A [`WorkQueue`] is a VI's bounded ring of posted descriptors. Entries are
//! addressed by absolute, wrapping `u32` indices and move through three
//! cursors: `done` (next to complete) and `head` (next for `Done`/`Wait` to
//! hand back); `tail` is where the next post lands. Completion is always in
//! posting order.
//!
//! The [`Doorbell`] is the engine's register of send queues with new work:
//! posting a send is one store into the ring plus one ring of the doorbell.
//!
//! A [`CompletionQueue`] records which VI and which queue completed a
//! descriptor, in completion order, for any number of VIs.

use std::collections::VecDeque;

/// One posted descriptor, as the engine tracks it.
#[derive(Clone, Copy, Debug, Default)]
pub struct WqEntry {
    /// Address of the `VIP_DESCRIPTOR` in registered memory.
    pub desc: usize,
    /// Memory handle of the descriptor's own memory.
    pub desc_handle: u32,
    /// Total bytes of the data segments.
    pub len: u32,
    pub segs: u16,
    pub control: u16,
    pub imm: u32,
    /// Error bits found when the descriptor was posted: it completes with
    /// them, in order, without moving data.
    pub pre_status: u32,
    /// First packet sequence number of the message (send queues).
    pub first_psn: u32,
    /// Frames the message takes (send queues; 0 until transmission starts).
    pub nframes: u32,
    /// Message sequence number, assigned at the first transmission; of a
    /// boxed send, its number among the connection's boxed messages.
    pub msg_seq: u32,
    /// Sent boxed (`engine::boxed`): it completes once the peer says it
    /// placed it, not by acknowledged frames (`nframes` stays 0).
    pub boxed: bool,
    /// Sent whole, as one frame whose payload the device lends
    /// ([`via_device::Path::lends_from`]): `nframes` is 1.
    pub lent_whole: bool,
    /// Index of the first local data segment: 0, or 1 for RDMA, whose
    /// segment 0 is the remote address segment.
    pub seg0: u16,
    /// RDMA: the remote address and memory handle (address segment).
    pub raddr: u64,
    pub rhandle: u32,
    /// Error bits the peer reported for this message (REMOTE_DESC,
    /// RDMA_PROT); it completes with them once acknowledged.
    pub remote_status: u32,
    /// Remote atomic: the operands as read at post, little-endian as
    /// they go on the wire (the addend or compare value, the swap value).
    pub operands: [u8; 16],
    /// RDMA read or atomic: response bytes placed so far, and whether the
    /// last response arrived.
    pub got: u32,
    pub read_done: bool,
    /// The local data segments as checked at post, when there are at most
    /// [`INLINE_SEGMENTS`].
    pub inline: [CheckedSegment; INLINE_SEGMENTS],
    /// The registration epoch at which the descriptor and its segments
    /// passed their checks at post (0: they did not). While it stands,
    /// transmit and receive use `inline` without reading the descriptor
    /// or checking it again, and the completion is written without
    /// looking its memory up.
    pub checked_epoch: u64,
}

/// Local data segments a work-queue entry keeps as checked at post: two,
/// so that a receive of a header and a payload (a common VIA layout, and
/// via-pingpong's) is kept and placed as a one-segment receive is.
pub const INLINE_SEGMENTS: usize = 2;

/// A data segment that passed the registration check: `len` bytes at
/// `addr` in region `handle`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckedSegment {
    pub addr: u64,
    pub len: u32,
    pub handle: u32,
}

impl WqEntry {
    /// The local data segments (`seg0..segs`) as checked at post, if kept
    /// and the registration table's epoch is still `epoch`.
    #[inline]
    pub fn checked_segments(&self, epoch: u64) -> Option<&[CheckedSegment]> {
        let n = (self.segs - self.seg0) as usize;
        (self.checked_epoch == epoch && n <= INLINE_SEGMENTS).then(|| &self.inline[..n])
    }

    /// Data segment `i` (`seg0 <= i < segs`): from `checked` (what
    /// [`WqEntry::checked_segments`] gave), else read from the descriptor.
    ///
    /// # Safety
    /// Without `checked`, the descriptor with its `segs` segments was
    /// checked against the registration table under the engine lock held
    /// since (`usermem::descriptor_registered`); `i < segs`.
    #[inline]
    pub unsafe fn segment(&self, checked: Option<&[CheckedSegment]>, i: usize) -> CheckedSegment {
        match checked {
            Some(c) => c[i - self.seg0 as usize],
            None => {
                // SAFETY: the caller's promise.
                let s = unsafe { crate::usermem::read_segment(self.desc, i) };
                CheckedSegment { addr: s.data.address_bits, len: s.length, handle: s.handle }
            }
        }
    }

    /// The `VIP_CONTROL_OP_*` operation.
    pub fn op(&self) -> u16 {
        self.control & crate::descriptor::control::OP_MASK
    }

    pub fn is_read(&self) -> bool {
        self.op() == crate::descriptor::control::OP_RDMAREAD
    }

    /// A remote atomic (extension; validated at post, so one of the two
    /// atomic bits is set).
    pub fn is_atomic(&self) -> bool {
        self.op() == crate::descriptor::control::OP_ATOMIC
    }

    /// Does the message complete only when the peer answers it (an RDMA
    /// read or a remote atomic: one request frame, then response frames)?
    pub fn awaits_response(&self) -> bool {
        self.is_read() || self.is_atomic()
    }
}

/// A VI's send or receive queue.
pub struct WorkQueue {
    /// A power of two of entries, never resized: `mask` is its length
    /// less one, so an index masked with it is always inside (`slot`).
    slots: Box<[WqEntry]>,
    mask: u32,
    pub head: u32,
    pub done: u32,
    pub tail: u32,
}

impl WorkQueue {
    /// A queue holding at least `depth` descriptors.
    pub fn new(depth: usize) -> Self {
        let cap = depth.max(2).next_power_of_two();
        // `mask` must name every slot and no more (`slot`'s unchecked
        // index): a depth past what a u32 index masks is refused here
        // (the engine's queues hold at most a few thousand).
        assert!(cap <= 1 << 31, "a work queue of {depth} entries");
        WorkQueue { slots: vec![WqEntry::default(); cap].into_boxed_slice(), mask: cap as u32 - 1, head: 0, done: 0, tail: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Posted and not yet handed back.
    pub fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.tail.wrapping_sub(self.done) as usize
    }

    /// Appends an entry; false when the ring is full.
    pub fn push(&mut self, e: WqEntry) -> bool {
        if self.len() == self.slots.len() {
            return false;
        }
        *self.slot_mut(self.tail) = e;
        self.tail = self.tail.wrapping_add(1);
        true
    }

    /// The entry at queue index `idx` (masked: any index names one).
    #[inline(always)]
    fn slot(&self, idx: u32) -> &WqEntry {
        let i = (idx & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `slots` has `mask + 1` entries from `new` on and is never
        // resized, so `idx & mask` is inside it (the bounds check the
        // compiler cannot drop cost a compare and a branch at every one
        // of the dozen lookups of a message).
        unsafe { self.slots.get_unchecked(i) }
    }

    #[inline(always)]
    fn slot_mut(&mut self, idx: u32) -> &mut WqEntry {
        let i = (idx & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: as in `slot`.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    /// The slot the next post fills, if the queue has room: the entry is
    /// built there and becomes part of the queue with [`WorkQueue::commit`].
    #[inline]
    pub fn vacant(&mut self) -> Option<&mut WqEntry> {
        if self.len() == self.slots.len() {
            return None;
        }
        Some(self.slot_mut(self.tail))
    }

    /// Makes the entry built in [`WorkQueue::vacant`] the newest posted.
    #[inline]
    pub fn commit(&mut self) {
        debug_assert!(self.len() < self.slots.len());
        self.tail = self.tail.wrapping_add(1);
    }

    #[inline]
    pub fn get(&self, idx: u32) -> &WqEntry {
        self.slot(idx)
    }

    #[inline]
    pub fn get_mut(&mut self, idx: u32) -> &mut WqEntry {
        self.slot_mut(idx)
    }

    /// Takes the oldest posted entry out, complete or not (a shared
    /// receive queue handing a receive to a VI: `engine::srq`).
    pub fn take_oldest(&mut self) -> Option<WqEntry> {
        if self.done == self.tail {
            return None;
        }
        let e = *self.get(self.done);
        self.done = self.done.wrapping_add(1);
        self.head = self.done;
        Some(e)
    }

    /// Hands back the oldest completed entry (a reference: the caller
    /// wants its descriptor's address, not a copy of the whole entry).
    #[inline]
    pub fn pop_completed(&mut self) -> Option<&WqEntry> {
        if self.head == self.done {
            return None;
        }
        let at = self.head;
        self.head = self.head.wrapping_add(1);
        Some(self.slot(at))
    }
}

/// The register of VIs whose send queues have work for the engine.
#[derive(Default)]
pub struct Doorbell {
    rung: Vec<u16>,
}

impl Doorbell {
    /// Rings for VI `vi` (duplicates are harmless and skipped).
    pub fn ring(&mut self, vi: u16) {
        if !self.rung.contains(&vi) {
            self.rung.push(vi);
        }
    }

    /// The VIs rung since the last call, oldest first.
    pub fn take(&mut self, into: &mut Vec<u16>) {
        into.clear();
        into.append(&mut self.rung);
    }

    pub fn is_rung(&self) -> bool {
        !self.rung.is_empty()
    }
}

/// A completion queue: (VI, queue) pairs in completion order.
pub struct CompletionQueue {
    entries: VecDeque<(u16, bool)>,
    capacity: usize,
    /// Completions that arrived while the queue was at capacity. They are
    /// kept (the queue grows), never dropped, and counted here.
    pub overflows: u64,
    /// Unique in the process ([`next_serial`]).
    pub serial: u64,
}

impl CompletionQueue {
    pub fn new(capacity: usize) -> Self {
        CompletionQueue { entries: VecDeque::with_capacity(capacity), capacity, overflows: 0, serial: next_serial() }
    }

    pub fn push(&mut self, vi: u16, recv: bool) {
        if self.entries.len() >= self.capacity {
            self.overflows += 1;
        }
        self.entries.push_back((vi, recv));
    }

    pub fn pop(&mut self) -> Option<(u16, bool)> {
        self.entries.pop_front()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the capacity; fails when more entries are queued than fit.
    pub fn resize(&mut self, capacity: usize) -> bool {
        if capacity < self.entries.len() {
            return false;
        }
        self.capacity = capacity;
        true
    }

    /// Drops every entry of VI `vi` (it is being destroyed).
    pub fn forget_vi(&mut self, vi: u16) {
        self.entries.retain(|e| e.0 != vi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_order_and_wrap() {
        let mut q = WorkQueue::new(4);
        for round in 0..10u32 {
            for i in 0..4 {
                assert!(q.push(WqEntry { desc: (round * 4 + i) as usize, ..Default::default() }));
            }
            assert!(!q.push(WqEntry::default()));
            assert_eq!(q.pop_completed().map(|e| e.desc), None);
            q.done = q.done.wrapping_add(4);
            for i in 0..4 {
                assert_eq!(q.pop_completed().unwrap().desc, (round * 4 + i) as usize);
            }
            assert!(q.is_empty());
        }
    }

    #[test]
    fn cq_keeps_overflow() {
        let mut cq = CompletionQueue::new(2);
        cq.push(1, true);
        cq.push(2, false);
        cq.push(3, true);
        assert_eq!(cq.overflows, 1);
        assert_eq!(cq.len(), 3);
        assert!(!cq.resize(2));
        cq.forget_vi(2);
        assert_eq!(cq.pop(), Some((1, true)));
        assert_eq!(cq.pop(), Some((3, true)));
        assert_eq!(cq.pop(), None);
    }

    #[test]
    fn doorbell_dedups() {
        let mut d = Doorbell::default();
        d.ring(3);
        d.ring(3);
        d.ring(1);
        let mut v = Vec::new();
        d.take(&mut v);
        assert_eq!(v, vec![3, 1]);
        assert!(!d.is_rung());
    }
}

/// Numbers each VI and CQ ever created in the process, so that a wait can
/// tell the object it began on from a later one given the same number.
pub fn next_serial() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
