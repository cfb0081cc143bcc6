//! The test suite that runs inside the QEMU guest (see `qemu/`), on the
//! NICs that have a VIA driver (`via_device::pci::NIC_DRIVERS`: tulips and
//! 82574L e1000e NICs) bound to vfio-pci, one process per NIC. Its first
//! line is `guest: suite started: K checks planned for N NICs (KINDS)`,
//! its last `guest: P passed, F failed, K planned`; it exits non-zero
//! unless every planned check passed (P == K). `VIA_GUEST_NICS` (from
//! `via_nics=N` on the kernel command line) says how many NICs the guest
//! was given and `VIA_GUEST_KINDS` (`via_kinds=tulip:1,e1000e:1`) how
//! many of each kind (unset: all N are tulips): another count of any kind
//! bound to vfio-pci is a failure, and so is every check whose NICs are
//! missing (never a skip). `VIA_GUEST_ONLY` filters the checks by name;
//! matching nothing is an error naming the known checks.
//!
//! `via-guest-suite` runs the suite; `via-guest-suite plan NICS [ONLY]`
//! lists the checks it would run for NICS (a number of tulips, or kinds
//! and counts such as `tulip:1,e1000e:1`; qemu/run.sh asks before
//! booting); `via-guest-suite rank R DEV [--forever]` is one process of
//! the all-to-all exchange and `via-guest-suite memlock DEV` the process
//! of the RLIMIT_MEMLOCK check (both started by the suite).
//!
//! What it runs, with every process owning one NIC through VFIO (the
//! checks on two NICs take the first two by PCI address: in a mixed guest
//! one tulip and one e1000e, so the two drivers talk to each other):
//! - as many NICs of each kind bound as given;
//! - opening every NIC (distinct station addresses) and reopening it, also
//!   by its numbered name `/dev/via_<kind><N>`; registration mapping and
//!   unmapping memory for the NIC;
//! - a process without CAP_IPC_LOCK under a low RLIMIT_MEMLOCK: the open or
//!   registration that does not fit fails naming the limit, leaves nothing
//!   mapped, and what fits still registers (`memlock.rs`);
//! - `via-pingpong --verify` between two NICs: send/receive on both
//!   reliability levels, RDMA write and RDMA read, over a sweep of sizes;
//! - the two-host scenarios of `via-testpeer` and every rule of the
//!   conformance suite (`via-conform`), which need no namespaces here;
//! - all-to-all among every NIC (4 with `qemu/run.sh --boot KIND:4`), NAS
//!   CG class S on 2 ranks and, with 4 NICs, on 4;
//! - processes killed with traffic in flight: bus mastering off, VFIO
//!   groups free and pinned pages released before the NICs reopen, no
//!   IOMMU fault, then the same NICs open reset and carry verified traffic
//!   (`killed.rs`, which reads each kind's own registers);
//! - with `VIA_GUEST_ONLY=bench` (`qemu/run.sh --only bench`): VIA against
//!   raw frames on the same two NICs, latency (64 and 1024 B) and
//!   bandwidth (messages of one frame, 1436 B, and of 64 KiB), naming
//!   their kinds (`--env VIA_GUEST_BENCH_STATS=1`: both VIA ends' counters
//!   too; `VIA_GUEST_BENCH_BW_SIZES` and `VIA_GUEST_BENCH_BW_ITERS`: other
//!   bandwidth sizes and counts; `--env VIA_GUEST_BENCH_ONE=raw` or
//!   `=via`: that transport alone, a stream of `VIA_GUEST_BENCH_MESSAGES`
//!   messages, 20,000 unless set).
//!
//! A check that runs for 110 s is reported with the state of every thread
//! of the suite and its children, and fails (`stuck.rs`).

