//! `mttl-run -n N [--transport via|tcp] [--nic-only | --hosts K] [--mtu BYTES] [--raw] [--no-port-rule] [--timeout SECONDS] [--no-auth] [--faults SPEC] -- PROGRAM ARGS`
//!
//! Each run makes a cluster secret of its own (32 random bytes, mode 0600
//! in a directory only root can enter, removed at exit) and hands it to
//! the ranks in `VIA_SECRET`, so every VIA frame of the run carries a MAC
//! (via_kernel_agent::auth); a `VIA_SECRET` set by the caller is used
//! instead, and `--no-auth` runs without one (CRC-32C only).
//!
//! Runs an MTTL program as N processes on this machine, each in a network
//! namespace of its own (`eth0`, 10.77.0.(rank+1)/16) joined by a bridge in
//! one more namespace, the way N hosts on one Ethernet would be. Every line
//! a rank prints is prefixed with `[rank]`. When a rank fails, the others
//! are stopped and mttl-run exits non-zero; on every exit path (Ctrl-C
//! included) it kills what it started and deletes the namespaces it made.
//! Needs root. On a cluster, start the program with `srun` or `mpirun`
//! instead: ranks read their number from that launcher's environment.
//!
//! With no more ranks than CPUs each rank is pinned to its own CPU and
//! waits spin for `VIA_SPIN_US` (200 µs) before sleeping; with more, waits
//! sleep at once (`VIA_SPIN_US=0`, unless set by the caller): a spinning
//! rank would hold a CPU that a rank with work needs.
//!
//! The links have Ethernet's MTU, 1500 bytes (`--mtu` gives another, up to
//! 65 000: veth allows it). The VIA layer runs on VIA in UDP/IPv4
//! datagrams (`udp:eth0`), whose superframes take a message's fragments
//! to the kernel in one trip, as TCP hands it 64 KB segments, whatever the
//! MTU. `--raw` gives it raw VIA frames instead (`/dev/via_eth0`), each
//! frame a trip through the kernel: at MTU 1500 a 64 KiB message is 45 of
//! them (with `--mtu 65000`, one; docs/BENCHMARKS.md compares them).
//! Each rank's namespace gets the rule that keeps the kernel's IP stack
//! off VIA's UDP port (`via-agent udp-port`; needs nft), as a host running
//! VIA in UDP would have it; `--no-port-rule` leaves it out.
//!
//! The ranks share this host, so over VIA each opens a composite device:
//! its `eth0` for the network and a shared-memory wire of the run for the
//! other ranks (`udp:eth0+shm:mttl<pid>-<random>-h<host>`: a name
//! no other user can guess and make the segment of first), which is the path their
//! frames take. `--nic-only` gives them the software NIC alone.
//! `--faults loss=P,dup=P,reorder=P` (with `--nic-only`) wraps each
//! rank's NIC in the software fault device, for runs over links that lose,
//! duplicate and reorder frames.
//! `--hosts K` plays a cluster of K SMP hosts: the ranks are dealt out in
//! blocks and each block shares a wire of its own, so ranks on one host
//! talk through shared memory and ranks on different hosts through the
//! NIC, from one process and one completion queue.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};
use via_kernel_agent::netns::ip;

static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// The links' MTU unless `--mtu` gives one: Ethernet's.
const DEFAULT_MTU: u32 = 1500;

struct Opts {
    n: usize,
    transport: String,
    timeout: Option<Duration>,
    mtu: u32,
    nic_only: bool,
    /// VIA in UDP/IPv4 (`udp:eth0`, the default) rather than raw VIA
    /// frames (`--raw`).
    udp: bool,
    /// No cluster secret: frames carry the CRC alone (`--no-auth`).
    no_auth: bool,
    /// Over VIA in UDP, leave the ranks' kernels processing VIA's
    /// datagrams too (`--no-port-rule`): no `udp_port` rule.
    no_port_rule: bool,
    hosts: usize,
    /// Faults every rank's NIC adds (`--faults loss=P,dup=P,...`, the
    /// software fault device's spec): only with `--nic-only`.
    faults: Option<String>,
    cmd: Vec<String>,
}

