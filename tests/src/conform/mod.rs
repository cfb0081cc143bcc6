//! The VIA 1.0 conformance suite: one rule per test, run across two real
//! hosts (network namespaces joined by a veth pair), one process each.
//!
//! A [`Rule`] names the behaviour it checks and the area of the
//! specification it belongs to, and has two halves: the *target* runs on
//! host a and accepts the connection, the *initiator* runs on host b and
//! connects to it. Both run as `via-conform target|initiator RULE` (the
//! binary of this crate); each exits 0 only if everything it checked held.
//!
//! Besides VIA itself the halves talk through the test harness: a line
//! `TELL <text>` printed by one half is written to the other's stdin
//! ([`Ctx::tell`], [`Ctx::heard`]), for the rules that need one side to
//! hold still (not call into VIA) until the other has checked something.

mod connection;
mod data;
mod errors;
mod queries;
mod rdma;

use crate::TestNet;
use std::io::BufRead;
use std::time::Duration;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, RemoteBuffer, Vi, ViAttributes};

/// One rule of the specification and the two halves that check it.
pub struct Rule {
    /// Test name (also the name given on the command line).
    pub name: &'static str,
    /// Area of the specification (see docs/CONFORMANCE.md).
    pub area: &'static str,
    /// The rule, in words.
    pub text: &'static str,
    pub target: fn(&mut Ctx),
    pub initiator: fn(&mut Ctx),
    /// Run the target without the background progress thread.
    pub target_passive: bool,
}

/// Every rule of the suite.
pub fn rules() -> Vec<Rule> {
    let mut v = Vec::new();
    v.extend(data::rules());
    v.extend(rdma::rules());
    v.extend(errors::rules());
    v.extend(connection::rules());
    v.extend(connection::peer_rules());
    v.extend(connection::name_rules());
    v.extend(queries::rules());
    v
}

/// Long enough for anything that should happen; short enough to fail fast.
pub const T: Option<Duration> = Some(Duration::from_secs(10));
/// MaxTransferSize of the suite's VIs.
pub const MTS: u32 = 1 << 20;
/// The discriminator the target waits on (with the run's tag: [`Ctx::disc`]).
pub const DISC: &[u8] = b"conform";

/// What a rule half works with.
pub struct Ctx {
    pub rule: &'static str,
    pub nic: Nic,
    pub ptag: via_user::Ptag,
    /// The target's MAC (initiator only).
    pub peer: Option<via_user::MacAddr>,
    pub dev: String,
    /// Appended to the rule's discriminators and host names (`--tag`), so
    /// that pairs of one rule can run at once on the same hosts.
    pub tag: String,
    /// Regions of posted control receives, by descriptor address.
    control: Vec<(usize, MemoryRegion)>,
}

/// Fails the rule with `msg`: prints it and exits 1.
pub fn fail(rule: &str, msg: &str) -> ! {
    eprintln!("via-conform {rule}: FAIL: {msg}");
    std::process::exit(1)
}

/// Checks a condition of the rule; on failure names the rule and the cause.
#[macro_export]
macro_rules! check {
    ($ctx:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $crate::conform::fail($ctx.rule, &format!($($msg)+));
        }
    };
}

impl Ctx {
    /// The discriminator `base` of this run (with its tag).
    pub fn disc(&self, base: &[u8]) -> Vec<u8> {
        [base, self.tag.as_bytes()].concat()
    }

    /// The host name `base` of this run (with its tag).
    pub fn name(&self, base: &str) -> String {
        format!("{base}{}", self.tag)
    }

    /// Unwraps `r` or fails the rule naming `what`.
    pub fn ok<T, E: std::fmt::Display>(&self, r: Result<T, E>, what: &str) -> T {
        r.unwrap_or_else(|e| fail(self.rule, &format!("{what}: {e}")))
    }

    pub fn attrs(&self, level: Reliability, rdma_write: bool, rdma_read: bool) -> ViAttributes {
        ViAttributes { reliability: level, max_transfer_size: MTS, ptag: self.ptag, enable_rdma_write: rdma_write, enable_rdma_read: rdma_read }
    }

    pub fn vi(&self, a: ViAttributes) -> Vi {
        self.ok(self.nic.create_vi(&a, None, None), "VipCreateVi")
    }

    /// A region of `len` bytes under the context's ptag.
    pub fn region(&self, len: usize, rdma_write: bool, rdma_read: bool) -> MemoryRegion {
        self.region_in(self.ptag, len, rdma_write, rdma_read)
    }

    pub fn region_in(&self, ptag: via_user::Ptag, len: usize, rdma_write: bool, rdma_read: bool) -> MemoryRegion {
        self.ok(MemoryRegion::new(&self.nic, len, 4096, MemAttributes { ptag, enable_rdma_write: rdma_write, enable_rdma_read: rdma_read }), "VipRegisterMem")
    }

