//! `mttl-check [all|invoke|sync|gptr|atomic|coll|many|ring|comm|crash]...`: the MTTL
//! test program, run by the tests under `mttl-run` at 1, 2, 4 and 8 ranks
//! over both transports. Every check computes its expected answer locally
//! and panics (failing the run) on a mismatch; a passing run ends with
//! `mttl-check: passed` on rank 0.

use mttl_via::comm::{self, Transport};
use mttl_via::{ainvoke, ainvoke_detached, broadcast, invoke, my_pe, on_all, pe_num, remote, Barrier, GlobalPtr, GlobalSync, Reduction, Sync};

remote! {
    /// Prints this rank's frames received by path (NIC, shared memory)
    /// and its peak resident memory.
    fn report_frames() -> u64 {
        let c = mttl_via::device_counters();
        let get = |k: &str| c.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
        let conns = mttl_via::connections().map_or("all".to_string(), |c| c.to_string());
        println!("mttl-check: rank {} received frames: nic {} shm {}; connections {conns}; peak resident memory {} KiB", my_pe(), get("rx_frames"), get("shm_rx_frames"), peak_rss_kib());
        if c.iter().any(|(n, _)| *n == "faults_lost") {
            println!("mttl-check: rank {} faults: lost {} duplicated {} reordered {}", my_pe(), get("faults_lost"), get("faults_duplicated"), get("faults_reordered"));
        }
        1
    }
    /// Invokes `whoami` on the next rank (a ring of neighbours).
    fn ring_step() -> u64 {
        let next = (my_pe() + 1) % pe_num();
        assert_eq!(invoke(next, whoami, ()), next as u64);
        1
    }
    fn square(x: u64) -> u64 { x * x }
    /// Reads `n` values at `p`, `times` times over (each read of 32 to
    /// 512 bytes goes as one RDMA read over VIA); returns the last.
    fn read_block(p: GlobalPtr<u64>, n: u64, times: u64) -> Vec<u64> {
        let mut v = vec![0u64; n as usize];
        for _ in 0..times { p.nread(&mut v); }
        v
    }
    fn whoami() -> u64 { my_pe() as u64 }
    fn nothing() {}
    fn echo(v: Vec<u8>, s: String) -> (Vec<u8>, String) { (v, s) }
    /// A method on a remote object: adds to a counter in the owner's heap.
    fn counter_add(p: GlobalPtr<u64>, k: u64) -> u64 {
        assert!(p.is_local());
        // SAFETY: only this thread touches the counter between yields.
        let c = unsafe { &mut p.local_slice(1)[0] };
        *c += k;
        *c
    }
    fn produce(to: GlobalSync<u64>, from: u64, count: u64) {
        for i in 0..count {
            to.write(from * 1_000_000 + i);
            if i % 7 == 0 { mttl_via::yield_now(); }
        }
    }
    fn consume(from: GlobalSync<u64>, count: u64) -> u64 {
        (0..count).map(|_| from.read()).sum()
    }
    fn make_sync() -> GlobalSync<u64> {
        let s = Sync::<u64>::new();
        let g = s.global();
        std::mem::forget(s); // lives for the run
        g
    }
    /// `k` fetch-and-adds of 1 on `p`; the values before.
    fn add_many(p: GlobalPtr<u64>, k: u64) -> Vec<u64> {
        (0..k).map(|_| p.fetch_add(1)).collect()
    }
    /// `rounds` increments of `counter` by a plain read and write, each
    /// under the lock at `lock` (taken by compare-and-swap as `me`).
    fn locked_increments(lock: GlobalPtr<u64>, counter: GlobalPtr<u64>, rounds: u64, me: u64) -> u64 {
        for _ in 0..rounds {
            while lock.compare_swap(0, me) != 0 {
                mttl_via::yield_now();
            }
            let v = counter.read();
            mttl_via::yield_now(); // let the others try the lock meanwhile
            counter.write(v + 1);
            assert_eq!(lock.compare_swap(me, 0), me, "the lock was ours until we let it go");
        }
        rounds
    }
    fn collectives(round: u64) -> u64 { check_collectives(round); 1 }
    fn fail_here(why: String) -> u64 { panic!("{why}") }
    fn die_detached() { eprintln!("mttl-check: rank {} stops on purpose", my_pe()); std::process::exit(3) }
}