mod checksum;
mod killed;
mod memlock;
mod pending;
mod stuck;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{exit, Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use via_device::pci;
use via_user::{Descriptor, MacAddr, MemAttributes, MemoryRegion, Nic, Reliability, Vi, ViAttributes};

/// Messages each rank sends to each other rank in the all-to-all.
const A2A_MESSAGES: usize = 48;
/// Largest all-to-all message (spans several frames).
const A2A_MAX: usize = 6000;
const T: Option<Duration> = Some(Duration::from_secs(60));

fn bin(name: &str) -> PathBuf {
    std::env::current_exe().expect("own path").with_file_name(name)
}

/// The NICs with a VIA driver bound to vfio-pci, as VIA device names
/// (`tulip:<pci>`, `e1000e:<pci>`), in PCI address order.
fn bound_nics() -> Vec<String> {
    pci::list().unwrap_or_default().into_iter().filter(|d| d.via_driver().is_some() && d.driver.as_deref() == Some("vfio-pci")).filter_map(|d| d.via_name()).collect()
}

/// The NIC kinds with a VIA driver, in `pci::NIC_DRIVERS` order (the
/// order every count by kind is written in).
fn kinds() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for &(_, _, k) in pci::NIC_DRIVERS.iter() {
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// The kind of a VIA device name (`e1000e` for `e1000e:0000:00:02.0`).
fn kind_of(dev: &str) -> &str {
    dev.split_once(':').map_or(dev, |(k, _)| k)
}

/// The PCI address of a VIA device name (`0000:00:02.0` for `e1000e:0000:00:02.0`).
fn address_of(dev: &str) -> &str {
    dev.split_once(':').map_or(dev, |(_, a)| a)
}

/// How many NICs of each kind: `(kind, count)` in [`kinds`] order, kinds
/// with none left out.
type KindCounts = Vec<(&'static str, usize)>;

/// The counts by kind of the NICs `devs` (VIA device names).
fn count_kinds(devs: &[String]) -> KindCounts {
    kinds().into_iter().map(|k| (k, devs.iter().filter(|d| kind_of(d) == k).count())).filter(|&(_, n)| n > 0).collect()
}

/// `tulip:1,e1000e:1` (`none` for no NIC at all).
fn show_kinds(counts: &KindCounts) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(",")
}

/// Parses NICs given as a number (that many tulips) or as kinds and
/// counts, `tulip:1,e1000e:1`; the result is in [`kinds`] order.
fn parse_kinds(spec: &str) -> Result<KindCounts, String> {
    if let Ok(n) = spec.parse::<usize>() {
        return Ok(if n > 0 { vec![("tulip", n)] } else { Vec::new() });
    }
    let known = kinds();
    let mut given: Vec<(&'static str, usize)> = Vec::new();
    for part in spec.split(',') {
        let (k, n) = part.split_once(':').ok_or(format!("{spec:?}: expected KIND:COUNT[,KIND:COUNT...] (kinds: {})", known.join(", ")))?;
        let kind = *known.iter().find(|&&x| x == k).ok_or(format!("{spec:?}: no VIA driver for NIC kind {k:?} (kinds: {})", known.join(", ")))?;
        let n: usize = n.parse().map_err(|_| format!("{spec:?}: {n:?} is not a count"))?;
        if given.iter().any(|&(g, _)| g == kind) {
            return Err(format!("{spec:?}: {kind} given twice"));
        }
        given.push((kind, n));
    }
    Ok(known.into_iter().filter_map(|k| given.iter().find(|&&(g, n)| g == k && n > 0).copied()).collect())
}

/// A child whose stdout is read line by line on a thread.
struct Child2 {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Child2 {
    fn spawn(mut cmd: Command) -> Result<Child2, String> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("starting {cmd:?}: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Ok(Child2 { child, lines, seen: Vec::new() })
    }

    /// Waits (up to a minute) for a stdout line starting with `prefix`.
    fn expect(&mut self, prefix: &str) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return Ok(rest.trim().to_string());
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let out = self.child.wait_with_output_ref();
                    return Err(format!("no {prefix:?} line; stdout so far: {:?}; {out}", self.seen));
                }
            }
        }
    }

    fn tell(&mut self, line: &str) {
        if let Some(w) = self.child.stdin.as_mut() {
            let _ = writeln!(w, "{line}");
            let _ = w.flush();
        }
    }

    /// Waits for the process; Ok(stdout) when it exited 0.
    fn finish(mut self) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(45);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                _ if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    break;
                }
                // Polling a child's exit: nothing here synchronises on time.
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let status = reap(&mut self.child)?;
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        self.seen.extend(self.lines.try_iter());
        let out = self.seen.join("\n");
        if status.success() {
            // Keep what the process reported on stderr (e.g. what it verified).
            Ok(out + "\n" + err.trim_end())
        } else {
            Err(format!("exited with {status}\n--- stdout\n{out}\n--- stderr\n{err}"))
        }
    }
}

