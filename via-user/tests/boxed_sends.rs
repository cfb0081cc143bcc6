//! Sends between processes of one host's shared-memory wire go boxed
//! (`engine::boxed`): a 40-byte header and the payload in the receiver's
//! ring, completed once the receiver says it placed them (in a reply's
//! header, or in a word of shared memory). These tests pin
//! what VIA keeps on that path: the bytes and immediate data arrive; a
//! reliable send completes only once placed (not when it entered the
//! ring); one that meets no receive is flushed; and a framed operation
//! posted behind boxed sends completes behind them. Two NICs of one
//! process on one wire, no progress thread: each side moves only when
//! the test drives it.

use std::time::Duration;
use via_user::descriptor::status;
use via_user::{Config, Cq, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, Vi, ViAttributes};
// The software drivers (shared memory), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

mod common;
use common::Wire;

struct End {
    nic: Nic,
    vi: Vi,
    mem: MemoryRegion,
    ptag: via_user::Ptag,
    /// The CQ its sends complete on, if it has one.
    send_cq: Option<Cq>,
}

impl End {
    fn desc(&self, range: std::ops::Range<usize>, imm: Option<u32>) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set(&[(&self.mem, range)], imm).unwrap();
        d
    }

    fn count(&self, name: &str) -> u64 {
        self.nic.counters().pairs().into_iter().find(|(k, _)| *k == name).map(|(_, v)| v).unwrap()
    }
}

/// Two connected ends on wire `wire`: `a` connected to `b`.
fn pair(wire: &Wire, reliability: Reliability) -> (End, End) {
    pair_with(wire, reliability, false)
}

/// [`pair`], each end's sends completing on a CQ if `send_cqs`.
fn pair_with(wire: &Wire, reliability: Reliability, send_cqs: bool) -> (End, End) {
    pair_sized(wire, reliability, send_cqs, 8192, 4096)
}

/// [`pair_with`], each end with `mem` bytes of registered memory and a
/// MaxTransferSize of `max_transfer`.
fn pair_sized(wire: &Wire, reliability: Reliability, send_cqs: bool, mem: usize, max_transfer: u32) -> (End, End) {
    let end = || {
        let config = Config { progress_thread: false, ..Config::default() };
        // Copying, not lending: a large send goes as fragments, as
        // these tests need (a lent message would go whole, one frame).
        let dev = via_softnic::ShmDevice::open(&format!("{},lend=off", wire.0), None).unwrap();
        let nic = Nic::with_device("shm", Box::new(dev), config).unwrap();
        let ptag = nic.create_ptag().unwrap();
        let attrs = ViAttributes { reliability, max_transfer_size: max_transfer, ptag, enable_rdma_write: true, enable_rdma_read: false };
        let send_cq = send_cqs.then(|| nic.create_cq(64).unwrap());
        let vi = nic.create_vi(&attrs, send_cq.as_ref(), None).unwrap();
        let mem = MemoryRegion::new(&nic, mem, 4096, MemAttributes { ptag, enable_rdma_write: true, enable_rdma_read: false }).unwrap();
        End { nic, vi, mem, ptag, send_cq }
    };
    let (mut a, b) = (end(), end());
    let bmac = b.nic.mac();
    let server = std::thread::spawn(move || {
        let req = b.nic.connect_wait(b"boxed", T).unwrap();
        b.nic.accept(&req, &b.vi).unwrap();
        b
    });
    a.vi.connect_retrying(bmac, b"boxed", T.unwrap()).unwrap();
    (a, server.join().unwrap())
}

fn wire(name: &str) -> Wire {
    Wire::new(&format!("boxed-{name}"))
}

#[test]
fn sends_to_a_process_on_the_wire_go_boxed_and_arrive_whole() {
    let w = wire("whole");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    for r in [0..100, 100..200] {
        b.vi.post_recv(b.desc(r, None)).unwrap();
    }
    a.mem.write(0, b"hello, boxed world").unwrap();
    let before = a.count("tx_frames");
    a.vi.post_send(a.desc(0..18, Some(0xfeed))).unwrap();
    a.vi.post_send(a.desc(0..0, None)).unwrap();
    let r = b.vi.recv_wait(T).unwrap();
    r.check_ok().unwrap();
    assert_eq!((r.length(), r.immediate()), (18, Some(0xfeed)));
    assert_eq!(b.mem.to_vec(0..18).unwrap(), b"hello, boxed world");
    let r = b.vi.recv_wait(T).unwrap();
    r.check_ok().unwrap();
    assert_eq!((r.length(), r.immediate()), (0, None));
    for _ in 0..2 {
        a.vi.send_wait(T).unwrap().check_ok().unwrap();
    }
    assert_eq!((a.count("tx_boxed"), b.count("rx_boxed")), (2, 2));
    assert_eq!(a.count("tx_frames"), before, "no frame went: no data, no ACK");
    assert_eq!(b.count("acks_sent"), 0);
}

