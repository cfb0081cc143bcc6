//! The target side of RDMA, on the receive path: checking the peer's
//! accesses to our memory (enable bits, protection tag, bounds), what a
//! violation does to the connection, serving the peer's RDMA read requests
//! and remote atomics (an extension: `vipl_ext.h`), and placing the
//! responses to ours.
//!
//! An atomic is answered as a read of its 8 bytes whose data is what the
//! atomic found: it runs when its request is first accepted, in order,
//! and its answer is remembered with the reads served, so that a
//! duplicate request gets the same answer and the atomic never runs twice
//! (the responder's cache an InfiniBand RC queue pair keeps).
//!
//! A duplicate read request (the requester lost part of a response and
//! asks again) is checked as a first one is: a wrong handle or range is a
//! violation that breaks the connection, so duplicates cannot probe
//! handles for free. It is served again only while the read may still be
//! in flight: the same request as one of the last reads we served (as
//! many as a requester's send queue can hold, the most it can have
//! outstanding; a window of PSNs would not do, as a requester goes on
//! sending while a long read streams), asking from no earlier offset than
//! the last repeat, and from one offset no more often than the
//! requester's retry limit lets it ask. Anything else is counted
//! (`read_requests_stale`) and dropped, so replayed requests cannot make
//! us send a read again and again.

use super::receive::{Payload, PlaceError};
use super::{AsyncError, AsyncErrorKind, Context};
use crate::descriptor::status;
use crate::usermem;
use crate::vi::{ReadJob, ServedRead, ViState};
use std::collections::VecDeque;
use crate::clock::Time;
use via_wire::{flags, seq_le, Frame};

/// RDMA protection violations an unreliable VI's peer may commit before
/// the connection is broken (a reliable VI breaks at the first).
pub const UNRELIABLE_VIOLATION_LIMIT: u32 = 16;

impl Context {
    /// Checks an RDMA access by the peer to `[addr, addr + len)` of our
    /// memory under `handle`: the VI's and the region's enable bit, the
    /// VI's protection tag, the region's bounds. Returns the address.
    pub(super) fn rdma_target(&self, vi: &ViState, addr: u64, handle: u32, len: u32, write: bool) -> Option<usize> {
        let vi_enabled = if write { vi.attrs.enable_rdma_write } else { vi.attrs.enable_rdma_read };
        if !vi_enabled {
            return None;
        }
        let addr = usize::try_from(addr).ok()?;
        let r = self.mem.check(handle, addr, len as usize, vi.attrs.ptag).ok()?;
        let enabled = if write { r.attrs.enable_rdma_write } else { r.attrs.enable_rdma_read };
        enabled.then_some(addr)
    }

    /// The peer's RDMA access `msg_seq` (first PSN `psn`) broke our
    /// protection. Reliable VIs report it to the initiator, whose descriptor
    /// completes with RDMA_PROT_ERROR, and break the connection (false);
    /// unreliable ones drop the message and go on (true). Either way our
    /// memory is untouched and the error is reported here.
    pub(super) fn rdma_violation(&mut self, vi: &mut ViState, psn: u32, msg_seq: u32, why: AsyncErrorKind) -> bool {
        self.counters.rdma_prot_errors += 1;
        if vi.reliable() {
            self.queue_report(vi, psn, msg_seq, status::RDMA_PROT_ERROR, true);
            self.enter_error(vi, why);
            return false;
        }
        // Unreliable: dropped and reported, and the connection goes on;
        // but a peer that keeps trying (guessing memory handles, whose
        // random bits are what stands in its way) loses it.
        vi.rx.prot_violations += 1;
        if vi.rx.prot_violations >= UNRELIABLE_VIOLATION_LIMIT {
            self.enter_error(vi, why);
            return false;
        }
        self.async_errors.push(AsyncError { vi: vi.id, kind: why });
        true
    }