/// Waits for `child` (killed already, or about to exit) for up to ten
/// seconds. A process that a SIGKILL cannot end is stuck in the kernel:
/// the error says where (its state, wait channel and kernel stack), and
/// the suite goes on instead of waiting forever.
fn reap(child: &mut Child) -> Result<std::process::ExitStatus, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st),
            Ok(None) if Instant::now() < deadline => {
                let _ = child.kill();
                // Polling a child's exit: nothing here synchronises on time.
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let pid = child.id();
                let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_else(|e| format!("({e})"));
                let state = read("stat").split(") ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
                return Err(format!("process {pid} did not exit 10 s after SIGKILL: stuck in the kernel (state {state}, wchan {}); kernel stack:\n{}", read("wchan"), read("stack")));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

trait WaitRef {
    fn wait_with_output_ref(&mut self) -> String;
}

impl WaitRef for Child {
    fn wait_with_output_ref(&mut self) -> String {
        if let Err(e) = reap(self) {
            return e;
        }
        let mut err = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        format!("stderr: {err}")
    }
}

// ---------------------------------------------------------------- checks

fn open_every_nic(devs: &[String]) -> Result<(), String> {
    let mut macs = Vec::new();
    for d in devs {
        let nic = Nic::open(d).map_err(|e| format!("{d}: {e}"))?;
        macs.push(nic.mac());
        println!("  {d}: MAC {}", nic.mac());
    }
    for (i, m) in macs.iter().enumerate() {
        if *m == MacAddr::ZERO || macs[..i].contains(m) {
            return Err(format!("station addresses {macs:?} are not distinct and nonzero"));
        }
    }
    // Closed above (dropped): every NIC opens again, with the same
    // address, also by its M-VIA style name /dev/via_<kind><N>, N its
    // index among the NICs of its kind by PCI address (every NIC present
    // is bound here, so the bound ones are the ones the name counts).
    for (i, (d, m)) in devs.iter().zip(&macs).enumerate() {
        let kind = kind_of(d);
        let n = devs[..i].iter().filter(|x| kind_of(x) == kind).count();
        for name in [d.clone(), format!("/dev/via_{kind}{n}")] {
            let nic = Nic::open(&name).map_err(|e| format!("reopening {name}: {e}"))?;
            if nic.mac() != *m {
                return Err(format!("{name}: MAC {} after reopening, {m} before", nic.mac()));
            }
        }
    }
    // One process owns a NIC: a second open of an open NIC is refused.
    let _first = Nic::open(&devs[0]).map_err(|e| e.to_string())?;
    match Nic::open(&devs[0]) {
        Ok(_) => return Err(format!("{} opened twice at once", devs[0])),
        Err(e) => println!("  second open of {}: {e}", devs[0]),
    }
    Ok(())
}

fn stat(nic: &Nic, name: &str) -> u64 {
    nic.device_counters().into_iter().find(|(n, _)| *n == name).map_or(u64::MAX, |(_, v)| v)
}

fn registration_maps_memory(devs: &[String]) -> Result<(), String> {
    let nic = Nic::open(&devs[0]).map_err(|e| e.to_string())?;
    let ptag = nic.create_ptag().map_err(|e| e.to_string())?;
    let attrs = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
    let before = stat(&nic, "dma_mappings");
    let regions: Vec<_> = (0..3).map(|k| MemoryRegion::new(&nic, 4096 << k, 4096, attrs)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let during = stat(&nic, "dma_mappings");
    drop(regions);
    let after = stat(&nic, "dma_mappings");
    if (before, during, after) != (0, 3, 0) {
        return Err(format!("IOMMU mappings before/while/after three registrations: {before}/{during}/{after}, expected 0/3/0"));
    }
    Ok(())
}

const SIZES: &str = "0,1,63,64,1000,1435,1436,1437,1500,4096,9000,65536";

fn pingpong(devs: &[String], extra: &[&str]) -> Result<(), String> {
    pingpong_env(devs, extra, &[]).map(|_| ())
}

/// A verified ping-pong with `env` set on both sides; returns the client's output.
fn pingpong_env(devs: &[String], extra: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    let pp = bin("via-pingpong");
    let common = ["--sizes", SIZES, "--bw-sizes", "1436,65536", "--iters", "200"];
    let mut server = Child2::spawn({
        let mut c = Command::new(&pp);
        c.args(["server", "--device", &devs[0]]).args(common).args(extra).envs(env.iter().copied());
        c
    })?;
    let mac = server.expect("READY")?;
    let client = Child2::spawn({
        let mut c = Command::new(&pp);
        c.args(["client", "--device", &devs[1], "--peer", &mac, "--verify"]).args(common).args(extra).envs(env.iter().copied());
        c
    })?;
    let out = client.finish().map_err(|e| format!("client: {e}"))?;
    server.finish().map_err(|e| format!("server: {e}"))?;
    for l in out.lines() {
        println!("  {l}");
    }
    Ok(out)
}

/// Two 82574s opened for jumbo frames (`,mtu=9000`): a verified
/// ping-pong of messages up to 64 KiB, and 8000-byte messages that each go
/// as one frame (at Ethernet's MTU each would take six): the client's
/// device sends fewer than two frames per message, ACKs included.
fn jumbo_frames_on_two_e1000e(devs: &[String]) -> Result<(), String> {
    let jumbo: Vec<String> = devs.iter().filter(|d| kind_of(d) == "e1000e").map(|d| format!("{d},mtu=9000")).collect();
    if jumbo.len() < 2 {
        return Err(format!("needs two e1000e NICs, the bound NICs are {devs:?}"));
    }
    pingpong(&jumbo, &[])?;
    let iters = 200;
    let out = pingpong_env(&jumbo, &["--sizes", "8000", "--bw-sizes", "8000", "--stats"], &[])?;
    let frames = device_counter(&out, "tx_frames").ok_or("no tx_frames counter in the client's --stats report")?;
    // pingpong_env's --iters: 200 latency round trips and 200 bandwidth
    // messages, each 8000 bytes from the client.
    let messages = 2 * iters;
    println!("  client: {frames} frames sent for {messages} messages of 8000 bytes at MTU 9000");
    if frames >= 2 * messages {
        return Err(format!("{frames} frames for {messages} messages of 8000 bytes: not one frame each (is the MTU 9000?)"));
    }
    Ok(())
}

/// The value of device counter `name` in a `--stats` report (the lines
/// after "counters of ... (device):").
fn device_counter(out: &str, name: &str) -> Option<u64> {
    let device = &out[out.find("(device):")?..];
    device.lines().skip(1).find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some(name)).then(|| w.next()?.parse().ok()).flatten()
    })
}

/// A receive wait asleep with nothing else able to wake it (no progress
/// thread, no spinning, no timers) is woken by the NIC's interrupt through
/// the VFIO eventfd (`irq_wake.rs`); and in a `via-pingpong` exchange
/// without spinning, interrupts are taken and data frames go from
/// registered memory (zero-copy).
fn sleeping_waits_wake_on_interrupts(devs: &[String]) -> Result<(), String> {
    // Kept in its own file (this one belongs to the QEMU harness).
    #[path = "irq_wake.rs"]
    mod irq_wake;
    irq_wake::receive_wait_is_woken_by_the_interrupt(&devs[0], &devs[1])?;
    let out = pingpong_env(devs, &["--sizes", "0,64,1436,65536", "--stats"], &[("VIA_SPIN_US", "0")])?;
    let irqs = device_counter(&out, "interrupts").ok_or("no interrupts counter in the client's --stats report")?;
    let zero_copy = device_counter(&out, "tx_zero_copy").ok_or("no tx_zero_copy counter")?;
    let copied = device_counter(&out, "tx_copied").ok_or("no tx_copied counter")?;
    println!("  client: {irqs} interrupts, {zero_copy} frames sent zero-copy, {copied} copied");
    if irqs == 0 || zero_copy == 0 {
        return Err(format!("expected interrupts and zero-copy frames: {irqs} interrupts, {zero_copy} zero-copy frames"));
    }
    Ok(())
}

