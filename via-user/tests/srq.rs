//! Shared receive queues (an extension) over the in-process loopback: one
//! pool of receives on a server serves the VIs of three clients, each of
//! which sends more messages at once than the pool holds; with the
//! receiver-not-ready mode nothing is lost, every message arrives whole and
//! in its VI's order, and the server learns which VI each came on from one
//! completion queue. And the rules: no receive posted on such a VI, a
//! pool only for an idle VI under its tag, a bad descriptor refused at the
//! pool.

use std::thread;
use std::time::Duration;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, ViAttributes, ViaError, VipReturn};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(20));
const CLIENTS: usize = 3;
const MESSAGES: usize = 40;
const POOL: usize = 8;
const SLOT: usize = 8192;

fn nic(wire: &str, cfg: Config) -> Nic {
    let dev = via_device::open_device(&format!("loop:{wire}"), &[]).unwrap();
    Nic::with_device(wire, dev, cfg).unwrap()
}

fn attrs(ptag: via_user::Ptag) -> ViAttributes {
    ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 16, ptag, enable_rdma_write: false, enable_rdma_read: false }
}

/// Client `c`'s message `i`: its length (1 B to 6 KB, some of several
/// frames) and bytes, which name both.
fn message(c: usize, i: usize) -> Vec<u8> {
    let n = 1 + (i * 997 + c * 131) % 6000;
    (0..n).map(|k| (k + 3 * i + 101 * c) as u8).collect()
}

#[test]
fn one_pool_serves_many_vis_and_loses_nothing() {
    let server = nic("srq-pool", Config { rnr: true, ..Config::default() });
    let ptag = server.create_ptag().unwrap();
    let srq = server.create_srq(ptag, POOL).unwrap();
    let cq = server.create_cq(256).unwrap();
    let mem = MemoryRegion::new(&server, POOL * SLOT, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    // Each descriptor's slot, by the descriptor's address.
    let mut slot_of = std::collections::HashMap::new();
    for k in 0..POOL {
        let mut d = Descriptor::new(&server, ptag, 1).unwrap();
        d.set(&[(&mem, k * SLOT..(k + 1) * SLOT)], None).unwrap();
        slot_of.insert(d.addr(), k);
        srq.post_recv(d).map_err(|(_, e)| e).unwrap();
    }
    let smac = server.mac();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            thread::spawn(move || {
                let n = nic("srq-pool", Config::default());
                let ptag = n.create_ptag().unwrap();
                let mut vi = n.create_vi(&attrs(ptag), None, None).unwrap();
                vi.connect_retrying(smac, b"pool", T.unwrap()).unwrap();
                let src = MemoryRegion::new(&n, MESSAGES * SLOT, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
                // Every message posted at once: far more than the pool holds.
                for i in 0..MESSAGES {
                    let m = message(c, i);
                    src.write(i * SLOT, &m).unwrap();
                    let mut d = Descriptor::new(&n, ptag, 1).unwrap();
                    d.set_op(Op::SendRecv, &[(&src, i * SLOT..i * SLOT + m.len())], None, false).unwrap();
                    vi.post_send(d).unwrap();
                }
                for i in 0..MESSAGES {
                    vi.send_wait(T).unwrap().check_ok().unwrap_or_else(|e| panic!("client {c} send {i}: {e}"));
                }
                n.counters().rnr_refusals_received
            })
        })
        .collect();
    let mut vis = Vec::new();
    for _ in 0..CLIENTS {
        let mut vi = server.create_vi(&attrs(ptag), None, Some(&cq)).unwrap();
        vi.use_srq(&srq).unwrap();
        let req = server.connect_wait(b"pool", T).unwrap();
        server.accept(&req, &vi).unwrap();
        vis.push(vi);
    }
    // Receive from any VI through the CQ; hand each receive back to the
    // pool at once.
    let mut next = vec![None::<(usize, usize)>; CLIENTS]; // per VI: the client and its next message
    let mut got = 0;
    while got < CLIENTS * MESSAGES {
        let c = cq.wait(T).unwrap();
        assert!(c.recv_queue);
        let v = vis.iter().position(|v| v.id() == c.vi).expect("a VI of ours");
        let d = vis[v].recv_done().unwrap().expect("the CQ named a completed receive");
        d.check_ok().unwrap();
        got += 1;
        let body = mem.to_vec(slot_of[&d.addr()] * SLOT..slot_of[&d.addr()] * SLOT + d.length() as usize).unwrap();
        // Which client sent it: the one whose first message it is.
        let client = match next[v] {
            Some((c, _)) => c,
            None => (0..CLIENTS).find(|&c| body == message(c, 0)).expect("a first message of some client"),
        };
        let i = next[v].map_or(0, |(_, i)| i);
        assert_eq!(body, message(client, i), "VI {v}: message {i} of client {client}, whole and in order");
        next[v] = Some((client, i + 1));
        srq.post_recv(d).map_err(|(_, e)| e).unwrap();
    }
    let refusals: u64 = clients.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(refusals > 0, "the pool never ran dry: the clients were never held back");
    assert!(server.take_async_errors().iter().all(|e| e.kind == via_user::AsyncErrorKind::ConnLost), "no error but the clients' leaving");
}

