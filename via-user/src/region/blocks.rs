//! Registered blocks that the Rust API's [`Descriptor`]s are carved from.
//!
//! Registering memory is a call into the device: on a VFIO NIC an IOMMU
//! mapping (a system call, and in a guest an exit to the hypervisor's
//! emulated IOMMU). A descriptor is 64-128 bytes, and when each had a
//! registration of its own, a sender that ran out of spare descriptors
//! paid a mapping per message: in the tulip guest's bandwidth bench the
//! mappings were most of the time (VIA/raw 0.33 with them, 0.65 with the
//! descriptors made before the clock started).
//!
//! A [`Block`] holds descriptors of one NIC, size and protection tag
//! under one registration. A descriptor's [`Slot`] goes back to its block
//! when the descriptor is dropped; the block is deregistered when its last
//! slot goes. The list of blocks keeps only weak references, so a block
//! never outlives the descriptors made from it. (The list is one for the
//! process, each block filed under its NIC: a list inside the NIC would
//! make the NIC's module depend on this one, which depends on the NIC's.
//! A live block holds its NIC, so a NIC named by a live block is never
//! one that went away and whose address was taken again.)
//!
//! [`Descriptor`]: super::Descriptor

use super::MemoryRegion;
use crate::descriptor::DESCRIPTOR_ALIGNMENT;
use crate::error::Result;
use crate::nic::Nic;
use std::sync::{Arc, Mutex, Weak};
use via_kernel_agent::memory::{MemAttributes, Ptag};

/// Bytes of one block: descriptors of two or three segments are 128
/// bytes apart, so 128 of them per registration.
const BLOCK_BYTES: usize = 16 << 10;

/// Descriptors of one size and tag under one registration.
pub(crate) struct Block {
    region: MemoryRegion,
    ptag: Ptag,
    /// Bytes from one slot to the next (a multiple of the alignment).
    stride: usize,
    /// Slots not in use, by index.
    free: Mutex<Vec<u16>>,
}

/// The memory of one descriptor: a slot of a block, returned when dropped.
pub(crate) struct Slot {
    block: Arc<Block>,
    addr: usize,
}

impl Slot {
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    pub(crate) fn handle(&self) -> u32 {
        self.block.region.handle()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let index = (self.addr - self.block.region.as_ptr() as usize) / self.block.stride;
        self.block.free.lock().unwrap_or_else(|p| p.into_inner()).push(index as u16);
    }
}

/// Every live block, with the NIC it is registered on (see the module's
/// comment), as weak references.
static BLOCKS: Mutex<Vec<(usize, Weak<Block>)>> = Mutex::new(Vec::new());

/// A zeroed slot of at least `bytes` under `ptag` on `nic`: a free one of
/// a live block, or the first of a new block registered there.
pub(crate) fn take(nic: &Nic, ptag: Ptag, bytes: usize) -> Result<Slot> {
    let stride = bytes.next_multiple_of(DESCRIPTOR_ALIGNMENT);
    let on = Arc::as_ptr(&nic.shared) as usize;
    let mut blocks = BLOCKS.lock().unwrap_or_else(|p| p.into_inner());
    blocks.retain(|(_, w)| w.strong_count() > 0);
    for block in blocks.iter().filter(|(n, _)| *n == on).filter_map(|(_, w)| w.upgrade()) {
        if block.ptag != ptag || block.stride != stride {
            continue;
        }
        let index = block.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(index) = index {
            let addr = block.region.as_ptr() as usize + index as usize * stride;
            // SAFETY: the slot lies inside the block's region (index <
            // slots) and nobody else holds it (it was on the free list).
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0, stride) };
            return Ok(Slot { block, addr });
        }
    }
    let slots = (BLOCK_BYTES / stride).clamp(1, u16::MAX as usize);
    let attrs = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
    let region = MemoryRegion::new(nic, slots * stride, 4096.max(DESCRIPTOR_ALIGNMENT), attrs)?;
    // Slot 0 is taken now; the rest go out in address order.
    let free = (1..slots as u16).rev().collect();
    let block = Arc::new(Block { region, ptag, stride, free: Mutex::new(free) });
    blocks.push((on, Arc::downgrade(&block)));
    let addr = block.region.as_ptr() as usize;
    Ok(Slot { block, addr })
}
