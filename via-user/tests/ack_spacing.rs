//! When a receiver acknowledges. A reliable send completes when the peer
//! acknowledges it, so an ACK that waits costs the sender: once the peer's
//! frames stop coming, the ACK goes `ack_idle` later (it waited for the
//! 200 us delayed-ACK timer before: a blocking send of a small message to
//! a peer that does not reply took 250-400 us), while a reply sent sooner
//! still carries it. And with `ack_every` 0 (an eighth of the window, as
//! MTTL runs), a large message whose reply follows at once costs no
//! standalone ACK in its middle, and a one-way stream is still
//! acknowledged as it goes. Each end is driven by a thread of its own, as
//! two processes would be, over the in-process loopback (MTU 1500: a
//! window of 1,024 frames).

use std::sync::mpsc;
use std::time::Duration;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Ptag, Reliability, Vi, ViAttributes};
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

/// One test at a time: each runs four spinning threads, and the machine
/// may have two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}
/// CG A's exchange step: 39 frames at MTU 1500.
const MSG: usize = 56_000;

struct End {
    nic: Nic,
    vi: Vi,
    mem: MemoryRegion,
    ptag: Ptag,
}

fn end(wire: &str, config: &Config) -> End {
    let dev = via_user::open_device(wire).unwrap();
    let nic = Nic::with_device(wire, dev, config.clone()).unwrap();
    let ptag = nic.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 16, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let vi = nic.create_vi(&a, None, None).unwrap();
    let mem = MemoryRegion::new(&nic, 2 * MSG, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    End { nic, vi, mem, ptag }
}

impl End {
    fn desc(&self, at: usize, len: usize) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set_op(Op::SendRecv, &[(&self.mem, at..at + len)], None, false).unwrap();
        d
    }
}

/// Two connected ends on a wire of their own.
fn pair(wire: &str, config: &Config) -> (End, End) {
    let (mut a, mut b) = (end(wire, config), end(wire, config));
    a.vi.connect_peer_request(b.nic.mac(), b"a", b"b", T).unwrap();
    b.vi.connect_peer_request(a.nic.mac(), b"b", b"a", T).unwrap();
    a.vi.connect_peer_wait().unwrap();
    b.vi.connect_peer_wait().unwrap();
    (a, b)
}

/// `b` on a thread of its own: takes `n` messages of up to MSG bytes (in
/// a RecvWait loop, replying to none), after telling `ready` it waits.
fn receiver(mut b: End, n: usize, ready: mpsc::Sender<()>) -> std::thread::JoinHandle<End> {
    std::thread::spawn(move || {
        for _ in 0..n {
            b.vi.post_recv(b.desc(0, MSG)).unwrap();
        }
        ready.send(()).unwrap();
        for i in 0..n {
            let d = b.vi.recv_wait(T).unwrap_or_else(|e| panic!("message {i}: {e}"));
            assert_eq!(d.errors(), 0);
        }
        b
    })
}

#[test]
fn a_blocking_send_completes_soon_after_its_last_frame() {
    let _one = one_at_a_time();
    // The delayed ACK and the retransmission timer far off: only the
    // pause's ACK can complete a send before the timer (1 s) would, and a
    // thread of ours descheduled for a while delays, not fails, the test.
    let config = Config { ack_delay: Duration::from_secs(10), ack_idle: Duration::from_micros(20), rto_initial: Duration::from_secs(1), ..Config::default() };
    for size in [1400usize, 16_000] {
        let (mut a, b) = pair(&format!("loop:ack-pause-{size}"), &config);
        let n = 100;
        let (tx, rx) = mpsc::channel();
        // One message first, so that b waits in RecvWait before the count,
        // and one after, so that it still does at the count's last send.
        let b = receiver(b, n + 2, tx);
        rx.recv().unwrap();
        a.vi.post_send(a.desc(0, size)).unwrap();
        a.vi.send_wait(T).unwrap();
        let before = a.nic.counters();
        for i in 0..n {
            a.vi.post_send(a.desc(0, size)).unwrap();
            let d = a.vi.send_wait(T).unwrap_or_else(|e| panic!("{size} B, send {i}: {e}"));
            assert_eq!(d.errors(), 0);
            let now = a.nic.counters();
            assert_eq!(now.rto_expiries, before.rto_expiries, "{size} B, send {i} waited for the retransmission timer: {now:?}");
        }
        let after = a.nic.counters();
        a.vi.post_send(a.desc(0, size)).unwrap();
        let b = b.join().unwrap();
        assert_eq!((after.rto_expiries - before.rto_expiries, after.retransmits - before.retransmits), (0, 0), "{size} B: each send waited for the retransmission timer: {after:?}");
        assert!(b.nic.counters().acks_sent >= n as u64, "{size} B: b acknowledged each message on its own: {:?}", b.nic.counters());
    }
}

