//! One side of a two-host VIA test scenario, run as a real process in a
//! test namespace by the integration tests.
//!
//! `via-testpeer server|client SCENARIO --dev DEVICE [--peer HOST] [--level unrel|rel|rr] [--sizes a,b,..|random:MAX]`
//! The server prints `READY <mac>` once it waits for connections. Each side
//! exits 0 only when everything it checked held; failures print the reason.

mod deadpeer;
mod soak;
mod stream;

use std::process::exit;
use std::time::{Duration, Instant};
use via_tests::pattern;
use via_user::descriptor::status;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, Vi, ViAttributes, ViPhase, VipReturn};

const MTS: u32 = 1 << 20;
const T: Option<Duration> = Some(Duration::from_secs(20));

struct Args {
    role: String,
    scenario: String,
    dev: String,
    peer: String,
    level: Reliability,
    sizes: Vec<usize>,
    /// `--sizes random:MAX`: message `i` has [`via_tests::random_size`] bytes.
    random_max: Option<usize>,
    count: usize,
    /// Sends kept in flight (`--window`, the `stream` scenario).
    window: usize,
    /// How long the `soak` scenario runs (`--seconds`).
    seconds: f64,
}

impl Args {
    /// The length of message `i`.
    fn size_of(&self, i: usize) -> usize {
        match self.random_max {
            Some(max) => via_tests::random_size(i as u32, max),
            None if self.sizes.is_empty() => 100,
            None => self.sizes[i % self.sizes.len()],
        }
    }

    /// The largest message (at least 1).
    fn max_size(&self) -> usize {
        self.random_max.unwrap_or_else(|| self.sizes.iter().copied().max().unwrap_or(100)).max(1)
    }
}

fn parse() -> Args {
    let mut a = std::env::args().skip(1);
    let role = a.next().unwrap_or_default();
    let scenario = a.next().unwrap_or_default();
    let mut args = Args { role, scenario, dev: String::new(), peer: String::new(), level: Reliability::ReliableDelivery, sizes: vec![], random_max: None, count: 1000, window: 16, seconds: 10.0 };
    while let Some(k) = a.next() {
        let v = a.next().unwrap_or_else(|| fail(&format!("{k} needs a value")));
        match k.as_str() {
            "--dev" => args.dev = v,
            "--peer" => args.peer = v,
            "--level" => {
                args.level = match v.as_str() {
                    "unrel" => Reliability::Unreliable,
                    "rel" => Reliability::ReliableDelivery,
                    "rr" => Reliability::ReliableReception,
                    _ => fail("--level is unrel, rel or rr"),
                }
            }
            "--sizes" => match v.strip_prefix("random:") {
                Some(max) => args.random_max = Some(max.parse().unwrap_or_else(|_| fail("bad --sizes random:MAX"))),
                None => args.sizes = v.split(',').map(|s| s.parse().unwrap_or_else(|_| fail("bad size"))).collect(),
            },
            "--seconds" => args.seconds = v.parse().ok().filter(|s: &f64| *s > 0.0).unwrap_or_else(|| fail("bad --seconds")),
            "--window" => args.window = v.parse().ok().filter(|w| *w > 0).unwrap_or_else(|| fail("bad --window")),
            "--count" => args.count = v.parse().unwrap_or_else(|_| fail("bad --count")),
            _ => fail(&format!("unknown option {k}")),
        }
    }
    args
}

fn fail(msg: &str) -> ! {
    eprintln!("via-testpeer: FAIL: {msg}");
    exit(1)
}