fn check_invoke() {
    let n = pe_num();
    for round in 0..200u64 {
        let pe = (round as usize * 7 + 3) % n;
        assert_eq!(invoke(pe, square, (round,)), round * round);
    }
    let pending: Vec<_> = (0..2000u64).map(|i| (i, ainvoke(i as usize % n, square, (i,)))).collect();
    for (i, p) in pending {
        assert_eq!(p.wait(), i * i, "ainvoke result for {i}");
    }
    for pe in 0..n {
        assert_eq!(invoke(pe, whoami, ()), pe as u64);
        invoke(pe, nothing, ());
        let big = (0..100_000u32).map(|i| (i * 31) as u8).collect::<Vec<u8>>();
        assert_eq!(invoke(pe, echo, (big.clone(), "héllo".into())), (big, "héllo".to_string()));
    }
    // Remote objects through a GlobalPtr.
    let counters: Vec<GlobalPtr<u64>> = (0..n).map(|pe| GlobalPtr::alloc_on(pe, 1)).collect();
    for k in 1..=10 {
        for c in &counters {
            c.invoke(counter_add, k);
        }
    }
    for c in counters {
        assert_eq!(c.read(), 55);
        c.free();
    }
    // A panic of a remote function fails its invoker, naming it.
    let r = std::panic::catch_unwind(|| invoke(n - 1, fail_here, ("on purpose".into(),)));
    let msg = r.err().map(|p| p.downcast_ref::<String>().cloned().unwrap_or_default()).unwrap_or_default();
    assert!(msg.contains("on purpose") && (n == 1 || msg.contains("fail_here")), "panic message was {msg:?}");
    println!("mttl-check: invoke ok");
}

fn check_sync() {
    let n = pe_num() as u64;
    let per = 300u64;
    let local = Sync::<u64>::new();
    local.write(5);
    assert_eq!(local.queue_length(), 1);
    assert_eq!(local.peek(), 5);
    assert_eq!(local.read(), 5);
    assert_eq!(local.queue_length(), 0);
    // Every rank produces into one Sync here.
    let sink = Sync::<u64>::new();
    for pe in 0..n {
        ainvoke_detached(pe as usize, produce, (sink.global(), pe, per));
    }
    let mut got = 0u64;
    for _ in 0..n * per {
        got += sink.read();
    }
    let want: u64 = (0..n).map(|pe| (0..per).map(|i| pe * 1_000_000 + i).sum::<u64>()).sum();
    assert_eq!(got, want);
    assert_eq!(sink.queue_length(), 0);
    // Consumers on every rank read Syncs that live on the next rank; we produce.
    let boxes: Vec<GlobalSync<u64>> = (0..n).map(|pe| invoke(((pe + 1) % n) as usize, make_sync, ())).collect();
    let sums: Vec<_> = (0..n).map(|pe| ainvoke(pe as usize, consume, (boxes[pe as usize], per))).collect();
    for (pe, b) in boxes.iter().enumerate() {
        for i in 0..per {
            b.write(pe as u64 + i);
        }
    }
    for (pe, s) in sums.into_iter().enumerate() {
        assert_eq!(s.wait(), (0..per).map(|i| pe as u64 + i).sum::<u64>());
    }
    // Remote peek and length.
    let b = boxes[0];
    b.write(42);
    assert_eq!(b.queue_length(), 1);
    assert_eq!(b.peek(), 42);
    assert_eq!(b.read(), 42);
    println!("mttl-check: sync ok");
}

