//! Test support: real test hosts (network namespaces joined by a veth
//! pair) that are removed on drop, and running real processes in them.
//!
//! Needs root (network namespaces, AF_PACKET). A test that cannot create
//! its hosts fails with a message saying so; it never passes silently.
//!
//! [`attack`] is the third-host rig: three hosts on one hub, an attacker
//! forging raw frames at a connection of the other two.
//!
//! [`rig`] is the exception: two engines on the in-process loopback wire,
//! driven by hand, for the hostile-frame tests and the fuzz targets.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use via_kernel_agent::netns::ip;

// The device drivers, linked so that each registers itself in via-device's
// opener table (nothing here names them otherwise).
use via_nic_e1000e as _;
use via_nic_tulip as _;
use via_softnic as _;

pub mod attack;
pub mod conform;
pub mod rig;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Two network namespaces `a` and `b` joined by a veth pair `va` <-> `vb`
/// ([`TestNet::new`]); or each on a subnet of its own, joined through a
/// third namespace that routes between them ([`TestNet::routed`]).
pub struct TestNet {
    pub a: String,
    pub b: String,
    pub va: String,
    pub vb: String,
    /// The router's namespace, when the hosts are on two subnets.
    pub router: Option<String>,
    /// Devices carry VIA in UDP/IPv4 (`udp:<ifname>`), hosts have IPv4
    /// addresses ([`TestNet::ip_a`], [`TestNet::ip_b`]).
    pub udp: bool,
}


impl TestNet {
    /// Creates the two hosts with the given MTU on the link.
    pub fn new(mtu: usize) -> TestNet {
        TestNet::with_mtus(mtu, mtu)
    }

