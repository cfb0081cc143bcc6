//! Remote atomics (the `vipl_ext.h` extension) through the engine over the
//! in-process loopback device: fetch-and-add and compare-and-swap results,
//! the checks at post and at the target, and exactly-once execution over
//! links that lose, duplicate and reorder frames (`loop:<wire>?loss=...`):
//! clients on NICs of their own add to one word, and every value before an
//! add is seen once (an add that ran twice, or not at all, would show), and
//! a lock taken with compare-and-swap guards a counter that its holders
//! update with an RDMA read and an RDMA write (a lost increment shows a
//! broken mutual exclusion).

use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, RemoteBuffer, Vi, ViAttributes, ViPhase};
// The software drivers (loopback and faulty devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(20));

struct Host {
    nic: Nic,
    ptag: via_user::Ptag,
}

impl Host {
    fn new(device: &str) -> Host {
        let nic = Nic::open(device).unwrap();
        let ptag = nic.create_ptag().unwrap();
        Host { nic, ptag }
    }
    fn vi(&self, level: Reliability, rdma_write: bool) -> Vi {
        let a = ViAttributes { reliability: level, max_transfer_size: 1 << 16, ptag: self.ptag, enable_rdma_write: rdma_write, enable_rdma_read: level != Reliability::Unreliable };
        self.nic.create_vi(&a, None, None).unwrap()
    }
    fn region(&self, len: usize, rdma: bool) -> MemoryRegion {
        MemoryRegion::new(&self.nic, len, 4096, MemAttributes { ptag: self.ptag, enable_rdma_write: rdma, enable_rdma_read: rdma }).unwrap()
    }
    fn desc(&self, op: Op, r: &MemoryRegion, off: usize, len: usize) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set_op(op, &[(r, off..off + len)], None, false).unwrap();
        d
    }
}