    /// A descriptor for `op` over one range of `r`.
    pub fn desc(&self, op: Op, r: &MemoryRegion, range: std::ops::Range<usize>, imm: Option<u32>, fence: bool) -> Descriptor {
        let mut d = self.ok(Descriptor::new(&self.nic, self.ptag, 2), "descriptor");
        self.ok(d.set_op(op, &[(r, range)], imm, fence), "filling the descriptor");
        d
    }

    /// Target: waits for the initiator's request and accepts it onto `vi`.
    pub fn accept(&self, vi: &Vi) {
        let req = self.ok(self.nic.connect_wait(&self.disc(DISC), T), "VipConnectWait");
        self.ok(self.nic.accept(&req, vi), "VipConnectAccept");
    }

    /// Initiator: connects `vi` to the target (retrying NO_MATCH).
    pub fn connect(&self, vi: &mut Vi) {
        let mac = self.peer.expect("initiator knows the target");
        self.ok(vi.connect_retrying(mac, &self.disc(DISC), Duration::from_secs(20)), "VipConnectRequest");
    }

    /// Posts a receive for one control message (up to 256 bytes).
    pub fn post_control_recv(&mut self, vi: &mut Vi) {
        let r = self.region(256, false, false);
        let d = self.desc(Op::SendRecv, &r, 0..256, None, false);
        self.control.push((d.addr(), r));
        self.ok(vi.post_recv(d), "posting a control receive");
    }

    /// Sends `bytes` (up to 256) as one message and waits for it.
    pub fn send_control(&self, vi: &mut Vi, bytes: &[u8]) {
        let r = self.region(256, false, false);
        self.ok(r.write(0, bytes), "control message");
        let d = self.desc(Op::SendRecv, &r, 0..bytes.len(), None, false);
        self.ok(vi.post_send(d), "VipPostSend (control)");
        let d = self.ok(vi.send_wait(T), "VipSendWait (control)");
        self.ok(d.check_ok(), "control send");
    }

    /// Waits for a control message posted with [`Ctx::post_control_recv`].
    pub fn recv_control(&mut self, vi: &mut Vi) -> Vec<u8> {
        let d = self.ok(vi.recv_wait(T), "VipRecvWait (control)");
        self.ok(d.check_ok(), "control receive");
        let Some(i) = self.control.iter().position(|(a, _)| *a == d.addr()) else { fail(self.rule, "a receive that was not a control receive completed") };
        let (_, r) = self.control.remove(i);
        self.ok(r.to_vec(0..d.length() as usize), "reading the control message")
    }

    /// Sends the peer where it may RDMA.
    pub fn offer(&self, vi: &mut Vi, b: RemoteBuffer) {
        self.send_control(vi, &b.to_bytes());
    }

    /// Receives what [`Ctx::offer`] sent.
    pub fn offered(&mut self, vi: &mut Vi) -> RemoteBuffer {
        let b = self.recv_control(vi);
        self.ok(RemoteBuffer::from_bytes(&b), "remote buffer")
    }

    /// Has the other half read `text` on its stdin.
    pub fn tell(&self, text: &str) {
        println!("TELL {text}");
    }

    /// Waits for the other half's next `tell`.
    pub fn heard(&self) -> String {
        let mut l = String::new();
        self.ok(std::io::stdin().lock().read_line(&mut l), "reading the harness");
        l.trim().to_string()
    }

    /// Passes the rule.
    pub fn pass(&self) {
        println!("PASS {}", self.rule);
    }
}

/// The deterministic contents of test buffers.
pub fn fill(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8).collect()
}

/// Entry point of the `via-conform` binary.
pub fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--list") {
        print!("{}", markdown());
        return;
    }
    let (role, name) = (args.first().cloned().unwrap_or_default(), args.get(1).cloned().unwrap_or_default());
    let mut dev = String::new();
    let mut tag = String::new();
    let mut peer = None;
    let mut it = args.iter().skip(2);
    while let Some(k) = it.next() {
        let v = it.next().cloned().unwrap_or_default();
        match k.as_str() {
            "--dev" => dev = v,
            "--tag" => tag = v,
            "--peer" => peer = Some(v.parse().unwrap_or_else(|e| fail(&name, &format!("--peer {v}: {e}")))),
            _ => fail(&name, &format!("unknown option {k}")),
        }
    }
    let Some(rule) = rules().into_iter().find(|r| r.name == name) else { fail(&name, "no such rule (see docs/CONFORMANCE.md)") };
    let mut config = Config::from_env();
    if role == "target" && rule.target_passive {
        config.progress_thread = false;
    }
    let device = via_user::open_device(&dev).unwrap_or_else(|e| fail(rule.name, &format!("opening {dev}: {e}")));
    let nic = Nic::with_device(&dev, device, config).unwrap_or_else(|e| fail(rule.name, &format!("VipOpenNic {dev}: {e}")));
    let ptag = nic.create_ptag().unwrap_or_else(|e| fail(rule.name, &format!("VipCreatePtag: {e}")));
    let mut ctx = Ctx { rule: rule.name, nic, ptag, peer, dev, tag, control: Vec::new() };
    match role.as_str() {
        "target" => {
            println!("READY {}", ctx.nic.mac());
            (rule.target)(&mut ctx)
        }
        "initiator" => (rule.initiator)(&mut ctx),
        r => fail(rule.name, &format!("unknown role {r:?}")),
    }
}