trait OrFail<T> {
    fn or_fail(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> T {
        self.unwrap_or_else(|e| fail(&format!("{what}: {e}")))
    }
}

struct Side {
    nic: Nic,
    ptag: via_user::Ptag,
    level: Reliability,
}

impl Side {
    fn new(dev: &str, level: Reliability) -> Side {
        let nic = Nic::open(dev).or_fail("open NIC");
        let ptag = nic.create_ptag().or_fail("create ptag");
        Side { nic, ptag, level }
    }
    fn attrs(&self) -> ViAttributes {
        ViAttributes { reliability: self.level, max_transfer_size: MTS, ptag: self.ptag, enable_rdma_write: false, enable_rdma_read: false }
    }
    fn vi(&self, cq: Option<&via_user::Cq>) -> Vi {
        self.nic.create_vi(&self.attrs(), None, cq).or_fail("create VI")
    }
    fn region(&self, len: usize) -> MemoryRegion {
        MemoryRegion::new(&self.nic, len, 4096, MemAttributes { ptag: self.ptag, enable_rdma_write: false, enable_rdma_read: false }).or_fail("register")
    }
    fn desc(&self, r: &MemoryRegion, off: usize, len: usize, imm: Option<u32>) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).or_fail("descriptor");
        d.set(&[(r, off..off + len)], imm).or_fail("set descriptor");
        d
    }
    /// Posts `count` receives of `size` bytes on `vi`, in consecutive
    /// slots of `r` from `base`; returns each descriptor's slot offset by
    /// its address (what a completed receive is found by).
    fn post_slots(&self, vi: &mut Vi, r: &MemoryRegion, base: usize, count: usize, size: usize) -> std::collections::HashMap<usize, usize> {
        let mut at = std::collections::HashMap::new();
        for i in 0..count {
            let d = self.desc(r, base + i * size, size, None);
            at.insert(d.addr(), base + i * size);
            vi.post_recv(d).or_fail("post recv");
        }
        at
    }
    fn ready(&self) {
        println!("READY {}", self.nic.mac());
    }
    /// Server: accept one connection on `disc` for `vi`.
    fn accept(&self, vi: &Vi, disc: &[u8]) {
        let req = self.nic.connect_wait(disc, T).or_fail("ConnectWait");
        self.nic.accept(&req, vi).or_fail("ConnectAccept");
    }
    /// Client: connect `vi` to the server, retrying while nobody waits yet.
    fn connect(&self, vi: &mut Vi, peer: &str, disc: &[u8]) {
        let mac = self.nic.lookup_host(peer).or_fail("name service");
        vi.connect_retrying(mac, disc, Duration::from_secs(20)).or_fail("ConnectRequest");
    }
}

fn check_payload(r: &MemoryRegion, d: &Descriptor, seq: u32, len: usize) {
    d.check_ok().or_fail(&format!("message {seq}"));
    if d.length() as usize != len {
        fail(&format!("message {seq}: length {} != {len}", d.length()));
    }
    if r.to_vec(0..len).or_fail("read") != pattern(seq, len) {
        fail(&format!("message {seq} of {len} bytes: contents differ"));
    }
}

/// Every size arrives intact and is echoed back intact.
fn sizes(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let max = a.sizes.iter().copied().max().unwrap_or(0).max(1);
    let rbuf = s.region(max);
    let sbuf = s.region(max);
    let mut vi = s.vi(None);
    vi.post_recv(s.desc(&rbuf, 0, max, None)).or_fail("post recv");
    if a.role == "server" {
        s.ready();
        s.accept(&vi, b"sizes");
        for (i, &n) in a.sizes.iter().enumerate() {
            let d = vi.recv_wait(T).or_fail(&format!("receive {n} bytes"));
            check_payload(&rbuf, &d, i as u32, n);
            vi.post_recv(d).or_fail("repost");
            sbuf.write(0, &pattern(i as u32, n)).or_fail("fill");
            vi.post_send(s.desc(&sbuf, 0, n, None)).or_fail("post echo");
            vi.send_wait(T).or_fail("echo send").check_ok().or_fail("echo status");
        }
    } else {
        s.connect(&mut vi, &a.peer, b"sizes");
        for (i, &n) in a.sizes.iter().enumerate() {
            sbuf.write(0, &pattern(i as u32, n)).or_fail("fill");
            vi.post_send(s.desc(&sbuf, 0, n, Some(i as u32))).or_fail("post send");
            let d = vi.recv_wait(T).or_fail(&format!("echo of {n} bytes"));
            check_payload(&rbuf, &d, i as u32, n);
            vi.post_recv(d).or_fail("repost");
            let sd = vi.send_wait(T).or_fail("send completion");
            sd.check_ok().or_fail("send status");
        }
        println!("OK {}", a.sizes.len());
        // What the link did to the frames, for tests on faulty devices.
        let dev = s.nic.device_counters();
        let lost = dev.iter().find(|(k, _)| *k == "faults_lost").map_or(0, |(_, v)| *v);
        println!("LINK faults_lost {lost} retransmits {} bad_checksum {}", s.nic.counters().retransmits, s.nic.counters().rx_bad_checksum);
        // Payloads that came lent by the server (a process on this host).
        println!("LENT {}", s.nic.counters().rx_lent);
        // Frames that came without a CRC by a path that cannot corrupt them.
        println!("UNSEALED {}", s.nic.counters().rx_unsealed);
        // What frame authentication did (a cluster secret in VIA_SECRET).
        println!("AUTH authenticated {} bad_auth {} bad_checksum {}", s.nic.counters().rx_authenticated, s.nic.counters().rx_bad_auth, s.nic.counters().rx_bad_checksum);
        // The device's counters (a composite's frames by member).
        let dev: Vec<String> = s.nic.device_counters().iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("DEVICE {}", dev.join(" "));
        // Stay until the server hangs up: on a lossy link our ACK of its
        // last echo may be lost, and its echo completes only when a
        // retransmission draws another from us. (Its Disconnect ends the
        // wait; if that is lost too, the wait's time limit does.)
        let _ = vi.recv_wait(Some(Duration::from_secs(5)));
    }
}

