//! The engine end to end over the in-process loopback device: two NICs on
//! one wire, server and client in two threads. No root needed.

use std::thread;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, Vi, ViAttributes, ViPhase, VipReturn};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

struct Host {
    nic: Nic,
    ptag: via_user::Ptag,
}

impl Host {
    fn new(wire: &str) -> Host {
        let nic = Nic::open(&format!("loop:{wire}")).unwrap();
        let ptag = nic.create_ptag().unwrap();
        Host { nic, ptag }
    }
    fn vi(&self, level: Reliability) -> Vi {
        let a = ViAttributes { reliability: level, max_transfer_size: 1 << 20, ptag: self.ptag, enable_rdma_write: false, enable_rdma_read: false };
        self.nic.create_vi(&a, None, None).unwrap()
    }
    fn region(&self, len: usize) -> MemoryRegion {
        MemoryRegion::new(&self.nic, len, 4096, MemAttributes { ptag: self.ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap()
    }
    fn desc(&self, r: &MemoryRegion, off: usize, len: usize) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set(&[(r, off..off + len)], None).unwrap();
        d
    }
}

fn connect(_client: &Host, vi: &mut Vi, server_mac: via_user::MacAddr, disc: &[u8]) {
    vi.connect_retrying(server_mac, disc, T.unwrap()).expect("connect");
}

fn data(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect()
}

fn exchange(wire: &str, level: Reliability, sizes: Vec<usize>) {
    let server = Host::new(wire);
    let client = Host::new(wire);
    let smac = server.nic.mac();
    let sizes2 = sizes.clone();
    const SLOT: usize = 1 << 20;
    let t = thread::spawn(move || {
        // Receive k lands in slot k % 8 (unreliable sends do not wait for us).
        let buf = server.region(8 * SLOT);
        let mut vi = server.vi(level);
        for k in 0..8 {
            vi.post_recv(server.desc(&buf, k * SLOT, SLOT)).unwrap();
        }
        let req = server.nic.connect_wait(b"ex", T).unwrap();
        server.nic.accept(&req, &vi).unwrap();
        for (i, n) in sizes2.into_iter().enumerate() {
            let d = vi.recv_wait(T).unwrap();
            d.check_ok().unwrap();
            assert_eq!(d.length() as usize, n);
            let at = (i % 8) * SLOT;
            assert_eq!(buf.to_vec(at..at + n).unwrap(), data(i as u8, n), "message {i} of {n} bytes");
            vi.post_recv(d).unwrap();
        }
    });
    let sbuf = client.region(1 << 20);
    let mut vi = client.vi(level);
    connect(&client, &mut vi, smac, b"ex");
    for (i, &n) in sizes.iter().enumerate() {
        sbuf.write(0, &data(i as u8, n)).unwrap();
        vi.post_send(client.desc(&sbuf, 0, n)).unwrap();
        let d = vi.send_wait(T).unwrap();
        d.check_ok().unwrap();
        assert_eq!(d.length() as usize, n);
    }
    t.join().unwrap();
}

#[test]
fn reliable_messages_of_every_size() {
    exchange("rel", Reliability::ReliableDelivery, vec![0, 1, 1435, 1436, 1437, 1500, 4000, 65536, 1 << 20]);
}

#[test]
fn unreliable_messages() {
    exchange("unrel", Reliability::Unreliable, vec![0, 1, 1436, 1437, 65536]);
}

#[test]
fn gather_and_scatter_over_several_segments() {
    let server = Host::new("sg");
    let client = Host::new("sg");
    let smac = server.nic.mac();
    let t = thread::spawn(move || {
        let a = server.region(8192);
        let b = server.region(8192);
        let mut vi = server.vi(Reliability::ReliableDelivery);
        // 6 scatter pieces: 100 + 2000 + 3 + 1000 + 4000 + 1 = 7104 bytes
        let mut d = Descriptor::new(&server.nic, server.ptag, 6).unwrap();
        d.set(&[(&a, 0..100), (&b, 0..2000), (&a, 200..203), (&b, 4000..5000), (&a, 1000..5000), (&b, 8000..8001)], None).unwrap();
        vi.post_recv(d).unwrap();
        let req = server.nic.connect_wait(b"sg", T).unwrap();
        server.nic.accept(&req, &vi).unwrap();
        let d = vi.recv_wait(T).unwrap();
        d.check_ok().unwrap();
        assert_eq!(d.length(), 7104);
        let mut got = Vec::new();
        for (r, range) in [(&a, 0..100), (&b, 0..2000), (&a, 200..203), (&b, 4000..5000), (&a, 1000..5000), (&b, 8000..8001)] {
            got.extend(r.to_vec(range).unwrap());
        }
        assert_eq!(got, data(9, 7104));
    });
    let buf = client.region(16384);
    let src = data(9, 7104);
    // 7 gather pieces, more than one frame can gather: the engine bounces.
    let cuts = [0, 10, 20, 1500, 1501, 3000, 7000, 7104];
    let mut segs = Vec::new();
    for w in cuts.windows(2) {
        let at = 2 * w[0] + 64; // spread the pieces out
        buf.write(at, &src[w[0]..w[1]]).unwrap();
        segs.push((&buf, at..at + (w[1] - w[0])));
    }
    let mut vi = client.vi(Reliability::ReliableDelivery);
    connect(&client, &mut vi, smac, b"sg");
    let mut d = Descriptor::new(&client.nic, client.ptag, segs.len()).unwrap();
    d.set(&segs, None).unwrap();
    vi.post_send(d).unwrap();
    vi.send_wait(T).unwrap().check_ok().unwrap();
    t.join().unwrap();
}

#[test]
fn descriptor_errors_complete_in_order() {
    let server = Host::new("err");
    let client = Host::new("err");
    let smac = server.nic.mac();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let buf = server.region(4096);
        let mut vi = server.vi(Reliability::ReliableDelivery);
        vi.post_recv(server.desc(&buf, 0, 4096)).unwrap();
        let req = server.nic.connect_wait(b"err", T).unwrap();
        server.nic.accept(&req, &vi).unwrap();
        vi.recv_wait(T).unwrap().check_ok().unwrap();
        done_rx.recv().unwrap(); // keep the connection until the client checked it
    });
    let buf = client.region(4096);
    let mut vi = client.vi(Reliability::ReliableDelivery);
    // Sending before connecting is an error of the call, not of a descriptor.
    let e = vi.post_send(client.desc(&buf, 0, 10)).unwrap_err();
    assert_eq!(e.code, VipReturn::InvalidState);
    connect(&client, &mut vi, smac, b"err");
    // A descriptor whose data lies in another ptag's memory: PROTECTION_ERROR.
    let other = client.nic.create_ptag().unwrap();
    let foreign = MemoryRegion::new(&client.nic, 4096, 4096, MemAttributes { ptag: other, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    vi.post_send(client.desc(&foreign, 0, 10)).unwrap();
    vi.post_send(client.desc(&buf, 0, 10)).unwrap();
    let first = vi.send_wait(T).unwrap();
    assert_ne!(first.errors() & status::PROTECTION_ERROR, 0, "status {:#x}", first.status());
    let second = vi.send_wait(T).unwrap();
    second.check_ok().unwrap();
    assert_eq!(vi.state(), ViPhase::Connected, "a descriptor error does not break the connection");
    done_tx.send(()).unwrap();
    t.join().unwrap();
    // The ptag is in use by the region: destroying it fails.
    assert_eq!(client.nic.destroy_ptag(other).unwrap_err().code, VipReturn::InvalidState);
}

#[test]
fn disconnect_flushes_posted_receives() {
    let h = Host::new("disc");
    let buf = h.region(4096);
    let mut vi = h.vi(Reliability::ReliableDelivery);
    vi.post_recv(h.desc(&buf, 0, 100)).unwrap();
    vi.post_recv(h.desc(&buf, 100, 100)).unwrap();
    assert!(vi.recv_done().unwrap().is_none());
    vi.disconnect().unwrap();
    for _ in 0..2 {
        let d = vi.recv_done().unwrap().expect("flushed descriptor");
        assert_ne!(d.errors() & status::DESC_FLUSHED_ERROR, 0);
    }
    assert_eq!(vi.state(), ViPhase::Idle);
}

#[test]
fn waits_time_out() {
    let h = Host::new("to");
    let mut vi = h.vi(Reliability::ReliableDelivery);
    let t0 = std::time::Instant::now();
    let e = vi.recv_wait(Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(e.code, VipReturn::Timeout);
    assert!(t0.elapsed() >= Duration::from_millis(50));
    let cq = h.nic.create_cq(4).unwrap();
    assert_eq!(cq.wait(Some(Duration::from_millis(20))).unwrap_err().code, VipReturn::Timeout);
    assert!(cq.done().unwrap().is_none());
}

#[test]
fn region_reads_append_and_check_their_range() {
    let h = Host::new("region-append");
    let r = h.region(4096);
    r.write(100, &data(9, 300)).unwrap();
    let mut out = b"head".to_vec();
    r.append_to(100..400, &mut out).unwrap();
    assert_eq!(&out[..4], b"head");
    assert_eq!(&out[4..], &data(9, 300)[..]);
    assert_eq!(r.to_vec(100..400).unwrap(), data(9, 300));
    // Past the end: an error, and `out` as it was.
    let before = out.clone();
    let e = r.append_to(4000..4097, &mut out).unwrap_err();
    assert_eq!(e.code, VipReturn::InvalidParameter, "{e}");
    assert_eq!(out, before);
}

// A descriptor posted again unchanged is not checked against the
// registration table again: the engine keeps what its last post found
// (`engine::post::Kept`) and takes it when the descriptor still says the
// same. The tests below pin when that may happen and when it must not (its
// contents changed, through its methods or behind them as a C program
// changes them; memory was deregistered; it goes to another VI).

/// Posts on `h` that took a kept validation.
fn kept(h: &Host) -> u64 {
    h.nic.counters().posts_kept
}

/// A connected pair of VIs, `a` on `ha` and `b` on `hb`, on one wire.
fn pair(wire: &str, disc: &[u8]) -> (Host, Vi, Host, Vi) {
    let (ha, hb) = (Host::new(wire), Host::new(wire));
    let (a, b) = connect_pair(&ha, &hb, disc);
    (ha, a, hb, b)
}

/// A new VI on each host, connected.
fn connect_pair(ha: &Host, hb: &Host, disc: &[u8]) -> (Vi, Vi) {
    let (mut a, b) = (ha.vi(Reliability::ReliableDelivery), hb.vi(Reliability::ReliableDelivery));
    let (nic, mac, disc2) = (hb.nic.clone(), hb.nic.mac(), disc.to_vec());
    let server = std::thread::spawn(move || {
        let req = nic.connect_wait(&disc2, T).unwrap();
        nic.accept(&req, &b).unwrap();
        b
    });
    connect(ha, &mut a, mac, disc);
    (a, server.join().unwrap())
}

/// Sends with `d` from `a` into the receive `r` posted on `b`; returns the
/// bytes that arrived and both descriptors.
fn send(a: &mut Vi, d: Descriptor, b: &mut Vi, r: Descriptor, rbuf: &MemoryRegion) -> (Vec<u8>, Descriptor, Descriptor) {
    b.post_recv(r).unwrap();
    a.post_send(d).unwrap();
    let r = b.recv_wait(T).unwrap();
    r.check_ok().unwrap();
    let got = rbuf.to_vec(0..r.length() as usize).unwrap();
    let d = a.send_wait(T).unwrap();
    d.check_ok().unwrap();
    (got, d, r)
}

#[test]
fn an_unchanged_descriptor_posted_again_is_not_checked_again_and_a_changed_one_is() {
    let (ha, mut a, hb, mut b) = pair("kept-1", b"k1");
    let (sbuf, other, rbuf) = (ha.region(4096), ha.region(4096), hb.region(4096));
    sbuf.write(0, &[1u8; 100]).unwrap();
    other.write(200, &[2u8; 50]).unwrap();
    let (d, r) = (ha.desc(&sbuf, 0, 100), hb.desc(&rbuf, 0, 4096));
    let (k0a, k0b) = (kept(&ha), kept(&hb));
    let (got, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![1u8; 100]);
    assert_eq!((kept(&ha), kept(&hb)), (k0a, k0b), "first posts are checked");

    // Unchanged (new bytes in the same segment are the payload's business,
    // read at transmit): both posts take what the first found.
    sbuf.write(0, &[3u8; 100]).unwrap();
    let (got, mut d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![3u8; 100]);
    assert_eq!((kept(&ha), kept(&hb)), (k0a + 1, k0b + 1), "unchanged descriptors are not checked again");

    // Changed: another region, another length. What arrives is what the
    // descriptor says now, and it was checked again.
    d.set(&[(&other, 200..250)], None).unwrap();
    let (got, d, _r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![2u8; 50], "the changed descriptor's segment is what goes");
    assert_eq!(d.length(), 50);
    assert_eq!(kept(&ha), k0a + 1, "a changed descriptor is checked again");
}

/// A connected pair after one send of `len` bytes of `byte` (the first
/// post of each descriptor, which is checked), with its buffers and its two
/// descriptors back.
struct SentOnce {
    ha: Host,
    a: Vi,
    hb: Host,
    b: Vi,
    sbuf: MemoryRegion,
    rbuf: MemoryRegion,
    d: Descriptor,
    r: Descriptor,
}

fn sent_once(wire: &str, disc: &[u8], byte: u8, len: usize) -> SentOnce {
    let (ha, mut a, hb, mut b) = pair(wire, disc);
    let (sbuf, rbuf) = (ha.region(4096), hb.region(4096));
    sbuf.write(0, &vec![byte; len]).unwrap();
    let (d, r) = (ha.desc(&sbuf, 0, len), hb.desc(&rbuf, 0, 4096));
    let (got, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![byte; len]);
    SentOnce { ha, a, hb, b, sbuf, rbuf, d, r }
}

#[test]
fn a_deregistration_between_posts_has_the_descriptor_checked_again() {
    let SentOnce { ha, mut a, mut b, rbuf, d, r, .. } = sent_once("kept-2", b"k2", 7, 64);
    let k = kept(&ha);
    // Any deregistration may have been of the descriptor's memory: what
    // was found before no longer stands.
    drop(ha.region(4096));
    let (got, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![7u8; 64]);
    assert_eq!(kept(&ha), k, "checked again after a deregistration");
    let (_, _d, _r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(kept(&ha), k + 1, "and kept again after that check");
}

#[test]
fn a_descriptor_posted_on_another_vi_is_checked_there() {
    let SentOnce { ha, hb, rbuf, d, r, .. } = sent_once("kept-3", b"k3", 9, 32);
    // A second connection on the same NICs: the descriptor moves to it.
    let (mut a2, mut b2) = connect_pair(&ha, &hb, b"k3b");
    let k = (kept(&ha), kept(&hb));
    let (got, _d, _r) = send(&mut a2, d, &mut b2, r, &rbuf);
    assert_eq!(got, vec![9u8; 32]);
    assert_eq!((kept(&ha), kept(&hb)), k, "another VI checks it anew");
}

#[test]
fn a_descriptor_rewritten_behind_its_methods_is_read_as_it_is_now() {
    let SentOnce { ha, mut a, mut b, sbuf, rbuf, d, r, .. } = sent_once("kept-4", b"k4", 5, 100);
    sbuf.write(1000, &[6u8; 100]).unwrap();
    let k = kept(&ha);
    // As a C program would: the first data segment's address (its first 8
    // bytes, after the 32-byte control segment) moved 1000 bytes on, in
    // the descriptor's memory directly; nothing else changes.
    // SAFETY: the descriptor is ours and not posted; its first data
    // segment lies 32 bytes in.
    unsafe {
        let at = (d.addr() + 32) as *mut u64;
        at.write_volatile(at.read_volatile() + 1000);
    }
    let (got, _d, _r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![6u8; 100], "the segment's new address is what goes");
    assert_eq!(kept(&ha), k, "a rewritten descriptor is checked again");
}

/// Receives of two segments (a header, then the payload) are kept as
/// checked at post and placed on the one-frame path: a message across
/// both, one that fits the first, and one longer than both (a length
/// error, as on the general path).
#[test]
fn two_segment_receives_are_placed_across_both() {
    let (ha, mut a, hb, mut b) = pair("twoseg", b"twoseg");
    let (sbuf, rbuf) = (ha.region(4096), hb.region(4096));
    rbuf.write(0, &[0xee; 4096]).unwrap();
    let src = data(3, 1000);
    sbuf.write(0, &src).unwrap();
    let mut r = Descriptor::new(&hb.nic, hb.ptag, 2).unwrap();
    // 32 header bytes at 0, the payload from 2048 on.
    r.set(&[(&rbuf, 0..32), (&rbuf, 2048..3048)], None).unwrap();
    let mut d = ha.desc(&sbuf, 0, 1000);
    let kept_before = kept(&hb);
    for (round, len) in [1000usize, 20, 1000].into_iter().enumerate() {
        d.set(&[(&sbuf, 0..len)], None).unwrap();
        b.post_recv(r).unwrap();
        a.post_send(d).unwrap();
        r = b.recv_wait(T).unwrap();
        r.check_ok().unwrap();
        assert_eq!(r.length() as usize, len);
        let n = len.min(32);
        assert_eq!(rbuf.to_vec(0..n).unwrap(), src[..n], "round {round}: the header segment");
        if len > 32 {
            assert_eq!(rbuf.to_vec(2048..2048 + len - 32).unwrap(), src[32..len], "round {round}: the payload segment");
        }
        d = a.send_wait(T).unwrap();
        d.check_ok().unwrap();
    }
    assert!(kept(&hb) > kept_before, "a two-segment receive posted again unchanged is kept");
    // 1,100 bytes into 32 + 1,000: a length error, and the connection breaks.
    sbuf.write(0, &data(4, 1100)).unwrap();
    d.set(&[(&sbuf, 0..1100)], None).unwrap();
    b.post_recv(r).unwrap();
    a.post_send(d).unwrap();
    let r = b.recv_wait(T).unwrap();
    assert!(r.errors() & status::LENGTH_ERROR != 0, "status {:#x}", r.status());
}

#[test]
fn a_descriptor_kept_under_other_vi_attributes_is_checked_again() {
    let (ha, mut a, hb, mut b) = pair("kept-4", b"k4");
    let (sbuf, rbuf) = (ha.region(4096), hb.region(4096));
    let (d, r) = (ha.desc(&sbuf, 0, 100), hb.desc(&rbuf, 0, 4096));
    let (_, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    let k = kept(&hb);
    let (_, _d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(kept(&hb), k + 1, "the receive posted again unchanged was kept");

    // Idle again, b takes messages of at most 1 KiB: the same 4 KiB
    // receive is checked against that, not taken as it was kept.
    b.disconnect().unwrap();
    assert_eq!(b.state(), ViPhase::Idle);
    let attrs = ViAttributes { max_transfer_size: 1024, ..b.attributes() };
    b.set_attributes(&attrs).unwrap();
    b.post_recv(r).unwrap();
    assert_eq!(kept(&hb), k + 1, "checked again under the new attributes");
    let r = b.recv_done().unwrap().expect("a receive longer than the VI's limit completes at once");
    assert!(r.errors() & status::LENGTH_ERROR != 0, "status {:#x}", r.status());
}

#[test]
fn a_chain_of_sends_posts_until_one_is_refused() {
    let server = Host::new("chain");
    let client = Host::new("chain");
    let smac = server.nic.mac();
    let t = thread::spawn(move || {
        let buf = server.region(8 * 4096);
        let mut vi = server.vi(Reliability::ReliableDelivery);
        for k in 0..8 {
            vi.post_recv(server.desc(&buf, k * 4096, 4096)).unwrap();
        }
        let req = server.nic.connect_wait(b"chain", T).unwrap();
        server.nic.accept(&req, &vi).unwrap();
        // Six messages: a whole chain of four, then the two before the
        // refused one of the second chain, in posting order.
        for i in 0..6usize {
            let d = vi.recv_wait(T).unwrap();
            d.check_ok().unwrap();
            assert_eq!(buf.to_vec(i * 4096..i * 4096 + 100).unwrap(), data(i as u8, 100), "message {i}");
        }
        assert!(vi.recv_wait(Some(Duration::from_millis(200))).is_err(), "nothing after the refused descriptor was sent");
    });
    let buf = client.region(8 * 4096);
    let mut vi = client.vi(Reliability::ReliableDelivery);
    connect(&client, &mut vi, smac, b"chain");
    for i in 0..6usize {
        buf.write(i * 4096, &data(i as u8, 100)).unwrap();
    }
    vi.post_sends((0..4).map(|i| client.desc(&buf, i * 4096, 100))).unwrap();
    assert_eq!(vi.posted().0, 4);
    // A descriptor of another NIC names memory this one never registered:
    // the post refuses it, keeps the two before and never sees the last.
    let elsewhere = Host::new("chain-elsewhere");
    let stray = elsewhere.region(4096);
    let chain = vec![client.desc(&buf, 4 * 4096, 100), client.desc(&buf, 5 * 4096, 100), elsewhere.desc(&stray, 0, 100), client.desc(&buf, 6 * 4096, 100)];
    let e = vi.post_sends(chain).unwrap_err();
    assert_eq!(e.code, VipReturn::InvalidParameter, "{e}");
    assert_eq!(vi.posted().0, 6, "the two before the refused descriptor stay posted");
    for _ in 0..6 {
        vi.send_wait(T).unwrap().check_ok().unwrap();
    }
    t.join().unwrap();
}
