//! The `soak` scenario: 64 VIs between two hosts (Reliable Delivery and
//! Reliable Reception taking turns), mixed traffic for `--seconds`.
//!
//! Each round the client posts, on every VI, a send of a random length (its
//! number as immediate data), an RDMA write of a random length into that
//! VI's window at the server and an RDMA read of the same bytes back, then
//! waits for all of them: the read must return what the write put there.
//! The server checks every message (each VI's arrive in order, exactly
//! once, intact) and reposts, granting credits (a 0-byte message whose
//! immediate data is how many it has taken) so that the client never sends
//! into an empty receive queue however far behind the server falls. Both
//! sides print `RSS <kB after a quarter of
//! the run> <kB at the end>`; the client prints `ROUNDS <n>` and the
//! engine's and device's counters (`COUNTERS name=value ...`), the server
//! `MESSAGES <n>`.

use super::{fail, Args, OrFail, Side, T};
use std::time::{Duration, Instant};
use via_tests::{pattern, random_size};
use via_user::{Descriptor, MemoryRegion, Op, Reliability, RemoteBuffer, Vi, ViAttributes, ViPhase};

const VIS: usize = 64;
/// Largest send, RDMA write or read.
const MAX: usize = 8192;
/// Receives each server VI keeps posted.
const RECVS: usize = 16;
/// Immediate data of the client's last message on each VI. (It ends the
/// server's wait rather than the client's Disconnect, which is one frame
/// and may be lost on these links: VIA has no keepalive, and a VI whose
/// peer vanished while it sends nothing does not notice.)
const END: u32 = u32::MAX;
/// The server grants credits every this many messages of a VI.
const CREDIT_EVERY: u32 = 4;
/// Receives each client VI keeps posted for credits.
const CREDIT_RECVS: usize = 8;

fn attrs(s: &Side, i: usize) -> ViAttributes {
    let reliability = if i.is_multiple_of(2) { Reliability::ReliableDelivery } else { Reliability::ReliableReception };
    ViAttributes { reliability, max_transfer_size: 1 << 20, ptag: s.ptag, enable_rdma_write: true, enable_rdma_read: true }
}

/// This process's resident set, kB.
fn rss_kb() -> u64 {
    via_tests::proc_kib("/proc/self/status", "VmRSS").or_fail("resident set")
}

pub fn soak(a: &Args) {
    if a.role == "server" {
        server(a)
    } else {
        client(a)
    }
}

fn rdma_region(s: &Side, len: usize) -> MemoryRegion {
    MemoryRegion::new(&s.nic, len, 4096, via_user::MemAttributes { ptag: s.ptag, enable_rdma_write: true, enable_rdma_read: true }).or_fail("register")
}