#[test]
fn a_large_message_answered_at_once_needs_no_standalone_ack() {
    let _one = one_at_a_time();
    // The retransmission timer far off: a thread of ours descheduled for
    // a while (four threads on two cores) delays the test, not fails it.
    let base = Config { rto_initial: Duration::from_secs(1), ..Config::default() };
    let auto = Config { ack_every: 0, ..base.clone() };
    for (config, standalone) in [(auto, false), (Config { ack_every: 32, ..base.clone() }, true)] {
        let every = config.ack_every;
        let (mut a, mut b) = pair(&format!("loop:ack-spacing-{every}"), &config);
        let rounds = 20;
        // b's receives are posted before a sends: a message that met none
        // would break the connection (reliable delivery).
        for _ in 0..rounds {
            b.vi.post_recv(b.desc(MSG, MSG)).unwrap();
        }
        // b answers each message at once, from a thread of its own.
        let echo = std::thread::spawn(move || {
            for _ in 0..rounds {
                let got = b.vi.recv_wait(T).unwrap();
                assert_eq!((got.errors(), got.length() as usize), (0, MSG));
                b.vi.post_send(b.desc(0, MSG)).unwrap();
                while b.vi.send_done().unwrap().is_some() {}
            }
            b
        });
        for i in 0..rounds {
            a.vi.post_recv(a.desc(MSG, MSG)).unwrap();
            a.mem.write(0, &vec![i as u8; MSG]).unwrap();
            a.vi.post_send(a.desc(0, MSG)).unwrap();
            let back = a.vi.recv_wait(T).unwrap();
            assert_eq!((back.errors(), back.length() as usize), (0, MSG));
            a.vi.send_wait(T).unwrap();
        }
        let b = echo.join().unwrap();
        let cb = b.nic.counters();
        assert!(cb.rx_frames >= rounds * 39, "{cb:?}");
        // Counted by the rule itself (`acks_by_count`), not by the ACKs
        // sent, which a pause of the threads' own (four threads and two
        // progress threads on two cores) may add to through the idle timer.
        if standalone {
            // One after the 32nd frame of each message (of most: a pause
            // that the idle timer acknowledged restarts the count): what 0
            // saves.
            assert!(cb.acks_by_count >= rounds / 2, "ack_every 32: {cb:?}");
        } else {
            // Each reply carries the ACK before the auto spacing (an
            // eighth of the 1,024-frame window) is reached.
            assert_eq!(cb.acks_by_count, 0, "b acknowledged in the middle of messages its replies acknowledged: {cb:?}");
        }
        assert_eq!(a.nic.counters().retransmits, 0);
    }
}

#[test]
fn a_one_way_stream_is_still_acknowledged_as_it_goes() {
    let _one = one_at_a_time();
    let config = Config { ack_every: 0, ..Config::default() };
    let (mut a, b) = pair("loop:ack-spacing-stream", &config);
    let n = 24;
    let (tx, rx) = mpsc::channel();
    let b = receiver(b, n, tx);
    rx.recv().unwrap();
    // 24 messages, 936 frames, with nothing coming back but ACKs.
    for _ in 0..n {
        a.vi.post_send(a.desc(0, MSG)).unwrap();
    }
    for _ in 0..n {
        assert_eq!(a.vi.send_wait(T).unwrap().errors(), 0);
    }
    let b = b.join().unwrap();
    let cb = b.nic.counters();
    assert!(cb.acks_sent >= 2, "b acknowledged the stream as it went: {cb:?}");
    assert!(cb.acks_sent <= 936 / 32, "at most one ACK per 32 frames: {cb:?}");
}