/// `via-agent unbind` gives the NIC up (opening it then fails with advice),
/// `via-agent bind` takes it back; a missing device is a clear error.
fn via_agent_unbinds_and_binds(devs: &[String]) -> Result<(), String> {
    let agent = bin("via-agent");
    let addr = address_of(&devs[0]).to_string();
    let run = |args: &[&str]| -> Result<String, String> {
        let o = Command::new(&agent).args(args).output().map_err(|e| e.to_string())?;
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        if o.status.success() { Ok(text) } else { Err(text) }
    };
    run(&["unbind", &addr]).map_err(|e| format!("unbind: {e}"))?;
    let refused = Nic::open(&devs[0]).err().map(|e| e.to_string());
    let status = run(&["status"]).unwrap_or_else(|e| e);
    run(&["bind", &addr]).map_err(|e| format!("bind: {e}"))?;
    let Some(msg) = refused else { return Err("the NIC opened while unbound from vfio-pci".into()) };
    if !msg.contains("via-agent bind") {
        return Err(format!("opening an unbound NIC says {msg:?}, without telling to bind it"));
    }
    if !status.contains("not bound to vfio-pci") {
        return Err(format!("status while unbound: {status}"));
    }
    Nic::open(&devs[0]).map_err(|e| format!("after binding again: {e}"))?;
    match run(&["bind", "0000:00:1f.7"]) {
        Ok(t) => Err(format!("binding a missing device succeeded: {t}")),
        Err(t) if t.contains("no PCI device") => Ok(()),
        Err(t) => Err(format!("binding a missing device: {t}")),
    }
}

/// One `via-pingpong` client run with `--json`: (bytes, t_typical µs or MB/s) rows.
fn pingpong_json(devs: &[String], extra: &[&str]) -> Result<Vec<(String, usize, f64)>, String> {
    let pp = bin("via-pingpong");
    let mut server = Child2::spawn({
        let mut c = Command::new(&pp);
        c.args(["server", "--device", &devs[0]]).args(extra);
        if extra.contains(&"--stats") {
            c.env("VIA_PINGPONG_STATS", "1"); // the server's counters too
        }
        c
    })?;
    let mac = server.expect("READY")?;
    let client = Child2::spawn({
        let mut c = Command::new(&pp);
        c.args(["client", "--device", &devs[1], "--peer", &mac, "--json"]).args(extra);
        c
    })?;
    let out = client.finish().map_err(|e| format!("client {extra:?}: {e}"))?;
    let served = server.finish().map_err(|e| format!("server {extra:?}: {e}"))?;
    if extra.contains(&"--stats") {
        println!("{out}");
        println!("server:\n{served}");
    }
    let field = |row: &str, key: &str| -> Option<String> {
        let at = row.find(&format!("\"{key}\":"))? + key.len() + 3;
        Some(row[at..].split([',', '}']).next()?.trim().trim_matches('"').to_string())
    };
    let mut rows = Vec::new();
    for row in out.split('{').skip(1) {
        let op = field(row, "op").unwrap_or_default();
        let bytes = field(row, "bytes").and_then(|b| b.parse().ok()).unwrap_or(0);
        let v = if op == "lat" { field(row, "t_typical_us") } else { field(row, "mb_per_s") };
        rows.push((op, bytes, v.and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)));
    }
    if rows.is_empty() {
        return Err(format!("no rows in the client's output: {out}"));
    }
    Ok(rows)
}

/// Figures, not a pass/fail criterion beyond both transports working:
/// VIA against raw frames on the same two NICs (the floor of this path),
/// in alternating rounds, medians of the per-round ratios. Says which
/// kinds of NIC the figures are of.
fn bench_via_against_raw(devs: &[String]) -> Result<(), String> {
    println!("  bench on {} (server) and {} (client)", devs[0], devs[1]);
    // The kinds the figures are of, client to server: "tulip-e1000e".
    let on = format!("{}-{}", kind_of(&devs[1]), kind_of(&devs[0]));
    // VIA_GUEST_BENCH_ONE=raw|via: that transport alone, 20,000 messages
    // of 1436 bytes one way (VIA_GUEST_BENCH_MESSAGES: another count, for
    // a stream long enough to profile from the host), for an instruction
    // profile of the guest (qemu/profile-guest.sh); no ratios.
    if let Ok(one) = std::env::var("VIA_GUEST_BENCH_ONE") {
        let n = std::env::var("VIA_GUEST_BENCH_MESSAGES").unwrap_or_else(|_| "20000".into());
        let rows = pingpong_json(devs, &["--sizes", "64", "--iters", "20", "--bw-sizes", "1436", "--bw-iters", &n, "--transport", &one])?;
        println!("  bench {on} {one} alone: {rows:?}");
        return Ok(());
    }
    // 3,000 messages stream for 30-90 ms: one descheduled vCPU does not
    // decide the figure, as it could at 300.
    // Bandwidth in messages of one frame (the cost per message) and of
    // 64 KiB (a bulk transfer's, as the host's demo measures 1 MiB).
    let bw = std::env::var("VIA_GUEST_BENCH_BW_SIZES").unwrap_or_else(|_| "1436,65536".into());
    let bw_iters = std::env::var("VIA_GUEST_BENCH_BW_ITERS").unwrap_or_else(|_| "3000".into());
    let common = ["--sizes", "64,1024", "--bw-sizes", &bw, "--iters", "300", "--bw-iters", &bw_iters];
    let nrows = 2 + bw.split(',').count();
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); nrows];
    let mut last = (Vec::new(), Vec::new());
    for _round in 0..3 {
        let raw = pingpong_json(devs, &[&common[..], &["--transport", "raw"]].concat())?;
        // VIA_GUEST_BENCH_STATS=1: the VIA client's counters too.
        let stats: &[&str] = if std::env::var_os("VIA_GUEST_BENCH_STATS").is_some() { &["--stats"] } else { &[] };
        let via = pingpong_json(devs, &[&common[..], &["--transport", "via"], stats].concat())?;
        if raw.len() != nrows || via.len() != nrows {
            return Err(format!("expected {nrows} rows from each: raw {raw:?}, via {via:?}"));
        }
        for k in 0..nrows {
            ratios[k].push(via[k].2 / raw[k].2);
        }
        last = (raw, via);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (raw, via) = last;
    for k in 0..nrows {
        let (op, bytes, _) = &raw[k];
        let unit = if op == "lat" { "us one-way" } else { "MB/s" };
        println!("  bench {on} {op} {bytes} B: via {:.2} {unit}, raw {:.2} {unit} (last round); VIA/raw median of 3 rounds {:.3}", via[k].2, raw[k].2, median(&mut ratios[k]));
    }
    Ok(())
}