fn server(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let cq = s.nic.create_cq(VIS * RECVS).or_fail("create CQ");
    let windows = rdma_region(&s, VIS * MAX);
    let rbuf = s.region(VIS * RECVS * MAX);
    let offer = s.region(VIS * RemoteBuffer::BYTES);
    let mut vis: Vec<Vi> = (0..VIS).map(|i| s.nic.create_vi(&attrs(&s, i), None, Some(&cq)).or_fail("create VI")).collect();
    let mut at = std::collections::HashMap::new();
    for (i, vi) in vis.iter_mut().enumerate() {
        at.extend(s.post_slots(vi, &rbuf, i * RECVS * MAX, RECVS, MAX));
    }
    let index: std::collections::HashMap<u16, usize> = vis.iter().enumerate().map(|(i, v)| (v.id(), i)).collect();
    s.ready();
    for (i, vi) in vis.iter_mut().enumerate() {
        s.accept(vi, b"soak");
        let rb = windows.remote(i * MAX..(i + 1) * MAX).or_fail("window");
        offer.write(i * RemoteBuffer::BYTES, &rb.to_bytes()).or_fail("offer");
        vi.post_send(s.desc(&offer, i * RemoteBuffer::BYTES, RemoteBuffer::BYTES, None)).or_fail("post offer");
        vi.send_wait(T).or_fail("offer").check_ok().or_fail("offer status");
    }
    let t0 = Instant::now();
    let (mut next, mut ended, mut open, mut messages) = (vec![0u32; VIS], vec![false; VIS], VIS, 0u64);
    let mut warm: Option<u64> = None;
    while open > 0 {
        let c = cq.wait(T).or_fail(&format!("a completion ({open} VIs open, {messages} messages)"));
        let i = index[&c.vi];
        let d = vis[i].recv_done().or_fail("receive").unwrap_or_else(|| fail("the CQ named a receive that is not done"));
        if ended[i] {
            continue; // flushed: the client hung up after its last message
        }
        d.check_ok().or_fail(&format!("VI {i} message {}", next[i]));
        if d.immediate() == Some(END) {
            ended[i] = true;
            open -= 1; // the client sends nothing more on this VI
            continue;
        }
        let seq = d.immediate().unwrap_or_else(|| fail("a message without its number"));
        let (len, off) = (d.length() as usize, at[&d.addr()]);
        if seq != next[i] || len != random_size(seq ^ ((i as u32) << 20), MAX) || rbuf.to_vec(off..off + len).or_fail("read") != pattern(seq, len) {
            fail(&format!("VI {i}: message {seq} ({len} bytes) where {} was expected, or its contents differ", next[i]));
        }
        next[i] += 1;
        messages += 1;
        vis[i].post_recv(d).or_fail("repost");
        if next[i] % CREDIT_EVERY == 0 {
            // (Credit sends are reaped here, unchecked: the last ones may
            // be cut off by the client's hang-up, which is no loss.)
            while let Ok(Some(_)) = vis[i].send_done() {}
            vis[i].post_send(s.desc(&offer, 0, 0, Some(next[i]))).or_fail("post credit");
        }
        if warm.is_none() && t0.elapsed() >= Duration::from_secs_f64(a.seconds / 4.0) {
            warm = Some(rss_kb());
        }
    }
    println!("MESSAGES {messages}");
    println!("RSS {} {}", warm.unwrap_or(0), rss_kb());
    // Stay until the client hangs up (or 5 s pass: a Disconnect may be
    // lost), so that our ACKs of its last messages are not cut off.
    let deadline = Instant::now() + Duration::from_secs(5);
    while vis.iter().any(|v| v.state() == ViPhase::Connected) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || cq.wait(Some(left)).is_err() {
            break;
        }
    }
}

/// One VI's buffers at the client: what it sends, writes and reads back.
struct Lane {
    vi: Vi,
    window: RemoteBuffer,
    seq: u32,
    /// Messages the server may be sent: those below this.
    allowed: u32,
}

impl Lane {
    /// Waits until the server has room for message `self.seq`, taking
    /// the credits that have come.
    fn wait_for_room(&mut self, i: usize) {
        loop {
            let credit = if self.seq < self.allowed { self.vi.recv_done().or_fail("credit") } else { Some(self.vi.recv_wait(T).or_fail(&format!("VI {i}: a credit"))) };
            let Some(d) = credit else { return };
            d.check_ok().or_fail("credit");
            self.allowed = self.allowed.max(d.immediate().unwrap_or_else(|| fail("a credit without its count")) + RECVS as u32);
            self.vi.post_recv(d).or_fail("repost credit recv");
        }
    }
}

