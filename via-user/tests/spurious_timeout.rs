//! A retransmission timeout that was spurious (every frame arrived, the
//! receiver's ACKs did not) costs one burst of frames sent again, not the
//! whole window: after a timeout the sender goes again [`RTO_BURST`] frames
//! at a time and waits for the peer's answer, and an answer that
//! acknowledges frames never sent again (F-RTO's test) ends the going back.
//! On a NIC whose ring a slow receiver fills (the tulip in a guest), the
//! window sent again on top of the frames still waiting there overflowed
//! it and turned one late ACK into hundreds of lost frames.

mod devices;

use devices::{DroppingDevice, OneMessage};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::vi::RTO_BURST;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, ViAttributes};
use via_wire::{Kind, ETH_HEADER_LEN};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8).collect()
}

#[test]
fn a_spurious_timeout_sends_one_burst_again_not_the_window() {
    // 200 fragments at MTU 1500: far more than a burst, within the window.
    let len = 200 * 1400;
    let pass = Arc::new(AtomicBool::new(false));
    let inner = via_device::open_device("loop:spurious", &[]).unwrap();
    // Loses every standalone ACK it sends until `pass` is set.
    let open = pass.clone();
    let drops = move |header: &[u8]| header[ETH_HEADER_LEN + 1] == Kind::Ack as u8 && !open.load(Ordering::SeqCst);
    let server = Nic::with_device("spurious", Box::new(DroppingDevice { inner, drops: Box::new(drops) }), Config::default()).unwrap();
    let peer = OneMessage::serve(server, b"spurious", len, T.unwrap());

    let cfg = Config { rto_initial: Duration::from_millis(1), ..Config::default() };
    let client = Nic::with_device("spurious", via_device::open_device("loop:spurious", &[]).unwrap(), cfg).unwrap();
    let ptag = client.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mut vi = client.create_vi(&a, None, None).unwrap();
    vi.connect_retrying(peer.mac, b"spurious", T.unwrap()).unwrap();
    peer.ready.recv().unwrap();
    let before = client.counters();
    let r = MemoryRegion::new(&client, len, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    r.write(0, &data(len)).unwrap();
    let mut d = Descriptor::new(&client, ptag, 1).unwrap();
    d.set(&[(&r, 0..len)], None).unwrap();
    vi.post_send(d).unwrap();
    // The receiver's ACKs are lost until the sender's first timeout:
    // everything arrived, and the timeout is spurious.
    let done = loop {
        if let Some(d) = vi.send_done().unwrap() {
            break d;
        }
        if client.counters().rto_expiries > before.rto_expiries {
            pass.store(true, Ordering::SeqCst);
        }
    };
    done.check_ok().unwrap();
    peer.end.send(()).unwrap();
    let (st, got, _) = peer.done.join().unwrap();
    assert_eq!(st & status::ERROR_MASK, 0, "the receive completes without error: status {st:#x}");
    assert!(got == data(len), "the message arrives whole and in order");

    let c = client.counters();
    let (expiries, resent) = (c.rto_expiries - before.rto_expiries, c.retransmits - before.retransmits);
    assert!(expiries >= 1, "the sender never timed out: nothing tested");
    assert!(
        resent <= expiries * u64::from(RTO_BURST),
        "{expiries} spurious timeouts sent {resent} frames again: more than a burst of {RTO_BURST} each (the 200-frame window went again)"
    );
}