/// `--count` messages one way, sizes taking turns from `--sizes`, each
/// carrying its number as immediate data: at any level, every message that
/// completes without error must hold exactly what was sent (a corrupted
/// frame is never delivered); the server says how many arrived, how many
/// completed with an error (a lost fragment) and how many frames failed
/// their checksum. It stops after two seconds without a message, or when
/// the client disconnects.
fn oneway(a: &Args) {
    const RECVS: usize = 64;
    let s = Side::new(&a.dev, a.level);
    let max = a.max_size();
    let mut vi = s.vi(None);
    if a.role == "server" {
        let buf = s.region(RECVS * max);
        let at = s.post_slots(&mut vi, &buf, 0, RECVS, max);
        s.ready();
        s.accept(&vi, b"oneway");
        let (mut delivered, mut failed) = (0u64, 0u64);
        let mut wait = T;
        while let Ok(d) = vi.recv_wait(wait) {
            wait = Some(Duration::from_secs(2));
            if d.errors() != 0 && vi.state() == via_user::ViPhase::Error {
                break; // the client has gone: the rest come back flushed
            }
            if d.errors() == 0 {
                let seq = d.immediate().unwrap_or_else(|| fail("a message without its number"));
                let len = d.length() as usize;
                let off = at[&d.addr()];
                if len != a.size_of(seq as usize) || buf.to_vec(off..off + len).or_fail("read") != pattern(seq, len) {
                    fail(&format!("message {seq} was delivered ({len} bytes) but differs from what was sent"));
                }
                delivered += 1;
            } else {
                failed += 1;
            }
            vi.post_recv(d).or_fail("repost");
        }
        let c = s.nic.counters();
        // Frames the kernel dropped before we read them (our ring was full).
        let ring = s.nic.device_counters().iter().find(|(k, _)| *k == "kernel_rx_drops").map_or(0, |(_, v)| *v);
        println!("DELIVERED {delivered} FAILED {failed} BAD_CHECKSUM {} NO_RECEIVE {} LOST {} RING_DROPS {ring}", c.rx_bad_checksum, c.rx_no_receive_posted, c.rx_lost);
    } else {
        let sbuf = s.region(max);
        s.connect(&mut vi, &a.peer, b"oneway");
        for i in 0..a.count {
            let len = a.size_of(i);
            sbuf.write(0, &pattern(i as u32, len)).or_fail("fill");
            vi.post_send(s.desc(&sbuf, 0, len, Some(i as u32))).or_fail("post send");
            vi.send_wait(T).or_fail("send completion").check_ok().or_fail("send status");
        }
        let dev = s.nic.device_counters();
        let fault = |name: &str| dev.iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| *v);
        println!("SENT {} LINK_LOST {} LINK_CORRUPTED {}", a.count, fault("faults_lost"), fault("faults_corrupted"));
    }
}