fn check_gptr() {
    let n = pe_num();
    for pe in 0..n {
        let p = GlobalPtr::<u64>::alloc_on(pe, 1 << 16);
        assert_eq!(p.pe(), pe);
        p.write(7);
        assert_eq!(p.read(), 7);
        p.set(9, 99);
        assert_eq!(p.get(9), 99);
        assert_eq!(p.add(9).read(), 99);
        for len in [1usize, 3, 100, 511, 512, 4096, 60_000] {
            let v: Vec<u64> = (0..len as u64).map(|i| i * 3 + len as u64 + pe as u64).collect();
            let at = p.add(17);
            at.nwrite(&v);
            let mut back = vec![0u64; len];
            at.nread(&mut back);
            assert_eq!(back, v, "range of {len} at rank {pe}");
            assert_eq!(at.add(len - 1).read(), v[len - 1]);
        }
        let f = GlobalPtr::<f64>::alloc_on(pe, 3);
        f.nwrite(&[1.5, -2.25, 1e300]);
        let mut fb = [0f64; 3];
        f.nread(&mut fb);
        assert_eq!(fb, [1.5, -2.25, 1e300]);
        f.free();
        p.free();
    }
    // Small reads of many threads at once (over VIA each waits parked
    // while the others run, and the scheduler wakes it): every thread gets
    // its own range back, whole.
    let q = GlobalPtr::<u64>::alloc_on(n - 1, 16 * 64);
    let all: Vec<u64> = (0..16 * 64).map(|i| i * 7 + 1).collect();
    q.nwrite(&all);
    let readers: Vec<_> = (0..16).map(|k| ainvoke(my_pe(), read_block, (q.add(k * 64), 4 + 4 * k as u64, 20))).collect();
    for (k, r) in readers.into_iter().enumerate() {
        assert_eq!(r.wait(), all[k * 64..k * 64 + 4 + 4 * k], "reader {k}");
    }
    q.free();
    // Out of bounds is an error naming the cause.
    let p = GlobalPtr::<u8>::alloc_on(n - 1, 8);
    let r = std::panic::catch_unwind(|| p.add(1 << 40).read());
    let msg = r.err().map(|p| p.downcast_ref::<String>().cloned().unwrap_or_default()).unwrap_or_default();
    assert!(msg.contains("heap"), "out-of-bounds message was {msg:?}");
    p.free();
    println!("mttl-check: gptr ok");
}

/// Remote atomics: fetch-and-adds from threads on every rank each see a
/// value before no other add saw (each ran once), and a compare-and-swap
/// lock keeps increments made by plain reads and writes from being lost.
fn check_atomic() {
    let n = pe_num();
    let owner = n - 1;
    let p = GlobalPtr::<u64>::alloc_on(owner, 1);
    const K: u64 = 200;
    let adders: Vec<_> = (0..2 * n).map(|i| ainvoke(i % n, add_many, (p, K))).collect();
    let mut seen: Vec<u64> = adders.into_iter().flat_map(|a| a.wait()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..2 * n as u64 * K).collect::<Vec<_>>(), "every value before an add seen once");
    assert_eq!(p.read(), 2 * n as u64 * K);
    assert_eq!(p.compare_swap(1, 5), 2 * n as u64 * K, "a compare that fails changes nothing");
    assert_eq!(p.compare_swap(2 * n as u64 * K, 5), 2 * n as u64 * K);
    assert_eq!(p.fetch_add(u64::MAX), 5, "adds wrap");
    assert_eq!(p.read(), 4);
    let lock = GlobalPtr::<u64>::alloc_on(owner, 1);
    let counter = GlobalPtr::<u64>::alloc_on(owner, 1);
    const ROUNDS: u64 = 30;
    let lockers: Vec<_> = (0..2 * n).map(|i| ainvoke(i % n, locked_increments, (lock, counter, ROUNDS, i as u64 + 1))).collect();
    let done: u64 = lockers.into_iter().map(|l| l.wait()).sum();
    assert_eq!(counter.read(), done, "an increment was lost: two held the lock at once");
    assert_eq!(lock.read(), 0);
    p.free();
    lock.free();
    counter.free();
    println!("mttl-check: atomic ok");
}

/// Each rank talks to its neighbour only (and rank 0 to everyone, to
/// start them): with connections on demand a rank connects to those.
fn check_ring() {
    let n = pe_num();
    assert_eq!(on_all(ring_step, ()).len(), n);
    println!("mttl-check: ring ok");
}