/// The rules as a Markdown list by area (docs/CONFORMANCE.md's body).
pub fn markdown() -> String {
    let mut out = String::new();
    let mut area = "";
    for r in rules() {
        if r.area != area {
            area = r.area;
            out += &format!("\n### {area}\n\n");
        }
        out += &format!("- `{}`: {}\n", r.name, r.text);
    }
    out
}

/// One half's stdin as the relay sees it: lines told before the half
/// started wait in `pending`.
struct Mailbox {
    stdin: Option<std::process::ChildStdin>,
    pending: Vec<String>,
}

impl Mailbox {
    fn write(w: &mut std::process::ChildStdin, line: &str) {
        use std::io::Write;
        let _ = writeln!(w, "{line}");
        let _ = w.flush();
    }

    fn deliver(&mut self, line: &str) {
        match self.stdin.as_mut() {
            Some(w) => Self::write(w, line),
            None => self.pending.push(line.to_string()),
        }
    }

    fn open(&mut self, stdin: Option<std::process::ChildStdin>) {
        self.stdin = stdin;
        if let Some(w) = self.stdin.as_mut() {
            for l in self.pending.drain(..) {
                Self::write(w, &l);
            }
        }
    }

    fn close(&mut self) {
        self.stdin = None;
    }
}

/// Runs rule `name` across two fresh hosts and asserts that both halves
/// passed. Needs root.
pub fn run(bin: &str, name: &str) {
    let net = TestNet::new(1500);
    let target = net.command(&net.a, bin, &["target", name, "--dev", &net.dev_a()]);
    let initiator = |mac: &str| net.command(&net.b, bin, &["initiator", name, "--dev", &net.dev_b(), "--peer", mac]);
    if let Err(report) = run_pair(name, target, initiator) {
        panic!("{report}");
    }
}

/// Runs rule `name` over VIA in UDP/IPv4 (`udp:<ifname>`) between hosts on
/// two subnets joined by a router namespace. Discovering a name asks the
/// segment (a broadcast, which no router forwards, as with ARP): that rule
/// runs between two hosts of one subnet, still over UDP.
pub fn run_routed(bin: &str, name: &str) {
    let net = if name == "name_service_discovers_a_host_not_in_the_hosts_file" { TestNet::udp(1500) } else { TestNet::routed(1500) };
    let target = net.command(&net.a, bin, &["target", name, "--dev", &net.dev_a()]);
    let initiator = |mac: &str| net.command(&net.b, bin, &["initiator", name, "--dev", &net.dev_b(), "--peer", mac]);
    if let Err(report) = run_pair(name, target, initiator) {
        panic!("{report}");
    }
}

