//! The id-level API (what the C ABI wraps) against a careless program:
//! memory deregistered and unmapped under posted descriptors, waits whose
//! VI or CQ another thread disconnects or destroys, a CQ of another NIC.
//! Two NICs on the in-process loopback wire, connected peer to peer.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use via_user::descriptor::{status, ControlSegment, DataSegment, Pvoid64};
use via_user::{Config, MemAttributes, Nic, Ptag, Reliability, ViAttributes, ViPhase, VipReturn};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));
const MEM: usize = 2 << 20;
const BUF: usize = 4096;

/// Anonymous memory the test maps and unmaps itself.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Mapping {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        Mapping { ptr: p.cast(), len }
    }
    fn at(&self, off: usize) -> usize {
        assert!(off < self.len);
        self.ptr as usize + off
    }
    fn unmap(self) {
        // SAFETY: our own mapping; nothing registered in it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One side: a NIC, a ptag, a registered mapping, a VI (by number).
struct Side {
    nic: Nic,
    ptag: Ptag,
    mem: Mapping,
    mh: u32,
    vi: u16,
}

fn attrs(ptag: Ptag) -> ViAttributes {
    ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false }
}

fn mem_attrs(ptag: Ptag) -> MemAttributes {
    MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }
}

impl Side {
    fn open(wire: &str, progress_thread: bool) -> Side {
        let name = format!("loop:{wire}");
        let dev = via_user::open_device(&name).unwrap();
        let nic = Nic::with_device(&name, dev, Config { progress_thread, ..Config::from_env() }).unwrap();
        let ptag = nic.create_ptag().unwrap();
        let mem = Mapping::new(MEM);
        // SAFETY: the mapping outlives the registration (deregistered in `close`).
        let mh = unsafe { nic.raw().register(mem.at(0), MEM, mem_attrs(ptag)) }.unwrap();
        let vi = nic.raw().vi_create(&attrs(ptag), None, None).unwrap();
        Side { nic, ptag, mem, mh, vi }
    }

    fn desc(&self, i: usize) -> usize {
        self.mem.at(64 * i)
    }

    fn buf(&self, i: usize) -> usize {
        self.mem.at(65536 + BUF * i)
    }

    /// Registers a mapping of its own (to take away later).
    fn register(&self, m: &Mapping) -> u32 {
        // SAFETY: deregistered before the test unmaps it.
        unsafe { self.nic.raw().register(m.at(0), m.len, mem_attrs(self.ptag)) }.unwrap()
    }

    fn close(self) {
        self.nic.raw().vi_disconnect(self.vi).unwrap();
        while self.nic.raw().vi_done(self.vi, true).unwrap().is_some() {}
        while self.nic.raw().vi_done(self.vi, false).unwrap().is_some() {}
        self.nic.raw().vi_destroy(self.vi).unwrap();
        self.nic.raw().deregister(self.mem.at(0), self.mh).unwrap();
        self.mem.unmap();
    }
}

/// Writes a one-segment send/receive descriptor at `at`.
fn fill(at: usize, data: usize, handle: u32, len: u32) {
    let cs = ControlSegment { seg_count: 1, length: len, ..Default::default() };
    let ds = DataSegment { data: Pvoid64 { address_bits: data as u64 }, handle, length: len };
    // SAFETY: `at` is 64-byte aligned registered memory of the test with
    // room for a descriptor of one segment.
    unsafe {
        std::ptr::write_volatile(at as *mut ControlSegment, cs);
        std::ptr::write_volatile((at + 32) as *mut DataSegment, ds);
    }
}

fn status_at(desc: usize) -> u32 {
    // SAFETY: a descriptor of the test, still mapped.
    unsafe { std::ptr::read_volatile(desc as *const ControlSegment) }.status
}

/// Connects a's VI with b's, polling both (no progress thread needed).
fn connect(a: &Side, b: &Side) {
    let (ma, mb) = (a.nic.mac(), b.nic.mac());
    a.nic.raw().vi_peer_request(a.vi, mb, b"a", b"b", T).unwrap();
    b.nic.raw().vi_peer_request(b.vi, ma, b"b", b"a", T).unwrap();
    let (mut da, mut db) = (false, false);
    while !(da && db) {
        da = da || a.nic.raw().vi_peer_done(a.vi).unwrap();
        db = db || b.nic.raw().vi_peer_done(b.vi).unwrap();
    }
}