fn testpeer(devs: &[String], scenario: &str, extra: &[&str], expect: &str) -> Result<(), String> {
    let tp = bin("via-testpeer");
    let mut server = Child2::spawn({
        let mut c = Command::new(&tp);
        c.args(["server", scenario, "--dev", &devs[0]]).args(extra);
        c
    })?;
    let mac = server.expect("READY")?;
    let client = Child2::spawn({
        let mut c = Command::new(&tp);
        c.args(["client", scenario, "--dev", &devs[1], "--peer", &mac]).args(extra);
        c
    })?;
    let out = client.finish().map_err(|e| format!("client: {e}"))?;
    server.finish().map_err(|e| format!("server: {e}"))?;
    if !out.contains(expect) {
        return Err(format!("client output lacks {expect:?}: {out}"));
    }
    Ok(())
}

fn conform(devs: &[String], rule: &str) -> Result<(), String> {
    let c = bin("via-conform");
    let mut target = Command::new(&c);
    target.args(["target", rule, "--dev", &devs[0]]);
    via_tests::conform::run_pair(rule, target, |mac| {
        let mut i = Command::new(&c);
        i.args(["initiator", rule, "--dev", &devs[1], "--peer", mac]);
        i
    })
}

/// Every NIC's process sends to every other and checks what it receives.
fn all_to_all(devs: &[String]) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut ranks = Vec::new();
    for (r, d) in devs.iter().enumerate() {
        let mut c = Command::new(&me);
        c.args(["rank", &r.to_string(), d]);
        ranks.push(Child2::spawn(c)?);
    }
    let mut macs = Vec::new();
    for r in ranks.iter_mut() {
        macs.push(r.expect("READY")?);
    }
    let line = format!("PEERS {}", macs.join(" "));
    for r in ranks.iter_mut() {
        r.tell(&line);
    }
    let mut errors = Vec::new();
    for (k, r) in ranks.into_iter().enumerate() {
        match r.finish() {
            Ok(out) => println!("  rank {k}: {}", out.lines().last().unwrap_or_default()),
            Err(e) => errors.push(format!("rank {k}: {e}")),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

// ------------------------------------------------------------ one rank

fn fill(from: usize, to: usize, k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + from * 7 + to * 13 + k * 101 + (i >> 8)) as u8).collect()
}

fn size_of(from: usize, to: usize, k: usize) -> usize {
    (k * 977 + from * 131 + to * 17) % (A2A_MAX + 1)
}