fn usage() -> ! {
    eprintln!("usage: mttl-run -n N [--transport via|tcp] [--nic-only | --hosts K] [--mtu BYTES] [--raw] [--no-port-rule] [--timeout SECONDS] [--no-auth] [--faults loss=P,dup=P,reorder=P] -- PROGRAM [ARGS...]");
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut a = std::env::args().skip(1);
    let mut o = Opts { n: 0, transport: std::env::var("MTTL_TRANSPORT").unwrap_or_else(|_| "via".into()), timeout: None, mtu: DEFAULT_MTU, nic_only: false, udp: true, no_auth: false, no_port_rule: false, hosts: 1, faults: None, cmd: Vec::new() };
    while let Some(x) = a.next() {
        match x.as_str() {
            "-n" | "--np" => o.n = a.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--transport" => o.transport = a.next().unwrap_or_else(|| usage()),
            "--mtu" => o.mtu = a.next().and_then(|v| v.parse().ok()).filter(|m| (576..=65000).contains(m)).unwrap_or_else(|| usage()),
            "--nic-only" => o.nic_only = true,
            "--udp" => o.udp = true, // the default; kept for older scripts
            "--raw" => o.udp = false,
            "--no-auth" => o.no_auth = true,
            "--no-port-rule" => o.no_port_rule = true,
            "--faults" => o.faults = Some(a.next().unwrap_or_else(|| usage())),
            "--hosts" => o.hosts = a.next().and_then(|v| v.parse().ok()).filter(|&k| k >= 1).unwrap_or_else(|| usage()),
            "--timeout" => o.timeout = Some(Duration::from_secs(a.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()))),
            "--" => {
                o.cmd = a.by_ref().collect();
                break;
            }
            "-h" | "--help" => usage(),
            _ => {
                o.cmd = std::iter::once(x).chain(a.by_ref()).collect();
                break;
            }
        }
    }
    if o.n == 0 || o.n > 250 || o.cmd.is_empty() {
        eprintln!("mttl-run: give -n between 1 and 250 and a program");
        usage()
    }
    if o.faults.is_some() && !(o.nic_only && o.transport == "via") {
        eprintln!("mttl-run: --faults goes with --nic-only over VIA (the faults are the NIC's)");
        usage()
    }
    if o.hosts > o.n || (o.hosts > 1 && o.nic_only) {
        eprintln!("mttl-run: --hosts K takes 1 <= K <= N, and not with --nic-only");
        usage()
    }
    if o.transport != "via" && o.transport != "tcp" {
        eprintln!("mttl-run: --transport must be via or tcp, not {:?}", o.transport);
        usage()
    }
    o
}


/// The namespaces of one run; deleted on drop.
struct Net {
    prefix: String,
    names: Vec<String>,
    /// Emulated hosts, each with a shared-memory wire.
    hosts: usize,
    /// The wires' random part (after the pid, which the stale sweep reads).
    wire_suffix: String,
}

impl Net {
    fn hub(&self) -> String {
        format!("{}hub", self.prefix)
    }
    /// The shared-memory wire of host `h`'s composite devices.
    fn shm_wire(&self, h: usize) -> String {
        format!("{}{}-h{h}", self.prefix, self.wire_suffix)
    }

    fn rank(&self, i: usize) -> String {
        format!("{}r{i}", self.prefix)
    }