fn word(r: &MemoryRegion, off: usize) -> u64 {
    let mut b = [0u8; 8];
    r.read(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

/// A target with one 4 KiB region (its first word `initial`, RDMA write
/// enabled as `enabled`) serving `clients` connections on VIs with
/// RDMA write as `enabled`; `body` runs on each client (its index, host,
/// connected VI, the region's remote buffer) on a thread of its own.
/// Returns the region's first two words once every client is done, the
/// target's async errors, what each client's body returned and the
/// target's counters.
fn with_target<R: Send + 'static>(device: &str, clients: usize, initial: u64, enabled: bool, body: impl Fn(usize, &Host, &mut Vi, RemoteBuffer) -> R + Send + Sync + 'static) -> ([u64; 2], Vec<via_user::AsyncError>, Vec<R>, via_user::Counters) {
    let server = Host::new(device);
    let smac = server.nic.mac();
    let buf = server.region(4096, enabled);
    buf.write(0, &initial.to_ne_bytes()).unwrap();
    let rb = buf.remote(0..4096).unwrap();
    let body = std::sync::Arc::new(body);
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..clients {
        let (device, ready_tx, body) = (device.to_string(), ready_tx.clone(), body.clone());
        threads.push(thread::spawn(move || {
            let client = Host::new(&device);
            let mut vi = client.vi(Reliability::ReliableDelivery, false);
            vi.connect_retrying(smac, b"atomics", T.unwrap()).unwrap();
            ready_tx.send(()).unwrap();
            body(i, &client, &mut vi, rb)
        }));
    }
    let mut vis = Vec::new();
    for _ in 0..clients {
        let vi = server.vi(Reliability::ReliableDelivery, enabled);
        let req = server.nic.connect_wait(b"atomics", T).unwrap();
        server.nic.accept(&req, &vi).unwrap();
        vis.push(vi);
    }
    for _ in 0..clients {
        ready_rx.recv_timeout(T.unwrap()).unwrap();
    }
    // The target's progress thread serves the atomics meanwhile.
    let results = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Each client's connection ends with its NIC: those losses are expected.
    let errors = server.nic.take_async_errors().into_iter().filter(|e| e.kind != via_user::AsyncErrorKind::ConnLost).collect();
    ([word(&buf, 0), word(&buf, 8)], errors, results, server.nic.counters())
}

/// Posts `op` with `out` (8 bytes at `off`) for the value before, waits,
/// and returns the completed descriptor.
fn run(c: &Host, vi: &mut Vi, op: Op, out: &MemoryRegion, off: usize) -> Descriptor {
    vi.post_send(c.desc(op, out, off, 8)).unwrap();
    vi.send_wait(T).unwrap()
}

#[test]
fn fetch_add_and_compare_swap_return_the_value_before() {
    let (last, errors, _, _) = with_target("loop:atomic-basic", 1, 40, true, |_, c, vi, rb| {
        let out = c.region(4096, false);
        let d = run(c, vi, Op::FetchAdd { remote: rb, add: 2 }, &out, 0);
        d.check_ok().unwrap();
        assert_eq!(d.status() & status::OP_MASK, status::OP_ATOMIC);
        assert_eq!(d.length(), 8);
        assert_eq!(word(&out, 0), 40, "fetch-add gives the value before");
        // A result buffer need not be aligned.
        let d = run(c, vi, Op::CompareSwap { remote: rb, compare: 42, swap: 7 }, &out, 13);
        d.check_ok().unwrap();
        assert_eq!(word(&out, 13), 42, "the compare matched: the value before");
        let d = run(c, vi, Op::CompareSwap { remote: rb, compare: 42, swap: 9 }, &out, 24);
        d.check_ok().unwrap();
        assert_eq!(word(&out, 24), 7, "the compare failed: the value found, nothing stored");
        let d = run(c, vi, Op::FetchAdd { remote: rb, add: u64::MAX }, &out, 32);
        d.check_ok().unwrap();
        assert_eq!(word(&out, 32), 7, "the addition wraps");
    });
    assert_eq!(last[0], 6);
    assert!(errors.is_empty(), "{errors:?}");
}

/// A VI of `host` at `level`, connected to a fresh VI of `peer` (which
/// enables RDMA write on it).
fn connected(host: &Host, peer: &Host, level: Reliability, discriminator: &str) -> (Vi, Vi) {
    let server = thread::spawn({
        let (nic, ptag, d) = (peer.nic.clone(), peer.ptag, discriminator.to_string());
        move || {
            let a = ViAttributes { reliability: level, max_transfer_size: 1 << 16, ptag, enable_rdma_write: true, enable_rdma_read: level != Reliability::Unreliable };
            let vi = nic.create_vi(&a, None, None).unwrap();
            let req = nic.connect_wait(d.as_bytes(), T).unwrap();
            nic.accept(&req, &vi).unwrap();
            vi
        }
    });
    let mut vi = host.vi(level, false);
    vi.connect_retrying(peer.nic.mac(), discriminator.as_bytes(), T.unwrap()).unwrap();
    (vi, server.join().unwrap())
}

#[test]
fn atomics_are_checked_at_post() {
    let host = Host::new("loop:atomic-post");
    let peer = Host::new("loop:atomic-post");
    let out = host.region(4096, false);
    let rb = peer.region(4096, true).remote(0..4096).unwrap();
    // The API refuses what the engine would: two local segments,
    // immediate data.
    let mut d = Descriptor::new(&host.nic, host.ptag, 2).unwrap();
    assert!(d.set_op(Op::FetchAdd { remote: rb, add: 1 }, &[(&out, 0..8), (&out, 8..16)], None, false).is_err());
    assert!(d.set_op(Op::FetchAdd { remote: rb, add: 1 }, &[(&out, 0..8)], Some(5), false).is_err());
    // An unreliable VI, a misaligned target, a result of other than 8
    // bytes: each completes with FORMAT_ERROR without leaving.
    let cases: [(Reliability, Op, usize); 3] = [
        (Reliability::Unreliable, Op::FetchAdd { remote: rb, add: 1 }, 8),
        (Reliability::ReliableDelivery, Op::CompareSwap { remote: rb.offset(4), compare: 0, swap: 1 }, 8),
        (Reliability::ReliableDelivery, Op::FetchAdd { remote: rb, add: 1 }, 16),
    ];
    for (i, (level, op, len)) in cases.into_iter().enumerate() {
        let (mut vi, _peer_vi) = connected(&host, &peer, level, &format!("post{i}"));
        vi.post_send(host.desc(op, &out, 0, len)).unwrap();
        let d = vi.send_wait(T).unwrap();
        assert_eq!(d.errors(), status::FORMAT_ERROR, "case {i}: status {:#x}", d.status());
        assert_eq!(vi.state(), ViPhase::Connected, "case {i}: a descriptor error, not a broken connection");
    }
    // VIA 1.0's reserved operation without the extension's bits is still a
    // FORMAT_ERROR.
    let (mut vi, _peer_vi) = connected(&host, &peer, Reliability::ReliableDelivery, "reserved");
    let mut d = host.desc(Op::RdmaWrite(rb), &out, 0, 8);
    d.set_raw_control(via_user::descriptor::control::OP_RESERVED, 2, 8);
    vi.post_send(d).unwrap();
    let d = vi.send_wait(T).unwrap();
    assert_eq!(d.errors(), status::FORMAT_ERROR, "status {:#x}", d.status());
}

#[test]
fn an_atomic_on_memory_without_rdma_write_is_refused() {
    let (last, errors, _, _) = with_target("loop:atomic-prot", 1, 5, false, |_, c, vi, rb| {
        let out = c.region(4096, false);
        out.write(0, &99u64.to_ne_bytes()).unwrap();
        let d = run(c, vi, Op::FetchAdd { remote: rb, add: 1 }, &out, 0);
        assert_ne!(d.errors() & status::RDMA_PROT_ERROR, 0, "status {:#x}", d.status());
        assert_eq!(word(&out, 0), 99, "no value came back");
        assert_eq!(vi.state(), ViPhase::Error);
    });
    assert_eq!(last[0], 5, "the target's memory is untouched");
    assert!(errors.iter().any(|e| e.kind == via_user::AsyncErrorKind::RdmaWriteProt), "{errors:?}");
}

/// Links that lose 1 % of frames, duplicate 1 % and reorder 2 %.
fn lossy(wire: &str, seed: u32) -> String {
    format!("loop:{wire}?loss=0.01,dup=0.01,reorder=0.02,seed={seed}")
}

#[test]
fn fetch_adds_run_exactly_once_over_lossy_duplicating_links() {
    const CLIENTS: usize = 4;
    const ADDS: usize = 500;
    let (last, errors, seen, target) = with_target(&lossy("atomic-adds", 7), CLIENTS, 0, true, |_, c, vi, rb| {
        let out = c.region(4096, false);
        let mut before = Vec::with_capacity(ADDS);
        for _ in 0..ADDS {
            let d = run(c, vi, Op::FetchAdd { remote: rb, add: 1 }, &out, 0);
            d.check_ok().unwrap();
            before.push(word(&out, 0));
        }
        (before, c.nic.counters())
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(last[0], (CLIENTS * ADDS) as u64, "every add ran, once");
    let mut all: Vec<u64> = seen.iter().flat_map(|(b, _)| b.iter().copied()).collect();
    all.sort_unstable();
    assert_eq!(all, (0..(CLIENTS * ADDS) as u64).collect::<Vec<_>>(), "each value before an add was seen by exactly one add");
    // The faults did happen: the clients sent frames again.
    let retransmits: u64 = seen.iter().map(|(_, c)| c.retransmits).sum();
    assert!(retransmits > 0, "no frame was ever sent again: the links lost nothing");
    // The target ran each add once, and answered requests it saw again
    // (duplicated, or sent again for a lost answer) from what it kept.
    assert_eq!(target.atomics_served, (CLIENTS * ADDS) as u64);
    assert!(target.atomics_replayed > 0, "no request came twice: the responder's cache was not tested ({target:?})");
}

#[test]
fn a_compare_swap_lock_guards_a_counter_over_lossy_links() {
    const CLIENTS: usize = 3;
    const ROUNDS: usize = 60;
    // Word 0 is the lock (0: free, else the holder's number), word 8 the
    // counter, which holders update with a read and a write (not atomic:
    // only the lock keeps two holders from losing an update).
    let (words, errors, contended, target) = with_target(&lossy("atomic-lock", 11), CLIENTS, 0, true, move |i, c, vi, rb| {
        let me = i as u64 + 1;
        let out = c.region(4096, false);
        let mut contended = 0u64;
        let deadline = std::time::Instant::now() + T.unwrap();
        for _ in 0..ROUNDS {
            loop {
                assert!(std::time::Instant::now() < deadline, "client {me} never got the lock: it is held by nobody who will let it go");
                let d = run(c, vi, Op::CompareSwap { remote: rb, compare: 0, swap: me }, &out, 0);
                d.check_ok().unwrap();
                if word(&out, 0) == 0 {
                    break;
                }
                contended += 1;
            }
            let d = run(c, vi, Op::RdmaRead(rb.offset(8)), &out, 16);
            d.check_ok().unwrap();
            out.write(24, &(word(&out, 16) + 1).to_ne_bytes()).unwrap();
            let d = run(c, vi, Op::RdmaWrite(rb.offset(8)), &out, 24);
            d.check_ok().unwrap();
            let d = run(c, vi, Op::CompareSwap { remote: rb, compare: me, swap: 0 }, &out, 32);
            d.check_ok().unwrap();
            assert_eq!(word(&out, 32), me, "the lock was ours until we let it go");
        }
        contended
    });
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(words[0], 0, "the lock is free at the end");
    assert_eq!(words[1], (CLIENTS * ROUNDS) as u64, "no update was lost: the lock excluded the others");
    assert!(contended.iter().sum::<u64>() > 0, "the clients never met at the lock: nothing was tested");
    assert!(target.atomics_replayed > 0, "no request came twice: the responder's cache was not tested ({target:?})");
}