fn client(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let sbuf = s.region(VIS * MAX);
    let wbuf = s.region(VIS * MAX);
    let rbuf = s.region(VIS * MAX);
    let obuf = s.region(VIS * RemoteBuffer::BYTES);
    let cbuf = s.region(VIS * CREDIT_RECVS * 16);
    let mac = s.nic.lookup_host(&a.peer).or_fail("name service");
    let mut lanes: Vec<Lane> = (0..VIS)
        .map(|i| {
            let mut vi = s.nic.create_vi(&attrs(&s, i), None, None).or_fail("create VI");
            vi.post_recv(s.desc(&obuf, i * RemoteBuffer::BYTES, RemoteBuffer::BYTES, None)).or_fail("post recv");
            vi.connect_retrying(mac, b"soak", Duration::from_secs(20)).or_fail("connect");
            let d = vi.recv_wait(T).or_fail("the server's offer");
            d.check_ok().or_fail("offer");
            let off = i * RemoteBuffer::BYTES;
            let window = RemoteBuffer::from_bytes(&obuf.to_vec(off..off + RemoteBuffer::BYTES).or_fail("read")).or_fail("offer");
            for k in 0..CREDIT_RECVS {
                vi.post_recv(s.desc(&cbuf, (i * CREDIT_RECVS + k) * 16, 16, None)).or_fail("post credit recv");
            }
            Lane { vi, window, seq: 0, allowed: RECVS as u32 }
        })
        .collect();
    let t0 = Instant::now();
    let mut warm: Option<u64> = None;
    let mut rounds = 0u64;
    let op = |op: Op, r: &MemoryRegion, off: usize, len: usize, imm: Option<u32>| -> Descriptor {
        let mut d = Descriptor::new(&s.nic, s.ptag, 2).or_fail("descriptor");
        d.set_op(op, &[(r, off..off + len)], imm, false).or_fail("descriptor");
        d
    };
    while t0.elapsed().as_secs_f64() < a.seconds {
        for (i, l) in lanes.iter_mut().enumerate() {
            l.wait_for_room(i);
            let (base, seq) = (i * MAX, l.seq);
            let len = random_size(seq ^ ((i as u32) << 20), MAX);
            sbuf.write(base, &pattern(seq, len)).or_fail("fill");
            let wlen = random_size(seq.wrapping_mul(7) ^ ((i as u32) << 20), MAX).max(1);
            wbuf.write(base, &pattern(seq ^ 0x5a5a, wlen)).or_fail("fill");
            l.vi.post_send(op(Op::SendRecv, &sbuf, base, len, Some(seq))).or_fail("post send");
            l.vi.post_send(op(Op::RdmaWrite(l.window), &wbuf, base, wlen, None)).or_fail("post RDMA write");
            l.vi.post_send(op(Op::RdmaRead(l.window), &rbuf, base, wlen, None)).or_fail("post RDMA read");
            l.seq += 1;
        }
        for (i, l) in lanes.iter_mut().enumerate() {
            for what in ["send", "RDMA write", "RDMA read"] {
                l.vi.send_wait(T).or_fail(&format!("VI {i}: {what}")).check_ok().or_fail(&format!("VI {i}: {what} of round {rounds}"));
            }
            let seq = l.seq - 1;
            let wlen = random_size(seq.wrapping_mul(7) ^ ((i as u32) << 20), MAX).max(1);
            if rbuf.to_vec(i * MAX..i * MAX + wlen).or_fail("read") != pattern(seq ^ 0x5a5a, wlen) {
                fail(&format!("VI {i}, round {rounds}: the RDMA read did not return what the RDMA write put there"));
            }
        }
        rounds += 1;
        if warm.is_none() && t0.elapsed().as_secs_f64() >= a.seconds / 4.0 {
            warm = Some(rss_kb());
        }
    }
    println!("ROUNDS {rounds}");
    let engine: Vec<String> = s.nic.counters().pairs().iter().map(|(k, v)| format!("{k}={v}")).collect();
    let device: Vec<String> = s.nic.device_counters().iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("COUNTERS {} {}", engine.join(" "), device.join(" "));
    println!("RSS {} {}", warm.unwrap_or(0), rss_kb());
    for (i, l) in lanes.iter_mut().enumerate() {
        l.wait_for_room(i);
        l.vi.post_send(op(Op::SendRecv, &sbuf, 0, 0, Some(END))).or_fail("post the last message");
    }
    for (i, l) in lanes.iter_mut().enumerate() {
        l.vi.send_wait(T).or_fail(&format!("VI {i}: the last message")).check_ok().or_fail("the last message");
        l.vi.disconnect().or_fail("disconnect");
    }
}