    /// Creates the two hosts, host a's end of the link with MTU `mtu_a`
    /// and host b's with `mtu_b` (a misconfigured segment: each end
    /// drops frames longer than its own MTU).
    pub fn with_mtus(mtu_a: usize, mtu_b: usize) -> TestNet {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root: it creates network namespaces and opens AF_PACKET sockets");
        }
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}x{n}", std::process::id());
        let net = TestNet { a: format!("vta{tag}"), b: format!("vtb{tag}"), va: format!("va{tag}"), vb: format!("vb{tag}"), router: None, udp: false };
        let r = (|| {
            ip(&["netns", "add", &net.a])?;
            ip(&["netns", "add", &net.b])?;
            ip(&["link", "add", &net.va, "mtu", &mtu_a.to_string(), "type", "veth", "peer", "name", &net.vb, "mtu", &mtu_b.to_string()])?;
            ip(&["link", "set", &net.va, "netns", &net.a])?;
            ip(&["link", "set", &net.vb, "netns", &net.b])?;
            ip(&["-n", &net.a, "link", "set", &net.va, "up"])?;
            ip(&["-n", &net.b, "link", "set", &net.vb, "up"])?;
            ip(&["-n", &net.a, "link", "set", "lo", "up"])?;
            ip(&["-n", &net.b, "link", "set", "lo", "up"])
        })();
        if let Err(e) = r {
            drop(net);
            panic!("creating test hosts: {e}");
        }
        net
    }

    /// The two hosts on one subnet, 10.1.0.0/24 (a is .2, b is .3), their
    /// devices VIA in UDP/IPv4 (`udp:<ifname>`).
    pub fn udp(mtu: usize) -> TestNet {
        let mut net = TestNet::new(mtu);
        net.udp = true;
        let r = (|| {
            ip(&["-n", &net.a, "addr", "add", "10.1.0.2/24", "dev", &net.va])?;
            ip(&["-n", &net.b, "addr", "add", "10.1.0.3/24", "dev", &net.vb])
        })();
        if let Err(e) = r {
            panic!("addressing the test hosts: {e}");
        }
        net
    }

    /// Host a on 10.1.0.0/24 (.2) and host b on 10.2.0.0/24 (.2), each
    /// link with MTU `mtu`, joined by a router namespace (.1 on both) that
    /// forwards between them; each host's default route goes through it.
    /// Devices carry VIA in UDP/IPv4 (`udp:<ifname>`).
    pub fn routed(mtu: usize) -> TestNet {
        TestNet::routed_with_mtus(mtu, mtu)
    }

    /// [`TestNet::routed`] with host a's link at MTU `mtu_a` and host b's
    /// at `mtu_b` (both ends of each link alike, the router's too).
    pub fn routed_with_mtus(mtu_a: usize, mtu_b: usize) -> TestNet {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}x{n}", std::process::id());
        let net = TestNet { a: format!("vta{tag}"), b: format!("vtb{tag}"), va: format!("va{tag}"), vb: format!("vb{tag}"), router: Some(format!("vtr{tag}")), udp: true };
        let r = net.router.as_deref().unwrap();
        let (ra, rb) = (format!("ra{tag}"), format!("rb{tag}"));
        let made = (|| {
            for ns in [&net.a, &net.b, r] {
                ip(&["netns", "add", ns])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            for (host, h_if, r_if, subnet, mtu) in [(&net.a, &net.va, &ra, "10.1.0", mtu_a), (&net.b, &net.vb, &rb, "10.2.0", mtu_b)] {
                let m = mtu.to_string();
                ip(&["link", "add", h_if, "mtu", &m, "type", "veth", "peer", "name", r_if, "mtu", &m])?;
                ip(&["link", "set", h_if, "netns", host])?;
                ip(&["link", "set", r_if, "netns", r])?;
                ip(&["-n", host, "addr", "add", &format!("{subnet}.2/24"), "dev", h_if])?;
                ip(&["-n", r, "addr", "add", &format!("{subnet}.1/24"), "dev", r_if])?;
                ip(&["-n", host, "link", "set", h_if, "up"])?;
                ip(&["-n", r, "link", "set", r_if, "up"])?;
                ip(&["-n", host, "route", "add", "default", "via", &format!("{subnet}.1")])?;
            }
            let out = Command::new("ip").args(["netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"]).output().map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("enabling forwarding in the router: {}", String::from_utf8_lossy(&out.stderr)))
            }
        })();
        if let Err(e) = made {
            drop(net);
            panic!("creating routed test hosts: {e}");
        }
        net
    }

    /// Host a's IPv4 address (UDP test nets).
    pub fn ip_a(&self) -> &'static str {
        "10.1.0.2"
    }

    /// Host b's IPv4 address (UDP test nets).
    pub fn ip_b(&self) -> &'static str {
        if self.router.is_some() {
            "10.2.0.2"
        } else {
            "10.1.0.3"
        }
    }

    fn dev(&self, ifname: &str) -> String {
        if self.udp {
            format!("udp:{ifname}")
        } else {
            format!("/dev/via_{ifname}")
        }
    }

    pub fn dev_a(&self) -> String {
        self.dev(&self.va)
    }

    pub fn dev_b(&self) -> String {
        self.dev(&self.vb)
    }

    /// Joins the two hosts by one more veth pair, `<va>n` <-> `<vb>n`, with
    /// the given MTU (a second network between them); returns the names.
    pub fn add_link(&self, mtu: usize) -> (String, String) {
        let (va, vb) = (format!("{}n", self.va), format!("{}n", self.vb));
        let r = (|| {
            ip(&["link", "add", &va, "mtu", &mtu.to_string(), "type", "veth", "peer", "name", &vb, "mtu", &mtu.to_string()])?;
            ip(&["link", "set", &va, "netns", &self.a])?;
            ip(&["link", "set", &vb, "netns", &self.b])?;
            ip(&["-n", &self.a, "link", "set", &va, "up"])?;
            ip(&["-n", &self.b, "link", "set", &vb, "up"])
        })();
        if let Err(e) = r {
            panic!("adding a link between the test hosts: {e}");
        }
        (va, vb)
    }

    /// The MAC address of interface `ifname` in namespace `ns`.
    pub fn mac_of(&self, ns: &str, ifname: &str) -> String {
        let out = self.command(ns, "cat", &[&format!("/sys/class/net/{ifname}/address")]).output().expect("reading an interface's address");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A command that runs `program args` inside namespace `ns`.
    pub fn command(&self, ns: &str, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]).args(args);
        c
    }

    /// Adds a network emulation qdisc (tc netem) on host a's interface.
    pub fn netem(&self, spec: &str) -> Result<(), String> {
        let mut args = vec!["netns", "exec", &self.a, "tc", "qdisc", "add", "dev", &self.va, "root", "netem"];
        args.extend(spec.split_whitespace());
        let out = Command::new("ip").args(&args).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it and its peer.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
        if let Some(r) = &self.router {
            let _ = ip(&["netns", "del", r]);
        }
    }
}

/// A process that is killed if still running when dropped.
pub struct Proc {
    child: Option<Child>,
    stdout: Option<BufReader<std::process::ChildStdout>>,
    pub name: String,
}

