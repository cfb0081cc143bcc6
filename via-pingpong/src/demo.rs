//! `via-pingpong --demo`: two test hosts on this machine (network
//! namespaces joined by a veth pair), a server and a client for each
//! transport, the tables, the ratios against the baselines and each side's
//! peak memory. Everything it creates is removed on every exit path: a
//! guard on normal return, error and panic, and a signal thread for Ctrl-C
//! and SIGTERM. Without root it runs VIA alone over the in-process loopback.

use std::os::unix::fs::DirBuilderExt;
use crate::common::{json_array, parse_json_array, print_tables, Options, Row};
use crate::cleanup::{created, track, untrack};
use crate::probe::Probe;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;
use via_kernel_agent::netns::ip;

/// The shared-memory wire of the via-shm transport: random past the pid,
/// so that no other user can guess it and make its segment first (were
/// there no randomness, a segment made first is still refused, not used).
fn shm_wire() -> String {
    static WIRE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let suffix = || {
        via_softnic::shm::unguessable_suffix().unwrap_or_else(|e| {
            eprintln!("via-pingpong: no random wire name ({e}): using a guessable one");
            "0".into()
        })
    };
    WIRE.get_or_init(|| format!("pingpong{}-{}", std::process::id(), suffix())).clone()
}

/// The cluster secret of the via-auth transport: made once per demo, 0600
/// in a private directory, removed by [`cleanup`].
fn demo_secret() -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("via-demo-secret-{}", std::process::id()));
    let path = dir.join("secret");
    if !path.exists() {
        std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        via_kernel_agent::auth::create_secret_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(path)
}

fn cleanup() {
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("via-demo-secret-{}", std::process::id())));
    via_softnic::shm::remove_wire(&shm_wire());
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
    mtu: usize,
}

