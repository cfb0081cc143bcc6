//! `via-pingpong --demo`: two test hosts on this machine (network
//! namespaces joined by a veth pair), a server and a client for each
//! transport, the tables, the ratios against the baselines and each side's
//! peak memory. Everything it creates is removed on every exit path: a
//! guard on normal return, error and panic, and a signal thread for Ctrl-C
//! and SIGTERM. Without root it runs VIA alone over the in-process loopback.

use crate::common::{json_array, parse_json_array, print_tables, Options, Row};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// What must be undone if a signal arrives: child pids and namespaces.
static CREATED: Mutex<(Vec<u32>, Vec<String>)> = Mutex::new((Vec::new(), Vec::new()));

fn created() -> std::sync::MutexGuard<'static, (Vec<u32>, Vec<String>)> {
    CREATED.lock().unwrap_or_else(|p| p.into_inner())
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn cleanup() {
    let mut c = created();
    for pid in c.0.drain(..) {
        // SAFETY: kill(2) on a pid we spawned.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    for ns in c.1.drain(..) {
        let _ = ip(&["netns", "del", &ns]);
    }
}

/// Removes the test hosts when dropped.
struct Hosts {
    a: String,
    b: String,
    va: String,
    vb: String,
    ip_a: String,
}

impl Hosts {
    fn create(mtu: usize) -> Result<Hosts, String> {
        let pid = std::process::id();
        let h = Hosts {
            a: format!("via-pp-a-{pid}"),
            b: format!("via-pp-b-{pid}"),
            va: format!("vppa{}", pid % 10_000_000),
            vb: format!("vppb{}", pid % 10_000_000),
            ip_a: format!("10.88.{}.1", pid % 250),
        };
        let ip_b = format!("10.88.{}.2", pid % 250);
        created().1.extend([h.a.clone(), h.b.clone()]);
        ip(&["netns", "add", &h.a])?;
        ip(&["netns", "add", &h.b])?;
        let m = mtu.to_string();
        ip(&["link", "add", &h.va, "mtu", &m, "type", "veth", "peer", "name", &h.vb, "mtu", &m])?;
        ip(&["link", "set", &h.va, "netns", &h.a])?;
        ip(&["link", "set", &h.vb, "netns", &h.b])?;
        for (ns, dev, addr) in [(&h.a, &h.va, &h.ip_a), (&h.b, &h.vb, &ip_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        cleanup();
    }
}

/// Blocks SIGINT/SIGTERM here and handles them on a thread of their own:
/// clean up, then exit 130.
fn install_signal_thread() {
    // SAFETY: plain signal-mask calls on a local sigset; the spawned thread
    // only calls sigwait on the same set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            eprintln!("via-pingpong: signal {sig}: removing the test hosts");
            cleanup();
            std::process::exit(130);
        });
    }
}

/// The arguments both sides share.
fn common_args(o: &Options) -> Vec<String> {
    let list = |v: &[usize]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
    let mut a = vec!["--sizes".into(), list(&o.sizes), "--bw-sizes".into(), list(&o.bw_sizes)];
    if o.quick {
        a.push("--quick".into());
    }
    a
}

/// Runs one transport: server on host a, client on host b. Returns the
/// client's rows and both sides' peak RSS in KiB.
fn run_pair(o: &Options, h: &Hosts, transport: &str) -> Result<(Vec<Row>, u64, u64), String> {
    run_pair_with(h, transport, common_args(o))
}

