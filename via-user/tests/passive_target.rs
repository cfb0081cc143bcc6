//! A wait that serves its peer keeps spinning: a process whose only
//! thread waits (here `RecvWait` on a receive nobody sends) while its
//! peer RDMA-reads its memory serves each read from inside that wait.
//! Such reads complete nothing at the target, so a wait that spun only
//! for its first VIA_SPIN_US went to sleep before every read once that
//! time was up, and every read paid a wake-up (MTTL's 32 B remote read
//! 28 against 11 us). The wait now spins until the device has been quiet
//! for the spin time. Counted by the shared-memory wire: a reader rings
//! the target's doorbell exactly when the target sleeps on it.

use std::time::{Duration, Instant};
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, ViAttributes};
// The software drivers (shared memory), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

mod common;
use common::Wire;

fn nic(wire: &str) -> Nic {
    // Spin 1 ms; no progress thread: only the waiting thread serves.
    let config = Config { progress_thread: false, spin: Duration::from_millis(1), ..Config::default() };
    let dev = via_softnic::ShmDevice::open(wire, None).unwrap();
    Nic::with_device("shm", Box::new(dev), config).unwrap()
}

/// Times the calling thread was preempted (involuntary context switches).
fn preemptions() -> i64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    u.ru_nivcsw
}

fn rung(nic: &Nic) -> u64 {
    nic.device_counters().into_iter().find(|(k, _)| *k == "shm_doorbells_rung").map(|(_, v)| v).expect("the shm device counts its doorbells")
}

#[test]
fn a_target_serving_reads_from_its_wait_does_not_sleep_between_them() {
    let wire = Wire::new("passive");
    let (reader, target) = (nic(&wire.0), nic(&wire.0));
    let attrs = |ptag| ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 4096, ptag, enable_rdma_write: false, enable_rdma_read: true };
    let (pr, pt) = (reader.create_ptag().unwrap(), target.create_ptag().unwrap());
    let mut vr = reader.create_vi(&attrs(pr), None, None).unwrap();
    let mut vt = target.create_vi(&attrs(pt), None, None).unwrap();
    let exposed = MemoryRegion::new(&target, 4096, 4096, MemAttributes { ptag: pt, enable_rdma_write: false, enable_rdma_read: true }).unwrap();
    exposed.write(0, &[0x5a; 64]).unwrap();
    let mut never = Descriptor::new(&target, pt, 1).unwrap();
    never.set(&[(&exposed, 64..128)], None).unwrap();
    vt.post_recv(never).unwrap();
    let remote = exposed.remote(0..64).unwrap();
    let tmac = target.mac();
    let server = std::thread::spawn(move || {
        let req = target.connect_wait(b"passive", T).unwrap();
        target.accept(&req, &vt).unwrap();
        // Waits (serving reads) until the reader disconnects, which
        // flushes the receive.
        let before = preemptions();
        let d = vt.recv_wait(Some(Duration::from_secs(60))).unwrap();
        let preempted = (preemptions() - before).max(0) as u64;
        assert!(d.errors() != 0, "the receive completes only flushed");
        drop(exposed);
        preempted
    });
    vr.connect_retrying(tmac, b"passive", T.unwrap()).unwrap();
    let local = MemoryRegion::new(&reader, 4096, 4096, MemAttributes { ptag: pr, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    let mut d = Descriptor::new(&reader, pr, 1).unwrap();
    d.set_op(Op::RdmaRead(remote), &[(&local, 0..64)], None, false).unwrap();
    // A read every 100 us for 30 spin times, well past the target's
    // first: the gaps outlast the rounds a wait spins on after frames
    // (BURST_ROUNDS), not the spin time.
    // A ring is the reader's fault, not the target's, when the reader
    // itself stood still for a spin time or more between two reads (this
    // 2-core machine preempts it under load): those are counted apart.
    let spin = Duration::from_millis(1);
    let start = Instant::now();
    let (mut reads, mut woken, mut excused) = (0u64, 0u64, 0u64);
    let mut last = Instant::now();
    while start.elapsed() < Duration::from_millis(30) || reads < 100 {
        let before = rung(&reader);
        vr.post_send(d).unwrap();
        let gap = last.elapsed();
        d = vr.send_wait(T).unwrap();
        d.check_ok().unwrap();
        last = Instant::now();
        reads += 1;
        if rung(&reader) > before {
            if gap >= spin {
                excused += 1;
            } else {
                woken += 1;
            }
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(100) {
            std::hint::spin_loop();
        }
    }
    assert_eq!(local.to_vec(0..64).unwrap(), vec![0x5a; 64]);
    vr.disconnect().unwrap();
    let preempted = server.join().unwrap();
    // A target the machine preempted comes back past its spin time and
    // may sleep once for each preemption (a 2-core machine under load):
    // those are excused too. A target whose virtual CPU the hypervisor
    // stopped for a millisecond does the same, and no counter of the
    // guest shows it (a stop's CI saw 14 rings in 100 reads with no
    // preemption). So the bound is half the reads: a wait that slept
    // once its first millisecond was over slept before nearly every read
    // after it (188 rings in 197 reads, the feature removed), whatever
    // the reader's gaps and however few the preemptions.
    let unexcused = woken.saturating_sub(preempted);
    assert!(
        unexcused * 2 < reads - excused,
        "the target slept (was rung) {woken} times in {reads} reads, preempted {preempted} times ({excused} more after the reader stood still for {spin:?})"
    );
}
