//! Area "RDMA": writes with and without immediate data, reads on the
//! reliable levels, QFENCE, and RDMA served by a target that is busy.

use super::{fill, Ctx, Rule, T};
use crate::check;
use std::time::{Duration, Instant};
use via_user::descriptor::status;
use via_user::{MemoryRegion, Op, Reliability, RemoteBuffer, Vi, VipReturn};

/// The target's exposed window: `WINDOW` bytes at offset `PAGE` of a region
/// of `PAGE + WINDOW + PAGE` bytes, the pages around it being canaries.
pub const PAGE: usize = 4096;
pub const WINDOW: usize = 128 << 10;
pub const REGION: usize = PAGE + WINDOW + PAGE;

pub fn rules() -> Vec<Rule> {
    vec![
        Rule {
            name: "rdma_write_lands_without_consuming_a_receive",
            area: "RDMA",
            text: "An RDMA write without immediate data places the data at the remote address and consumes no receive descriptor: the next send still lands in the first posted receive.",
            target: write_target,
            initiator: write_initiator,
            target_passive: false,
        },
        Rule {
            name: "rdma_write_with_immediate_consumes_a_receive",
            area: "RDMA",
            text: "An RDMA write with immediate data places the data and completes one receive descriptor with OP_REMOTE_RDMA_WRITE, STATUS_IMMEDIATE and the immediate data.",
            target: write_imm_target,
            initiator: write_imm_initiator,
            target_passive: false,
        },
        Rule {
            name: "rdma_read_fetches_remote_memory",
            area: "RDMA",
            text: "An RDMA read on a Reliable Reception VI brings the remote range (many frames) into the local segments; the send descriptor completes with OP_RDMA_READ and the length read.",
            target: read_target,
            initiator: read_initiator,
            target_passive: false,
        },
        Rule {
            name: "rdma_read_needs_a_reliable_level",
            area: "RDMA",
            text: "RDMAReadSupport covers the reliable levels only: creating an unreliable VI with EnableRdmaRead gives INVALID_RDMAREAD, and an RDMA read posted on an unreliable VI completes with FORMAT_ERROR without breaking the connection.",
            target: unrel_read_target,
            initiator: unrel_read_initiator,
            target_passive: false,
        },
        Rule {
            name: "qfence_holds_a_descriptor_until_earlier_reads_complete",
            area: "RDMA",
            text: "A descriptor with CONTROL_QFENCE starts only after the VI's earlier RDMA reads completed: a read followed by a fenced write to the same remote bytes reads the old contents.",
            target: fence_target,
            initiator: fence_initiator,
            target_passive: false,
        },
        Rule {
            name: "busy_target_serves_rdma_through_the_progress_thread",
            area: "RDMA",
            text: "With the progress thread (the default), a target that is computing and never calls into VIA still serves RDMA writes and reads.",
            target: busy_target,
            initiator: busy_initiator,
            target_passive: false,
        },
        Rule {
            name: "passive_target_serves_rdma_only_inside_calls",
            area: "RDMA",
            text: "Without the progress thread, progress happens inside calls: an RDMA read of a target that makes no calls does not complete until the target calls into VIA.",
            target: passive_target,
            initiator: passive_initiator,
            target_passive: true,
        },
    ]
}

/// Target side of the RDMA rules: a VI with the given enable bits, `recvs`
/// receives posted, the window's region (with the given enable bits,
/// filled with `fill(7, ..)`) offered to the initiator.
pub fn serve(c: &mut Ctx, level: Reliability, vi_bits: (bool, bool), region_bits: (bool, bool), recvs: usize) -> (Vi, MemoryRegion, MemoryRegion) {
    let mut vi = c.vi(c.attrs(level, vi_bits.0, vi_bits.1));
    let mem = c.region(REGION, region_bits.0, region_bits.1);
    mem.write(0, &fill(7, REGION)).unwrap();
    let rbuf = c.region(4096, false, false);
    for i in 0..recvs {
        vi.post_recv(c.desc(Op::SendRecv, &rbuf, i * 64..i * 64 + 64, None, false)).unwrap();
    }
    c.accept(&vi);
    if level == Reliability::Unreliable {
        // Nothing is retransmitted: wait until the initiator's VI is
        // connected too, or the offer could arrive before it is.
        check!(c, c.heard() == "connected", "expected connected");
    }
    let offer = c.ok(mem.remote(PAGE..PAGE + WINDOW), "remote buffer");
    c.offer(&mut vi, offer);
    (vi, mem, rbuf)
}