/// VmHWM of /proc/self/status, in KiB (0 where there is none).
fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

fn check_collectives(round: u64) {
    let (me, n) = (my_pe() as u64, pe_num() as u64);
    Barrier::wait();
    for len in [1usize, 7, 64, 1000, 5000, 70_000] {
        let mut v: Vec<u64> = (0..len as u64).map(|i| i * (me + 1) + round).collect();
        Reduction::sum(&mut v);
        let want: Vec<u64> = (0..len as u64).map(|i| i * n * (n + 1) / 2 + round * n).collect();
        assert_eq!(v, want, "sum of {len}");
        let mut m: Vec<i64> = (0..len as i64).map(|i| (i - me as i64 * 3) * if i % 2 == 0 { 1 } else { -1 }).collect();
        let mut mx = m.clone();
        Reduction::min(&mut m);
        Reduction::max(&mut mx);
        for i in 0..len as i64 {
            let vals = (0..n as i64).map(|r| (i - r * 3) * if i % 2 == 0 { 1 } else { -1 });
            assert_eq!(m[i as usize], vals.clone().min().unwrap());
            assert_eq!(mx[i as usize], vals.max().unwrap());
        }
        let mut x: Vec<u32> = (0..len as u32).map(|i| i ^ (me as u32 * 0x9e37)).collect();
        Reduction::with(&mut x, |a, b| *a ^= *b);
        for (i, got) in x.iter().enumerate() {
            assert_eq!(*got, (0..n as u32).fold(0, |a, r| a ^ (i as u32 ^ (r * 0x9e37))));
        }
        for root in [0, (n - 1) as usize] {
            let mut b: Vec<u64> = if me as usize == root { (0..len as u64).map(|i| i + 1000 * root as u64).collect() } else { vec![0; len] };
            broadcast(root, &mut b);
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as u64 + 1000 * root as u64), "broadcast of {len} from {root}");
        }
    }
    if n.is_power_of_two() {
        // Reduce-scatter: rank k ends with the k-th block of the sum.
        let g = mttl_via::Group::world();
        let len = 8 * n as usize;
        let mut v: Vec<u64> = (0..len as u64).map(|i| i * (me + 1) + round).collect();
        let mine = g.reduce_scatter_sum(&mut v);
        assert_eq!(mine, me as usize * 8..me as usize * 8 + 8);
        for i in mine {
            assert_eq!(v[i], i as u64 * n * (n + 1) / 2 + round * n, "reduce-scatter element {i}");
        }
    }
    // A group of some ranks: the even ones sum among themselves.
    let evens: Vec<usize> = (0..n as usize).step_by(2).collect();
    if me % 2 == 0 {
        let mut x = [me + 1];
        mttl_via::Group::new(evens.clone()).sum(&mut x);
        assert_eq!(x[0], evens.iter().map(|&r| r as u64 + 1).sum::<u64>());
    } else {
        // Odd ranks skip that collective; they must skip its sequence
        // number too, so the next global collective still matches.
        mttl_via::collective::skip();
    }
    assert_eq!(Reduction::sum_of(me + 1), n * (n + 1) / 2);
    assert_eq!(Reduction::max_of(me), n - 1);
    assert_eq!(Reduction::min_of(me as f64 + 0.5), 0.5);
    Barrier::wait();
}

fn check_coll() {
    for round in 0..3 {
        assert!(on_all(collectives, (round,)).into_iter().all(|r| r == 1));
    }
    println!("mttl-check: coll ok");
}

fn check_many() {
    let n = pe_num();
    let count = 100_000u64;
    let before = mttl_via::thread::stats();
    let pending: Vec<_> = (0..count).map(|i| ainvoke(i as usize % n, square, (i,))).collect();
    let mut sum = 0u64;
    for p in pending {
        sum = sum.wrapping_add(p.wait());
    }
    assert_eq!(sum, (0..count).fold(0u64, |a, i| a.wrapping_add(i * i)));
    let s = mttl_via::thread::stats();
    println!(
        "mttl-check: many ok: {count} ainvokes in flight; here {} threads created, {} stacks allocated ({} KiB each)",
        s.created - before.created,
        s.stacks_allocated - before.stacks_allocated,
        s.stack_bytes >> 10
    );
}