    /// An RDMA read request from the peer (reliable VIs only). `again`:
    /// a retransmission asking for the rest from `offset`. False when the
    /// VI broke.
    pub(super) fn on_read_request<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, f: &Frame<T>, again: bool) -> bool {
        let (psn, seq, len, off, handle) = (f.psn(), f.msg_seq(), f.msg_len(), f.offset(), f.rdma_handle());
        let Some(addr) = self.rdma_target(vi, f.rdma_addr(), handle, len, false) else {
            // Duplicates too: a wrong handle is a violation however it comes.
            return self.rdma_violation(vi, psn, seq, AsyncErrorKind::RdmaReadProt);
        };
        let (max_jobs, retries) = (self.config.queue_depth, self.config.retry_limit);
        if off > len || vi.served.jobs.iter().any(|j| j.psn == psn) {
            return true;
        }
        let asked = ServedRead { psn, msg_seq: seq, addr: f.rdma_addr(), handle, len, resume_off: off, repeats: 0, value: None };
        if !again {
            remember_read(&mut vi.served.recent, asked, max_jobs);
        } else if replay_allowed(&mut vi.served.recent, &asked, retries).is_some_and(|r| r.value.is_none()) {
            self.counters.read_requests_replayed += 1;
        } else {
            self.counters.read_requests_stale += 1;
            return true;
        }
        self.queue_response(vi, ReadJob { psn, msg_seq: seq, addr, handle, len, off, value: None });
        true
    }

    /// Queues the response frames of `job`, unless the VI already has as
    /// many queued as a requester can have outstanding (then the requester
    /// asks again).
    fn queue_response(&mut self, vi: &mut ViState, job: ReadJob) {
        if vi.served.jobs.len() >= self.config.queue_depth {
            self.counters.read_responses_dropped += 1;
            return;
        }
        vi.served.jobs.push_back(job);
        self.outbox.ring(vi.id);
    }

    /// A remote atomic from the peer (reliable VIs only), on its 8-byte,
    /// 8-aligned target with the VI's and the region's RDMA-write enable
    /// bits. It runs once, when its request is first accepted; its answer
    /// is remembered with the reads we served, and a duplicate of the
    /// request (the requester lost the answer, or the ACK) gets that
    /// answer again, within the same limits as a duplicate read request,
    /// and never runs the atomic again. `again`: a duplicate. False when
    /// the VI broke.
    pub(super) fn on_atomic_request<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, f: &Frame<T>, payload: Payload<'_>, again: bool) -> bool {
        let (psn, seq, handle, raddr, code) = (f.psn(), f.msg_seq(), f.rdma_handle(), f.rdma_addr(), f.imm());
        let operands: Option<[u8; 16]> = match payload {
            Payload::Inline(b) => b.try_into().ok(),
            Payload::Lent(_) => None,
        };
        let target = self.rdma_target(vi, raddr, handle, 8, true).filter(|a| a.is_multiple_of(8));
        let known = code == via_wire::atomic_op::FETCH_ADD || code == via_wire::atomic_op::CMP_SWAP;
        let (Some(addr), Some(operands), true, 8) = (target, operands, known, f.msg_len()) else {
            // Duplicates too, as for reads: a wrong target is a violation
            // however it comes.
            return self.rdma_violation(vi, psn, seq, AsyncErrorKind::RdmaWriteProt);
        };
        if vi.served.jobs.iter().any(|j| j.psn == psn) {
            return true; // its answer is queued already
        }
        let asked = ServedRead { psn, msg_seq: seq, addr: raddr, handle, len: 8, resume_off: 0, repeats: 0, value: None };
        let value = if !again {
            // SAFETY: rdma_target checked [addr, addr + 8) against the
            // registration table just now, under the engine lock; aligned.
            let old = unsafe { usermem::atomic_at(addr, code, &operands) }.expect("a known atomic code");
            let value = old.to_le_bytes();
            remember_read(&mut vi.served.recent, ServedRead { value: Some(value), ..asked }, self.config.queue_depth);
            self.counters.atomics_served += 1;
            value
        } else {
            match replay_allowed(&mut vi.served.recent, &asked, self.config.retry_limit).and_then(|r| r.value) {
                Some(v) => {
                    self.counters.atomics_replayed += 1;
                    v
                }
                None => {
                    self.counters.read_requests_stale += 1;
                    return true;
                }
            }
        };
        self.queue_response(vi, ReadJob { psn, msg_seq: seq, addr, handle, len: 8, off: 0, value: Some(value) });
        true
    }

    /// Response data for one of our RDMA reads (`atomic` false), or the
    /// answer to one of our remote atomics: the target's value before it
    /// ran, stored into the descriptor's 8-byte local segment in this
    /// host's byte order.
    pub(super) fn on_read_response<T: AsRef<[u8]>>(&mut self, vi: &mut ViState, f: &Frame<T>, payload: Payload<'_>, atomic: bool, now: Time) {
        let (psn, seq, off) = (f.psn(), f.msg_seq(), f.offset());
        let mut idx = vi.sq.done;
        let found = loop {
            if idx == vi.sq.tail {
                break None;
            }
            let e = vi.sq.get(idx);
            if e.nframes != 0 && e.awaits_response() && e.is_atomic() == atomic && e.first_psn == psn && e.msg_seq == seq {
                break Some(*e);
            }
            idx = idx.wrapping_add(1);
        };
        let native: [u8; 8];
        let payload = match payload {
            Payload::Inline(b) if atomic => {
                let Ok(le) = <[u8; 8]>::try_from(b) else {
                    self.counters.rx_malformed += 1;
                    return;
                };
                native = u64::from_le_bytes(le).to_ne_bytes();
                Payload::Inline(&native)
            }
            p => p,
        };
        let Some(e) = found else {
            self.counters.rx_duplicate += 1; // an old read, already complete
            return;
        };
        let end = off as u64 + payload.len() as u64;
        let last = f.flags() & flags::LAST != 0;
        if e.read_done || off != e.got || f.msg_len() != e.len || end > e.len as u64 || last != (end == e.len as u64) {
            self.counters.rx_out_of_order += 1; // a gap: a later resume asks again
            return;
        }
        // A response means the request arrived: an implicit acknowledgement.
        if seq_le(vi.tx.una, psn) {
            self.on_ack(vi, psn.wrapping_add(1), false, None, now);
        }
        let ptag = vi.attrs.ptag;
        let placed = match self.scatter_at(&e, ptag, off, payload) {
            Err(PlaceError::SourceGone) => {
                // Not placed: the read asks again for it, or times out.
                self.counters.rx_lent_failed += 1;
                return;
            }
            r => r.is_ok(),
        };
        self.count_lent(payload);
        let en = vi.sq.get_mut(idx);
        en.got += payload.len() as u32;
        if !placed {
            en.remote_status |= status::PROTECTION_ERROR; // our memory went away
        }
        en.read_done |= last || !placed;
        let done = en.read_done;
        self.restart_rto(vi, now, true);
        if done {
            self.complete_acked(vi);
        }
    }
}

