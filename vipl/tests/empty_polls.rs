//! An empty poll allocates nothing: `VipSendDone`, `VipRecvDone` and
//! `VipCQDone` with nothing completed answer `VIP_NOT_DONE` without a
//! single heap allocation on the calling thread (a C program polling a CQ
//! makes this call millions of times). Counted by a global allocator that
//! counts per thread, so the NIC's background progress thread does not
//! disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::os::raw::c_void;
use std::ptr::null_mut;
use vipl::api::*;
use vipl::types::*;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; counting touches only a
// const-initialised thread-local Cell (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

const SUCCESS: VipReturnCode = 0;
const NOT_DONE: VipReturnCode = 1;

#[test]
fn empty_polls_allocate_nothing() {
    // SAFETY (all calls): pointers to locals of the right types, handles
    // the calls returned.
    unsafe {
        let mut nic: VipHandle = null_mut();
        assert_eq!(VipOpenNic(c"/dev/via_lo".as_ptr(), &mut nic), SUCCESS);
        let mut ptag: VipHandle = null_mut();
        assert_eq!(VipCreatePtag(nic, &mut ptag), SUCCESS);
        let mut cq: VipHandle = null_mut();
        assert_eq!(VipCreateCQ(nic, 16, &mut cq), SUCCESS);
        let attrs = VipViAttributes { reliability_level: 2, max_transfer_size: 4096, qos: null_mut(), ptag, enable_rdma_write: VIP_FALSE, enable_rdma_read: VIP_FALSE };
        let mut vi: VipHandle = null_mut();
        assert_eq!(VipCreateVi(nic, &attrs, null_mut(), cq, &mut vi), SUCCESS);

        let mut desc: *mut c_void = null_mut();
        let mut which: VipHandle = null_mut();
        let mut recv: VipBoolean = 0;
        // Warm up: thread-locals, lazily made tables, the first progress round.
        for _ in 0..100 {
            assert_eq!(VipSendDone(vi, &mut desc), NOT_DONE);
            assert_eq!(VipRecvDone(vi, &mut desc), NOT_DONE);
            assert_eq!(VipCQDone(cq, &mut which, &mut recv), NOT_DONE);
        }
        let before = allocations();
        for _ in 0..10_000 {
            assert_eq!(VipSendDone(vi, &mut desc), NOT_DONE);
            assert_eq!(VipRecvDone(vi, &mut desc), NOT_DONE);
            assert_eq!(VipCQDone(cq, &mut which, &mut recv), NOT_DONE);
        }
        let made = allocations() - before;
        assert_eq!(made, 0, "30,000 empty polls made {made} heap allocations");

        assert_eq!(VipDestroyVi(vi), SUCCESS);
        assert_eq!(VipDestroyCQ(cq), SUCCESS);
        assert_eq!(VipDestroyPtag(nic, ptag), SUCCESS);
        assert_eq!(VipCloseNic(nic), SUCCESS);
    }
}

#[test]
fn the_counter_sees_this_threads_allocations() {
    let before = allocations();
    let v = std::hint::black_box(vec![1u8; 100]);
    drop(v);
    assert_eq!(allocations() - before, 1);
}