fn check_crash() {
    let victim = pe_num() - 1;
    println!("mttl-check: rank {victim} will stop");
    ainvoke_detached(victim, die_detached, ());
    // Keep talking to everyone until the run is stopped.
    for i in 0u64.. {
        for pe in 0..pe_num() {
            invoke(pe, square, (i,));
        }
    }
}

/// What a rank of the `comm` check has received.
#[derive(Debug)]
struct Inbox {
    me: usize,
    got: Vec<usize>,
    notice: Option<usize>,
    bye: Vec<bool>,
}

/// Message sizes, among them the edges of the VIA layer's slots (32 KiB:
/// 32 760 bytes of payload; 64 KiB on links of MTU 65 000: 65 528): half a
/// slot and one byte more (the smallest message copied straight into send
/// slots), one slot, one slot and a byte. An odd count, so that every size
/// is sent each of the ways below.
const SIZES: [usize; 17] = [0, 1, 8, 100, 8184, 8185, 16_380, 16_381, 32_760, 32_761, 32_764, 32_765, 49_000, 65_520, 65_528, 65_529, 100_000];
const PER: usize = 68;

fn comm_msg(from: usize, to: usize, k: usize) -> Vec<u8> {
    (0..SIZES[k % SIZES.len()]).map(|i| (i * 7 + from * 13 + to * 17 + k) as u8).collect()
}

impl Inbox {
    /// Files one message from `j`: the next data message, the bulk notice
    /// or the last word; anything else fails the check.
    fn file(&mut self, j: usize, buf: &[u8]) {
        if self.got[j] < PER {
            assert_eq!(buf, comm_msg(j, self.me, self.got[j]), "message {} from {j}", self.got[j]);
            self.got[j] += 1;
        } else if buf.len() == 5 && buf[0] == comm::BULK_NOTICE {
            assert!(self.notice.is_none(), "one bulk notice");
            assert_eq!(u32::from_le_bytes(buf[1..].try_into().unwrap()), 77 + j as u32);
            self.notice = Some(j);
        } else {
            assert_eq!(buf, b"bye", "the last message from {j}");
            self.bye[j] = true;
        }
    }
}

/// Polls with `prob` until something is there (yielding the CPU between
/// polls); after 30 s of nothing, fails with what the layer holds.
fn wait_probe(t: &mut dyn Transport, inbox: &Inbox) -> usize {
    let since = std::time::Instant::now();
    loop {
        if let Some(j) = t.prob().unwrap() {
            return j;
        }
        if since.elapsed() > std::time::Duration::from_secs(30) {
            panic!("rank {}: nothing arrived for 30 s; {inbox:?}; {}", inbox.me, t.describe());
        }
        std::thread::yield_now();
    }
}