#[test]
fn a_reliable_boxed_send_completes_only_once_placed() {
    let w = wire("placed");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    a.vi.post_send(a.desc(0..64, None)).unwrap();
    // In b's ring, not placed: b has not looked.
    for _ in 0..1000 {
        a.nic.progress();
        assert!(a.vi.send_done().unwrap().is_none(), "a boxed send completed before its receiver placed it");
    }
    b.vi.recv_wait(T).unwrap().check_ok().unwrap();
    a.vi.send_wait(T).unwrap().check_ok().unwrap();
    assert_eq!(a.count("tx_boxed"), 1);
}

#[test]
fn an_unreliable_boxed_send_completes_on_the_wire() {
    let w = wire("unrel");
    let (mut a, mut b) = pair(&w, Reliability::Unreliable);
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    a.vi.post_send(a.desc(0..64, None)).unwrap();
    a.vi.send_done().unwrap().expect("complete at once").check_ok().unwrap();
    b.vi.recv_wait(T).unwrap().check_ok().unwrap();
    assert_eq!((a.count("tx_boxed"), b.count("rx_boxed")), (1, 1));
}

#[test]
fn a_boxed_send_that_meets_no_receive_is_flushed() {
    let w = wire("norecv");
    let (mut a, b) = pair(&w, Reliability::ReliableDelivery);
    a.vi.post_send(a.desc(0..64, None)).unwrap();
    // b takes it with no receive posted: the connection breaks.
    while b.count("rx_no_receive_posted") == 0 {
        b.nic.progress();
    }
    let d = a.vi.send_wait(T).unwrap();
    assert!(d.errors() & status::DESC_FLUSHED_ERROR != 0, "the send that was never placed completes flushed, not {:#x}", d.status());
}

#[test]
fn a_framed_write_behind_boxed_sends_completes_behind_them() {
    let w = wire("order");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    let target = b.mem.remote(4096..4160).unwrap();
    a.mem.write(0, &[7u8; 64]).unwrap();
    a.vi.post_send(a.desc(0..32, None)).unwrap();
    let mut write = Descriptor::new(&a.nic, a.ptag, 2).unwrap();
    write.set_op(Op::RdmaWrite(target), &[(&a.mem, 0..64)], None, false).unwrap();
    a.vi.post_send(write).unwrap();
    // Both sides driven here (no progress threads): b places, writes and
    // acknowledges; a completes in posting order.
    let start = std::time::Instant::now();
    let mut done = Vec::new();
    while done.len() < 2 {
        assert!(start.elapsed() < T.unwrap(), "completed {} of 2", done.len());
        b.nic.progress();
        a.nic.progress();
        while let Some(d) = a.vi.send_done().unwrap() {
            d.check_ok().unwrap();
            done.push(d.length());
        }
    }
    assert_eq!(done, [32, 64], "the boxed send first, then the write");
    b.vi.recv_done().unwrap().expect("the send was placed").check_ok().unwrap();
    assert_eq!(b.mem.to_vec(4096..4160).unwrap(), vec![7u8; 64]);
    assert_eq!(a.count("tx_boxed"), 1, "the write went as frames");
}

/// The accepting side does not box before it heard its peer on the
/// connection: the peer may not have taken the acceptance yet, would drop
/// a boxed message as stale, and none is ever sent again (a frame is).
#[test]
fn the_accepting_side_boxes_only_once_it_heard_its_peer() {
    let w = wire("heard");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    for r in [0..64, 64..128] {
        a.vi.post_recv(a.desc(r, None)).unwrap();
    }
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    b.vi.post_send(b.desc(0..64, None)).unwrap();
    assert_eq!(b.count("tx_boxed"), 0, "the acceptor's first send went boxed");
    a.vi.recv_wait(T).unwrap().check_ok().unwrap();
    // a was answered when it connected: it boxes at once.
    a.vi.post_send(a.desc(0..64, None)).unwrap();
    assert_eq!(a.count("tx_boxed"), 1);
    b.vi.recv_wait(T).unwrap().check_ok().unwrap();
    // a's boxed send carried the ACK of b's framed one (nobody drives
    // a's timers here: without it b would time out).
    b.vi.send_wait(T).unwrap().check_ok().unwrap();
    // b has heard a now.
    b.vi.post_send(b.desc(0..64, None)).unwrap();
    assert_eq!(b.count("tx_boxed"), 1);
    a.vi.recv_wait(T).unwrap().check_ok().unwrap();
}