#[test]
fn a_cq_of_another_nic_is_refused() {
    let a = Nic::open("loop:misuse-cq").unwrap();
    let b = Nic::open("loop:misuse-cq").unwrap();
    let ptag = a.create_ptag().unwrap();
    let (cq_a, cq_b) = (a.create_cq(4).unwrap(), b.create_cq(4).unwrap());
    assert_eq!(cq_a.id(), cq_b.id(), "both CQs have the same number on their NIC");
    for (s, r) in [(Some(&cq_b), None), (None, Some(&cq_b)), (Some(&cq_a), Some(&cq_b))] {
        let e = a.create_vi(&attrs(ptag), s, r).err().expect("a CQ of another NIC is refused");
        assert_eq!(e.code, VipReturn::InvalidParameter, "{e}");
    }
    a.create_vi(&attrs(ptag), Some(&cq_a), Some(&cq_a)).unwrap();
}

#[test]
fn a_receive_whose_memory_is_deregistered_completes_with_a_protection_error() {
    let a = Side::open("misuse-recv", true);
    let b = Side::open("misuse-recv", true);
    // r1: descriptor and buffer deregistered and unmapped; r2: its buffer
    // deregistered (still mapped); r3: untouched.
    let gone = Mapping::new(2 * BUF);
    let mgone = b.register(&gone);
    fill(gone.at(0), gone.at(BUF), mgone, BUF as u32);
    b.nic.raw().vi_post(b.vi, gone.at(0), mgone, false).unwrap();
    let dereg = Mapping::new(BUF);
    let mdereg = b.register(&dereg);
    fill(b.desc(2), dereg.at(0), mdereg, BUF as u32);
    b.nic.raw().vi_post(b.vi, b.desc(2), b.mh, false).unwrap();
    fill(b.desc(3), b.buf(3), b.mh, BUF as u32);
    b.nic.raw().vi_post(b.vi, b.desc(3), b.mh, false).unwrap();
    connect(&a, &b);
    let r1 = gone.at(0);
    b.nic.raw().deregister(gone.at(0), mgone).unwrap();
    gone.unmap();
    b.nic.raw().deregister(dereg.at(0), mdereg).unwrap();

    for i in 1..=3 {
        // SAFETY: a buffer in a's registered mapping.
        unsafe { std::ptr::write_bytes(a.buf(i) as *mut u8, b'A' + i as u8, 100) };
        fill(a.desc(i), a.buf(i), a.mh, 100);
        a.nic.raw().vi_post(a.vi, a.desc(i), a.mh, true).unwrap();
    }
    assert_eq!(b.nic.raw().vi_wait(b.vi, false, T).unwrap(), r1, "completed; nowhere to write its status");
    assert_eq!(b.nic.raw().vi_wait(b.vi, false, T).unwrap(), b.desc(2));
    assert_eq!(status_at(b.desc(2)) & (status::DONE | status::ERROR_MASK), status::DONE | status::PROTECTION_ERROR);
    // SAFETY: still mapped (only deregistered).
    assert!(unsafe { std::slice::from_raw_parts(dereg.ptr, BUF) }.iter().all(|&x| x == 0), "nothing written into deregistered memory");
    assert_eq!(b.nic.raw().vi_wait(b.vi, false, T).unwrap(), b.desc(3));
    assert_eq!(status_at(b.desc(3)), status::DONE | status::OP_RECEIVE);
    for i in 1..=3 {
        assert_eq!(a.nic.raw().vi_wait(a.vi, true, T).unwrap(), a.desc(i));
        assert_eq!(status_at(a.desc(i)) & status::ERROR_MASK, 0);
    }
    assert_eq!(b.nic.raw().vi_query(b.vi).unwrap().0, ViPhase::Connected);
    dereg.unmap();
    a.close();
    b.close();
}

#[test]
fn a_send_whose_buffer_is_deregistered_completes_alone_with_a_protection_error() {
    // No progress threads: the sends behind two 1 MiB messages (which
    // fill the window at once: 1,024 frames) are still unsent when their
    // buffer goes.
    let a = Side::open("misuse-send", false);
    let b = Side::open("misuse-send", false);
    const BIG: usize = 1 << 20;
    fill(b.desc(0), b.mem.at(BIG), b.mh, BIG as u32);
    fill(b.desc(4), b.mem.at(BIG), b.mh, BIG as u32);
    fill(b.desc(1), b.buf(1), b.mh, BUF as u32);
    fill(b.desc(2), b.buf(2), b.mh, BUF as u32);
    for i in [0, 4, 1, 2] {
        b.nic.raw().vi_post(b.vi, b.desc(i), b.mh, false).unwrap();
    }
    connect(&a, &b);
    let gone = Mapping::new(BUF);
    let mgone = a.register(&gone);
    fill(a.desc(4), a.mem.at(BIG), a.mh, BIG as u32);
    fill(a.desc(1), a.mem.at(BIG), a.mh, BIG as u32);
    fill(a.desc(2), gone.at(0), mgone, 5);
    fill(a.desc(3), a.buf(3), a.mh, 6);
    for i in [4, 1, 2, 3] {
        a.nic.raw().vi_post(a.vi, a.desc(i), a.mh, true).unwrap();
    }
    a.nic.raw().deregister(gone.at(0), mgone).unwrap();
    gone.unmap();

    let (mut sent, mut got) = (Vec::new(), Vec::new());
    while sent.len() < 4 || got.len() < 3 {
        sent.extend(a.nic.raw().vi_done(a.vi, true).unwrap());
        got.extend(b.nic.raw().vi_done(b.vi, false).unwrap());
    }
    assert_eq!(sent, vec![a.desc(4), a.desc(1), a.desc(2), a.desc(3)]);
    assert_eq!(status_at(a.desc(1)), status::DONE | status::OP_SEND);
    assert_eq!(status_at(a.desc(2)), status::DONE | status::OP_SEND | status::PROTECTION_ERROR);
    assert_eq!(status_at(a.desc(3)), status::DONE | status::OP_SEND);
    assert_eq!(got, vec![b.desc(0), b.desc(4), b.desc(1)], "the refused send sent nothing");
    assert_eq!(status_at(b.desc(1)), status::DONE | status::OP_RECEIVE);
    assert_eq!(a.nic.raw().vi_query(a.vi).unwrap().0, ViPhase::Connected);
    a.close();
    b.close();
}