/// [`run_pair`] with explicit size arguments for both sides.
fn run_pair_with(h: &Hosts, transport: &str, extra: Vec<String>) -> Result<(Vec<Row>, u64, u64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let exe = exe.to_string_lossy().to_string();
    let (t, rel, rdma) = match transport {
        "via-unrel" => ("via", "unreliable", None),
        "via-write" => ("via", "reliable", Some("write")),
        "via-read" => ("via", "reliable", Some("read")),
        t => (t, "reliable", None),
    };
    let mut extra = extra;
    if let Some(m) = rdma {
        extra.extend(["--rdma".to_string(), m.to_string()]);
    }
    let mut sargs: Vec<String> = vec!["netns".into(), "exec".into(), h.a.clone(), exe.clone(), "server".into()];
    sargs.extend(["--transport", t, "--reliability", rel, "--device", &format!("/dev/via_{}", h.va), "--bind-ip", &h.ip_a].map(String::from));
    sargs.extend(extra.iter().cloned());
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if pinned {
        sargs.extend(["--cpu".to_string(), "0".to_string()]);
    }
    let mut server = Command::new("ip").args(&sargs).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    created().0.push(server.id());
    let mut sout = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    sout.read_line(&mut line).map_err(|e| e.to_string())?;
    let Some(addr) = line.trim().strip_prefix("READY ") else {
        let _ = server.kill();
        let mut err = String::new();
        let _ = server.stderr.take().unwrap().read_to_string(&mut err);
        return Err(format!("{transport} server did not start: {}", err.trim()));
    };
    let peer = if t == "udp" || t == "tcp" { h.ip_a.clone() } else { addr.to_string() };
    let mut cargs: Vec<String> = vec!["netns".into(), "exec".into(), h.b.clone(), exe, "client".into()];
    cargs.extend(["--transport", t, "--reliability", rel, "--device", &format!("/dev/via_{}", h.vb), "--peer", &peer, "--json"].map(String::from));
    cargs.extend(extra);
    if pinned {
        cargs.extend(["--cpu".to_string(), "1".to_string()]);
    }
    let client = Command::new("ip").args(&cargs).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    created().0.push(client.id());
    let out = client.wait_with_output().map_err(|e| e.to_string())?;
    let sres = server.wait();
    let mut serr = String::new();
    let _ = server.stderr.take().unwrap().read_to_string(&mut serr);
    created().0.retain(|p| *p != server.id());
    let cerr = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        let _ = server.kill();
        return Err(format!("{transport} client failed: {}\n{}", cerr.trim(), serr.trim()));
    }
    if !sres.map(|s| s.success()).unwrap_or(false) {
        return Err(format!("{transport} server failed: {}", serr.trim()));
    }
    let rss = |s: &str| s.lines().find_map(|l| l.strip_prefix("peak_rss_kib=")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    Ok((parse_json_array(&String::from_utf8_lossy(&out.stdout)), rss(&serr), rss(&cerr)))
}

fn find<'a>(rows: &'a [Row], t: &str, op: &str, bytes: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.transport == t && r.op == op && r.bytes == bytes)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The headline figures measured again in alternating rounds (raw, via,
/// udp, tcp, raw, via, ...), so that drift of this noisy machine hits every
/// transport alike: latency at 64 B and bandwidth at 1 MiB. Returns one
/// row per transport and op holding the median over the rounds.
fn alternating_rounds(o: &Options, h: &Hosts) -> Vec<Row> {
    let mut lat: Vec<(String, Vec<f64>)> = Vec::new();
    let mut bw: Vec<(String, Vec<f64>)> = Vec::new();
    let wanted: Vec<&String> = o.transports.iter().filter(|t| *t != "via-unrel").collect();
    for round in 0..o.rounds {
        for t in &wanted {
            let mut args: Vec<String> = vec!["--sizes".into(), "64".into(), "--bw-sizes".into()];
            args.push(if ["raw", "via", "via-write", "via-read"].contains(&t.as_str()) { (1 << 20).to_string() } else { String::new() });
            match run_pair_with(h, t, args) {
                Ok((rows, _, _)) => {
                    for r in rows {
                        let (list, v) = if r.op == "lat" { (&mut lat, r.t_typical_us) } else { (&mut bw, r.mb_per_s) };
                        match list.iter_mut().find(|(n, _)| n == *t) {
                            Some((_, xs)) => xs.push(v),
                            None => list.push((t.to_string(), vec![v])),
                        }
                    }
                }
                Err(e) => eprintln!("via-pingpong --demo: round {round} {t}: {e}"),
            }
        }
    }
    let mut out = Vec::new();
    for (t, xs) in lat {
        eprintln!("via-pingpong --demo: {t:<4} 64 B latency per round (us): {}", xs.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" "));
        let mut r = Row::latency(&t, 64, vec![median(xs).unwrap_or(0.0)]);
        r.iters = o.rounds;
        out.push(r);
    }
    for (t, xs) in bw {
        eprintln!("via-pingpong --demo: {t:<4} 1 MiB bandwidth per round (MB/s): {}", xs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(" "));
        let mut r = Row::bandwidth(&t, 1 << 20, 1, Duration::from_secs(1));
        r.mb_per_s = median(xs).unwrap_or(0.0);
        r.iters = o.rounds;
        out.push(r);
    }
    out
}

