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