/// A thread in a wait.
struct Waiter<R>(std::sync::mpsc::Receiver<R>);

impl<R> Waiter<R> {
    /// What the wait returned. (A watchdog, not a timing check: without
    /// the wake-up the wait never returns, and the test fails instead of
    /// hanging.)
    fn join(self) -> R {
        self.0.recv_timeout(Duration::from_secs(30)).expect("the waiting thread was never woken")
    }
}

/// Runs `wait` on a thread and returns once that thread sleeps in it (in
/// ppoll, as /proc/self/task/TID/syscall shows): what follows must wake it.
fn start_waiter<R: Send + 'static>(wait: impl FnOnce() -> R + Send + 'static) -> Waiter<R> {
    let tid = Arc::new(AtomicI32::new(0));
    let t2 = Arc::clone(&tid);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        t2.store(unsafe { libc::gettid() }, Ordering::SeqCst);
        let _ = tx.send(wait());
    });
    let tid = loop {
        match tid.load(Ordering::SeqCst) {
            0 => std::thread::yield_now(),
            t => break t,
        }
    };
    let want = format!("{} ", libc::SYS_ppoll);
    while !std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).unwrap_or_default().starts_with(&want) {
        std::thread::yield_now();
    }
    Waiter(rx)
}

#[test]
fn waits_end_when_another_thread_disconnects_or_destroys() {
    let a = Side::open("misuse-wake", true);
    let b = Side::open("misuse-wake", true);
    fill(a.desc(0), a.buf(0), a.mh, BUF as u32);
    a.nic.raw().vi_post(a.vi, a.desc(0), a.mh, false).unwrap();
    connect(&a, &b);

    // RecvWait, then a disconnect: the flushed receive.
    let (nic, vi) = (a.nic.clone(), a.vi);
    let w = start_waiter(move || nic.raw().vi_wait(vi, false, None));
    a.nic.raw().vi_disconnect(a.vi).unwrap();
    assert_eq!(w.join().unwrap(), a.desc(0));
    assert_eq!(status_at(a.desc(0)), status::DONE | status::OP_RECEIVE | status::DESC_FLUSHED_ERROR);

    // SendWait / RecvWait, then a destroy: INVALID_STATE.
    for send in [true, false] {
        let id = a.nic.raw().vi_create(&attrs(a.ptag), None, None).unwrap();
        let nic = a.nic.clone();
        let w = start_waiter(move || nic.raw().vi_wait(id, send, None));
        a.nic.raw().vi_destroy(id).unwrap();
        assert_eq!(w.join().unwrap_err().code, VipReturn::InvalidState);
    }

    // CQWait, then a disconnect flushing a receive onto it; then a destroy.
    let cq = a.nic.raw().cq_create(4).unwrap();
    let id = a.nic.raw().vi_create(&attrs(a.ptag), None, Some(cq)).unwrap();
    fill(a.desc(1), a.buf(1), a.mh, BUF as u32);
    a.nic.raw().vi_post(id, a.desc(1), a.mh, false).unwrap();
    let nic = a.nic.clone();
    let w = start_waiter(move || nic.raw().cq_wait(cq, None));
    a.nic.raw().vi_disconnect(id).unwrap();
    assert_eq!(w.join().unwrap(), (id, true));
    assert_eq!(a.nic.raw().vi_done(id, false).unwrap(), Some(a.desc(1)));
    a.nic.raw().vi_destroy(id).unwrap();
    let nic = a.nic.clone();
    let w = start_waiter(move || nic.raw().cq_wait(cq, None));
    a.nic.raw().cq_destroy(cq).unwrap();
    assert_eq!(w.join().unwrap_err().code, VipReturn::InvalidState);

    a.close();
    b.close();
}