/// In a ping-pong each boxed message says in its header what its sender
/// placed of the other's, so every send completes by the reply it got,
/// and no placed word is read (each read pulls the word's cache line
/// away from the receiver about to store it).
#[test]
fn a_reply_completes_the_send_it_answers_without_reading_the_placed_word() {
    let w = wire("reply");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    a.vi.post_recv(a.desc(0..64, None)).unwrap();
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    for i in 0..100 {
        a.vi.post_send(a.desc(64..128, None)).unwrap();
        let r = b.vi.recv_wait(T).unwrap();
        r.check_ok().unwrap();
        b.vi.post_recv(r).unwrap();
        if i > 0 {
            // b's previous send was answered by this ping.
            b.vi.send_done().unwrap().expect("b's send, completed by a's ping").check_ok().unwrap();
        }
        b.vi.post_send(b.desc(64..128, None)).unwrap();
        let r = a.vi.recv_wait(T).unwrap();
        r.check_ok().unwrap();
        a.vi.post_recv(r).unwrap();
        a.vi.send_done().unwrap().expect("a's send, completed by b's pong").check_ok().unwrap();
    }
    assert_eq!((a.count("tx_boxed"), b.count("tx_boxed")), (100, 100));
    assert_eq!((a.count("placed_reads"), b.count("placed_reads")), (0, 0), "a placed word was read");
    // b's last send was answered by nothing: waiting for it reads the word.
    b.vi.send_wait(T).unwrap().check_ok().unwrap();
    assert!(b.count("placed_reads") > 0);
}

/// The receive path only notes what a reply says was placed; the send
/// completes at the next look for it (a CQ poll, `SendDone`, our next
/// send, or the round of progress under a poll), and none of those reads
/// a placed word for it: a CQ poll right after the reply finds it, and so
/// does the application's first `SendDone`.
#[test]
fn a_send_a_reply_said_was_placed_completes_at_the_first_look() {
    let w = wire("told");
    let (mut a, mut b) = pair_with(&w, Reliability::ReliableDelivery, true);
    a.vi.post_recv(a.desc(0..64, None)).unwrap();
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    for i in 0..50 {
        a.vi.post_send(a.desc(64..128, None)).unwrap();
        let r = b.vi.recv_wait(T).unwrap();
        b.vi.post_recv(r).unwrap();
        if i > 0 {
            // b's previous send, answered by this ping: its first SendDone.
            b.vi.send_done().unwrap().expect("b's send, completed by a's ping").check_ok().unwrap();
            b.send_cq.as_ref().unwrap().done().unwrap().expect("b's send on its CQ");
        }
        b.vi.post_send(b.desc(64..128, None)).unwrap();
        let r = a.vi.recv_wait(T).unwrap();
        a.vi.post_recv(r).unwrap();
        // a's send, answered by the pong: the CQ's first poll has it.
        let c = a.send_cq.as_ref().unwrap().done().unwrap().expect("a's send on its CQ at the first poll");
        assert!(!c.recv_queue);
        a.vi.send_done().unwrap().expect("a's send, completed by b's pong").check_ok().unwrap();
    }
    assert_eq!((a.count("placed_reads"), b.count("placed_reads")), (0, 0), "a placed word was read");
}

/// A send a reply said was placed completes as placed, not flushed, when
/// the connection ends before the application looked for it (whether
/// the disconnect's round of progress or the flush settles it).
#[test]
fn a_send_a_reply_said_was_placed_is_not_flushed_by_a_disconnect() {
    let w = wire("told-flush");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    a.vi.post_recv(a.desc(0..64, None)).unwrap();
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    // One exchange so that b boxes too (it has heard a).
    a.vi.post_send(a.desc(64..128, None)).unwrap();
    let r = b.vi.recv_wait(T).unwrap();
    b.vi.post_recv(r).unwrap();
    b.vi.post_send(b.desc(64..128, None)).unwrap();
    let r = a.vi.recv_wait(T).unwrap();
    a.vi.post_recv(r).unwrap();
    a.vi.send_wait(T).unwrap().check_ok().unwrap();
    // Then: a's send, b's reply saying it placed it, a's disconnect.
    a.vi.post_send(a.desc(64..128, None)).unwrap();
    b.vi.recv_wait(T).unwrap().check_ok().unwrap();
    b.vi.send_wait(T).unwrap().check_ok().unwrap();
    b.vi.post_send(b.desc(64..128, None)).unwrap();
    a.vi.recv_wait(T).unwrap().check_ok().unwrap();
    a.vi.disconnect().unwrap();
    let d = a.vi.send_done().unwrap().expect("a's send, completed");
    assert_eq!(d.status() & status::DESC_FLUSHED_ERROR, 0, "a placed send came back flushed: status {:#x}", d.status());
    d.check_ok().unwrap();
}

