//! Shared receive queues (an extension): a pool of posted receive
//! descriptors that many VIs draw from, so that a process need not post
//! receives on every VI for the most any one peer may send.
//!
//! A VI that uses a pool has nothing posted on its own receive queue. When
//! a message needs a receive there (`Context::begin_message`), the pool's
//! oldest descriptor moves into the VI's queue, as if posted there, and
//! everything after is what a receive posted on the VI goes through:
//! placement, completion in the VI's order, its CQ, its `RecvDone` and
//! `RecvWait`, flushing when it disconnects. An empty pool is a VI with no
//! receive posted: the connection breaks, or in receiver-not-ready mode
//! the sender is told to wait.

use super::post::Queue;
use super::{vi_at, Context, Core};
use crate::error::{Result, ViaError, VipReturn};
use crate::usermem;
use crate::vi::{Reliability, ViAttributes, ViPhase, ViState};
use crate::workqueue::WorkQueue;
use via_kernel_agent::memory::Ptag;

/// Most shared receive queues one NIC handle can hold.
pub const MAX_SRQ: usize = 256;

/// One pool of posted receives, all under one protection tag.
pub struct SharedReceiveQueue {
    pub ptag: Ptag,
    entries: WorkQueue,
    /// VIs drawing from it (it may not be destroyed while any does).
    pub users: u32,
}

impl SharedReceiveQueue {
    /// Receives posted and not yet taken.
    fn len(&self) -> usize {
        self.entries.outstanding()
    }
}

/// Pool `id` of `srqs` (borrowing only the pools, so the registration
/// table stays usable alongside).
fn srq_at(srqs: &mut [Option<SharedReceiveQueue>], id: u16) -> Result<&mut SharedReceiveQueue> {
    srqs.get_mut((id as usize).wrapping_sub(1)).and_then(Option::as_mut).ok_or_else(|| ViaError::invalid(format!("no shared receive queue with handle {id}")))
}

impl Core {
    /// Creates a pool of up to `depth` receives under `ptag`.
    pub fn create_srq(&mut self, ptag: Ptag, depth: usize) -> Result<u16> {
        if depth == 0 || depth > super::MAX_CQ_ENTRIES {
            return Err(ViaError::invalid(format!("a shared receive queue holds 1 to {} descriptors, not {depth}", super::MAX_CQ_ENTRIES)));
        }
        self.mem.acquire_ptag(ptag).map_err(|_| ViaError::new(VipReturn::InvalidPtag, "unknown protection tag"))?;
        let Some(slot) = super::vacant_slot(&mut self.srqs, MAX_SRQ) else {
            self.mem.release_ptag(ptag);
            return Err(ViaError::resource(format!("too many shared receive queues ({MAX_SRQ})")));
        };
        self.srqs[slot] = Some(SharedReceiveQueue { ptag, entries: WorkQueue::new(depth), users: 0 });
        Ok(slot as u16 + 1)
    }

    /// Destroys pool `id`; refused while a VI draws from it. Receives
    /// still in it are dropped (their descriptors never complete).
    pub fn destroy_srq(&mut self, id: u16) -> Result<()> {
        let q = self.srq_mut(id)?;
        if q.users != 0 {
            return Err(ViaError::state(format!("{} VIs still draw from this shared receive queue", q.users)));
        }
        let ptag = q.ptag;
        self.srqs[id as usize - 1] = None;
        self.mem.release_ptag(ptag);
        Ok(())
    }

    fn srq_mut(&mut self, id: u16) -> Result<&mut SharedReceiveQueue> {
        srq_at(&mut self.srqs, id)
    }

    /// Posts the receive descriptor at `addr` (memory `handle`) to pool
    /// `id`. A descriptor that is not a valid receive under the pool's tag
    /// is refused here (DESCRIPTOR_ERROR), since no VI is there to
    /// complete it with its error.
    pub fn srq_post(&mut self, id: u16, addr: usize, handle: u32) -> Result<()> {
        let Core { cx, .. } = self;
        let Context { mem, srqs, .. } = cx;
        let q = srq_at(srqs, id)?;
        let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: super::MAX_TRANSFER_SIZE, ptag: q.ptag, enable_rdma_write: false, enable_rdma_read: false };
        let capacity = q.entries.capacity();
        let Some(e) = q.entries.vacant() else {
            return Err(ViaError::resource(format!("shared receive queue full ({capacity} descriptors posted)")));
        };
        Self::validate(mem, &attrs, addr, handle, Queue::Recv, e)?;
        if e.pre_status != 0 {
            let bits = e.pre_status;
            return Err(ViaError::new(VipReturn::DescriptorError, format!("not a receive descriptor the shared queue can take (it would complete with status {bits:#x})")));
        }
        // SAFETY: `validate` checked the control segment under the engine lock.
        unsafe { usermem::clear_completion(addr) };
        q.entries.commit();
        Ok(())
    }

    /// Makes VI `vi` draw its receives from pool `srq`: an idle VI with
    /// nothing posted on its receive queue, under the pool's tag.
    pub fn vi_use_srq(&mut self, vi: u16, srq: u16) -> Result<()> {
        let ptag = self.srq_mut(srq)?.ptag;
        let v = self.vi_mut(vi)?;
        if v.phase != ViPhase::Idle || !v.rq.is_empty() || v.srq.is_some() {
            return Err(ViaError::state("a VI takes a shared receive queue while idle, with no receive posted and no pool yet"));
        }
        if v.attrs.ptag != ptag {
            return Err(ViaError::new(VipReturn::InvalidPtag, "the VI and the shared receive queue have different protection tags"));
        }
        v.srq = Some(srq);
        self.srq_mut(srq)?.users += 1;
        Ok(())
    }

    /// VI `id` no longer draws from its pool (it is being destroyed).
    pub(super) fn vi_leave_srq(&mut self, id: u16) {
        let Some(srq) = vi_at(&mut self.vis, id).and_then(|v| v.srq.take()) else { return };
        if let Ok(q) = self.srq_mut(srq) {
            q.users = q.users.saturating_sub(1);
        }
    }

    /// Receives waiting in pool `id`.
    pub fn srq_len(&mut self, id: u16) -> Result<usize> {
        Ok(self.srq_mut(id)?.len())
    }
}

impl Context {
    /// A message needs a receive on `vi`, which has none posted: the
    /// oldest of its pool's moves into its receive queue. False when it
    /// has no pool, or the pool is empty.
    pub(super) fn refill_from_srq(&mut self, vi: &mut ViState) -> bool {
        let Some(q) = vi.srq.and_then(|id| srq_at(&mut self.srqs, id).ok()) else { return false };
        let Some(e) = q.entries.take_oldest() else { return false };
        vi.rq.push(e)
    }
}
