//! Tags checked four at a time on receipt: a superframe's units come to
//! the engine with the rest of the superframe behind them
//! (`via_device::Ahead`), and the engine checks a unit's tag together
//! with the next three's and keeps their verdicts. A unit whose bytes
//! were changed on the way must still be refused, alone, wherever it lies
//! in its four, and the message must still arrive whole (sent again).
//! Over the in-process loopback device, behind a wrapper that hands its
//! frames on as the UDP packet device hands a superframe's units
//! (`devices::Superframing`). (Alone in its test binary: it sets
//! VIA_SECRET.)

mod devices;

use devices::{OneMessage, Superframing};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, ViAttributes};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29) ^ (i >> 9) as u8).collect()
}

/// Sends one 100-fragment message to a receiver whose device flips a bit
/// in the unit at `corrupt_at` of the first long run of data frames;
/// returns the receiver's counters.
fn one_corrupted_unit(corrupt_at: usize) -> via_user::Counters {
    let len = 100 * 1400;
    let corrupted = Arc::new(AtomicUsize::new(0));
    let wire = format!("loop:ahead-{corrupt_at}");
    let inner = via_device::open_device(&wire, &[]).unwrap();
    let dev = Superframing { inner, corrupt_at, corrupted: corrupted.clone() };
    let server = Nic::with_device("ahead", Box::new(dev), Config::default()).unwrap();
    let peer = OneMessage::serve(server, b"ahead", len, T.unwrap());
    let client = Nic::with_device("ahead", via_device::open_device(&wire, &[]).unwrap(), Config::default()).unwrap();
    let ptag = client.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mut vi = client.create_vi(&a, None, None).unwrap();
    let msg = data(len);
    let buf = MemoryRegion::new(&client, len, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    buf.write(0, &msg).unwrap();
    vi.connect_retrying(peer.mac, b"ahead", T.unwrap()).unwrap();
    peer.ready.recv().unwrap();
    let mut d = Descriptor::new(&client, ptag, 1).unwrap();
    d.set(&[(&buf, 0..len)], None).unwrap();
    vi.post_send(d).unwrap();
    let sent = vi.send_wait(T).unwrap();
    assert_eq!(sent.errors(), 0, "the send: status {:#x}", sent.status());
    peer.end.send(()).unwrap();
    let (st, got, counters) = peer.done.join().unwrap();
    assert_eq!(st & status::DONE, status::DONE);
    assert_eq!(got.len(), len);
    assert!(got == msg, "the message arrived whole (unit {corrupt_at} of its run corrupted)");
    assert_eq!(corrupted.load(Ordering::SeqCst), 1, "one unit was corrupted");
    counters
}

#[test]
fn a_unit_changed_on_the_way_is_refused_wherever_it_lies_in_its_four() {
    let dir = std::env::temp_dir().join(format!("via-tags-ahead-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let secret = dir.join("secret");
    via_kernel_agent::auth::create_secret_file(&secret).unwrap();
    // SAFETY (edition 2021: safe): this binary's only test, before any
    // engine opens.
    std::env::set_var("VIA_SECRET", &secret);
    let lanes = via_wire::tag::lanes::lanes_available();
    // Each position of a four: its first (checked with the three after
    // it), and the three checked ahead.
    for at in 0..4 {
        let c = one_corrupted_unit(at);
        assert_eq!(c.rx_bad_auth, 1, "unit {at}: the changed unit alone is refused: {c:?}");
        assert!(c.rx_authenticated >= 100, "unit {at}: {c:?}");
        if lanes {
            // The run's first four were checked together (how many more
            // were depends on how the receiver's polls cut the stream).
            assert!(c.rx_checked_ahead >= 3, "unit {at}: units' tags checked ahead: {c:?}");
        } else {
            eprintln!("no AVX-512 with VAES here: each tag is checked alone");
            assert_eq!(c.rx_checked_ahead, 0, "{c:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