fn rank(r: usize, dev: &str, forever: bool) -> Result<(), String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |x: via_user::ViaError| format!("rank {r}: {what}: {x}")
    };
    let nic = Nic::open(dev).map_err(e("open"))?;
    println!("READY {}", nic.mac());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).map_err(|x| x.to_string())?;
    let macs: Vec<MacAddr> = line.split_whitespace().skip(1).map(|m| m.parse().map_err(|x| format!("bad MAC {m}: {x}"))).collect::<Result<_, _>>()?;
    let n = macs.len();
    let ptag = nic.create_ptag().map_err(e("ptag"))?;
    let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: A2A_MAX as u32, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mem = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
    let per = A2A_MESSAGES + 1; // + the closing message
    let rbuf = MemoryRegion::new(&nic, n * per * A2A_MAX, 4096, mem).map_err(e("register receive memory"))?;
    let sbuf = MemoryRegion::new(&nic, n * per * A2A_MAX, 4096, mem).map_err(e("register send memory"))?;
    // Pinned by the container while the process lives (see PINNED_BALLAST).
    let _ballast = if forever { Some(MemoryRegion::new(&nic, killed::PINNED_BALLAST, 4096, mem).map_err(e("register pinned memory"))?) } else { None };
    let peers: Vec<usize> = (0..n).filter(|&j| j != r).collect();
    let mut vis: Vec<Option<Vi>> = (0..n).map(|_| None).collect();
    for &j in &peers {
        let mut vi = nic.create_vi(&attrs, None, None).map_err(e("create VI"))?;
        for k in 0..per {
            let mut d = Descriptor::new(&nic, ptag, 1).map_err(e("descriptor"))?;
            let at = (j * per + k) * A2A_MAX;
            d.set(&[(&rbuf, at..at + A2A_MAX)], None).map_err(e("descriptor"))?;
            vi.post_recv(d).map_err(e("post receive"))?;
        }
        let local = format!("a2a-{r}-{j}");
        let remote = format!("a2a-{j}-{r}");
        vi.connect_peer_request(macs[j], local.as_bytes(), remote.as_bytes(), Some(Duration::from_secs(60))).map_err(e("peer connect request"))?;
        vis[j] = Some(vi);
    }
    for &j in &peers {
        vis[j].as_mut().unwrap().connect_peer_wait().map_err(e(&format!("peer connection to rank {j}")))?;
    }
    let send = |vi: &mut Vi, j: usize, k: usize, n: usize, data: &[u8]| -> Result<(), String> {
        let at = (j * per + k) * A2A_MAX;
        sbuf.write(at, data).map_err(e("fill"))?;
        let mut d = Descriptor::new(&nic, ptag, 1).map_err(e("descriptor"))?;
        d.set(&[(&sbuf, at..at + n)], None).map_err(e("descriptor"))?;
        vi.post_send(d).map_err(e("post send"))
    };
    if forever {
        // Rank 0 and 1 ping-pong large messages until killed.
        let j = 1 - r;
        let vi = vis[j].as_mut().unwrap();
        let data = fill(r, j, 0, A2A_MAX);
        let mut round = 0usize;
        loop {
            if r == 0 || round > 0 {
                send(vi, j, 0, A2A_MAX, &data)?;
            }
            let d = vi.recv_wait(T).map_err(e("receive"))?;
            d.check_ok().map_err(e("receive"))?;
            vi.post_recv(d).map_err(e("repost"))?;
            if r == 1 && round == 0 {
                send(vi, j, 0, A2A_MAX, &data)?;
            }
            while let Some(s) = vi.send_done().map_err(e("send"))? {
                s.check_ok().map_err(e("send"))?;
            }
            round += 1;
            if round == 8 {
                println!("STREAMING");
            }
            if round.is_multiple_of(16) {
                println!("PROGRESS {round} {} {}", stat(&nic, "rx_frames"), stat(&nic, "tx_frames"));
            }
        }
    }
    for k in 0..A2A_MESSAGES {
        for &j in &peers {
            let len = size_of(r, j, k);
            send(vis[j].as_mut().unwrap(), j, k, len, &fill(r, j, k, len))?;
        }
    }
    let mut received = 0;
    for &j in &peers {
        let vi = vis[j].as_mut().unwrap();
        for k in 0..A2A_MESSAGES {
            let d = vi.recv_wait(T).map_err(e(&format!("message {k} from rank {j}")))?;
            d.check_ok().map_err(e(&format!("message {k} from rank {j}")))?;
            let want = fill(j, r, k, size_of(j, r, k));
            let at = (j * per + k) * A2A_MAX;
            let got = rbuf.to_vec(at..at + d.length() as usize).map_err(e("read"))?;
            if got != want {
                return Err(format!("rank {r}: message {k} from rank {j}: {} bytes, expected {}, or contents differ", got.len(), want.len()));
            }
            received += 1;
        }
    }
    // Everything arrived: say so to every peer and hear the same from
    // each, so no process leaves while a peer still needs its ACKs.
    for &j in &peers {
        send(vis[j].as_mut().unwrap(), j, A2A_MESSAGES, 3, b"FIN")?;
    }
    for &j in &peers {
        let d = vis[j].as_mut().unwrap().recv_wait(T).map_err(e(&format!("closing message from rank {j}")))?;
        d.check_ok().map_err(e("closing message"))?;
    }
    println!("DONE rank {r}: received {received} verified messages from {} peers", peers.len());
    Ok(())
}

/// NAS CG class S on MTTL across `n` processes, each owning one NIC
/// (ranks started as a cluster launcher would: rank and size in the
/// environment, the start-up rendezvous on the guest's loopback).
fn cg_class_s(devs: &[String], n: usize) -> Result<(), String> {
    let cg = bin("cg");
    let mut ranks = Vec::new();
    for (i, d) in devs.iter().take(n).enumerate() {
        let mut c = Command::new(&cg);
        c.args(["--class", "S"])
            .env("MTTL_RANK", i.to_string())
            .env("MTTL_SIZE", n.to_string())
            .env("MTTL_ROOT", "127.0.0.1:47001")
            .env("MTTL_TRANSPORT", "via")
            .env("MTTL_VIA_DEVICE", d)
            .env("MTTL_HEAP_MB", "4");
        ranks.push(Child2::spawn(c)?);
    }
    let mut outs = Vec::new();
    for (i, r) in ranks.into_iter().enumerate() {
        outs.push(r.finish().map_err(|e| format!("rank {i}: {e}"))?);
    }
    let out0 = &outs[0];
    if !out0.contains("VERIFICATION SUCCESSFUL") {
        return Err(format!("rank 0 did not verify:\n{out0}"));
    }
    for l in out0.lines().filter(|l| l.contains("Zeta is") || l.contains("Time in seconds") || l.contains("Mop/s total")) {
        println!("  {}", l.trim());
    }
    Ok(())
}

// ------------------------------------------------------------ the suite

/// The check that always runs first: as many NICs of each kind are bound
/// to vfio-pci as qemu/run.sh gave the guest (`via_nics=N` and
/// `via_kinds=...` on the kernel command line, [`Given`] here).
const NIC_COUNT_CHECK: &str = "nics_bound_match_the_nics_given";