/// Prints the ratios the targets are stated in, from the medians of the
/// alternating rounds (or, without rounds, from the sweep).
fn print_ratios(rows: &[Row]) {
    println!("\n=== VIA against the baselines (same run; medians of alternating rounds) ===");
    if !rows.iter().any(|r| !r.transport.starts_with("via")) {
        println!("(no baselines in this run: they need root)");
        return;
    }
    let lat = |t| find(rows, t, "lat", 64).map(|r| r.t_typical_us);
    if let Some(v) = lat("via") {
        for (b, target, ok) in [("raw", "<= 1.15", 1.15), ("udp", "< 1", 1.0), ("tcp", "< 1", 1.0)] {
            if let Some(x) = lat(b) {
                let r = v / x;
                let pass = if b == "raw" { r <= ok } else { r < ok };
                println!("latency 64 B    VIA/{b:<4} = {v:.2} / {x:.2} us = {r:.3}   (target {target}) {}", if pass { "PASS" } else { "MISS" });
            }
        }
    }
    if let (Some(w), Some(v)) = (lat("via-write"), lat("via")) {
        let r = w / v;
        println!("latency 64 B    RDMA write/send = {w:.2} / {v:.2} us = {r:.3}   (target <= 1) {}", if r <= 1.0 { "PASS" } else { "MISS" });
    }
    if let Some(x) = lat("via-read") {
        println!("latency 64 B    RDMA read (whole read, a round trip) = {x:.2} us");
    }
    let bw = |t| find(rows, t, "bw", 1 << 20).map(|r| r.mb_per_s);
    for t in ["via-write", "via-read"] {
        if let (Some(v), Some(x)) = (bw(t), bw("raw")) {
            println!("bandwidth 1 MiB {t}/raw = {v:.1} / {x:.1} MB/s = {:.3}", v / x);
        }
    }
    if let (Some(v), Some(x)) = (bw("via"), bw("raw")) {
        let r = v / x;
        println!("bandwidth 1 MiB VIA/raw  = {v:.1} / {x:.1} MB/s = {r:.3}   (target >= 0.9) {}", if r >= 0.9 { "PASS" } else { "MISS" });
    }
    for b in ["udp", "tcp"] {
        if let (Some(v), Some(x)) = (bw("via"), bw(b)) {
            println!("bandwidth 1 MiB VIA/{b:<4} = {v:.1} / {x:.1} MB/s = {:.3}", v / x);
        }
    }
}

/// Runs the demo; returns the process exit code.
pub fn run(o: &Options) -> i32 {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return run_loopback(o);
    }
    install_signal_thread();
    let h = match Hosts::create(o.mtu) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("via-pingpong --demo: cannot create the test hosts: {e}");
            cleanup();
            return 1;
        }
    };
    eprintln!("via-pingpong --demo: hosts {} ({}) and {} ({}), veth MTU {}", h.a, h.va, h.b, h.vb, o.mtu);
    let mut rows = Vec::new();
    let mut rss = Vec::new();
    let mut failed = false;
    for t in &o.transports {
        eprintln!("via-pingpong --demo: running {t} ...");
        match run_pair(o, &h, t) {
            Ok((r, s, c)) => {
                rows.extend(r);
                rss.push((t.clone(), s, c));
            }
            Err(e) => {
                eprintln!("via-pingpong --demo: {e}");
                failed = true;
            }
        }
    }
    let headline = if o.rounds > 0 { alternating_rounds(o, &h) } else { rows.clone() };
    drop(h);
    report(o, &rows, &headline);
    if !o.json {
        println!("\n=== peak resident memory (KiB) ===");
        for (t, s, c) in &rss {
            println!("{t:<10} server {s:>8}   client {c:>8}");
        }
    }
    i32::from(failed)
}

fn report(o: &Options, rows: &[Row], headline: &[Row]) {
    if o.json {
        println!("{}", json_array(rows));
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for r in rows {
            if !seen.contains(&r.transport.as_str()) {
                seen.push(&r.transport);
                print_tables(&r.transport, rows);
            }
        }
        print_ratios(headline);
    }
    if let Some(dir) = &o.plot {
        match crate::plot::write(std::path::Path::new(dir), rows) {
            Ok(()) => eprintln!("via-pingpong: plots written to {dir}/latency.svg and {dir}/bandwidth.svg"),
            Err(e) => eprintln!("via-pingpong: cannot write plots to {dir}: {e}"),
        }
    }
}

/// Without root: VIA only, server and client as two threads of this
/// process over the in-process loopback device.
fn run_loopback(o: &Options) -> i32 {
    eprintln!("via-pingpong --demo: not root, so no network namespaces or AF_PACKET: running VIA over the in-process loopback device (/dev/via_lo) only; the baselines need root");
    let mut so = o.clone();
    so.device = "/dev/via_lo".into();
    let (tx, rx) = std::sync::mpsc::channel();
    let server_opts = so.clone();
    let server = std::thread::spawn(move || crate::via::server(&server_opts, |mac| tx.send(mac).unwrap()));
    let Ok(mac) = rx.recv() else {
        eprintln!("via-pingpong: loopback server failed: {:?}", server.join());
        return 1;
    };
    so.peer = mac;
    match crate::via::client(&so) {
        Ok(rows) => {
            let _ = server.join();
            report(o, &rows, &rows);
            0
        }
        Err(e) => {
            eprintln!("via-pingpong: {e}");
            1
        }
    }
}