impl Hosts {
    /// Two hosts on one veth pair; with a `loss` (frames in a thousand),
    /// each on a veth pair of its own to a bridge in a third namespace (a
    /// switch) that drops that many ([`drop_frames`]).
    fn create(mtu: usize, loss: u32) -> Result<Hosts, String> {
        let pid = std::process::id();
        let tag = pid % 10_000_000;
        let h = Hosts {
            a: format!("via-pp-a-{pid}"),
            b: format!("via-pp-b-{pid}"),
            va: format!("vppa{tag}"),
            vb: format!("vppb{tag}"),
            ip_a: format!("10.88.{}.1", pid % 250),
            mtu,
        };
        let ip_b = format!("10.88.{}.2", pid % 250);
        created().1.extend([h.a.clone(), h.b.clone()]);
        ip(&["netns", "add", &h.a])?;
        ip(&["netns", "add", &h.b])?;
        let m = mtu.to_string();
        // Each end is made inside its namespace: a signal between making
        // the pair and moving its ends would otherwise leave it in ours
        // (deleting a namespace removes only what is inside it).
        if loss > 0 {
            let s = format!("via-pp-s-{pid}");
            let ports = [format!("vpsa{tag}"), format!("vpsb{tag}")];
            created().1.push(s.clone());
            ip(&["netns", "add", &s])?;
            ip(&["-n", &s, "link", "add", "vppbr", "mtu", &m, "type", "bridge"])?;
            for (ns, dev, port) in [(&h.a, &h.va, &ports[0]), (&h.b, &h.vb, &ports[1])] {
                ip(&["link", "add", dev, "netns", ns, "mtu", &m, "type", "veth", "peer", "name", port, "netns", &s, "mtu", &m])?;
                ip(&["-n", &s, "link", "set", port, "master", "vppbr"])?;
                ip(&["-n", &s, "link", "set", port, "up"])?;
            }
            ip(&["-n", &s, "link", "set", "vppbr", "up"])?;
            drop_frames(&s, &ports, loss)?;
        } else {
            ip(&["link", "add", &h.va, "netns", &h.a, "mtu", &m, "type", "veth", "peer", "name", &h.vb, "netns", &h.b, "mtu", &m])?;
        }
        for (ns, dev, addr) in [(&h.a, &h.va, &h.ip_a), (&h.b, &h.vb, &ip_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }
}

/// Makes the kernel of switch `ns` drop `per_mille` frames in a thousand
/// arriving on either of its `ports`, whatever they carry: an nftables
/// netdev ingress rule (this kernel has no netem), so VIA, TCP and UDP meet
/// the same loss. Not on the hosts' own interfaces: a packet socket bound
/// to every EtherType (VIA in UDP) is handed each frame before the ingress
/// hook runs, so a rule there dropped TCP's frames and none of VIA's (the
/// demo's loss figures from 7fd9626 until be9d3b0).
fn drop_frames(ns: &str, ports: &[String; 2], per_mille: u32) -> Result<(), String> {
    let n = per_mille.to_string();
    via_kernel_agent::netns::nft(Some(ns), &["add", "table", "netdev", "via_loss"], "")?;
    for (i, dev) in ports.iter().enumerate() {
        let chain = format!("in{i}");
        let hook = format!("{{ type filter hook ingress device {dev} priority 0; }}");
        for args in [vec!["add", "chain", "netdev", "via_loss", &chain, &hook], vec!["add", "rule", "netdev", "via_loss", &chain, "numgen", "random", "mod", "1000", "<", &n, "drop"]] {
            via_kernel_agent::netns::nft(Some(ns), &args, "")?;
        }
    }
    eprintln!("via-pingpong --demo: the hosts meet through a switch ({ns}) whose kernel drops {per_mille} in 1000 frames arriving on either port");
    Ok(())
}

impl Hosts {
    /// With `on`, both hosts keep the kernel's IP stack off VIA's UDP port
    /// (`via_kernel_agent::udp_port`): their packet sockets take the
    /// datagrams, and the kernel need not route each to a UDP socket that
    /// drops it. Says which; without nft the demo goes on without it.
    fn port_rule(&self, on: bool) {
        let port = via_softnic::VIA_UDP_PORT;
        if !on {
            eprintln!("via-pingpong --demo: via-udp without the port rule (--no-port-rule): both kernels process every VIA datagram too");
            return;
        }
        match [&self.a, &self.b].into_iter().try_for_each(|ns| via_kernel_agent::udp_port::install(Some(ns), port)) {
            Ok(()) => eprintln!("via-pingpong --demo: both hosts keep their IP stack off VIA's UDP port {port} (the rule of via-agent udp-port)"),
            Err(e) => eprintln!("via-pingpong --demo: note: {e}; via-udp runs with both kernels processing every VIA datagram too"),
        }
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
    // via-shm: both ends on composite devices joined by one shared-memory
    // wire (the two test hosts are processes of one machine).
    // via-shm-lent: the same with payloads of 16 KiB and more lent
    // (copied once, from the sender's memory) instead of framed.
    // via?<faults>: VIA (reliable delivery) over devices that inject
    // faults (loss=P,dup=P,reorder=P,corrupt=P: a FaultyDevice), for
    // goodput against the clean link.
    let (transport_name, transport) = (transport, transport.split_once('?').map_or(transport, |(t, _)| t));
    let shm = match (transport, transport_name.split_once('?')) {
        ("via", Some((_, faults))) => format!("?{faults}"),
        ("via-shm", _) => format!("+shm:{}", shm_wire()),
        ("via-shm-lent", _) => format!("+shm:{},lend=16384", shm_wire()),
        _ => String::new(),
    };
    // via-udp: VIA in UDP/IPv4 datagrams (device udp:<ifname>), the
    // routable encapsulation, on the same link.
    let dev = |ifname: &str| if transport == "via-udp" { format!("udp:{ifname}{shm}") } else { format!("/dev/via_{ifname}{shm}") };
    let (t, rel, rdma) = match transport {
        "via-unrel" => ("via", "unreliable", None),
        // via-auth: reliable delivery with a cluster secret on both ends
        // (every frame carries a MAC in place of the CRC).
        "via-shm" | "via-shm-lent" | "via-auth" | "via-udp" => ("via", "reliable", None),
        "via-write" => ("via", "reliable", Some("write")),
        "via-read" => ("via", "reliable", Some("read")),
        "via-atomic" => ("via", "reliable", Some("atomic")),
        t => (t, "reliable", None),
    };
    let mut extra = extra;
    extra.extend(["--mtu".to_string(), h.mtu.to_string()]);
    if let Some(m) = rdma {
        extra.extend(["--rdma".to_string(), m.to_string()]);
    }
    let mut sargs: Vec<String> = vec!["netns".into(), "exec".into(), h.a.clone(), exe.clone(), "server".into()];
    sargs.extend(["--transport", t, "--reliability", rel, "--device", &dev(&h.va), "--bind-ip", &h.ip_a].map(String::from));
    sargs.extend(extra.iter().cloned());
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if pinned {
        sargs.extend(["--cpu".to_string(), "0".to_string()]);
    }
    let secret = if transport == "via-auth" { Some(demo_secret()?) } else { None };
    let keyed = |mut c: Command| {
        match &secret {
            Some(s) => c.env("VIA_SECRET", s),
            None => c.env_remove("VIA_SECRET"),
        };
        c
    };
    let mut server = keyed(Command::new("ip")).args(&sargs).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    track(server.id());
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
    cargs.extend(["--transport", t, "--reliability", rel, "--device", &dev(&h.vb), "--peer", &peer, "--json"].map(String::from));
    cargs.extend(extra);
    if pinned {
        cargs.extend(["--cpu".to_string(), "1".to_string()]);
    }
    let client = keyed(Command::new("ip")).args(&cargs).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
    track(client.id());
    let out = client.wait_with_output().map_err(|e| e.to_string())?;
    let sres = server.wait();
    let mut serr = String::new();
    let _ = server.stderr.take().unwrap().read_to_string(&mut serr);
    untrack(server.id());
    let cerr = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        let _ = server.kill();
        return Err(format!("{transport} client failed: {}\n{}", cerr.trim(), serr.trim()));
    }
    if !sres.map(|s| s.success()).unwrap_or(false) {
        return Err(format!("{transport} server failed: {}", serr.trim()));
    }
    let rss = |s: &str| s.lines().find_map(|l| l.strip_prefix("peak_rss_kib=")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let mut rows = parse_json_array(&String::from_utf8_lossy(&out.stdout));
    if transport_name != transport {
        rows.iter_mut().for_each(|r| r.transport = transport_name.to_string());
    }
    Ok((rows, rss(&serr), rss(&cerr)))
}

fn find<'a>(rows: &'a [Row], t: &str, op: &str, bytes: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.transport == t && r.op == op && r.bytes == bytes)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Per-round headline figures: (transport, op) -> one value per round
/// (None where that round's run failed).
#[derive(Default)]
pub struct Rounds {
    values: Vec<(Headline, Vec<Option<f64>>)>,
}

/// A headline figure's transport and what it measures.
type Headline = (String, &'static str);

impl Rounds {
    fn push(&mut self, t: &str, op: &'static str, round: usize, v: f64) {
        let i = match self.values.iter().position(|(k, _)| k.0 == t && k.1 == op) {
            Some(i) => i,
            None => {
                self.values.push(((t.to_string(), op), Vec::new()));
                self.values.len() - 1
            }
        };
        let list = &mut self.values[i].1;
        list.resize(list.len().max(round + 1), None);
        list[round] = Some(v);
    }

    fn get(&self, t: &str, op: &str) -> Option<&Vec<Option<f64>>> {
        self.values.iter().find(|(k, _)| k.0 == t && k.1 == op).map(|(_, v)| v)
    }

    /// The median over rounds of `a / b`, each round's pair measured
    /// minutes apart at most, so that drift cancels.
    fn paired_ratio(&self, a: &str, b: &str, op: &str) -> Option<f64> {
        let (xa, xb) = (self.get(a, op)?, self.get(b, op)?);
        median(xa.iter().zip(xb).filter_map(|(x, y)| Some(x.as_ref()? / y.as_ref()?)).collect())
    }
}

/// What the rounds record of a run's rows: (op, bytes, key in [`Rounds`],
/// what it is). The last three are the large messages of via-udp and tcp.
const ROUND_FIGURES: [(&str, usize, &str, &str); 5] = [
    ("lat", 64, "lat", "64 B latency"),
    ("bw", 1 << 20, "bw", "1 MiB bandwidth"),
    ("lat", 65536, "lat-64k", "64 KiB latency"),
    ("lat", 1 << 20, "lat-1m", "1 MiB latency"),
    ("bw", 65536, "bw-64k", "64 KiB bandwidth"),
];

/// The C probe's transports (`c-tcp`, `c-udp`): run in the rounds beside
/// the demo's own tcp and udp. None under `--kernel-loss`: the probe
/// checks the baselines on a clean link, and under loss TCP's own
/// retransmission timeouts (200 ms at least) decide its figure; at 5 %
/// its 64 B ping-pong alone ran for over ten minutes.
fn probe_transports(o: &Options) -> Vec<String> {
    if o.kernel_loss > 0 {
        return Vec::new();
    }
    ["tcp", "udp"].iter().filter(|t| o.transports.iter().any(|x| x == *t)).map(|t| format!("c-{t}")).collect()
}

/// One run of the C probe at 64 B between the test hosts.
fn run_probe(o: &Options, h: &Hosts, probe: &Probe, t: &str) -> Result<Row, String> {
    let iters = crate::common::lat_iters(64, o.quick);
    probe.latency(t.trim_start_matches("c-"), &h.a, &h.b, &h.ip_a, o.port + 1, 64, iters + iters / 10)
}

/// The headline figures measured again in alternating rounds, so that
/// drift of this noisy machine hits every transport alike: latency at 64 B
/// and bandwidth at 1 MiB; for via-udp and tcp, whose large messages are
/// compared, latency at 64 KiB and 1 MiB and bandwidth at 64 KiB too
/// ([`ROUND_FIGURES`]). Each round starts one transport further along
/// the list (raw, via, ..., tcp; then via, ..., tcp, raw; ...), so no
/// transport always follows the same one. Returns one row per transport
/// and op holding the median over the rounds, the per-round values, and
/// the runs that failed (each also printed at once).
fn alternating_rounds(o: &Options, h: &Hosts, probe: Option<&Probe>) -> (Vec<Row>, Rounds, Vec<String>) {
    let mut rounds = Rounds::default();
    let mut failures = Vec::new();
    let mut wanted: Vec<String> = o.transports.iter().filter(|t| *t != "via-unrel").cloned().collect();
    if probe.is_some() {
        wanted.extend(probe_transports(o));
    }
    if o.transports.iter().any(|t| t == "via-shm") {
        wanted.push("shm-floor".into()); // what via-shm is held to
        // What a user of one host has: Open MPI's and UCX's shared memory.
        if crate::mpi::available() {
            wanted.push("ompi-shm".into());
        } else {
            eprintln!("via-pingpong --demo: Open MPI is not installed (mpicc, mpirun): via-shm is not compared with it");
        }
        if crate::ucx::available() {
            wanted.push("ucx-shm".into());
        } else {
            eprintln!("via-pingpong --demo: UCX's ucx_perftest is not installed (ucx-utils): via-shm is not compared with it");
        }
        if crate::ofi::available() {
            wanted.push("ofi-shm".into());
        } else {
            eprintln!("via-pingpong --demo: libfabric's fi_pingpong is not installed (libfabric-bin): via-shm is not compared with it");
        }
    }
    for round in 0..o.rounds {
        let mut order = wanted.clone();
        let n = order.len().max(1);
        order.rotate_left(round % n);
        for t in &order {
            let got = if t.starts_with("c-") {
                run_probe(o, h, probe.expect("probe transports only with a probe"), t).map(|r| vec![r])
            } else if t == "shm-floor" {
                crate::floor::latency(crate::common::lat_iters(64, o.quick)).map(|r| vec![r])
            } else if t == "ompi-shm" {
                crate::mpi::run(crate::common::lat_iters(64, o.quick))
            } else if t == "ucx-shm" {
                crate::ucx::run(crate::common::lat_iters(64, o.quick))
            } else if t == "ofi-shm" {
                crate::ofi::run(crate::common::lat_iters(64, o.quick))
            } else {
                let run = |sizes: &str, bw_sizes: &str| run_pair_with(h, t, vec!["--sizes".into(), sizes.into(), "--bw-sizes".into(), bw_sizes.into()]).map(|(rows, _, _)| rows);
                // The large messages on a connection of their own: after
                // thousands of 64 B round trips TCP's receive window has
                // shrunk to what they needed, and a 64 KiB ping-pong then
                // takes 28-50 us where a fresh connection takes 18.
                let large = t == "via-udp" || t == "tcp";
                run("64", "1048576").and_then(|mut rows| {
                    if large {
                        rows.extend(run("65536,1048576", "65536")?);
                    }
                    Ok(rows)
                })
            };
            match got {
                Ok(rows) => {
                    for r in rows {
                        let Some(&(_, _, key, _)) = ROUND_FIGURES.iter().find(|(op, bytes, _, _)| *op == r.op && *bytes == r.bytes) else { continue };
                        rounds.push(t, key, round, if r.op == "lat" { r.t_typical_us } else { r.mb_per_s });
                    }
                }
                Err(e) => {
                    eprintln!("via-pingpong --demo: ROUND FAILED: round {round} {t}: {e}");
                    failures.push(format!("round {round} {t}: {}", e.lines().next().unwrap_or("")));
                }
            }
        }
    }
    let mut out = Vec::new();
    for ((t, op), xs) in &rounds.values {
        let xs: Vec<f64> = xs.iter().flatten().copied().collect();
        let what = ROUND_FIGURES.iter().find(|f| f.2 == *op).map_or("", |f| f.3);
        let unit = if what.contains("latency") { "us" } else { "MB/s" };
        eprintln!("via-pingpong --demo: {t:<4} {what} per round ({unit}): {}", xs.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" "));
        if *op != "lat" && *op != "bw" {
            continue; // the large messages' figures: only their ratios are printed
        }
        let mut r = if *op == "lat" {
            Row::latency(t, 64, vec![median(xs.clone()).unwrap_or(0.0)])
        } else {
            let mut r = Row::bandwidth(t, 1 << 20, 1, Duration::from_secs(1));
            r.mb_per_s = median(xs.clone()).unwrap_or(0.0);
            r
        };
        r.iters = xs.len();
        out.push(r);
    }
    (out, rounds, failures)
}

/// Prints the ratios the targets are stated in. With alternating rounds,
/// each ratio is the median of the per-round ratios (the two transports of
/// a pair measured in the same round); the medians of each transport's
/// rounds are shown beside it. Without rounds, the sweep's figures.
fn print_ratios(rows: &[Row], sweeps: &[Row], rounds: Option<&Rounds>) {
    let paired = rounds.is_some();
    println!("\n=== VIA against the baselines (same run; {}) ===", if paired { "median of per-round ratios of alternating rounds" } else { "sweep figures" });
    if !rows.iter().any(|r| !r.transport.starts_with("via") || r.transport.starts_with("via?")) && !rows.iter().any(|r| ["via-write", "via-auth", "via-atomic"].contains(&r.transport.as_str())) {
        println!("(no baseline rows: they need root, or their runs failed above)");
        return;
    }
    let val = |t: &str, op: &str| find(rows, t, op, if op == "lat" { 64 } else { 1 << 20 }).map(|r| if op == "lat" { r.t_typical_us } else { r.mb_per_s });
    let ratio = |a: &str, b: &str, op: &str| -> Option<(f64, f64, f64)> {
        let (x, y) = (val(a, op)?, val(b, op)?);
        let r = rounds.and_then(|rs| rs.paired_ratio(a, b, op)).unwrap_or(x / y);
        Some((x, y, r))
    };
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    for (b, target) in [("raw", "<= 1.10"), ("udp", "< 1"), ("tcp", "< 1")] {
        if let Some((v, x, r)) = ratio("via", b, "lat") {
            let pass = if b == "raw" { r <= 1.10 } else { r < 1.0 };
            println!("latency 64 B    VIA/{b:<4} = {r:.3}  (medians {v:.2} / {x:.2} us; target {target}) {}", verdict(pass));
        }
    }
    for b in ["tcp", "udp"] {
        let c = format!("c-{b}");
        if let Some((v, x, r)) = ratio(b, &c, "lat") {
            println!("latency 64 B    {b}/C probe = {r:.3}  (medians {v:.2} / {x:.2} us: the demo's {b} against probe/sockprobe.c; target <= 1.10) {}", verdict(r <= 1.10));
        }
        if let Some((v, x, r)) = ratio("via", &c, "lat") {
            println!("latency 64 B    VIA/C {b:<4} = {r:.3}  (medians {v:.2} / {x:.2} us)");
        }
    }
    if let Some((w, v, r)) = ratio("via-write", "via", "lat") {
        println!("latency 64 B    RDMA write/send = {r:.3}  (medians {w:.2} / {v:.2} us; target <= 1) {}", verdict(r <= 1.0));
    }
    if let Some((a, p, r)) = ratio("via-auth", "via", "lat") {
        println!("latency 64 B    auth/plain = {r:.3}  (target <= 1.05; medians {a:.2} / {p:.2} us; via-auth against via)");
    }
    if let Some((a, p, r)) = ratio("via-auth", "via", "bw") {
        println!("bandwidth 1 MiB auth/plain = {r:.3}  (medians {a:.1} / {p:.1} MB/s; via-auth against via)");
    }
    if let Some((u, t, r)) = ratio("via-udp", "tcp", "bw") {
        println!("bandwidth 1 MiB via-udp/tcp = {r:.3}  (medians {u:.1} / {t:.1} MB/s; target >= 1) {}", verdict(r >= 1.0));
    }
    // Large messages: from the rounds when they ran, else the sweeps (one
    // run each).
    for (key, op, bytes) in [("lat-64k", "lat", 65536), ("lat-1m", "lat", 1 << 20), ("bw-64k", "bw", 65536)] {
        let lat = op == "lat";
        let from_rounds = rounds.and_then(|rs| {
            let med = |t: &str| median(rs.get(t, key)?.iter().flatten().copied().collect());
            Some((med("via-udp")?, med("tcp")?, rs.paired_ratio("via-udp", "tcp", key)?, "medians of the rounds"))
        });
        let from_sweeps = || {
            let (u, t) = (find(sweeps, "via-udp", op, bytes)?, find(sweeps, "tcp", op, bytes)?);
            let (u, t) = if lat { (u.t_typical_us, t.t_typical_us) } else { (u.mb_per_s, t.mb_per_s) };
            Some((u, t, u / t, "the sweeps"))
        };
        let Some((u, t, r, whence)) = from_rounds.or_else(from_sweeps) else { continue };
        let size = format!("{:>4} KiB", bytes / 1024);
        if lat {
            println!("latency {size} via-udp/tcp = {r:.3}  ({u:.1} / {t:.1} us, {whence}; target <= 1) {}", verdict(r <= 1.0));
        } else {
            println!("bandwidth {size} via-udp/tcp = {r:.3}  ({u:.1} / {t:.1} MB/s, {whence}; target >= 1) {}", verdict(r >= 1.0));
        }
    }
    if let Some((u, v, r)) = ratio("via-udp", "via", "lat") {
        println!("latency 64 B    UDP-encapsulated/raw VIA = {r:.3}  (medians {u:.2} / {v:.2} us; via-udp against via, the same link)");
    }
    if let Some((u, v, r)) = ratio("via-udp", "via", "bw") {
        println!("bandwidth 1 MiB UDP-encapsulated/raw VIA = {r:.3}  (medians {u:.1} / {v:.1} MB/s)");
    }
    if let Some((s, v, r)) = ratio("via-shm", "via", "lat") {
        println!("latency 64 B    shared memory/software NIC = {r:.3}  (medians {s:.2} / {v:.2} us; via-shm against via)");
    }
    if let Some((s, f, r)) = ratio("via-shm", "shm-floor", "lat") {
        println!("latency 64 B    via-shm = {s:.3} us, shared-memory floor = {f:.3} us  (via-shm/floor = {r:.2}: two processes handing a cache line back and forth; target via-shm <= 0.35 us) {}", verdict(s <= 0.35));
    }
    if let Some((s, m, r)) = ratio("via-shm", "ompi-shm", "lat") {
        println!("latency 64 B    via-shm/Open MPI = {r:.3}  (medians {s:.3} / {m:.3} us; Open MPI's shared memory, probe/mpi_shm.c; target <= 1) {}", verdict(r <= 1.0));
    }
    if let Some((s, u, r)) = ratio("via-shm", "ucx-shm", "lat") {
        println!("latency 64 B    via-shm/UCX = {r:.3}  (medians {s:.3} / {u:.3} us; ucx_perftest tag_lat, UCX_TLS=sm,self; target <= 1) {}", verdict(r <= 1.0));
    }
    if let Some((s, f, r)) = ratio("via-shm", "ofi-shm", "lat") {
        println!("latency 64 B    via-shm/libfabric = {r:.3}  (medians {s:.3} / {f:.3} us; fi_pingpong -p shm -e rdm, its mean; target <= 1) {}", verdict(r <= 1.0));
    }
    if let Some((s, v, r)) = ratio("via-shm", "via", "bw") {
        println!("bandwidth 1 MiB shared memory/software NIC = {r:.3}  (medians {s:.1} / {v:.1} MB/s)");
    }
    if let Some((s, m, r)) = ratio("via-shm", "ompi-shm", "bw") {
        println!("bandwidth 1 MiB via-shm/Open MPI = {r:.3}  (medians {s:.1} / {m:.1} MB/s; target >= 1) {}", verdict(r >= 1.0));
    }
    if let Some((s, u, r)) = ratio("via-shm", "ucx-shm", "bw") {
        println!("bandwidth 1 MiB via-shm/UCX = {r:.3}  (medians {s:.1} / {u:.1} MB/s; ucx_perftest tag_bw)");
    }
    if let Some((l, c, r)) = ratio("via-shm-lent", "via-shm", "bw") {
        println!("bandwidth 1 MiB shared memory lent/copied = {r:.3}  (medians {l:.1} / {c:.1} MB/s; via-shm-lent against via-shm)");
    }
    for t in rows.iter().map(|r| r.transport.as_str()).filter(|t| t.starts_with("via?")).collect::<std::collections::BTreeSet<_>>() {
        if let Some((f, c, r)) = ratio(t, "via", "bw") {
            println!("bandwidth 1 MiB {t}/via = {r:.3}  (medians {f:.1} / {c:.1} MB/s: goodput against the clean link)");
        }
        if let Some((f, c, r)) = ratio(t, "via", "lat") {
            println!("latency 64 B    {t}/via = {r:.3}  (medians {f:.2} / {c:.2} us)");
        }
    }
    if let Some(x) = val("via-read", "lat") {
        println!("latency 64 B    RDMA read (whole read, a round trip) = {x:.2} us");
    }
    if let Some((a, r, x)) = ratio("via-atomic", "via-read", "lat") {
        println!("latency         atomic fetch-and-add/RDMA read = {x:.3}  (medians {a:.2} / {r:.2} us; 8 B atomic against a 64 B read, each a round trip; target <= 1.1) {}", verdict(x <= 1.1));
    }
    if let Some((v, x, r)) = ratio("via", "raw", "bw") {
        println!("bandwidth 1 MiB VIA/raw  = {r:.3}  (medians {v:.1} / {x:.1} MB/s; target >= 0.9) {}", verdict(r >= 0.9));
    }
    for t in ["via-write", "via-read"] {
        if let Some((v, x, r)) = ratio(t, "raw", "bw") {
            println!("bandwidth 1 MiB {t}/raw = {r:.3}  (medians {v:.1} / {x:.1} MB/s)");
        }
    }
    for b in ["udp", "tcp"] {
        if let Some((v, x, r)) = ratio("via", b, "bw") {
            println!("bandwidth 1 MiB VIA/{b:<4} = {r:.3}  (medians {v:.1} / {x:.1} MB/s)");
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
    let h = match Hosts::create(o.mtu, o.kernel_loss) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("via-pingpong --demo: cannot create the test hosts: {e}");
            cleanup();
            return 1;
        }
    };
    eprintln!("via-pingpong --demo: hosts {} ({}) and {} ({}), veth MTU {}", h.a, h.va, h.b, h.vb, o.mtu);
    if o.transports.iter().any(|t| t.starts_with("via-udp")) {
        h.port_rule(o.port_rule);
    }
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
    // The C probe: the reference for the tcp and udp rows.
    let probe = if probe_transports(o).is_empty() {
        None
    } else {
        match Probe::install() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("via-pingpong --demo: C probe missing: {e}");
                None
            }
        }
    };
    if let Some(p) = &probe {
        for t in probe_transports(o) {
            eprintln!("via-pingpong --demo: running {t} (probe/sockprobe.c) ...");
            match run_probe(o, &h, p, &t) {
                Ok(r) => rows.push(r),
                Err(e) => {
                    eprintln!("via-pingpong --demo: {e}");
                    failed = true;
                }
            }
        }
    }
    let (headline, rounds, round_failures) = if o.rounds > 0 {
        let (r, x, f) = alternating_rounds(o, &h, probe.as_ref());
        (r, Some(x), f)
    } else {
        (rows.clone(), None, Vec::new())
    };
    drop(h);
    report(o, &rows, &headline, rounds.as_ref());
    if !o.json {
        println!("\n=== peak resident memory (KiB) ===");
        for (t, s, c) in &rss {
            println!("{t:<10} server {s:>8}   client {c:>8}");
        }
    }
    if !round_failures.is_empty() {
        println!("\n=== {} alternating run(s) FAILED; the ratios above lack them ===", round_failures.len());
        for f in &round_failures {
            println!("FAILED {f}");
        }
        failed = true;
    }
    i32::from(failed)
}

fn report(o: &Options, rows: &[Row], headline: &[Row], rounds: Option<&Rounds>) {
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
        print_ratios(headline, rows, rounds);
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
            report(o, &rows, &rows, None);
            0
        }
        Err(e) => {
            eprintln!("via-pingpong: {e}");
            1
        }
    }
}
