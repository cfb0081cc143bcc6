//! A connection's first frames settle its request: a VI whose program has
//! not polled its peer request since the connection was made (it computes,
//! or blocks elsewhere) takes the peer's first message when it comes,
//! instead of refusing it as stale (or, with a cluster secret, for want of
//! the connection's keys) until its program polls, and the peer's send
//! completes without a retransmission. Both sides of the decision, with
//! and without a secret, over the in-process loopback device. (Alone in
//! its test binary: it sets VIA_SECRET.)

use std::time::Duration;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, ViAttributes, ViPhase};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));
const MSG: usize = 200;

fn vi_and_region(nic: &Nic) -> (via_user::Vi, MemoryRegion, via_user::Ptag) {
    let ptag = nic.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 4096, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let vi = nic.create_vi(&a, None, None).unwrap();
    let r = MemoryRegion::new(nic, 4096, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    (vi, r, ptag)
}

fn desc(nic: &Nic, ptag: via_user::Ptag, r: &MemoryRegion) -> Descriptor {
    let mut d = Descriptor::new(nic, ptag, 1).unwrap();
    d.set_op(Op::SendRecv, &[(r, 0..MSG)], None, false).unwrap();
    d
}

/// `sender` connects (polling) and sends one message; `quiet` asked for
/// the same connection, posted a receive and polls nothing until the
/// send has completed.
fn first_message(wire: &str, quiet_decides: bool) {
    let (n1, n2) = (Nic::open(wire).unwrap(), Nic::open(wire).unwrap());
    // The side whose MAC is lower decides the connection.
    let (quiet, sender) = if (n1.mac().0 < n2.mac().0) == quiet_decides { (n1, n2) } else { (n2, n1) };
    let (mut vq, rq, pq) = vi_and_region(&quiet);
    let (mut vs, rs, ps) = vi_and_region(&sender);
    vq.post_recv(desc(&quiet, pq, &rq)).unwrap();
    vq.connect_peer_request(sender.mac(), b"quiet", b"sender", T).unwrap();
    vs.connect_peer_request(quiet.mac(), b"sender", b"quiet", T).unwrap();
    vs.connect_peer_wait().unwrap();
    let msg: Vec<u8> = (0..MSG).map(|i| (i * 7) as u8).collect();
    rs.write(0, &msg).unwrap();
    vs.post_send(desc(&sender, ps, &rs)).unwrap();
    // Reliable delivery: the send completes once the quiet side placed it.
    let d = vs.send_wait(T).unwrap();
    let what = format!("{wire} (quiet side decides: {quiet_decides})");
    assert_eq!(d.status() & via_user::descriptor::status::DONE, via_user::descriptor::status::DONE, "{what}: status {:#x}", d.status());
    assert_eq!(d.errors(), 0, "{what}: status {:#x}", d.status());
    assert_eq!(vq.state(), ViPhase::Connected, "{what}: the first frame settled the request");
    let (cq, cs) = (quiet.counters(), sender.counters());
    assert_eq!(cq.requests_settled_by_frame, 1, "{what}: {cq:?}");
    assert_eq!((cq.rx_stale, cq.rx_bad_auth), (0, 0), "{what}: nothing refused: {cq:?}");
    assert_eq!(cs.retransmits, 0, "{what}: nothing sent twice: {cs:?}");
    // The program's poll finds it connected, the message placed.
    assert!(vq.connect_peer_done().unwrap(), "{what}");
    let got = vq.recv_wait(T).unwrap();
    assert_eq!((got.errors(), got.length() as usize), (0, MSG), "{what}");
    let mut back = vec![0u8; MSG];
    rq.read(0, &mut back).unwrap();
    assert_eq!(back, msg, "{what}");
}

#[test]
fn a_connections_first_message_reaches_a_side_that_has_not_polled_its_request() {
    for quiet_decides in [true, false] {
        first_message(&format!("loop:first-plain-{quiet_decides}"), quiet_decides);
    }
    let dir = std::env::temp_dir().join(format!("via-first-frames-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let secret = dir.join("secret");
    via_kernel_agent::auth::create_secret_file(&secret).unwrap();
    // SAFETY (edition 2021: safe): this binary's only test, after its
    // unkeyed half.
    std::env::set_var("VIA_SECRET", &secret);
    for quiet_decides in [true, false] {
        first_message(&format!("loop:first-keyed-{quiet_decides}"), quiet_decides);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