/// The NICs qemu/run.sh gave the guest: how many, and how many of each kind.
#[derive(Clone, Debug)]
struct Given {
    total: usize,
    kinds: KindCounts,
}

impl Given {
    /// From a number (that many tulips) or kinds and counts
    /// (`tulip:1,e1000e:1`); at least 2 NICs in all.
    fn parse(spec: &str) -> Result<Given, String> {
        let kinds = parse_kinds(spec)?;
        let total = kinds.iter().map(|&(_, n)| n).sum();
        if total < 2 {
            return Err(format!("{spec:?}: {total} NICs; the suite needs at least 2"));
        }
        Ok(Given { total, kinds })
    }
}

/// One planned check: its name, how many bound NICs it needs and what it
/// runs on them. A check whose NICs are missing fails; nothing is skipped.
struct Check {
    name: String,
    nics: usize,
    run: Box<CheckFn>,
}

/// What a check runs, on the NICs bound to vfio-pci (VIA device names in
/// PCI address order).
type CheckFn = dyn Fn(&[String]) -> Result<(), String>;

fn check(name: &str, nics: usize, run: impl Fn(&[String]) -> Result<(), String> + 'static) -> Check {
    Check { name: name.to_string(), nics, run: Box::new(run) }
}

/// Every check of the suite for a guest given `nics` NICs (bench_*
/// included), in the order they run. The checks over every NIC need all
/// `nics`; with 4 given, the 4-rank CG check is among them. Every check
/// runs on every kind: the ones that look at a NIC's own registers
/// (`killed.rs`) read each kind's.
fn all_checks(given: &Given) -> Vec<Check> {
    let nics = given.total;
    let sizes = "0,1,1435,1436,1437,1499,1500,1501,2879,65536,1048576";
    let mut checks = vec![
        check("open_every_nic", nics, open_every_nic),
        check("registration_maps_memory_for_the_nic", 2, registration_maps_memory),
        check("memlock_too_low_names_the_limit", 2, memlock::memlock_too_low_names_the_limit),
        check("via_agent_unbinds_and_binds", 2, via_agent_unbinds_and_binds),
        check("sleeping_waits_wake_on_interrupts", 2, sleeping_waits_wake_on_interrupts),
        check("a_poll_asks_the_ring_if_a_frame_is_there", 2, pending::a_poll_asks_the_ring_if_a_frame_is_there),
        check("the_frame_checksum_takes_the_faster_way_here", 0, checksum::the_frame_checksum_takes_the_faster_way_here),
        check("pingpong_send_receive_reliable", 2, |d| pingpong(d, &[])),
        check("pingpong_send_receive_unreliable", 2, |d| pingpong(d, &["--reliability", "unreliable"])),
        check("pingpong_rdma_write", 2, |d| pingpong(d, &["--rdma", "write"])),
        check("pingpong_rdma_read", 2, |d| pingpong(d, &["--rdma", "read"])),
        check("testpeer_sizes_reliable", 2, move |d| testpeer(d, "sizes", &["--level", "rel", "--sizes", sizes], "OK")),
        check("testpeer_sizes_unreliable", 2, move |d| testpeer(d, "sizes", &["--level", "unrel", "--sizes", sizes], "OK")),
        check("testpeer_cq", 2, |d| testpeer(d, "cq", &["--level", "rel"], "OK")),
        check("testpeer_reject", 2, |d| testpeer(d, "reject", &[], "REJECTED")),
        check("testpeer_nomatch", 2, |d| testpeer(d, "nomatch", &[], "CONNECTED")),
        check("testpeer_length", 2, |d| testpeer(d, "length", &["--level", "rel"], "OK")),
    ];
    for rule in via_tests::conform::rules() {
        let rule_name = rule.name;
        checks.push(check(&format!("conform_{rule_name}"), 2, move |d| conform(d, rule_name)));
    }
    checks.push(check(&format!("all_to_all_{nics}_nics"), nics, all_to_all));
    checks.push(check("killed_processes_leave_clean_nics", 2, killed::killed_processes_leave_clean_nics));
    checks.push(check("cg_class_s_2_ranks", 2, |d| cg_class_s(d, 2)));
    if nics >= 4 {
        checks.push(check("cg_class_s_4_ranks", 4, |d| cg_class_s(d, 4)));
    }
    if given.kinds.iter().any(|&(k, n)| k == "e1000e" && n >= 2) {
        checks.push(check("jumbo_frames_on_two_e1000e", 2, jumbo_frames_on_two_e1000e));
    }
    checks.push(check("bench_via_against_raw_frames", 2, bench_via_against_raw));
    checks
}

/// The checks to run for `nics` NICs and the filter `only` (a part of a
/// check's name; none: every check but the figures, bench_*). A filter
/// that matches no check is an error naming the known checks.
fn plan(given: &Given, only: Option<&str>) -> Result<Vec<Check>, String> {
    let nics = given.total;
    let all = all_checks(given);
    let known: Vec<String> = all.iter().map(|c| c.name.clone()).collect();
    let planned: Vec<Check> = all
        .into_iter()
        .filter(|c| match only {
            Some(o) => c.name.contains(o),
            // The raw baseline has no loss recovery, so a rare lost frame
            // in the emulated hub stalls it; figures run only when asked for.
            None => !c.name.starts_with("bench_"),
        })
        .collect();
    if planned.is_empty() {
        return Err(format!("no check matches {:?} (--only); the checks for {nics} NICs are: {}", only.unwrap_or_default(), known.join(" ")));
    }
    Ok(planned)
}

