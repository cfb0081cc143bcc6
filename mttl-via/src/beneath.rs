//! The transport's operations bare, without the runtime's layers around
//! them: what `mttl-bench` holds MTTL's own operations against ("the VIA
//! operation beneath it"). Not for programs: they bypass the scheduler.

use crate::runtime::{fatal, with};

/// One RDMA read of `len` bytes at heap offset `off` of process `pe` into
/// a block of this process's heap, posted and waited for in place (the
/// transport polled until it completes). None where the transport has no
/// RDMA reads (TCP) or the heap has no room; Some(false) if the transport
/// refused the range.
pub fn rdma_read(pe: usize, off: u64, len: usize) -> Option<bool> {
    with(|rt| {
        rt.comm.bulk()?;
        let landing = rt.heap.alloc(len)?;
        let r = match rt.comm.bulk().expect("checked above").get(pe, off as usize, landing as usize, len) {
            Ok(h) => {
                while !rt.comm.senddone(h).unwrap_or_else(|e| fatal(e)) {}
                true
            }
            Err(_) => false,
        };
        rt.heap.free(landing);
        Some(r)
    })
}
