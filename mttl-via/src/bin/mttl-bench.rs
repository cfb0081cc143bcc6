//! `mttl-bench [nread] [invoke] [sync] [exchange] [threads] [--paths A,B] [--rounds R] [--quick] [--plot DIR]`
//!
//! MTTL's figures 4 and 5: latency and throughput of remote reads
//! (`GlobalPtr::nread`) and of remote invocations, and of `Sync` writes
//! (`sync`: a value written into the peer's Sync, which a thread there
//! reads and writes back into ours), per size, over two
//! paths in the same run (two ranks under `mttl-run`, the paths
//! alternating round by round; each figure is the median of the rounds),
//! as a table with A/B ratios and, with `--plot`, as SVG charts. Paths:
//! `via` (the VIA layer on the software NIC, `mttl-run --nic-only`),
//! `via-shm` (the VIA layer through the composite device, whose shared
//! memory carries the frames between ranks of one host: mttl-run's
//! default), `tcp` (the TCP layer). Default `--paths via,tcp`. `threads` measures user-level thread creation, switches
//! and memory per thread. Needs root (mttl-run makes namespaces).
//!
//! Latency is t_typical (the median) of one blocking operation at a time;
//! each row also times the operation beneath it alone
//! (`mttl_via::beneath`: for nread the transport's RDMA read, where it
//! has one; for invoke a send/receive round trip of the same payload,
//! for a Sync write there and back one with the payload both ways)
//! and prints the ratio of the two (issue 26: at most 1.3);
//! throughput is bytes per second with 16 threads each keeping one
//! operation in flight, over ten times as many operations as the latency
//! takes.

use mttl_via::{ainvoke, invoke, my_pe, pe_num, remote, sendrecv, GlobalPtr, GlobalSync, Pending, Sync};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;
use via_plot::{chart, Point};

const ALL_SIZES: [usize; 11] = [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 1 << 20, 4 << 20];

/// The sizes to measure: all, or those `MTTL_BENCH_SIZES` lists (comma-separated).
fn sizes() -> Vec<usize> {
    match std::env::var("MTTL_BENCH_SIZES") {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => ALL_SIZES.to_vec(),
    }
}
/// The throughput phase's operations against the latency's.
const THROUGHPUT_FACTOR: u64 = 10;