/// Remembers a read we serve, forgetting the oldest past `keep` (O(1):
/// this is on every read request's path).
fn remember_read(served: &mut VecDeque<ServedRead>, read: ServedRead, keep: usize) {
    while served.len() >= keep.max(1) {
        served.pop_front();
    }
    served.push_back(read);
}

/// May the duplicate request `asked` be served again? Only when it is a
/// read (or atomic) we served, asked for identically, from no earlier
/// offset than the last repeat, and from the same offset at most
/// `retries` times (a requester that sees no progress gives up after that
/// many tries). Returns what we remembered of it when it may.
fn replay_allowed(served: &mut VecDeque<ServedRead>, asked: &ServedRead, retries: u32) -> Option<ServedRead> {
    let r = served.iter_mut().rev().find(|r| r.psn == asked.psn)?;
    if (r.msg_seq, r.addr, r.handle, r.len) != (asked.msg_seq, asked.addr, asked.handle, asked.len) || asked.resume_off < r.resume_off {
        return None;
    }
    if asked.resume_off > r.resume_off {
        (r.resume_off, r.repeats) = (asked.resume_off, 0);
    }
    r.repeats += 1;
    (r.repeats <= retries.max(1)).then_some(*r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay_allowed_bool(served: &mut VecDeque<ServedRead>, asked: &ServedRead, retries: u32) -> bool {
        replay_allowed(served, asked, retries).is_some()
    }

    fn read(psn: u32, off: u32) -> ServedRead {
        ServedRead { psn, msg_seq: 3, addr: 0x1000, handle: 0xabcd, len: 8192, resume_off: off, repeats: 0, value: None }
    }

    #[test]
    fn a_repeat_is_served_within_the_retry_budget_from_no_earlier_offset() {
        let mut served = VecDeque::new();
        remember_read(&mut served, read(7, 0), 4);
        assert!(!replay_allowed_bool(&mut served, &read(8, 0), 3), "never served");
        assert!(!replay_allowed_bool(&mut served, &ServedRead { handle: 1, ..read(7, 0) }, 3), "another request");
        for _ in 0..3 {
            assert!(replay_allowed_bool(&mut served, &read(7, 0), 3));
        }
        assert!(!replay_allowed_bool(&mut served, &read(7, 0), 3), "past the retry budget");
        assert!(replay_allowed_bool(&mut served, &read(7, 4096), 3), "progress: the budget starts over");
        assert!(!replay_allowed_bool(&mut served, &read(7, 0), 3), "from an earlier offset");
        for psn in 10..14 {
            remember_read(&mut served, read(psn, 0), 4);
        }
        assert!(!replay_allowed_bool(&mut served, &read(7, 4096), 3), "forgotten: older than the reads kept");
        assert_eq!(served.len(), 4);
    }
}
