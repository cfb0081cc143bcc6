//! Loss recovery and loss reporting through the engine, over the loopback
//! device wrapped in one that drops chosen frames: unreliable gaps give
//! PARTIAL_ERROR, reliable VIs retransmit, and a lost RDMA read response is
//! asked for again.

mod devices;

use devices::DroppingDevice;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use via_wire::{Kind, ETH_HEADER_LEN};
use via_user::descriptor::status;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, ViAttributes};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

/// A NIC on loopback wire `wire` whose transmissions lose the first
/// `budget` frames of `kind` at fragment offset `offset`.
fn lossy_nic(wire: &str, kind: Kind, offset: u32, budget: u32) -> Nic {
    let inner = via_device::open_device(&format!("loop:{wire}"), &[]).unwrap();
    let mut left = budget;
    let drops = move |header: &[u8]| {
        let via = &header[ETH_HEADER_LEN..];
        let off = u32::from_be_bytes([via[32], via[33], via[34], via[35]]);
        let hit = via[1] == kind as u8 && off == offset && left > 0;
        left -= u32::from(hit);
        hit
    };
    let dev = DroppingDevice { inner, drops: Box::new(drops) };
    let cfg = Config { rto_initial: Duration::from_millis(1), ..Config::default() };
    Nic::with_device(wire, Box::new(dev), cfg).unwrap()
}

fn data(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(17) ^ seed).collect()
}

/// Target on a clean NIC, initiator on a lossy one; `body` runs on the
/// initiator with its VI and the target's region (RDMA-enabled, filled with
/// `data(9, ..)`), the target thread posts `recvs` receives of 8000 bytes
/// and returns their (status, length, contents) once the initiator is done.
#[allow(clippy::type_complexity)]
fn run(wire: &str, level: Reliability, lossy: Nic, recvs: usize, body: impl FnOnce(&Nic, &mut via_user::Vi, via_user::RemoteBuffer, via_user::Ptag)) -> Vec<(u32, u32, Vec<u8>)> {
    let server = Nic::open(&format!("loop:{wire}")).unwrap();
    let smac = server.mac();
    let (rb_tx, rb_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let ptag = server.create_ptag().unwrap();
        let read = level != Reliability::Unreliable;
        let a = ViAttributes { reliability: level, max_transfer_size: 1 << 20, ptag, enable_rdma_write: true, enable_rdma_read: read };
        let mut vi = server.create_vi(&a, None, None).unwrap();
        let mem = MemoryRegion::new(&server, 1 << 20, 4096, MemAttributes { ptag, enable_rdma_write: true, enable_rdma_read: read }).unwrap();
        mem.write(0, &data(9, 1 << 20)).unwrap();
        let rbuf = MemoryRegion::new(&server, recvs.max(1) * 8000, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
        for i in 0..recvs {
            let mut d = Descriptor::new(&server, ptag, 1).unwrap();
            d.set(&[(&rbuf, i * 8000..(i + 1) * 8000)], None).unwrap();
            vi.post_recv(d).unwrap();
        }
        let req = server.connect_wait(b"lossy", T).unwrap();
        server.accept(&req, &vi).unwrap();
        rb_tx.send(mem.remote(0..1 << 20).unwrap()).unwrap();
        let mut out = Vec::new();
        for i in 0..recvs {
            let d = vi.recv_wait(T).unwrap();
            out.push((d.status(), d.length(), rbuf.to_vec(i * 8000..i * 8000 + d.length() as usize).unwrap()));
        }
        let _ = done_rx.recv();
        out
    });
    let ptag = lossy.create_ptag().unwrap();
    let read = level != Reliability::Unreliable;
    let a = ViAttributes { reliability: level, max_transfer_size: 1 << 20, ptag, enable_rdma_write: true, enable_rdma_read: read };
    let mut vi = lossy.create_vi(&a, None, None).unwrap();
    vi.connect_retrying(smac, b"lossy", T.unwrap()).unwrap();
    let rb = rb_rx.recv().unwrap();
    body(&lossy, &mut vi, rb, ptag);
    let _ = done_tx.send(());
    t.join().unwrap()
}