/// Runs rule `name` through composite devices (`<nic>+shm:<wire>`, one
/// wire per host), two pairs at once (in turn for the name-service
/// rules, see below), both initiators on host a: one with
/// its target on host a too (their frames go through shared memory), one
/// with its target on host b (through the NIC). Each pair tags its
/// discriminators and names (`--tag`), so that neither answers the
/// other's requests. The initiators on host a lend every payload they
/// may (`,lend=1`), so the rules also check the single-copy path; the
/// target there does not, so its one-frame sends go boxed
/// (`via_device::boxed`) and the rules check that path too.
pub fn run_composite(bin: &str, name: &str) {
    let net = TestNet::new(1500);
    let wire = |host: &str| format!("{}-{host}", net.a);
    let (dev_a, dev_b) = (format!("{}+shm:{},lend=1", net.dev_a(), wire("a")), format!("{}+shm:{}", net.dev_b(), wire("b")));
    let dev_a_target = format!("{}+shm:{}", net.dev_a(), wire("a"));
    let pair = |target_host: &str, dev_t: &str, tag: &str| {
        let target = net.command(target_host, bin, &["target", name, "--dev", dev_t, "--tag", tag]);
        let initiator = |mac: &str| net.command(&net.a, bin, &["initiator", name, "--dev", &dev_a, "--peer", mac, "--tag", tag]);
        run_pair(name, target, initiator)
    };
    // The name-service rules run their pairs in turn: a reverse lookup
    // asks an address, and at host a's address the other pair's initiator,
    // which goes by its default name, would answer too.
    let names = rules().iter().any(|r| r.name == name && r.area == "name service");
    let (same, other) = if names {
        (pair(&net.a, &dev_a_target, "-same"), pair(&net.b, &dev_b, "-other"))
    } else {
        std::thread::scope(|s| {
            let same = s.spawn(|| pair(&net.a, &dev_a_target, "-same"));
            let other = s.spawn(|| pair(&net.b, &dev_b, "-other"));
            (same.join().expect("the same-host pair's runner"), other.join().expect("the two-host pair's runner"))
        })
    };
    for w in ["a", "b"] {
        via_softnic::shm::remove_wire(&wire(w));
    }
    let failed: Vec<String> = [("peers on one host", same), ("peers on two hosts", other)].into_iter().filter_map(|(what, r)| r.err().map(|e| format!("{what}: {e}"))).collect();
    if !failed.is_empty() {
        panic!("{}", failed.join("\n\n"));
    }
}

/// Runs rule `name` with the target started by `target` and the
/// initiator by `initiator(target's MAC)`, relaying TELL lines between
/// them; Err carries both halves' output. Works for any pair of hosts:
/// namespaces here, two processes owning one tulip each in the QEMU guest.
pub fn run_pair(name: &str, target: std::process::Command, initiator: impl FnOnce(&str) -> std::process::Command) -> Result<(), String> {
    use std::process::{Command, Stdio};
    use std::sync::{mpsc, Arc, Mutex};
    let spawn = |mut c: Command| c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("{name}: starting via-conform: {e}"));
    let mut target = spawn(target)?;
    let target_in = Arc::new(Mutex::new(Mailbox { stdin: target.stdin.take(), pending: Vec::new() }));
    let initiator_in = Arc::new(Mutex::new(Mailbox { stdin: None, pending: Vec::new() }));
    // Each half's stdout: TELL lines go to the other half's stdin; the
    // rest is kept for the report.
    let relay = |out: std::process::ChildStdout, to: Arc<Mutex<Mailbox>>, ready: Option<mpsc::Sender<String>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(t) = line.strip_prefix("TELL ") {
                    to.lock().unwrap().deliver(t);
                }
                if let (Some(tx), Some(mac)) = (ready.as_ref(), line.strip_prefix("READY ")) {
                    let _ = tx.send(mac.to_string());
                }
                kept.push(line);
            }
            kept
        })
    };
    let (tx, rx) = mpsc::channel();
    let t_out = relay(target.stdout.take().unwrap(), initiator_in.clone(), Some(tx));
    let Ok(mac) = rx.recv_timeout(Duration::from_secs(20)) else {
        let _ = target.kill();
        let out = target.wait_with_output().unwrap();
        return Err(format!("{name}: the target never got ready: {}", String::from_utf8_lossy(&out.stderr)));
    };
    let mut initiator = match spawn(initiator(&mac)) {
        Ok(c) => c,
        Err(e) => {
            let _ = target.kill();
            return Err(e);
        }
    };
    initiator_in.lock().unwrap().open(initiator.stdin.take());
    // A rule that hangs fails instead of stopping the suite.
    let pids = [target.id() as i32, initiator.id() as i32];
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if done_rx.recv_timeout(Duration::from_secs(90)).is_err() {
            for p in pids {
                // SAFETY: plain kill(2) of our own children.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    });
    let i_out = relay(initiator.stdout.take().unwrap(), target_in.clone(), None);
    let i = initiator.wait_with_output().unwrap();
    let i_lines = i_out.join().unwrap();
    // The initiator is done: the target gets EOF on stdin and finishes.
    target_in.lock().unwrap().close();
    let t = target.wait_with_output().unwrap();
    let _ = done_tx.send(());
    let t_lines = t_out.join().unwrap();
    let report = format!(
        "--- initiator ({})\n{}\n{}\n--- target ({})\n{}\n{}",
        i.status,
        i_lines.join("\n"),
        String::from_utf8_lossy(&i.stderr),
        t.status,
        t_lines.join("\n"),
        String::from_utf8_lossy(&t.stderr)
    );
    if !(i.status.success() && t.status.success()) {
        return Err(format!("{name} failed:\n{report}"));
    }
    if !i_lines.iter().any(|l| *l == format!("PASS {name}")) {
        return Err(format!("{name}: the initiator never printed PASS:\n{report}"));
    }
    Ok(())
}
