//! Closing a NIC is synchronous: when its last handle is dropped, its
//! progress thread has ended and its file descriptors are closed. (Alone
//! in its test binary: it counts the process's threads and fds.)

use std::time::Duration;
use via_user::{Nic, Reliability, ViAttributes};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Two NICs, a connected VI pair, a message; then everything dropped.
fn cycle() {
    let a = Nic::open("loop:close").unwrap();
    let b = Nic::open("loop:close").unwrap();
    let pa = a.create_ptag().unwrap();
    let pb = b.create_ptag().unwrap();
    let attrs = |ptag| ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 4096, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mut va = a.create_vi(&attrs(pa), None, None).unwrap();
    let mut vb = b.create_vi(&attrs(pb), None, None).unwrap();
    let t = Some(Duration::from_secs(10));
    va.connect_peer_request(b.mac(), b"a", b"b", t).unwrap();
    vb.connect_peer_request(a.mac(), b"b", b"a", t).unwrap();
    va.connect_peer_wait().unwrap();
    vb.connect_peer_wait().unwrap();
}

/// The threads of this process once every exiting one has left
/// `/proc/self/task`: a joined thread has ended (it woke its joiner on its
/// way out of the kernel, CLONE_CHILD_CLEARTID), but the kernel removes
/// its task entry a moment later, so a count right after the join may
/// still see it (CI saw 3 threads for 2 once in a few hundred cycles). A
/// thread that really remains still counts after the 2 s.
fn threads_settled(want: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let n = threads();
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::yield_now();
    }
}

#[test]
fn dropping_the_last_handle_ends_the_progress_thread_and_closes_the_fds() {
    cycle(); // first-use allocations
    let (t0, f0) = (threads(), fds());
    for i in 0..20 {
        cycle();
        // The descriptors are closed by the time the drop returns.
        assert_eq!(fds(), f0, "after cycle {i}: fds of closed NICs remain");
        assert_eq!(threads_settled(t0), t0, "after cycle {i}: threads of closed NICs remain");
    }
}