fn send(nic: &Nic, vi: &mut via_user::Vi, ptag: via_user::Ptag, bytes: &[u8]) {
    let r = MemoryRegion::new(nic, bytes.len().max(1), 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    r.write(0, bytes).unwrap();
    let mut d = Descriptor::new(nic, ptag, 1).unwrap();
    d.set(&[(&r, 0..bytes.len())], None).unwrap();
    vi.post_send(d).unwrap();
    vi.send_wait(T).unwrap().check_ok().unwrap();
}

#[test]
fn unreliable_gap_completes_the_receive_with_partial_error() {
    // The second fragment (offset 1436 at MTU 1500) of the first message is lost.
    let lossy = lossy_nic("partial", Kind::Data, 1436, 1);
    let got = run("partial", Reliability::Unreliable, lossy, 2, |nic, vi, _, ptag| {
        send(nic, vi, ptag, &data(1, 5000));
        send(nic, vi, ptag, &data(2, 100));
    });
    let (st, len, bytes) = &got[0];
    assert_eq!(st & status::ERROR_MASK, status::PARTIAL_ERROR, "status {st:#x}");
    assert_eq!(*len, 1436, "the bytes placed before the gap");
    assert_eq!(bytes[..], data(1, 5000)[..1436]);
    let (st, len, bytes) = &got[1];
    assert_eq!(st & status::ERROR_MASK, 0, "the next message: status {st:#x}");
    assert_eq!((*len, bytes.clone()), (100, data(2, 100)));
}

#[test]
fn reliable_loss_is_retransmitted() {
    let lossy = lossy_nic("rel", Kind::Data, 1436, 3);
    let n = lossy.clone();
    let got = run("rel", Reliability::ReliableDelivery, lossy, 1, |nic, vi, _, ptag| send(nic, vi, ptag, &data(3, 7000)));
    assert_eq!(got[0].0 & status::ERROR_MASK, 0);
    assert_eq!(got[0].2, data(3, 7000));
    assert!(n.counters().retransmits > 0, "{:?}", n.counters());
}

#[test]
fn lost_rdma_read_response_is_asked_for_again() {
    // The target's response at offset 2 * 1436 is lost (twice): the
    // initiator's read stalls, times out, and asks for the rest.
    let (lossy_target_wire, budget) = ("readloss", 2);
    let target = lossy_nic(lossy_target_wire, Kind::RdmaReadResp, 2 * 1436, budget);
    let server = target.clone();
    let smac = server.mac();
    let (rb_tx, rb_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let ptag = server.create_ptag().unwrap();
        let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: true };
        let vi = server.create_vi(&a, None, None).unwrap();
        let mem = MemoryRegion::new(&server, 65536, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: true }).unwrap();
        mem.write(0, &data(5, 65536)).unwrap();
        let req = server.connect_wait(b"lossy", T).unwrap();
        server.accept(&req, &vi).unwrap();
        rb_tx.send(mem.remote(0..65536).unwrap()).unwrap();
        let _ = done_rx.recv();
    });
    let client = Nic::open(&format!("loop:{lossy_target_wire}")).unwrap();
    let ptag = client.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: true };
    let mut vi = client.create_vi(&a, None, None).unwrap();
    vi.connect_retrying(smac, b"lossy", T.unwrap()).unwrap();
    let rb = rb_rx.recv().unwrap();
    let dst = MemoryRegion::new(&client, 65536, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    let mut d = Descriptor::new(&client, ptag, 1).unwrap();
    d.set_op(Op::RdmaRead(rb), &[(&dst, 0..65536)], None, false).unwrap();
    vi.post_send(d).unwrap();
    let d = vi.send_wait(T).unwrap();
    d.check_ok().unwrap();
    assert_eq!(dst.to_vec(0..65536).unwrap(), data(5, 65536));
    assert!(client.counters().rto_expiries > 0, "the stall was recovered by the timer: {:?}", client.counters());
    let _ = done_tx.send(());
    t.join().unwrap();
}

/// A Disconnect is the last frame a peer hears from us, acknowledged and
/// repeated by nothing, and the peer's VI has nothing outstanding to time
/// out on: one lost Disconnect left it connected for good (MTTL's ranks
/// waited for a send to a rank that had exited). With the first one lost,
/// the peer must still see the connection end.
#[test]
fn a_disconnect_reaches_the_peer_when_its_first_frame_is_lost() {
    let wire = "lost-disconnect";
    let server = Nic::open(&format!("loop:{wire}")).unwrap();
    let smac = server.mac();
    let t = thread::spawn(move || {
        let ptag = server.create_ptag().unwrap();
        let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
        let mut vi = server.create_vi(&a, None, None).unwrap();
        let buf = MemoryRegion::new(&server, 4096, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
        let mut d = Descriptor::new(&server, ptag, 1).unwrap();
        d.set(&[(&buf, 0..100)], None).unwrap();
        vi.post_recv(d).unwrap();
        let req = server.connect_wait(b"lossy", T).unwrap();
        server.accept(&req, &vi).unwrap();
        // The client disconnects: the posted receive is flushed.
        match vi.recv_wait(Some(Duration::from_secs(5))) {
            Ok(d) => assert_ne!(d.errors() & status::DESC_FLUSHED_ERROR, 0, "the receive completed without the flush"),
            Err(e) => assert_ne!(e.code, via_user::VipReturn::Timeout, "the server never heard the disconnect: {e}"),
        }
        assert_eq!(vi.state(), via_user::ViPhase::Error);
    });
    let client = lossy_nic(wire, Kind::Disconnect, 0, 1);
    let ptag = client.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mut vi = client.create_vi(&a, None, None).unwrap();
    vi.connect_retrying(smac, b"lossy", T.unwrap()).unwrap();
    vi.disconnect().unwrap();
    t.join().unwrap();
}
