//! Receiver-not-ready mode (an extension, `Config::rnr` / `VIA_RNR=1`)
//! over the in-process loopback: messages sent before any receive is
//! posted are refused, held by the sender and sent again after a back-off,
//! and arrive whole and in order once the receiver posts; without the
//! mode the connection breaks as VIA 1.0 says; past the sender's retry
//! limit the message fails and the connection breaks. The receiver posts
//! only once its counters show that it refused a message, so "late" is
//! observed, not timed.

use std::thread;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::{AsyncErrorKind, Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, Vi, ViAttributes, ViPhase};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(20));
/// Sizes of the messages sent before the receiver is ready: one frame,
/// and several (the loopback's MTU is 1500).
const SIZES: [usize; 6] = [64, 1, 5000, 1500, 20_000, 300];

fn nic(wire: &str, cfg: Config) -> Nic {
    let dev = via_device::open_device(&format!("loop:{wire}"), &[]).unwrap();
    Nic::with_device(wire, dev, cfg).unwrap()
}

fn attrs(nic: &Nic) -> ViAttributes {
    ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 16, ptag: nic.create_ptag().unwrap(), enable_rdma_write: false, enable_rdma_read: false }
}

fn region(nic: &Nic, a: &ViAttributes, len: usize) -> MemoryRegion {
    MemoryRegion::new(nic, len, 4096, MemAttributes { ptag: a.ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap()
}

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + k * 13) as u8).collect()
}

/// A connected pair: the receiver (on a NIC with `receiver_cfg`, nothing
/// posted) and the sender (on one with `sender_cfg`).
fn pair(wire: &str, receiver_cfg: Config, sender_cfg: Config) -> ((Nic, Vi, ViAttributes), (Nic, Vi, ViAttributes)) {
    let rn = nic(wire, receiver_cfg);
    let sn = nic(wire, sender_cfg);
    let (ra, sa) = (attrs(&rn), attrs(&sn));
    let rvi = rn.create_vi(&ra, None, None).unwrap();
    let mut svi = sn.create_vi(&sa, None, None).unwrap();
    let rmac = rn.mac();
    let server = thread::spawn(move || {
        let req = rn.connect_wait(b"rnr", T).unwrap();
        rn.accept(&req, &rvi).unwrap();
        (rn, rvi)
    });
    svi.connect_retrying(rmac, b"rnr", T.unwrap()).unwrap();
    let (rn, rvi) = server.join().unwrap();
    ((rn, rvi, ra), (sn, svi, sa))
}

/// The sender's configuration: patient enough for any late receiver here.
fn patient() -> Config {
    Config { rnr_retry_limit: 400, ..Config::default() }
}

/// Posts every message of [`SIZES`] on `vi`.
fn send_all(nic: &Nic, vi: &mut Vi, a: &ViAttributes, src: &MemoryRegion) {
    let mut at = 0;
    for (k, &n) in SIZES.iter().enumerate() {
        src.write(at, &pattern(k, n)).unwrap();
        let mut d = Descriptor::new(nic, a.ptag, 1).unwrap();
        d.set_op(Op::SendRecv, &[(src, at..at + n)], None, false).unwrap();
        vi.post_send(d).unwrap();
        at += n;
    }
}

/// Runs `nic`'s progress until `cond` holds (at most [`T`]).
fn poll_until(nic: &Nic, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + T.unwrap();
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {T:?}");
        nic.progress();
    }
}

/// Waits until `nic` has refused a message (its counters say so).
fn until_refused(nic: &Nic) {
    poll_until(nic, "a refusal", || nic.counters().rnr_refused > 0);
}

#[test]
fn a_receiver_that_posts_late_loses_nothing_in_rnr_mode() {
    let ((rn, mut rvi, ra), (sn, mut svi, sa)) = pair("rnr-late", Config { rnr: true, ..Config::default() }, patient());
    let src = region(&sn, &sa, 64 << 10);
    send_all(&sn, &mut svi, &sa, &src);
    until_refused(&rn);
    // Now ready: one receive per message.
    let dst = region(&rn, &ra, SIZES.len() << 15);
    for k in 0..SIZES.len() {
        let mut d = Descriptor::new(&rn, ra.ptag, 1).unwrap();
        d.set(&[(&dst, k << 15..(k + 1) << 15)], None).unwrap();
        rvi.post_recv(d).unwrap();
    }
    for (k, &n) in SIZES.iter().enumerate() {
        let d = rvi.recv_wait(T).unwrap();
        d.check_ok().unwrap();
        assert_eq!(d.length() as usize, n, "message {k}");
        assert_eq!(dst.to_vec(k << 15..(k << 15) + n).unwrap(), pattern(k, n), "message {k}: whole, and in order");
    }
    for k in 0..SIZES.len() {
        svi.send_wait(T).unwrap().check_ok().unwrap_or_else(|e| panic!("send {k}: {e}"));
    }
    assert_eq!(rvi.state(), ViPhase::Connected);
    assert_eq!(svi.state(), ViPhase::Connected);
    assert!(rn.take_async_errors().is_empty(), "no error at the receiver");
    assert!(sn.counters().rnr_refusals_received > 0, "the sender was told it was refused: {:?}", sn.counters());
}

#[test]
fn without_rnr_mode_a_send_with_no_receive_breaks_the_connection() {
    let ((rn, rvi, _), (sn, mut svi, sa)) = pair("rnr-off", Config::default(), patient());
    let src = region(&sn, &sa, 64 << 10);
    send_all(&sn, &mut svi, &sa, &src);
    poll_until(&rn, "the receiver's VI breaks", || rvi.state() == ViPhase::Error);
    let errors = rn.take_async_errors();
    assert!(errors.iter().any(|e| e.kind == AsyncErrorKind::RecvQueueEmpty), "{errors:?}");
    assert_eq!(rn.counters().rnr_refused, 0);
    poll_until(&sn, "the sender's VI breaks", || svi.state() == ViPhase::Error);
}

#[test]
fn a_receiver_that_never_posts_fails_the_send_past_the_retry_limit() {
    let ((rn, _rvi, _), (sn, mut svi, sa)) = pair("rnr-never", Config { rnr: true, ..Config::default() }, Config { rnr_retry_limit: 4, ..Config::default() });
    let src = region(&sn, &sa, 4096);
    let mut d = Descriptor::new(&sn, sa.ptag, 1).unwrap();
    d.set(&[(&src, 0..64)], None).unwrap();
    svi.post_send(d).unwrap();
    let d = svi.send_wait(T).unwrap();
    assert_eq!(d.errors(), status::TRANSPORT_ERROR, "status {:#x}", d.status());
    assert_eq!(svi.state(), ViPhase::Error);
    assert_eq!(sn.counters().rnr_refusals_received, 5, "the limit, then one more refusal");
    assert!(rn.counters().rnr_refused >= 5);
}
