//! The wire's side of copies both ends share ([`via_device::shared_copy`]):
//! the block beside each lent record in its slot, the tickets by which a
//! receiver tells the record's sender that it posted a copy there (in the
//! sender's port, `Control::copy_posted`), and the sender's look at its
//! ticket ([`posted_to`]).
//!
//! A ticket names the receiver's port, the ring index of the slot and the
//! record (`(port + 1) << 56 | index << 32 | record`, the index's low 24
//! bits). Record numbers carry their sender's port (`(port + 1) << 24`
//! and a count), so a sender helps only with its own records; and it
//! claims a chunk only while the block's job word names that record with
//! chunks left, which it does only while the receiver holds the slot.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use via_device::shared_copy::{SharedCopy, SharedCopyRef};
use via_device::LentPayload;

use super::segment::{Segment, SLOT_PREFIX};
use super::{read_slot, shared_block, PORTS};

/// The ticket for the record `record` in slot `index` of port `port`.
pub(super) fn ticket(port: usize, index: u64, record: u32) -> u64 {
    (port as u64 + 1) << 56 | (index & 0xff_ffff) << 32 | u64::from(record)
}

/// Numbers the lent records of one port.
pub(super) struct RecordCount {
    port: u32,
    count: u32,
    /// A payload long enough to share was lent: the port's `copy_posted`
    /// is worth looking at (a process that never lends one never does).
    pub(super) shared: bool,
}

impl RecordCount {
    pub(super) fn new(port: usize) -> RecordCount {
        RecordCount { port: port as u32, count: 0, shared: false }
    }

    /// The next record's number (for a payload of `len` bytes): nonzero,
    /// unique among the records in flight on the wire.
    pub(super) fn next(&mut self, len: usize) -> u32 {
        self.shared |= len >= 2 * via_device::shared_copy::CHUNK;
        self.count = (self.count % 0xff_ffff) + 1;
        (self.port + 1) << 24 | self.count
    }

    /// Is `record` one of ours?
    fn ours(&self, record: u32) -> bool {
        record >> 24 == self.port + 1
    }
}

/// The copy a receiver last posted to port `port` (ours, process `pid`,
/// numbering its records with `records`), if it still has chunks left:
/// its block, its record and our payload as lent. (Callers look only once
/// the port has lent a payload worth sharing, `RecordCount::shared`.)
pub(super) fn posted_to<'s>(seg: &'s Segment, port: usize, pid: u32, records: &RecordCount) -> Option<(&'s SharedCopy, u32, LentPayload)> {
    let posted = &seg.control(port).copy_posted;
    let t = posted.load(Ordering::Acquire);
    if t == 0 {
        return None;
    }
    let (p, index, record) = ((t >> 56) as usize, t >> 32 & 0xff_ffff, t as u32);
    let found = open_copy(seg, p, index, record, pid, records);
    if found.is_none() {
        // Done with (or not ours): later looks stop at the first load.
        let _ = posted.compare_exchange(t, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
    found
}

/// The copy of `record` in slot `index` of port `p - 1`, if its job has
/// chunks left (see [`posted_to`]).
fn open_copy<'s>(seg: &'s Segment, p: usize, index: u64, record: u32, pid: u32, records: &RecordCount) -> Option<(&'s SharedCopy, u32, LentPayload)> {
    if p == 0 || p > PORTS || !records.ours(record) {
        return None;
    }
    let s = seg.slot(p - 1, index).wrapping_add(SLOT_PREFIX - 8);
    // SAFETY: the slot lies in the mapping; its length word is read as
    // any word of a slot another process may write (checked below).
    let word = u64::from_le_bytes(unsafe { std::slice::from_raw_parts(s, 8) }.try_into().unwrap());
    // SAFETY: `s` is a slot's length word.
    let block = unsafe { shared_block(s, word) }?;
    // The job first, then the record: while the job names our record with
    // chunks left, the receiver holds the slot and the record is ours.
    if block.open_record() != Some(record) {
        return None;
    }
    // SAFETY: as above; read_slot checks every length it reads.
    let (_, lent) = unsafe { read_slot(s, word) }?;
    let lent = lent.filter(|l| l.pid == pid)?;
    Some((block, record, lent.alone()))
}

/// For a receiver: the shared block of a lent record in slot `index` of
/// our port `port`, and the word of its sender's port (process `pid`)
/// where we post a copy there. None if the sender has no live port.
pub(super) fn shared_ref(seg: &Segment, block: &SharedCopy, port: usize, index: u64, pid: u32) -> Option<SharedCopyRef> {
    let sender = seg.port_of(pid)?;
    Some(SharedCopyRef { block: NonNull::from(block), posted: NonNull::from(&seg.control(sender).copy_posted), ticket: ticket(port, index, block.record()) })
}