impl Proc {
    /// Starts `cmd` with piped stdin, stdout and stderr.
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().map(BufReader::new);
        Proc { child: Some(child), stdout, name: name.to_string() }
    }

    /// Reads stdout lines until one starts with `prefix`; returns the rest
    /// of that line. Panics (with the process's stderr) if it ends first.
    pub fn expect_line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.as_mut().map_or(0, |r| r.read_line(&mut line).unwrap_or(0));
            if n == 0 {
                let out = self.child.take().expect("running").wait_with_output().expect("waiting");
                panic!("{} ended ({}) before printing {prefix:?}: {}", self.name, out.status, String::from_utf8_lossy(&out.stderr));
            }
            if let Some(rest) = line.trim_end().strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    /// Waits for the process; returns its output (stdout after what
    /// `expect_line` consumed).
    pub fn finish(mut self) -> Output {
        let mut rest = Vec::new();
        if let Some(mut r) = self.stdout.take() {
            let _ = std::io::Read::read_to_end(&mut r, &mut rest);
        }
        let mut out = self.child.take().expect("running").wait_with_output().expect("waiting for child");
        rest.extend_from_slice(&out.stdout);
        out.stdout = rest;
        out
    }

    /// Writes a line to the process's stdin.
    pub fn write_line(&mut self, line: &str) {
        use std::io::Write;
        if let Some(stdin) = self.child.as_mut().and_then(|c| c.stdin.as_mut()) {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// Kills the process now (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    /// Kills the process. When the test is failing (unwinding from a
    /// panic), its stderr is shown too: the other side of a failed
    /// exchange often says why (a peer's connection error, its counters).
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            if let Some(mut err) = self.child.as_mut().and_then(|c| c.stderr.take()) {
                // What the pipe holds, without waiting: a process it
                // started may still hold the pipe open.
                // SAFETY: fcntl on a pipe fd we own.
                unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&err), libc::F_SETFL, libc::O_NONBLOCK) };
                let mut bytes = Vec::new();
                let _ = std::io::Read::read_to_end(&mut err, &mut bytes);
                let text = String::from_utf8_lossy(&bytes);
                if !text.trim().is_empty() {
                    eprintln!("--- {}'s stderr, as the failing test ended it ---\n{}", self.name, text.trim_end());
                }
            }
        }
    }
}

/// Runs `f` on a thread inside network namespace `ns`: what it opens
/// there (a VIA device, an AF_PACKET socket, the kernel's tables) stays
/// bound to that host whichever thread uses it later.
pub fn within<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
                // SAFETY: setns on a namespace fd we hold open; it changes
                // only this thread's network namespace.
                let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "entering {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Asserts that a finished process succeeded, showing its output if not.
pub fn assert_ok(name: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{name} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One side of a `via-testpeer` pair: its host (namespace), its device
/// and its environment.
pub struct PeerSide<'a> {
    pub host: &'a str,
    pub dev: &'a str,
    pub env: &'a [(&'a str, &'a std::ffi::OsStr)],
}

/// Runs `via-testpeer` (`bin`) scenario `scenario` with `args`: the server
/// on `server`, then the client on `client`, connecting to the server's
/// MAC. Both must exit 0; returns their stdout (client, server).
pub fn testpeer_pair(net: &TestNet, bin: &str, scenario: &str, server: PeerSide, client: PeerSide, args: &[&str]) -> (String, String) {
    let mut cmd = net.command(server.host, bin, &["server", scenario, "--dev", server.dev]);
    cmd.args(args).envs(server.env.iter().copied());
    let mut s = Proc::spawn("server", cmd);
    let mac = s.expect_line("READY");
    let mut cmd = net.command(client.host, bin, &["client", scenario, "--dev", client.dev, "--peer", &mac]);
    cmd.args(args).envs(client.env.iter().copied());
    let c = Proc::spawn("client", cmd).finish();
    let s = s.finish();
    assert_ok("client", &c);
    assert_ok("server", &s);
    (String::from_utf8_lossy(&c.stdout).into_owned(), String::from_utf8_lossy(&s.stdout).into_owned())
}

/// Writes a hosts file mapping `name` to `mac` and returns its path.
pub fn hosts_file(dir: &Path, entries: &[(&str, &str)]) -> std::path::PathBuf {
    let p = dir.join(format!("hosts-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst)));
    let text: String = entries.iter().map(|(n, m)| format!("{n} {m}\n")).collect();
    std::fs::write(&p, text).expect("writing hosts file");
    p
}

/// The deterministic test pattern for message `seq` of `len` bytes.
pub fn pattern(seq: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq.wrapping_mul(7919)) as u8 ^ (i >> 8) as u8).collect()
}

/// A length from 0 to `max` for message `seq`, the same on both sides of a
/// test (splitmix64 of the sequence number).
pub fn random_size(seq: u32, max: usize) -> usize {
    let mut z = (seq as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) % (max as u64 + 1)) as usize
}

/// A `kB` field of `/proc/meminfo` or `/proc/<pid>/status` (`VmRSS`,
/// `VmLck`, `MemFree`...).
pub fn proc_kib(file: &str, field: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse().ok()).ok_or(format!("no {field} in {file}"))
}