/// Several VIs on one CQ: every message arrives, in order per VI.
fn cq(a: &Args) {
    const VIS: usize = 4;
    const PER_VI: u32 = 50;
    const LEN: usize = 3000;
    let s = Side::new(&a.dev, a.level);
    if a.role == "server" {
        let cq = s.nic.create_cq(VIS * PER_VI as usize).or_fail("create CQ");
        let bufs: Vec<MemoryRegion> = (0..VIS).map(|_| s.region(LEN * PER_VI as usize)).collect();
        let mut vis: Vec<Vi> = (0..VIS).map(|_| s.vi(Some(&cq))).collect();
        for (v, vi) in vis.iter_mut().enumerate() {
            for k in 0..PER_VI as usize {
                vi.post_recv(s.desc(&bufs[v], k * LEN, LEN, None)).or_fail("post recv");
            }
        }
        s.ready();
        for vi in &vis {
            s.accept(vi, b"cq");
        }
        let mut next = [0u32; VIS];
        for _ in 0..VIS as u32 * PER_VI {
            let c = cq.wait(T).or_fail("CQ wait");
            if !c.recv_queue {
                fail("CQ reported a send queue");
            }
            let v = vis.iter().position(|x| x.id() == c.vi).unwrap_or_else(|| fail("CQ named an unknown VI"));
            let d = vis[v].recv_done().or_fail("recv done").unwrap_or_else(|| fail("CQ entry without a completed receive"));
            d.check_ok().or_fail("receive status");
            let k = next[v] as usize;
            let got = bufs[v].to_vec(k * LEN..k * LEN + LEN).or_fail("read");
            let seq = u32::from_le_bytes(got[..4].try_into().unwrap());
            let tag = u32::from_le_bytes(got[4..8].try_into().unwrap());
            if seq != next[v] || tag != v as u32 || got[8..] != pattern(seq + 1000 * v as u32, LEN)[8..] {
                fail(&format!("VI {v}: expected message {} got seq {seq} tag {tag}", next[v]));
            }
            next[v] += 1;
        }
        if cq.done().or_fail("cq done").is_some() {
            fail("extra CQ entry");
        }
    } else {
        let sbuf = s.region(LEN * VIS);
        let mut vis: Vec<Vi> = (0..VIS).map(|_| s.vi(None)).collect();
        for vi in vis.iter_mut() {
            s.connect(vi, &a.peer, b"cq");
        }
        for seq in 0..PER_VI {
            for (v, vi) in vis.iter_mut().enumerate() {
                let mut m = pattern(seq + 1000 * v as u32, LEN);
                m[..4].copy_from_slice(&seq.to_le_bytes());
                m[4..8].copy_from_slice(&(v as u32).to_le_bytes());
                sbuf.write(v * LEN, &m).or_fail("fill");
                vi.post_send(s.desc(&sbuf, v * LEN, LEN, None)).or_fail("post send");
            }
            for vi in vis.iter_mut() {
                vi.send_wait(T).or_fail("send").check_ok().or_fail("send status");
            }
        }
        println!("OK");
    }
}

/// The server rejects; the client sees REJECT.
fn reject(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let mut vi = s.vi(None);
    if a.role == "server" {
        s.ready();
        let req = s.nic.connect_wait(b"rej", T).or_fail("ConnectWait");
        s.nic.reject(&req).or_fail("reject");
        // Answer the client's retransmissions until it is gone.
        let _ = s.nic.connect_wait(b"never", Some(Duration::from_millis(300)));
    } else {
        let mac = s.nic.lookup_host(&a.peer).or_fail("name service");
        match vi.connect_retrying(mac, b"rej", Duration::from_secs(20)) {
            Err(e) if e.code == VipReturn::Reject => {}
            r => fail(&format!("expected REJECT, got {r:?}")),
        }
        if vi.state() != ViPhase::Idle {
            fail("VI not Idle after a rejected request");
        }
        println!("REJECTED");
    }
}

/// A request to an address nobody waits on: NO_MATCH; then the right one connects.
fn nomatch(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let mut vi = s.vi(None);
    if a.role == "server" {
        s.ready();
        s.accept(&vi, b"right");
    } else {
        let mac = s.nic.lookup_host(&a.peer).or_fail("name service");
        match vi.connect(mac, b"wrong", Some(Duration::from_secs(5))) {
            Err(e) if e.code == VipReturn::NoMatch => println!("NO_MATCH"),
            r => fail(&format!("expected NO_MATCH, got {r:?}")),
        }
        s.connect(&mut vi, &a.peer, b"right");
        println!("CONNECTED");
    }
}

/// Nobody at that address: TIMEOUT after the requested time.
fn timeout(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let mut vi = s.vi(None);
    let t0 = Instant::now();
    match vi.connect("02:00:00:00:00:99".parse().unwrap(), b"x", Some(Duration::from_millis(300))) {
        Err(e) if e.code == VipReturn::Timeout => {}
        r => fail(&format!("expected TIMEOUT, got {r:?}")),
    }
    let el = t0.elapsed();
    if el < Duration::from_millis(300) || el > Duration::from_secs(3) {
        fail(&format!("timeout took {el:?}"));
    }
    println!("TIMEOUT {}", el.as_millis());
}