/// A send nobody polls for still completes, by rounds of progress alone:
/// they read the placed word a little after the send went out (what a
/// program that watches the descriptor's status word relies on), so the
/// first poll then finds it complete.
#[test]
fn a_boxed_send_nobody_polls_for_completes_by_progress() {
    let w = wire("unpolled");
    let (mut a, mut b) = pair(&w, Reliability::ReliableDelivery);
    b.vi.post_recv(b.desc(0..64, None)).unwrap();
    a.vi.post_send(a.desc(0..64, None)).unwrap();
    b.vi.recv_wait(T).unwrap().check_ok().unwrap();
    let start = std::time::Instant::now();
    while a.count("placed_reads") == 0 {
        assert!(start.elapsed() < T.unwrap(), "progress never read the placed word");
        a.nic.progress();
    }
    a.vi.send_done().unwrap().expect("complete at the first poll").check_ok().unwrap();
    // Not by the retransmission timer giving up on the peer (milliseconds
    // later, and the connection broken).
    assert_eq!(a.count("rto_expiries"), 0);
}

/// A framed send that the shared ring cut short while a boxed send ahead
/// of it was still out goes on from its own first unsent fragment: the
/// boxed send, which has no frames, is not taken for a send never
/// started and sent again as a frame. (It was: the receiver then met the
/// boxed message a second time, as a frame in the middle of the framed
/// one, and the stream fell apart: a third of `via-pingpong --demo`'s
/// via-shm runs failed with DESC_FLUSHED.)
#[test]
fn a_framed_send_the_ring_cut_short_goes_on_from_its_own_fragment_past_a_boxed_one() {
    const SLOTS: usize = via_softnic::shm::SLOTS as usize;
    const BIG: usize = 3 * 65_000; // three fragments of the wire's MTU
    let w = wire("cut-short");
    let (mut a, mut b) = pair_sized(&w, Reliability::ReliableDelivery, false, 1 << 20, 1 << 20);
    // b has not taken anything from its ring until the end: the small
    // sends fill it but for two slots, so the big one's third fragment
    // finds it full.
    let small = SLOTS - 2 - 1; // the first exchange below took one slot
    for i in 0..small + 1 {
        b.vi.post_recv(b.desc(i * 64..i * 64 + 64, None)).unwrap();
    }
    b.vi.post_recv(b.desc(1 << 19..(1 << 19) + BIG, None)).unwrap();
    // One exchange first, so that a boxes (it has heard b).
    a.vi.post_recv(a.desc(0..64, None)).unwrap();
    b.vi.post_send(b.desc(0..8, None)).unwrap();
    a.vi.recv_wait(T).unwrap().check_ok().unwrap();
    a.mem.write(0, &[7u8; 64]).unwrap();
    for _ in 0..small + 1 {
        a.vi.post_send(a.desc(0..64, None)).unwrap();
    }
    assert!(a.count("tx_boxed") >= small as u64, "the small sends went boxed");
    let big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    a.mem.write(4096, &big).unwrap();
    a.vi.post_send(a.desc(4096..4096 + BIG, None)).unwrap();
    assert!(a.count("tx_ring_full") > 0, "the ring refused part of the big send");
    // b takes everything; a goes on as b makes room.
    for i in 0..small + 1 {
        let r = b.vi.recv_wait(T).unwrap();
        r.check_ok().unwrap();
        assert_eq!(r.length(), 64, "message {i}: a small send");
        a.nic.progress();
    }
    let start = std::time::Instant::now();
    let r = loop {
        a.nic.progress();
        if let Some(r) = b.vi.recv_done().unwrap() {
            break r;
        }
        assert!(start.elapsed() < T.unwrap(), "the big send never arrived");
    };
    r.check_ok().unwrap();
    assert_eq!(r.length() as usize, BIG);
    assert_eq!(b.mem.to_vec(1 << 19..(1 << 19) + BIG).unwrap(), big, "the big send's bytes");
    assert_eq!(b.count("rx_bad_offset"), 0, "a message met in the middle of another");
    assert_eq!(b.count("connections_lost"), 0);
}