/// The eight primitives directly, without the runtime: every rank sends
/// every other rank messages of many sizes (nsend or nsendv of three parts
/// for half, with senddone checked) and one bulk put to the next rank;
/// receives take half of each node's messages by brecnode, highest node
/// first (leaving the others pending), and the rest by prob + brecany. Per
/// node, messages must come in order and intact.
fn check_comm() {
    let mut boot = mttl_via::boot::Boot::from_env().unwrap_or_else(|e| panic!("{e}"));
    let mut t: Box<dyn Transport> = comm::cominit(&mut boot, 1 << 20).unwrap_or_else(|e| panic!("{e}"));
    let (me, n) = (boot.rank, boot.size);
    let mut handles = Vec::new();
    for k in 0..PER {
        for j in (0..n).filter(|&j| j != me) {
            let m = comm_msg(me, j, k);
            if k % 2 == 0 {
                t.asend(j, &m).unwrap();
            } else if k % 4 == 1 {
                handles.push(t.nsend(j, &m).unwrap());
            } else {
                // Gathered from three parts (the middle one may be empty).
                let (a, rest) = m.split_at(m.len() / 3);
                let (b, c) = rest.split_at(rest.len() / 2 * (k % 8 / 4));
                handles.push(t.nsendv(j, &[a, b, c]).unwrap());
            }
        }
    }
    let bulk = t.bulk().is_some() && n > 1;
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut put = None;
    if bulk {
        let (base, _) = t.heap();
        // SAFETY: our own heap; nobody writes [0, 300000) of it in this test.
        let heap = unsafe { std::slice::from_raw_parts_mut(base, 300_000) };
        for (i, b) in heap.iter_mut().enumerate() {
            *b = (i * 3 + me) as u8;
        }
        put = Some(t.bulk().unwrap().put(next, 0, 400_000, 300_000, 77 + me as u32).unwrap());
    }
    let mut inbox = Inbox { me, got: vec![0; n], notice: None, bye: vec![false; n] };
    inbox.got[me] = PER;
    inbox.bye[me] = true;
    let mut buf = Vec::new();
    for j in (0..n).rev().filter(|&j| j != me) {
        for _ in 0..PER / 2 {
            t.brecnode(j, &mut buf).unwrap();
            inbox.file(j, &buf);
        }
    }
    while inbox.got.iter().any(|&g| g < PER) || (bulk && inbox.notice.is_none()) {
        // prob never blocks; when it finds nothing, brecany waits (sleeping
        // once its spin is over, so eight ranks on two CPUs do not starve
        // each other).
        let probed = wait_probe(&mut *t, &inbox);
        let j = t.brecany(&mut buf).unwrap();
        assert_eq!(j, probed, "prob and brecany agree");
        inbox.file(j, &buf);
    }
    if bulk {
        assert_eq!(inbox.notice, Some(prev));
        let (base, _) = t.heap();
        // SAFETY: the range prev's put filled; its notice came.
        let landed = unsafe { std::slice::from_raw_parts(base.add(400_000), 300_000) };
        assert!(landed.iter().enumerate().all(|(i, &b)| b == (i * 3 + prev) as u8), "bulk data from {prev}");
    }
    for h in handles.into_iter().chain(put) {
        let since = std::time::Instant::now();
        while !t.senddone(h).unwrap() {
            // Progress without taking anything: the peers' messages stay
            // for the last-word phase.
            let _ = t.prob().unwrap();
            std::thread::yield_now();
            if since.elapsed() > std::time::Duration::from_secs(25) {
                panic!("rank {me}: send {h:?} not done after 25 s; {}", t.describe());
            }
        }
    }
    // The last word: after it, peers may close.
    for j in (0..n).filter(|&j| j != me) {
        t.asend(j, b"bye").unwrap();
    }
    t.closing();
    while inbox.bye.iter().any(|b| !b) {
        wait_probe(&mut *t, &inbox);
        let j = t.brecany(&mut buf).unwrap();
        inbox.file(j, &buf);
    }
    t.comfinish().unwrap();
    println!("mttl-check: comm ok ({} transport, {n} ranks)", t.name());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut what: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    if what.is_empty() || what == ["all"] {
        what = vec!["invoke", "sync", "gptr", "atomic", "coll", "many"];
    }
    if what == ["comm"] {
        return check_comm();
    }
    println!("mttl-check: rank {} pid {}", std::env::var("MTTL_RANK").unwrap_or_else(|_| "0".into()), std::process::id());
    let what: Vec<String> = what.into_iter().map(String::from).collect();
    mttl_via::run(move || {
        for w in &what {
            match w.as_str() {
                "invoke" => check_invoke(),
                "sync" => check_sync(),
                "gptr" => check_gptr(),
                "atomic" => check_atomic(),
                "coll" => check_coll(),
                "many" => check_many(),
                "ring" => check_ring(),
                "crash" => check_crash(),
                other => panic!("unknown check {other:?}"),
            }
        }
        on_all(report_frames, ());
        println!("mttl-check: passed ({} ranks)", pe_num());
    });
}