/// A receive buffer too small: LENGTH_ERROR, and the connection goes on.
fn length(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let buf = s.region(4096);
    let mut vi = s.vi(None);
    if a.role == "server" {
        vi.post_recv(s.desc(&buf, 0, 100, None)).or_fail("post small recv");
        vi.post_recv(s.desc(&buf, 1024, 300, None)).or_fail("post recv");
        s.ready();
        s.accept(&vi, b"len");
        let d = vi.recv_wait(T).or_fail("first receive");
        if d.errors() & status::LENGTH_ERROR == 0 {
            fail(&format!("expected LENGTH_ERROR, status {:#x}", d.status()));
        }
        let d = vi.recv_wait(T).or_fail("second receive");
        d.check_ok().or_fail("second receive status");
        if d.length() != 200 || buf.to_vec(1024..1224).unwrap() != pattern(2, 200) {
            fail("second message corrupted");
        }
        println!("LENGTH_ERROR");
    } else {
        s.connect(&mut vi, &a.peer, b"len");
        buf.write(0, &pattern(1, 200)).unwrap();
        buf.write(1024, &pattern(2, 200)).unwrap();
        vi.post_send(s.desc(&buf, 0, 200, None)).or_fail("send 1");
        vi.post_send(s.desc(&buf, 1024, 200, None)).or_fail("send 2");
        vi.send_wait(T).or_fail("send 1 wait");
        vi.send_wait(T).or_fail("send 2 wait").check_ok().or_fail("send 2 status");
        println!("OK");
    }
}

/// The peer vanishes: the survivor's descriptors flush and the VI is in Error.
fn vanish(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let buf = s.region(65536);
    let mut vi = s.vi(None);
    if a.role == "server" {
        s.ready();
        s.accept(&vi, b"gone");
        println!("CONNECTED");
        let mut l = String::new();
        let _ = std::io::stdin().read_line(&mut l); // killed here
        loop {
            s.nic.progress();
            std::thread::sleep(Duration::from_millis(50));
        }
    } else {
        vi.post_recv(s.desc(&buf, 0, 1024, None)).or_fail("post recv");
        s.connect(&mut vi, &a.peer, b"gone");
        println!("CONNECTED");
        let mut l = String::new();
        std::io::stdin().read_line(&mut l).or_fail("stdin");
        let t0 = Instant::now();
        for i in 0..3 {
            vi.post_send(s.desc(&buf, 4096 * (i + 1), 40000, None)).or_fail("post send");
        }
        // The send that could not be delivered: TRANSPORT_ERROR; the rest flushed.
        for i in 0..3 {
            let d = vi.send_wait(Some(Duration::from_secs(30))).or_fail(&format!("send {i} should complete (in error), not hang"));
            let want = if i == 0 { status::TRANSPORT_ERROR } else { status::DESC_FLUSHED_ERROR };
            if d.errors() != want {
                fail(&format!("send {i}: expected status bits {want:#x}, got {:#x}", d.status()));
            }
        }
        let r = vi.recv_wait(Some(Duration::from_secs(1))).or_fail("posted receive should be flushed");
        if r.errors() & status::DESC_FLUSHED_ERROR == 0 {
            fail("receive not flushed");
        }
        if vi.state() != ViPhase::Error {
            fail(&format!("VI state {:?}, expected Error", vi.state()));
        }
        let lost = s.nic.take_async_errors();
        if !lost.iter().any(|e| e.kind == via_user::AsyncErrorKind::ConnLost) {
            fail("no CONN_LOST reported");
        }
        println!("FLUSHED {}", t0.elapsed().as_millis());
    }
}

fn main() {
    let a = parse();
    if a.dev.is_empty() || !(a.role == "server" || a.role == "client") {
        fail("usage: via-testpeer server|client SCENARIO --dev DEVICE [--peer HOST] [--level rel|unrel] [--sizes ...]");
    }
    match a.scenario.as_str() {
        "sizes" => sizes(&a),
        "cq" => cq(&a),
        "reject" => reject(&a),
        "nomatch" => nomatch(&a),
        "timeout" => timeout(&a),
        "length" => length(&a),
        "vanish" => vanish(&a),
        "oneway" => oneway(&a),
        "stream" => stream::stream(&a),
        "deadpeer" => deadpeer::deadpeer(&a),
        "soak" => soak::soak(&a),
        s => fail(&format!("unknown scenario {s}")),
    }
}