/// The NICs qemu/run.sh gave the guest: `VIA_GUEST_NICS` (how many) and
/// `VIA_GUEST_KINDS` (how many of each kind; unset: all are tulips), which
/// must add up.
fn nics_given() -> Result<Given, String> {
    let v = std::env::var("VIA_GUEST_NICS").map_err(|_| "VIA_GUEST_NICS is not set (qemu/run.sh passes via_nics=N on the kernel command line; qemu/init exports it)".to_string())?;
    let total: usize = v.parse().map_err(|_| format!("VIA_GUEST_NICS={v:?}: expected a number of NICs, at least 2"))?;
    let given = match std::env::var("VIA_GUEST_KINDS") {
        Ok(k) if !k.is_empty() => Given::parse(&k).map_err(|e| format!("VIA_GUEST_KINDS: {e}"))?,
        _ => Given::parse(&v).map_err(|e| format!("VIA_GUEST_NICS: {e}"))?,
    };
    if given.total != total {
        return Err(format!("VIA_GUEST_NICS={total} but VIA_GUEST_KINDS gives {} NICs ({})", given.total, show_kinds(&given.kinds)));
    }
    Ok(given)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("rank") {
        let r = args.get(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: via-guest-suite rank R DEV [--forever]");
            exit(2)
        });
        let dev = args.get(2).cloned().unwrap_or_default();
        if let Err(e) = rank(r, &dev, args.iter().any(|a| a == "--forever")) {
            eprintln!("{e}");
            exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("memlock") {
        let dev = args.get(1).cloned().unwrap_or_default();
        if let Err(e) = memlock::child(&dev) {
            eprintln!("{e}");
            exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("plan") {
        // `via-guest-suite plan NICS [ONLY]`: the checks a guest given NICS
        // (N tulips, or `tulip:1,e1000e:1`) runs (qemu/run.sh asks before
        // booting).
        let given = match args.get(1).map(|s| Given::parse(s)) {
            Some(Ok(g)) => g,
            Some(Err(e)) => {
                eprintln!("via-guest-suite plan: {e}");
                exit(2)
            }
            None => {
                eprintln!("usage: via-guest-suite plan NICS [ONLY] (NICS: a number of tulips, at least 2, or KIND:COUNT,... such as tulip:1,e1000e:1)");
                exit(2)
            }
        };
        match plan(&given, args.get(2).map(String::as_str).filter(|o| !o.is_empty())) {
            Ok(checks) => {
                for c in checks {
                    println!("{}", c.name);
                }
                return;
            }
            Err(e) => {
                eprintln!("via-guest-suite: {e}");
                exit(1);
            }
        }
    }
    // An empty VIA_GUEST_ONLY (qemu/run.sh without --only) means no filter.
    let only = std::env::var("VIA_GUEST_ONLY").ok().filter(|o| !o.is_empty());
    let given = nics_given();
    let checks = match &given {
        Ok(g) => plan(g, only.as_deref()),
        Err(e) => Err(e.clone()),
    };
    let checks = checks.unwrap_or_else(|e| {
        // Nothing can be planned: the suite fails before it starts.
        println!("guest: suite started: 0 checks planned");
        println!("FAIL plan: {e}");
        println!("guest: 0 passed, 1 failed, 0 planned");
        exit(1)
    });
    let given = given.expect("planned above");
    let planned = checks.len() + 1; // + NIC_COUNT_CHECK
    // qemu/run.sh's watchdog reads this line: from here on a silent guest
    // is a hang of the suite, never rebooted.
    println!("guest: suite started: {planned} checks planned for {} NICs ({})", given.total, show_kinds(&given.kinds));
    let devs = bound_nics();
    let bound = count_kinds(&devs);
    let present: Vec<String> = pci::list().unwrap_or_default().into_iter().filter_map(|d| d.via_name()).collect();
    // qemu/run.sh reads this line: the count bound, and by kind.
    println!(
        "guest: {} NICs bound to vfio-pci ({}), {} given ({}), {} with a VIA driver present ({}): {devs:?}",
        devs.len(),
        show_kinds(&bound),
        given.total,
        show_kinds(&given.kinds),
        present.len(),
        show_kinds(&count_kinds(&present))
    );
    let (mut passed, mut failed) = (0, 0);
    let mut record = |name: &str, r: Result<(), String>| match r {
        Ok(()) => {
            passed += 1;
            stuck::PASSED.store(passed, std::sync::atomic::Ordering::SeqCst);
            println!("PASS {name}");
        }
        Err(e) => {
            failed += 1;
            stuck::FAILED.store(failed, std::sync::atomic::Ordering::SeqCst);
            println!("FAIL {name}: {e}");
        }
    };
    stuck::watch(planned);
    record(
        NIC_COUNT_CHECK,
        if bound == given.kinds {
            Ok(())
        } else {
            Err(format!("NICs given: {}; bound to vfio-pci: {} ({} with a VIA driver present: {present:?})", show_kinds(&given.kinds), show_kinds(&bound), present.len()))
        },
    );
    for c in &checks {
        if devs.len() < c.nics {
            record(&c.name, Err(format!("needs {} NICs bound to vfio-pci, {} are", c.nics, devs.len())));
            continue;
        }
        let t0 = Instant::now();
        stuck::running(Some(&c.name));
        let r = (c.run)(&devs);
        stuck::running(None);
        println!("  ({}: {:.1} s)", c.name, t0.elapsed().as_secs_f64());
        record(&c.name, r);
    }
    println!("guest: {passed} passed, {failed} failed, {planned} planned");
    exit(if failed == 0 && passed == planned { 0 } else { 1 });
}