fn threads_n() -> u64 {
    std::env::var("MTTL_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(16)
}

fn iters(size: usize, quick: bool) -> u64 {
    if let Some(n) = std::env::var("MTTL_BENCH_ITERS").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    let n = if size <= 8192 { 3000 } else if size <= 131072 { 400 } else { 60 };
    if quick { n / 10 } else { n }
}

remote! {
    fn sink(v: Vec<u8>) -> u64 { v.len() as u64 }
    fn reader(p: GlobalPtr<u8>, size: u64, count: u64) {
        let mut buf = vec![0u8; size as usize];
        for _ in 0..count { p.nread(&mut buf); }
    }
    fn exchanger(size: u64, count: u64) {
        let (out, mut back) = (vec![1u8; size as usize], vec![0u8; size as usize]);
        for _ in 0..count { sendrecv(0, &out, 0, &mut back); }
    }
    fn invoker(pe: u64, size: u64, count: u64) {
        let v = vec![7u8; size as usize];
        for _ in 0..count { assert_eq!(invoke(pe as usize, sink, (v.clone(),)), size); }
    }
    // The peer's half of a Sync ping-pong: says where its Sync is, then
    // writes each value it reads there back into `back`.
    fn sync_echo(hello: GlobalSync<GlobalSync<Vec<u8>>>, back: GlobalSync<Vec<u8>>, count: u64) {
        let mine = Sync::<Vec<u8>>::new();
        hello.write(mine.global());
        for _ in 0..count { back.write(mine.read()); }
    }
    fn sync_pinger(pe: u64, size: u64, count: u64) {
        let mut ping = SyncPing::new(pe as usize, size as usize, count);
        for _ in 0..count { ping.once(); }
        ping.finish();
    }
}

/// Our half of a Sync ping-pong with a thread on `pe` (`sync_echo`):
/// `once` writes `size` bytes into its Sync and reads them back from ours.
struct SyncPing {
    back: Sync<Vec<u8>>,
    there: GlobalSync<Vec<u8>>,
    echo: Pending<()>,
    payload: Vec<u8>,
}

impl SyncPing {
    /// A peer thread that echoes `count` values.
    fn new(pe: usize, size: usize, count: u64) -> SyncPing {
        let (back, hello) = (Sync::<Vec<u8>>::new(), Sync::<GlobalSync<Vec<u8>>>::new());
        let echo = ainvoke(pe, sync_echo, (hello.global(), back.global(), count));
        SyncPing { back, there: hello.read(), echo, payload: vec![7u8; size] }
    }

    fn once(&mut self) {
        self.there.write(self.payload.clone());
        assert_eq!(self.back.read().len(), self.payload.len());
    }

    /// Waits for the peer's thread, done once it echoed `count` values.
    fn finish(self) {
        self.echo.wait();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `exchange`: ranks 0 and 1 swap `size` bytes at once (`sendrecv`, the
/// step of a reduce-scatter or a transpose); prints `ROW exchange size
/// lat_us mb_per_s` with the median time of one exchange and the bytes
/// each way per second at that time.
fn measure_exchange(quick: bool) {
    assert_eq!(pe_num(), 2, "exchange runs on 2 ranks");
    for size in sizes() {
        let n = iters(size, quick);
        let warm = n / 10 + 1;
        let partner = ainvoke(1, exchanger, (size as u64, warm + n));
        let (out, mut back) = (vec![1u8; size], vec![0u8; size]);
        // (`typical_us` warms up with `warm` exchanges: the partner's count.)
        let lat = typical_us(n, &mut || sendrecv(1, &out, 1, &mut back));
        partner.wait();
        println!("ROW exchange {size} {lat:.3} {:.3}", size as f64 / lat);
    }
}

/// t_typical of `op` in microseconds: the median of `n` timed calls after
/// `n / 10 + 1` untimed ones.
fn typical_us(n: u64, op: &mut dyn FnMut()) -> f64 {
    for _ in 0..n / 10 + 1 {
        op();
    }
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = Instant::now();
            op();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    median(&mut t)
}

/// Prints `ROW op size lat_us mb_per_s beneath_us` lines for `op` (rank 0 of a 2-rank run).
fn measure(op: &str, quick: bool) {
    let target = if pe_num() > 1 { 1 } else { 0 };
    let me = my_pe();
    for size in sizes() {
        let n = iters(size, quick);
        let p = GlobalPtr::<u8>::alloc_on(target, size);
        let payload = vec![7u8; size];
        let mut buf = vec![0u8; size];
        // (`typical_us` runs n / 10 + 1 untimed, then n timed.)
        let mut ping = (op == "sync").then(|| SyncPing::new(target, size, n / 10 + 1 + n));
        let mut one = || match op {
            "nread" => p.nread(&mut buf),
            "sync" => ping.as_mut().expect("a Sync ping-pong").once(),
            _ => assert_eq!(invoke(target, sink, (payload.clone(),)), size as u64),
        };
        let lat = typical_us(n, &mut one);
        if let Some(ping) = ping {
            ping.finish();
        }
        // The operation beneath, timed alike: for a read the transport's
        // RDMA read alone (NaN where the transport has none), for an
        // invocation a send/receive round trip of the same payload, for a
        // Sync write there and back one with the payload both ways.
        let bare = || match op {
            "nread" => mttl_via::beneath::rdma_read(target, p.heap_offset(), size) == Some(true),
            "sync" => {
                mttl_via::beneath::round_trip_whole(target, &payload);
                true
            }
            _ => {
                mttl_via::beneath::round_trip(target, &payload);
                true
            }
        };
        let beneath = if target != me && bare() {
            typical_us(n, &mut || {
                bare();
            })
        } else {
            f64::NAN
        };
        let nthreads = threads_n();
        // Ten times the latency's operations: at 3,000 small reads the
        // phase lasted ~4 ms, and the threads' start weighed on it.
        let per = (THROUGHPUT_FACTOR * n / nthreads).max(4);
        let s = Instant::now();
        let workers: Vec<_> = (0..nthreads)
            .map(|_| match op {
                "nread" => ainvoke(me, reader, (p, size as u64, per)),
                "sync" => ainvoke(me, sync_pinger, (target as u64, size as u64, per)),
                _ => ainvoke(me, invoker, (target as u64, size as u64, per)),
            })
            .collect();
        for w in workers {
            w.wait();
        }
        let mbps = (nthreads * per) as f64 * size as f64 / s.elapsed().as_secs_f64() / 1e6;
        println!("ROW {op} {size} {lat:.3} {mbps:.3} {beneath:.3}");
        p.free();
    }
}

/// Thread creation, switch cost and memory per thread, in this process.
fn threads() {
    use mttl_via::thread;
    use std::cell::Cell;
    use std::rc::Rc;
    let n = 100_000;
    let done = Rc::new(Cell::new(0usize));
    let s = Instant::now();
    for _ in 0..n {
        let d = done.clone();
        thread::spawn(move || d.set(d.get() + 1));
    }
    while done.get() < n {
        thread::yield_now();
    }
    let create_ns = s.elapsed().as_secs_f64() * 1e9 / n as f64;
    let rounds = 500_000;
    let s = Instant::now();
    let d = done.clone();
    thread::spawn(move || {
        for _ in 0..rounds {
            thread::yield_now();
        }
        d.set(0);
    });
    for _ in 0..rounds {
        thread::yield_now();
    }
    while done.get() != 0 {
        thread::yield_now();
    }
    let switch_ns = s.elapsed().as_secs_f64() * 1e9 / (2 * rounds) as f64;
    let rss = || std::fs::read_to_string("/proc/self/status").ok().and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())).unwrap_or(0.0);
    let blocked = 10_000;
    let ids = Rc::new(std::cell::RefCell::new(Vec::new()));
    let before = rss();
    let stats0 = thread::stats();
    for _ in 0..blocked {
        let ids = ids.clone();
        thread::spawn(move || {
            ids.borrow_mut().push(thread::current().unwrap());
            thread::block();
        });
    }
    while ids.borrow().len() < blocked {
        thread::yield_now();
    }
    let kib = (rss() - before) / blocked as f64;
    let st = thread::stats();
    for id in ids.borrow_mut().drain(..) {
        thread::wake(id);
    }
    thread::yield_now();
    println!(
        "ROW threads create+run+finish {create_ns:.0} ns, switch {switch_ns:.0} ns, resident memory per blocked thread {kib:.1} KiB (stack {} KiB reserved), stacks allocated for {blocked} blocked threads: {}",
        st.stack_bytes >> 10,
        st.stacks_allocated - stats0.stacks_allocated
    );
}

struct Opts {
    ops: Vec<String>,
    /// The two paths compared, A then B.
    paths: [String; 2],
    rounds: usize,
    quick: bool,
    plot: Option<String>,
}

const USAGE: &str = "usage: mttl-bench [nread] [invoke] [sync] [exchange] [threads] [--paths A,B] [--rounds R] [--quick] [--plot DIR]
  nread, invoke, sync, exchange: latency and throughput per size over two paths (default nread invoke sync threads)
  threads: user-level thread creation, switch and memory
  --paths A,B   two of via (software NIC alone), via-shm (composite device), tcp (the TCP layer); default via,tcp
  --rounds R    rounds (default 3); each runs both paths, the first one alternating from round to round
  --quick       a tenth of the iterations
  --plot DIR    SVG charts of the medians
Environment: MTTL_BENCH_SIZES (comma-separated sizes), MTTL_BENCH_ITERS, MTTL_BENCH_THREADS (16),
MTTL_BENCH_MTU (the links' MTU), VIA_SPIN_US (spin of blocking waits, both layers).
Prints the median of the rounds per size and path, then every round's figure. A run that fails
stops the benchmark (exit status 1).";

/// Stops the benchmark with `why` (exit status 1).
fn fail(why: &str) -> ! {
    eprintln!("mttl-bench: {why}");
    std::process::exit(1)
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts { ops: Vec::new(), paths: ["via".into(), "tcp".into()], rounds: 3, quick: false, plot: None };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            "--rounds" => {
                o.rounds = args.get(i + 1).and_then(|v| v.parse().ok()).filter(|&r| r > 0).unwrap_or_else(|| {
                    eprintln!("mttl-bench: --rounds takes a positive number\n{USAGE}");
                    std::process::exit(2)
                });
                i += 1;
            }
            "--plot" => {
                o.plot = Some(args.get(i + 1).cloned().unwrap_or_else(|| {
                    eprintln!("mttl-bench: --plot takes a directory\n{USAGE}");
                    std::process::exit(2)
                }));
                i += 1;
            }
            "--quick" => o.quick = true,
            "--paths" => {
                let v: Vec<String> = args.get(i + 1).map(|p| p.split(',').map(String::from).collect()).unwrap_or_default();
                match &v[..] {
                    [a, b] if [a, b].iter().all(|p| ["via", "via-shm", "tcp"].contains(&p.as_str())) => o.paths = [a.clone(), b.clone()],
                    _ => {
                        eprintln!("mttl-bench: --paths takes two of via, via-shm, tcp (comma-separated)");
                        std::process::exit(2)
                    }
                }
                i += 1;
            }
            op @ ("nread" | "invoke" | "sync" | "exchange" | "threads") => o.ops.push(op.into()),
            other => {
                eprintln!("mttl-bench: unknown argument {other:?}\n{USAGE}");
                std::process::exit(2)
            }
        }
        i += 1;
    }
    if o.ops.is_empty() {
        o.ops = vec!["nread".into(), "invoke".into(), "sync".into(), "threads".into()];
    }
    o
}

/// Runs this program as a 2-rank worker over `path`; returns its ROW
/// lines. A run that fails, or that does not give a figure for every
/// operation and size, stops the benchmark.
fn worker(path: &str, ops: &str, quick: bool) -> Vec<String> {
    let me = std::env::current_exe().expect("own path");
    let run = me.with_file_name("mttl-run");
    let mut args = vec!["--worker".to_string(), ops.to_string()];
    if quick {
        args.push("--quick".into());
    }
    // The links' MTU: mttl-run's default unless MTTL_BENCH_MTU gives one.
    let mtu: Vec<String> = std::env::var("MTTL_BENCH_MTU").map(|m| vec!["--mtu".into(), m]).unwrap_or_default();
    let (transport, device): (&str, &[&str]) = match path {
        "via" => ("via", &["--nic-only"]),
        "via-shm" => ("via", &[]),
        _ => ("tcp", &[]),
    };
    let out = Command::new(&run).args(["-n", "2", "--transport", transport]).args(device).args(&mtu).args(["--timeout", "600", "--"]).arg(&me).args(&args).output().unwrap_or_else(|e| fail(&format!("running {}: {e}", run.display())));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
        fail(&format!("the {path} run ({ops}) failed: {}", out.status));
    }
    let rows: Vec<String> = text.lines().filter_map(|l| l.strip_prefix("[0] ROW ")).map(String::from).collect();
    let expected = ops.split(',').count() * sizes().len();
    if rows.len() != expected {
        eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
        fail(&format!("the {path} run ({ops}) gave {} figures, not {expected}", rows.len()));
    }
    rows
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        let ops: Vec<String> = args[1].split(',').map(String::from).collect();
        let quick = args.iter().any(|a| a == "--quick");
        mttl_via::run(move || {
            for op in &ops {
                match op.as_str() {
                    "threads" => threads(),
                    "exchange" => measure_exchange(quick),
                    op => measure(op, quick),
                }
            }
        });
    }
    let o = parse(&args);
    if o.ops.iter().any(|op| op == "threads") {
        let me = std::env::current_exe().expect("own path");
        let out = Command::new(me).args(["--worker", "threads"]).env("MTTL_TRANSPORT", "tcp").env_remove("MTTL_RANK").output().expect("thread benchmark");
        let text = String::from_utf8_lossy(&out.stdout);
        for l in text.lines().filter_map(|l| l.strip_prefix("ROW threads ")) {
            println!("threads: {l}");
        }
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            std::process::exit(1);
        }
    }
    let comm_ops: Vec<&str> = o.ops.iter().map(String::as_str).filter(|op| *op != "threads").collect();
    if comm_ops.is_empty() {
        return;
    }
    // (op, path, size) -> samples of (lat, mbps)
    let mut samples: BTreeMap<(String, String, usize), Vec<(f64, f64)>> = BTreeMap::new();
    // (op, path, size) -> per round (latency, that of the operation beneath it)
    let mut beneath: BTreeMap<(String, String, usize), Vec<(f64, f64)>> = BTreeMap::new();
    let [pa, pb] = [o.paths[0].as_str(), o.paths[1].as_str()];
    for round in 0..o.rounds {
        let order = if round % 2 == 0 { [pa, pb] } else { [pb, pa] };
        for t in order {
            for row in worker(t, &comm_ops.join(","), o.quick) {
                let f: Vec<&str> = row.split_whitespace().collect();
                let parsed = match f[..] {
                    [op, size, lat, mbps, ..] if f.len() <= 5 => size.parse::<usize>().ok().zip(lat.parse::<f64>().ok()).zip(mbps.parse::<f64>().ok()).map(|((s, l), m)| (op, s, l, m)),
                    _ => None,
                };
                let Some((op, size, lat, mbps)) = parsed else { fail(&format!("the {t} run printed a malformed figure: {row:?}")) };
                samples.entry((op.into(), t.into(), size)).or_default().push((lat, mbps));
                if let Some(b) = f.get(4).and_then(|b| b.parse::<f64>().ok()).filter(|b| b.is_finite()) {
                    beneath.entry((op.into(), t.into(), size)).or_default().push((lat, b));
                }
            }
        }
        eprintln!("mttl-bench: round {} of {} done", round + 1, o.rounds);
    }
    let med = |op: &str, t: &str, size: usize, k: usize| -> f64 {
        let mut v: Vec<f64> = samples.get(&(op.to_string(), t.to_string(), size)).map(|s| s.iter().map(|x| if k == 0 { x.0 } else { x.1 }).collect()).unwrap_or_default();
        if v.is_empty() { f64::NAN } else { median(&mut v) }
    };
    for op in &comm_ops {
        println!("\n=== {op}: {pa} against {pb} (2 ranks, medians of {} alternating rounds) ===", o.rounds);
        let col = |p: &str, what: &str| format!("{p} {what}");
        println!("{:>9} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}", "bytes", col(pa, "lat us"), col(pb, "lat us"), format!("{pb}/{pa}"), col(pa, "MB/s"), col(pb, "MB/s"), format!("{pa}/{pb}"));
        for size in sizes() {
            let (al, bl, ab, bb) = (med(op, pa, size, 0), med(op, pb, size, 0), med(op, pa, size, 1), med(op, pb, size, 1));
            println!("{size:>9} {al:>12.2} {bl:>12.2} {:>8.2} {ab:>12.2} {bb:>12.2} {:>8.2}", bl / al, ab / bb);
        }
        // Every round's figure (in round order), not just the medians.
        let all = |t: &str, size: usize, k: usize| -> String {
            samples.get(&(op.to_string(), t.to_string(), size)).map(|s| s.iter().map(|x| format!("{:.2}", if k == 0 { x.0 } else { x.1 })).collect::<Vec<_>>().join(" ")).unwrap_or_default()
        };
        println!("  every round, latency us | MB/s:");
        for size in sizes() {
            println!("  {size:>9}  {pa}: {}  {pb}: {} | {pa}: {}  {pb}: {}", all(pa, size, 0), all(pb, size, 0), all(pa, size, 1), all(pb, size, 1));
        }
        if *op == "exchange" {
            continue;
        }
        // Each round's figure against the operation beneath it, timed in
        // the same process right after.
        let under = match *op {
            "nread" => "the RDMA read",
            "sync" => "a send/receive round trip with the payload both ways",
            _ => "a send/receive round trip",
        };
        for ((o2, t, size), v) in &beneath {
            if o2 != op {
                continue;
            }
            let mut ratios: Vec<f64> = v.iter().map(|(l, b)| l / b).collect();
            let mut b: Vec<f64> = v.iter().map(|x| x.1).collect();
            let r = median(&mut ratios);
            let verdict = if *size == 32 { format!(" (target <= 1.3) {}", if r <= 1.3 { "PASS" } else { "MISS" }) } else { String::new() };
            println!("{op} {size} B latency on {t} / {under} beneath it = {r:.2} (median of rounds; beneath {:.2} us){verdict}", median(&mut b));
        }
        let r = med(op, pa, 32, 1) / med(op, pb, 32, 1);
        println!("{op} 32 B throughput {pa}/{pb} = {r:.2}{}", if o.paths == ["via", "tcp"] { format!(" (target >= 3) {}", if r >= 3.0 { "PASS" } else { "MISS" }) } else { String::new() });
    }
    if let Some(dir) = &o.plot {
        std::fs::create_dir_all(dir).expect("plot directory");
        for op in &comm_ops {
            let series = [pa, pb];
            let pts = |k: usize| -> Vec<Point> { sizes().into_iter().flat_map(|s| series.iter().map(move |&t| (t, s))).map(|(t, s)| Point { series: t, bytes: s, value: med(op, t, s, k) }).filter(|p| p.value.is_finite()).collect() };
            let name = if o.paths == ["via", "tcp"] { op.to_string() } else { format!("{op}-{pa}-{pb}") };
            std::fs::write(format!("{dir}/mttl-{name}-latency.svg"), chart(&pts(0), &series, &format!("{op} latency, t_typical [usec]"), true)).expect("writing plot");
            std::fs::write(format!("{dir}/mttl-{name}-throughput.svg"), chart(&pts(1), &series, &format!("{op} throughput, 16 threads [MB/s]"), false)).expect("writing plot");
        }
        println!("plots in {dir}");
    }
}