/// Initiator side: a VI of `level` connected to the target, and the window.
/// `read`: EnableRdmaRead, which must match the target VI's.
pub fn attach(c: &mut Ctx, level: Reliability, read: bool) -> (Vi, RemoteBuffer) {
    let mut vi = c.vi(c.attrs(level, true, read));
    c.post_control_recv(&mut vi);
    c.connect(&mut vi);
    if level == Reliability::Unreliable {
        c.tell("connected");
    }
    let rb = c.offered(&mut vi);
    (vi, rb)
}

/// Checks the target's region: `expect` over the window, canaries intact.
pub fn check_region(c: &Ctx, mem: &MemoryRegion, expect: &[u8]) {
    let got = mem.to_vec(0..REGION).unwrap();
    let orig = fill(7, REGION);
    check!(c, got[..PAGE] == orig[..PAGE], "the canary page before the window changed");
    check!(c, got[PAGE + WINDOW..] == orig[PAGE + WINDOW..], "the canary page after the window changed");
    if let Some(i) = (0..WINDOW).find(|&i| got[PAGE + i] != expect[i]) {
        check!(c, false, "window byte {i}: {:#x}, expected {:#x}", got[PAGE + i], expect[i]);
    }
}

fn write_target(c: &mut Ctx) {
    let (mut vi, mem, rbuf) = serve(c, Reliability::ReliableDelivery, (true, false), (true, false), 2);
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "the send after the write");
    check!(c, d.status() & status::OP_MASK == status::OP_RECEIVE, "the first receive completed as {:#x}, not as the send", d.status());
    check!(c, rbuf.to_vec(0..4).unwrap() == b"done", "the send did not land in the first receive");
    let mut expect = fill(7, REGION)[PAGE..PAGE + WINDOW].to_vec();
    expect[1000..1000 + 100_000].copy_from_slice(&fill(1, 100_000));
    check_region(c, &mem, &expect);
    c.pass();
    c.heard();
}

fn write_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, false);
    let src = c.region(100_000, false, false);
    src.write(0, &fill(1, 100_000)).unwrap();
    vi.post_send(c.desc(Op::RdmaWrite(rb.offset(1000)), &src, 0..100_000, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    c.ok(d.check_ok(), "RDMA write");
    check!(c, d.status() & status::OP_MASK == status::OP_RDMA_WRITE, "op {:#x}", d.status());
    c.send_control(&mut vi, b"done");
    c.pass();
}

fn write_imm_target(c: &mut Ctx) {
    let (mut vi, mem, _) = serve(c, Reliability::ReliableReception, (true, false), (true, false), 1);
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "receive consumed by the write");
    check!(c, d.status() & status::OP_MASK == status::OP_REMOTE_RDMA_WRITE, "op {:#x}", d.status());
    check!(c, d.immediate() == Some(0x1234_5678), "immediate {:?} (status {:#x})", d.immediate(), d.status());
    let mut expect = fill(7, REGION)[PAGE..PAGE + WINDOW].to_vec();
    expect[..5000].copy_from_slice(&fill(2, 5000));
    check_region(c, &mem, &expect);
    c.pass();
    c.heard();
}

fn write_imm_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableReception, false);
    let src = c.region(5000, false, false);
    src.write(0, &fill(2, 5000)).unwrap();
    vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0..5000, Some(0x1234_5678), false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "RDMA write with immediate");
    c.pass();
}

fn read_target(c: &mut Ctx) {
    let (_vi, mem, _) = serve(c, Reliability::ReliableReception, (false, true), (false, true), 0);
    c.heard();
    check_region(c, &mem, &fill(7, REGION)[PAGE..PAGE + WINDOW]); // reads change nothing
}

fn read_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableReception, true);
    let dst = c.region(WINDOW, false, false);
    vi.post_send(c.desc(Op::RdmaRead(rb), &dst, 0..WINDOW, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    c.ok(d.check_ok(), "RDMA read");
    check!(c, d.status() & status::OP_MASK == status::OP_RDMA_READ, "op {:#x}", d.status());
    check!(c, d.length() as usize == WINDOW, "length {}", d.length());
    check!(c, dst.to_vec(0..WINDOW).unwrap() == fill(7, REGION)[PAGE..PAGE + WINDOW], "the data read differs");
    c.pass();
}

fn unrel_read_target(c: &mut Ctx) {
    let a = c.attrs(Reliability::Unreliable, true, true);
    let e = c.nic.create_vi(&a, None, None).err();
    check!(c, e.as_ref().map(|e| e.code) == Some(VipReturn::InvalidRdmaRead), "unreliable VI with EnableRdmaRead: {e:?}");
    let (mut vi, _, rbuf) = serve(c, Reliability::Unreliable, (true, false), (true, true), 1);
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "the send after the refused read");
    check!(c, rbuf.to_vec(0..5).unwrap() == b"after", "payload");
    c.pass();
    c.heard();
}