/// `RecvNotify` on a VI that draws from a pool: the callback gets the
/// pool descriptor the next message took, with the message in it; until
/// then `RecvDone` is refused (the notification owns the next completion).
#[test]
fn recv_notify_hands_over_the_pool_descriptor_a_message_took() {
    let server = nic("srq-notify", Config::default());
    let ptag = server.create_ptag().unwrap();
    let srq = server.create_srq(ptag, 4).unwrap();
    let plain = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mem = MemoryRegion::new(&server, 4 * SLOT, 4096, plain).unwrap();
    let mut addrs = Vec::new();
    for k in 0..4 {
        let mut d = Descriptor::new(&server, ptag, 1).unwrap();
        d.set(&[(&mem, k * SLOT..(k + 1) * SLOT)], None).unwrap();
        addrs.push(d.addr());
        srq.post_recv(d).map_err(|(_, e)| e).unwrap();
    }
    let smac = server.mac();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // The client sends only once the server has checked that the armed
    // notification refuses `recv_done`: a message that came earlier would
    // have fired (and so disarmed) it already.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let client = thread::spawn(move || {
        let n = nic("srq-notify", Config::default());
        let ptag = n.create_ptag().unwrap();
        let mut vi = n.create_vi(&attrs(ptag), None, None).unwrap();
        vi.connect_retrying(smac, b"notify", T.unwrap()).unwrap();
        let src = MemoryRegion::new(&n, SLOT, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
        let m = message(0, 5);
        src.write(0, &m).unwrap();
        let mut d = Descriptor::new(&n, ptag, 1).unwrap();
        d.set_op(Op::SendRecv, &[(&src, 0..m.len())], None, false).unwrap();
        go_rx.recv_timeout(T.unwrap()).expect("the server's go");
        vi.post_send(d).unwrap();
        vi.send_wait(T).unwrap().check_ok().unwrap();
        // Stay connected until the server has the message.
        let _ = done_rx.recv_timeout(T.unwrap());
    });
    let mut vi = server.create_vi(&attrs(ptag), None, None).unwrap();
    vi.use_srq(&srq).unwrap();
    let req = server.connect_wait(b"notify", T).unwrap();
    server.accept(&req, &vi).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    vi.recv_notify(move |d| tx.send(d).unwrap()).unwrap();
    assert_eq!(vi.recv_done().unwrap_err().code, VipReturn::InvalidState, "the armed notification owns the next completion");
    go_tx.send(()).unwrap();
    let d = rx.recv_timeout(T.unwrap()).expect("the notification came");
    d.check_ok().unwrap();
    assert!(addrs.contains(&d.addr()), "a descriptor of the pool");
    let k = addrs.iter().position(|&a| a == d.addr()).unwrap();
    assert_eq!(mem.to_vec(k * SLOT..k * SLOT + d.length() as usize).unwrap(), message(0, 5));
    assert_eq!(srq.len().unwrap(), 3, "the message took one receive of the pool");
    done_tx.send(()).unwrap();
    drop(vi);
    client.join().unwrap();
}

#[test]
fn the_rules_of_a_pool() {
    let n = nic("srq-rules", Config::default());
    let ptag = n.create_ptag().unwrap();
    let other = n.create_ptag().unwrap();
    let srq = n.create_srq(ptag, 4).unwrap();
    let mem = MemoryRegion::new(&n, 4096, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    // A VI under another tag cannot use it.
    let mut vi = n.create_vi(&attrs(other), None, None).unwrap();
    assert_eq!(vi.use_srq(&srq).unwrap_err().code, VipReturn::InvalidPtag);
    // A VI with a receive posted cannot either.
    let mut vi = n.create_vi(&attrs(ptag), None, None).unwrap();
    let mut d = Descriptor::new(&n, ptag, 1).unwrap();
    d.set(&[(&mem, 0..64)], None).unwrap();
    vi.post_recv(d).unwrap();
    assert_eq!(vi.use_srq(&srq).unwrap_err().code, VipReturn::InvalidState);
    // One that uses it takes no receive of its own.
    let mut vi = n.create_vi(&attrs(ptag), None, None).unwrap();
    vi.use_srq(&srq).unwrap();
    let mut d = Descriptor::new(&n, ptag, 1).unwrap();
    d.set(&[(&mem, 0..64)], None).unwrap();
    let e: ViaError = vi.post_recv(d).unwrap_err();
    assert_eq!(e.code, VipReturn::InvalidState, "{e}");
    // A descriptor that is no receive (an RDMA write) is refused by the
    // pool and handed back.
    let mut d = Descriptor::new(&n, ptag, 1).unwrap();
    d.set_op(Op::RdmaWrite(mem.remote(0..64).unwrap()), &[(&mem, 0..64)], None, false).unwrap();
    let (back, e) = srq.post_recv(d).unwrap_err();
    assert_eq!(e.code, VipReturn::DescriptorError, "{e}");
    assert_eq!(back.control() & via_user::descriptor::control::OP_MASK, via_user::descriptor::control::OP_RDMAWRITE);
    assert_eq!(srq.len().unwrap(), 0);
}