    fn build(n: usize, mtu: u32, hosts: usize) -> Result<Net, String> {
        let mtu = mtu.to_string();
        let wire_suffix = via_softnic::shm::unguessable_suffix().map_err(|e| format!("drawing a random wire name: {e}"))?;
        let mut net = Net { prefix: format!("mttl{}-", std::process::id()), names: Vec::new(), hosts, wire_suffix };
        let hub = net.hub();
        ip(&["netns", "add", &hub])?;
        net.names.push(hub.clone());
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        // The hub is a switch, not a firewall: where br_netfilter is
        // loaded, stop it sending every bridged frame through iptables
        // (a per-frame cost that would tax the layer with more frames).
        for table in ["iptables", "ip6tables", "arptables"] {
            let knob = format!("/proc/sys/net/bridge/bridge-nf-call-{table}");
            let _ = Command::new("ip").args(["netns", "exec", &hub, "sh", "-c", &format!("[ ! -e {knob} ] || echo 0 > {knob}")]).status();
        }
        for i in 0..n {
            let ns = net.rank(i);
            ip(&["netns", "add", &ns])?;
            net.names.push(ns.clone());
            let port = format!("p{i}");
            ip(&["-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["-n", &hub, "link", "set", &port, "mtu", &mtu, "master", "br0", "up"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "mtu", &mtu])?;
            ip(&["-n", &ns, "addr", "add", &format!("10.77.{}.{}/16", (i + 1) / 256, (i + 1) % 256), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Over VIA in UDP: in every rank's namespace, the rule that keeps the
    /// kernel's IP stack off VIA's port (`via_kernel_agent::udp_port`; the
    /// provider's packet sockets take the datagrams, the kernel need not
    /// route them to a socket that drops them). Without nft the run goes on
    /// as without the rule, and says so.
    fn keep_ip_stack_off_the_port(&self, n: usize) {
        for i in 0..n {
            if let Err(e) = via_kernel_agent::udp_port::install(Some(&self.rank(i)), via_softnic::VIA_UDP_PORT) {
                eprintln!("mttl-run: note: {e}; the ranks' kernels will process every VIA datagram as well");
                return;
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in 0..self.hosts {
            via_softnic::shm::remove_wire(&self.shm_wire(h));
        }
        for ns in self.names.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Deletes namespaces and shared-memory wires left by mttl-run processes
/// that no longer exist (killed with SIGKILL, which no handler sees).
fn sweep_stale() {
    let stale = |rest: &str| {
        let pid = rest.split(['-', '.']).next().and_then(|p| p.parse::<i32>().ok());
        // SAFETY: kill with signal 0 only checks that the process exists.
        pid.is_some_and(|pid| pid != std::process::id() as i32 && unsafe { libc::kill(pid, 0) } != 0)
    };
    for e in std::fs::read_dir("/var/run/netns").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_prefix("mttl").is_some_and(stale) {
            let _ = ip(&["netns", "del", &name]);
        }
    }
    for e in std::fs::read_dir("/dev/shm").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_prefix("via-shm-mttl").is_some_and(stale) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn pump(rank: usize, r: impl std::io::Read + Send + 'static, to_err: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(r).split(b'\n').map_while(Result::ok) {
            let mut l = format!("[{rank}] ").into_bytes();
            l.extend_from_slice(&line);
            l.push(b'\n');
            if to_err {
                let _ = std::io::stderr().lock().write_all(&l);
            } else {
                let _ = std::io::stdout().lock().write_all(&l);
            }
        }
    })
}

fn kill_all(children: &mut [Option<Child>], sig: libc::c_int) {
    for c in children.iter().flatten() {
        // SAFETY: signalling a child we started and have not reaped.
        unsafe { libc::kill(c.id() as i32, sig) };
    }
}

/// The cluster secret of a run.
enum RunSecret {
    /// Made for this run in this private directory (removed on drop).
    Made(std::path::PathBuf),
    /// The caller's `VIA_SECRET`, passed through.
    Callers,
    /// `--no-auth`.
    None,
}

impl RunSecret {
    fn make(o: &Opts) -> std::io::Result<RunSecret> {
        use std::os::unix::fs::DirBuilderExt;
        if o.no_auth {
            return Ok(RunSecret::None);
        }
        if std::env::var_os(via_kernel_agent::auth::SECRET_ENV).is_some_and(|v| !v.is_empty()) {
            return Ok(RunSecret::Callers);
        }
        let mut name = [0u8; 8];
        via_kernel_agent::auth::fill_random(&mut name);
        let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
        let dir = std::env::temp_dir().join(format!("mttl-secret-{hex}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let made = RunSecret::Made(dir.clone());
        via_kernel_agent::auth::create_secret_file(&dir.join("secret"))?;
        Ok(made)
    }
}

impl Drop for RunSecret {
    fn drop(&mut self) {
        if let RunSecret::Made(dir) = self {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn main() -> ExitCode {
    let o = parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("mttl-run: needs root to make network namespaces (on a cluster, start the program with srun or mpirun instead)");
        return ExitCode::from(2);
    }
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(s, on_signal as *const () as libc::sighandler_t) };
    }
    sweep_stale();
    let net = match Net::build(o.n, o.mtu, o.hosts) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("mttl-run: setting up the network: {e}");
            return ExitCode::from(2);
        }
    };
    if o.transport == "via" && o.udp && !o.no_port_rule {
        net.keep_ip_stack_off_the_port(o.n);
    }
    let secret = match RunSecret::make(&o) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mttl-run: making the run's cluster secret: {e}");
            return ExitCode::from(2);
        }
    };
    let root = "10.77.0.1:47000";
    // Rank i's host when the ranks are dealt out in blocks to o.hosts hosts.
    let host = |i: usize| i * o.hosts / o.n;
    let nic = if o.udp { "udp:eth0" } else { "/dev/via_eth0" };
    // The software fault device wraps the NIC: frames lost, duplicated or
    // reordered on their way in and out.
    let nic = match &o.faults {
        Some(f) => format!("{nic}?{f}"),
        None => nic.to_string(),
    };
    let nic = nic.as_str();
    let device = |i: usize| if o.nic_only || o.n == 1 { nic.to_string() } else { format!("{nic}+shm:{}", net.shm_wire(host(i))) };
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    // With no more ranks than CPUs, rank i runs on CPU i (MTTL_PIN=0 turns
    // this off): no migrations, and each rank's caches stay warm.
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let pin = o.n <= cpus && std::env::var("MTTL_PIN").map_or(true, |v| v != "0");
    // With more ranks than CPUs, a rank spinning in a wait holds a CPU that
    // a rank with work needs: waits then sleep at once (VIA_SPIN_US=0 for
    // both layers), unless the caller chose a spin.
    let sleep_at_once = o.n > cpus && ["VIA_SPIN_US", "MTTL_TCP_SPIN_US"].iter().all(|v| std::env::var_os(v).is_none());
    for i in 0..o.n {
        let mut cmd = Command::new("ip");
        if pin {
            // SAFETY: between fork and exec only async-signal-safe calls:
            // sched_setaffinity on a stack-local set.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(i, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    Ok(())
                });
            }
        }
        if sleep_at_once {
            cmd.env("VIA_SPIN_US", "0");
        }
        match &secret {
            RunSecret::Made(dir) => cmd.env("VIA_SECRET", dir.join("secret")),
            RunSecret::Callers => &mut cmd,
            RunSecret::None => cmd.env_remove("VIA_SECRET"),
        };
        let spawned = cmd
            .args(["netns", "exec", &net.rank(i)])
            .args(&o.cmd)
            .env("MTTL_RANK", i.to_string())
            .env("MTTL_SIZE", o.n.to_string())
            .env("MTTL_ROOT", root)
            .env("MTTL_TRANSPORT", &o.transport)
            .env("MTTL_VIA_DEVICE", device(i))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(mut c) => {
                pumps.push(pump(i, c.stdout.take().unwrap(), false));
                pumps.push(pump(i, c.stderr.take().unwrap(), true));
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!("mttl-run: starting rank {i} ({}): {e}", o.cmd[0]);
                kill_all(&mut children, libc::SIGKILL);
                for c in children.iter_mut().flatten() {
                    let _ = c.wait();
                }
                return ExitCode::from(1);
            }
        }
    }
    let started = Instant::now();
    let mut failed: Option<String> = None;
    let mut left = o.n;
    let mut stopping_since: Option<Instant> = None;
    // Every rank that failed on its own, in the order seen.
    let mut reasons: Vec<String> = Vec::new();
    while left > 0 {
        let mut progressed = false;
        let mut failures = Vec::new();
        for (i, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    *slot = None;
                    left -= 1;
                    progressed = true;
                    if !st.success() {
                        failures.push(format!("rank {i} {}", describe(st)));
                        // Ranks we stopped ourselves are not reported.
                        if stopping_since.is_none() || st.code().is_some() {
                            reasons.push(format!("rank {i} {}", describe(st)));
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    failed.get_or_insert(format!("waiting for rank {i}: {e}"));
                }
            }
        }
        if failed.is_none() && !failures.is_empty() {
            failed = Some(failures.join(", "));
        }
        let sig = STOP.load(Ordering::SeqCst);
        if sig != 0 && failed.is_none() {
            failed = Some(format!("stopped by signal {sig}"));
        }
        if failed.is_none() && o.timeout.is_some_and(|t| started.elapsed() > t) {
            failed = Some(format!("the run took longer than {} s", o.timeout.unwrap().as_secs()));
        }
        if failed.is_some() && left > 0 {
            match stopping_since {
                None => {
                    eprintln!("mttl-run: {}; stopping the other ranks", failed.as_deref().unwrap());
                    kill_all(&mut children, libc::SIGTERM);
                    stopping_since = Some(Instant::now());
                }
                Some(t) if t.elapsed() > Duration::from_secs(2) => kill_all(&mut children, libc::SIGKILL),
                Some(_) => {}
            }
        }
        if !progressed && left > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for p in pumps {
        let _ = p.join();
    }
    drop(net);
    match failed {
        None => ExitCode::SUCCESS,
        Some(why) => {
            let why = if reasons.is_empty() { why } else { reasons.join(", ") };
            eprintln!("mttl-run: failed: {why}");
            ExitCode::from(1)
        }
    }
}

fn describe(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (_, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}