fn unrel_read_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::Unreliable, false);
    let dst = c.region(4096, false, false);
    vi.post_send(c.desc(Op::RdmaRead(rb), &dst, 0..4096, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    check!(c, d.errors() == status::FORMAT_ERROR, "status {:#x}, expected FORMAT_ERROR", d.status());
    c.send_control(&mut vi, b"after");
    check!(c, vi.state() == via_user::ViPhase::Connected, "state {:?}", vi.state());
    c.pass();
}

fn fence_target(c: &mut Ctx) {
    let (_vi, mem, _) = serve(c, Reliability::ReliableDelivery, (true, true), (true, true), 0);
    c.heard();
    let mut expect = fill(7, REGION)[PAGE..PAGE + WINDOW].to_vec();
    expect[..64].copy_from_slice(&[0xEE; 64]);
    check_region(c, &mem, &expect);
}

fn fence_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, true);
    let dst = c.region(WINDOW, false, false);
    let src = c.region(64, false, false);
    src.write(0, &[0xEE; 64]).unwrap();
    vi.post_send(c.desc(Op::RdmaRead(rb), &dst, 0..WINDOW, None, false)).unwrap();
    vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0..64, None, true)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait (read)").check_ok(), "read");
    c.ok(c.ok(vi.send_wait(T), "SendWait (fenced write)").check_ok(), "fenced write");
    check!(c, dst.to_vec(0..64).unwrap() == fill(7, REGION)[PAGE..PAGE + 64], "the read saw the fenced write's data");
    c.pass();
}

/// Computes without calling into VIA until told to stop (or 20 s pass).
fn compute_until_told(c: &Ctx) -> u64 {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = std::io::stdin().read_line(&mut l);
        let _ = tx.send(());
    });
    let t0 = Instant::now();
    let mut x: u64 = 1;
    while rx.try_recv().is_err() && t0.elapsed() < Duration::from_secs(20) {
        for i in 0..100_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
    }
    let _ = c;
    x
}

fn busy_target(c: &mut Ctx) {
    let (_vi, mem, _) = serve(c, Reliability::ReliableDelivery, (true, true), (true, true), 0);
    std::hint::black_box(compute_until_told(c));
    let mut expect = fill(7, REGION)[PAGE..PAGE + WINDOW].to_vec();
    expect[..30000].copy_from_slice(&fill(4, 30000));
    check_region(c, &mem, &expect);
}

fn busy_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, true);
    let src = c.region(30000, false, false);
    src.write(0, &fill(4, 30000)).unwrap();
    let dst = c.region(30000, false, false);
    vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0..30000, None, false)).unwrap();
    vi.post_send(c.desc(Op::RdmaRead(rb), &dst, 0..30000, None, false)).unwrap();
    for what in ["write", "read"] {
        let d = c.ok(vi.send_wait(Some(Duration::from_secs(5))), &format!("SendWait ({what}) while the target computes"));
        c.ok(d.check_ok(), what);
    }
    check!(c, dst.to_vec(0..30000).unwrap() == fill(4, 30000), "read back differs");
    c.tell("stop");
    c.pass();
}

fn passive_target(c: &mut Ctx) {
    let (mut vi, _mem, _) = serve(c, Reliability::ReliableDelivery, (false, true), (false, true), 0);
    c.tell("idle"); // from here on no calls until told
    check!(c, c.heard() == "call", "expected call");
    // Now call in: a wait drives progress until the initiator is done.
    c.post_control_recv(&mut vi);
    c.recv_control(&mut vi);
}

fn passive_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, true);
    check!(c, c.heard() == "idle", "expected idle");
    let dst = c.region(4096, false, false);
    vi.post_send(c.desc(Op::RdmaRead(rb), &dst, 0..4096, None, false)).unwrap();
    let e = vi.send_wait(Some(Duration::from_millis(300)));
    check!(c, e.as_ref().is_err_and(|e| e.code == VipReturn::Timeout), "the read completed although the target made no calls: {:?}", e.map(|d| d.status()));
    c.tell("call");
    let d = c.ok(vi.send_wait(T), "SendWait once the target calls in");
    c.ok(d.check_ok(), "read");
    check!(c, dst.to_vec(0..4096).unwrap() == fill(7, REGION)[PAGE..PAGE + 4096], "data");
    c.send_control(&mut vi, b"bye");
    c.pass();
}
