//! What every transport of via-pingpong shares: options, result rows,
//! statistics, the spin-then-sleep wait, and the measurement protocol over
//! a message link (used by the raw, UDP and TCP baselines; VIA runs the
//! same protocol on descriptors in `via.rs`).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};
use via_device::Sleep;

/// Command-line options of one side.
#[derive(Clone, Debug)]
pub struct Options {
    pub transport: String,
    pub device: String,
    pub peer: String,
    pub bind_ip: String,
    pub port: u16,
    pub sizes: Vec<usize>,
    pub bw_sizes: Vec<usize>,
    pub quick: bool,
    pub json: bool,
    pub reliability: via_user::Reliability,
    pub discriminator: String,
    pub plot: Option<String>,
    pub mtu: usize,
    /// Demo: frames of every kind the kernel drops on both hosts'
    /// interfaces, per thousand (an nftables netdev ingress rule).
    pub kernel_loss: u32,
    /// Demo: with via-udp, both hosts keep the kernel's IP stack off VIA's
    /// UDP port (`via_kernel_agent::udp_port`), as a host running VIA in
    /// UDP would; `--no-port-rule` leaves the rule out.
    pub port_rule: bool,
    pub transports: Vec<String>,
    /// Demo: alternating rounds for the headline ratios.
    pub rounds: usize,
    /// CPU to pin this process to.
    pub cpu: Option<usize>,
    /// VIA RDMA mode: "write" or "read" (None: send/receive).
    pub rdma: Option<String>,
    /// Latency iterations and bandwidth messages per size (None: by size).
    pub iters: Option<usize>,
    /// Bandwidth messages per size, over `iters`.
    pub bw_iters: Option<usize>,
    /// VIA client: after the sweep, check message contents both ways at
    /// every latency size (send/receive, RDMA write or read).
    pub verify: bool,
    /// VIA client: print the engine's and the device's counters at the end.
    pub stats: bool,
    /// VIA: receives complete through a completion queue (CQWait, then
    /// RecvDone), as CQ-driven programs take them.
    pub recv_cq: bool,
}

/// What `--demo` runs unless `--transports` says otherwise.
pub const DEMO_DEFAULT: [&str; 10] = ["raw", "via", "via-auth", "via-shm", "via-udp", "via-unrel", "via-write", "via-read", "udp", "tcp"];

/// Every transport `--demo --transports` takes (the shared-memory
/// references, `shm-floor`, `ompi-shm`, `ucx-shm` and `ofi-shm`, run
/// beside `via-shm` by themselves).
pub const DEMO_TRANSPORTS: [&str; 12] = ["raw", "via", "via-auth", "via-shm", "via-shm-lent", "via-udp", "via-unrel", "via-write", "via-read", "via-atomic", "udp", "tcp"];

impl Default for Options {
    fn default() -> Self {
        Options {
            transport: "via".into(),
            device: "/dev/via_lo".into(),
            peer: String::new(),
            bind_ip: "0.0.0.0".into(),
            port: 18515,
            sizes: default_sizes(true),
            bw_sizes: default_sizes(false),
            quick: false,
            json: false,
            reliability: via_user::Reliability::ReliableDelivery,
            discriminator: "pingpong".into(),
            plot: None,
            mtu: 1500,
            kernel_loss: 0,
            port_rule: true,
            transports: DEMO_DEFAULT.map(String::from).to_vec(),
            rounds: 5,
            cpu: None,
            rdma: None,
            iters: None,
            bw_iters: None,
            verify: false,
            stats: false,
            recv_cq: false,
        }
    }
}

/// 0 (latency only), then 1, 2, 4, ... 1 MiB.
pub fn default_sizes(with_zero: bool) -> Vec<usize> {
    let mut v: Vec<usize> = if with_zero { vec![0] } else { vec![] };
    v.extend((0..=20).map(|k| 1usize << k));
    v
}

/// Largest message of a run.
pub fn max_size(o: &Options) -> usize {
    o.sizes.iter().chain(&o.bw_sizes).copied().max().unwrap_or(1).max(16)
}

/// Ping-pong iterations for `size` (warm-up not included).
pub fn lat_iters(size: usize, quick: bool) -> usize {
    let n = match size {
        0..=4096 => 10_000,
        4097..=65536 => 1000,
        _ => (64 << 20) / size,
    };
    if quick { (n / 4).max(50) } else { n.max(100) }
}

/// Messages streamed for the bandwidth of `size`.
pub fn bw_count(size: usize, quick: bool) -> usize {
    let bytes: usize = if quick { 64 << 20 } else { 256 << 20 };
    let cap = if quick { 50_000 } else { 200_000 };
    (bytes / size.max(1)).clamp(64, cap)
}

/// One result line.
#[derive(Clone, Debug)]
pub struct Row {
    pub transport: String,
    /// "lat" or "bw".
    pub op: String,
    pub bytes: usize,
    pub iters: usize,
    pub t_min_us: f64,
    pub t_typical_us: f64,
    pub t_avg_us: f64,
    pub t_p99_us: f64,
    pub t_p999_us: f64,
    pub mb_per_s: f64,
    pub mpps: f64,
}

impl Row {
    /// A latency row from one-way samples in µs; its MB/s is bytes / t_typical.
    pub fn latency(transport: &str, bytes: usize, mut samples: Vec<f64>) -> Row {
        samples.sort_by(f64::total_cmp);
        let n = samples.len().max(1);
        let at = |q: f64| samples.get(((n as f64 * q) as usize).min(n - 1)).copied().unwrap_or(0.0);
        let avg = samples.iter().sum::<f64>() / n as f64;
        let typ = at(0.5);
        Row {
            transport: transport.into(),
            op: "lat".into(),
            bytes,
            iters: samples.len(),
            t_min_us: samples.first().copied().unwrap_or(0.0),
            t_typical_us: typ,
            t_avg_us: avg,
            t_p99_us: at(0.99),
            t_p999_us: at(0.999),
            mb_per_s: if typ > 0.0 { bytes as f64 / typ } else { 0.0 },
            mpps: 0.0,
        }
    }

    /// A bandwidth row: `count` messages of `bytes` in `elapsed`.
    pub fn bandwidth(transport: &str, bytes: usize, count: usize, elapsed: Duration) -> Row {
        let s = elapsed.as_secs_f64().max(1e-9);
        Row {
            transport: transport.into(),
            op: "bw".into(),
            bytes,
            iters: count,
            t_min_us: 0.0,
            t_typical_us: 0.0,
            t_avg_us: 0.0,
            t_p99_us: 0.0,
            t_p999_us: 0.0,
            mb_per_s: (bytes * count) as f64 / s / 1e6,
            mpps: count as f64 / s / 1e6,
        }
    }

    pub fn json(&self) -> String {
        format!(
            "{{\"transport\":\"{}\",\"op\":\"{}\",\"bytes\":{},\"iters\":{},\"t_min_us\":{:.3},\"t_typical_us\":{:.3},\"t_avg_us\":{:.3},\"t_p99_us\":{:.3},\"t_p999_us\":{:.3},\"mb_per_s\":{:.3},\"mpps\":{:.5}}}",
            self.transport, self.op, self.bytes, self.iters, self.t_min_us, self.t_typical_us, self.t_avg_us, self.t_p99_us, self.t_p999_us, self.mb_per_s, self.mpps
        )
    }

    /// Parses what [`Row::json`] wrote.
    pub fn from_json(s: &str) -> Option<Row> {
        let field = |k: &str| -> Option<&str> {
            let at = s.find(&format!("\"{k}\":"))? + k.len() + 3;
            let rest = &s[at..];
            let end = rest.find([',', '}'])?;
            Some(rest[..end].trim_matches('"'))
        };
        let num = |k: &str| field(k).and_then(|v| v.parse::<f64>().ok());
        Some(Row {
            transport: field("transport")?.into(),
            op: field("op")?.into(),
            bytes: num("bytes")? as usize,
            iters: num("iters")? as usize,
            t_min_us: num("t_min_us")?,
            t_typical_us: num("t_typical_us")?,
            t_avg_us: num("t_avg_us")?,
            t_p99_us: num("t_p99_us")?,
            t_p999_us: num("t_p999_us")?,
            mb_per_s: num("mb_per_s")?,
            mpps: num("mpps")?,
        })
    }
}

/// Rows as one JSON array.
pub fn json_array(rows: &[Row]) -> String {
    let v: Vec<String> = rows.iter().map(Row::json).collect();
    format!("[\n{}\n]", v.join(",\n"))
}

/// Splits a JSON array written by [`json_array`] back into rows.
pub fn parse_json_array(s: &str) -> Vec<Row> {
    s.split('{').skip(1).filter_map(|obj| Row::from_json(&format!("{{{obj}"))).collect()
}

/// Prints perftest-style tables of `rows` for one transport.
pub fn print_tables(transport: &str, rows: &[Row]) {
    let lat: Vec<_> = rows.iter().filter(|r| r.transport == transport && r.op == "lat").collect();
    if !lat.is_empty() {
        println!("\n--- {transport}: latency (one-way, usec) ---");
        println!(" {:>9} {:>11} {:>12} {:>16} {:>10} {:>11} {:>13}", "#bytes", "#iterations", "t_min[usec]", "t_typical[usec]", "t_avg[usec]", "t_p99[usec]", "t_p99.9[usec]");
        for r in lat {
            println!(" {:>9} {:>11} {:>12.2} {:>16.2} {:>10.2} {:>11.2} {:>13.2}", r.bytes, r.iters, r.t_min_us, r.t_typical_us, r.t_avg_us, r.t_p99_us, r.t_p999_us);
        }
    }
    let bw: Vec<_> = rows.iter().filter(|r| r.transport == transport && r.op == "bw").collect();
    if !bw.is_empty() {
        println!("\n--- {transport}: bandwidth ---");
        println!(" {:>9} {:>11} {:>12} {:>15}", "#bytes", "#iterations", "BW[MB/s]", "MsgRate[Mpps]");
        for r in bw {
            println!(" {:>9} {:>11} {:>12.2} {:>15.4}", r.bytes, r.iters, r.mb_per_s, r.mpps);
        }
    }
}

/// Spin budget of waits, the same for every transport: `VIA_SPIN_US`
/// (default 200 µs), as the VIA engine uses.
pub fn spin_budget() -> Duration {
    // Read once: the baselines wait once per message, and looking the
    // variable up each time put a getenv in front of every wait.
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| Duration::from_micros(std::env::var("VIA_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(200)))
}

/// What one attempt of a wait found.
pub enum Step<T> {
    /// The wait is over.
    Done(T),
    /// Data arrived, but not all the wait needs (a message's first frames).
    Partial,
    /// Nothing arrived.
    Empty,
}

/// Rounds a wait keeps spinning after data arrived that did not complete
/// it: the VIA engine's rule (via-user/src/nic.rs, `BURST_ROUNDS`), so the
/// rest of a message is not waited for in poll().
const BURST_ROUNDS: u32 = 64;

/// Calls `attempt` until it is done: spinning for the spin budget and for
/// [`BURST_ROUNDS`] more after each partial arrival, then sleeping in
/// poll() on `fd` for `events` between attempts. The same rule as VIA's
/// waits, so no transport is favoured by its wait.
pub fn spin_then_poll<T>(fd: RawFd, events: i16, timeout: Duration, attempt: impl FnMut() -> io::Result<Step<T>>) -> io::Result<T> {
    spin_then_sleep(fd, events, timeout, attempt, || Some(Sleep::default()))
}

thread_local! {
    /// The waits' clock, made once (it asks the processor about its
    /// counter: in a VM, a CPUID exits to the hypervisor).
    static CLOCK: std::cell::RefCell<via_user::clock::Clock> = std::cell::RefCell::new(via_user::clock::Clock::default());
}

/// [`spin_then_poll`] on a frame device's descriptor: `prepare` runs
/// before each sleep (`FrameDevice::prepare_sleep`, which a NIC over VFIO
/// needs to let its interrupt through again) and holds the [`Sleep`] it
/// gives while asleep; None (frames came meanwhile) skips the sleep.
pub fn spin_then_sleep<T>(
    fd: RawFd,
    events: i16,
    timeout: Duration,
    mut attempt: impl FnMut() -> io::Result<Step<T>>,
    mut prepare: impl FnMut() -> Option<Sleep>,
) -> io::Result<T> {
    let mut start: Option<via_user::Time> = None;
    let spin = spin_budget();
    let mut burst = 0u32;
    // As VIA's waits do, the clock is read every 8 rounds only (a reading
    // costs ~40 ns here; a round is one non-blocking system call), and it
    // is VIA's clock (`via_user::clock`): where the system clock is dear
    // (a TCG guest's HPET: a system call and an exit to the hypervisor)
    // the baseline does not spend its spin reading it while VIA does not.
    let mut round = 0u32;
    let mut el = Duration::ZERO;
    loop {
        match attempt()? {
            Step::Done(v) => return Ok(v),
            Step::Partial => burst = BURST_ROUNDS,
            Step::Empty => {}
        }
        if round.is_multiple_of(8) {
            let now = CLOCK.with_borrow_mut(|c| c.now());
            el = now.since(*start.get_or_insert(now));
        }
        round = round.wrapping_add(1);
        if el >= timeout {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out waiting for the peer"));
        }
        if burst > 0 || el < spin {
            burst = burst.saturating_sub(1);
            std::hint::spin_loop();
            continue;
        }
        let Some(_asleep) = prepare() else { continue };
        let mut p = libc::pollfd { fd, events, revents: 0 };
        let ms = (timeout - el).as_millis().min(100) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms.max(1)) };
        round = 0; // read the clock again right after the sleep
    }
}

/// Peak resident memory of this process in KiB (VmHWM).
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// A message link: what the baselines offer the measurement protocol.
pub trait Link {
    /// Sends one message.
    fn send(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Receives one message into `buf`; returns its length.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Bytes the receiver holds without loss when the sender runs ahead
    /// (its ring or socket buffer); None when the transport has flow
    /// control of its own (TCP).
    fn lossless_bytes(&self) -> Option<usize>;
}

const OP_LAT: u32 = 1;
const OP_BW: u32 = 2;
const OP_END: u32 = 3;
/// Messages a bandwidth sender may have unconfirmed; the receiver grants
/// credit every half window. The VIA transport's window (its 64 posted
/// receives, `via.rs` `RECVS`), so every transport streams under the same
/// credits.
pub const WINDOW_MSGS: usize = 64;

fn words(b: &[u8]) -> [u32; 3] {
    let w = |i: usize| b.get(4 * i..4 * i + 4).map_or(0, |x| u32::from_le_bytes(x.try_into().unwrap()));
    [w(0), w(1), w(2)]
}

fn msg(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Messages of `size` in the window of `link`: [`WINDOW_MSGS`], fewer
/// where a link without flow control of its own could not hold them all
/// (its receiver would drop what overflows, and nothing resends it).
/// Both ends compute it from their own link; the server's grants rule.
fn window_msgs(link: &dyn Link, size: usize) -> usize {
    match link.lossless_bytes() {
        None => WINDOW_MSGS,
        Some(b) => (b / size.max(1)).clamp(2, WINDOW_MSGS),
    }
}

/// The server side of the protocol over `link`, until the client ends it.
pub fn serve_link(link: &mut dyn Link, max: usize) -> io::Result<()> {
    let mut buf = vec![0u8; max.max(16)];
    loop {
        let n = link.recv(&mut buf)?;
        let [op, size, count] = words(&buf[..n.min(12)]);
        let (size, count) = (size as usize, count as usize);
        link.send(&msg(&[op]))?;
        match op {
            OP_LAT => {
                for _ in 0..count {
                    let n = link.recv(&mut buf)?;
                    if n != size {
                        return Err(io::Error::other(format!("ping of {n} bytes, expected {size}")));
                    }
                    link.send(&buf[..n])?;
                }
            }
            OP_BW => {
                let half = (window_msgs(link, size) / 2).max(1);
                let mut since = 0;
                for _ in 0..count {
                    link.recv(&mut buf)?;
                    since += 1;
                    if since == half {
                        since = 0;
                        link.send(&msg(&[half as u32]))?;
                    }
                }
                link.send(&msg(&[0]))?;
            }
            OP_END => return Ok(()),
            _ => return Err(io::Error::other(format!("unknown control op {op} ({n} bytes)"))),
        }
    }
}

/// The client side of the protocol over a link.
pub struct LinkClient<'a> {
    pub link: &'a mut dyn Link,
    buf: Vec<u8>,
}

impl<'a> LinkClient<'a> {
    pub fn new(link: &'a mut dyn Link, max: usize) -> Self {
        LinkClient { link, buf: vec![0u8; max.max(16)] }
    }

    fn control(&mut self, op: u32, size: usize, count: usize) -> io::Result<()> {
        self.link.send(&msg(&[op, size as u32, count as u32]))?;
        let n = self.link.recv(&mut self.buf)?;
        if n != 4 || words(&self.buf[..4])[0] != op {
            return Err(io::Error::other("bad control answer"));
        }
        Ok(())
    }

    pub fn latency(&mut self, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<f64>> {
        self.control(OP_LAT, size, iters + warmup)?;
        let out_msg = vec![0x5au8; size];
        let mut v = Vec::with_capacity(iters);
        for i in 0..iters + warmup {
            let t0 = Instant::now();
            self.link.send(&out_msg)?;
            let n = self.link.recv(&mut self.buf)?;
            let dt = t0.elapsed();
            if n != size {
                return Err(io::Error::other(format!("pong of {n} bytes, expected {size}")));
            }
            if i >= warmup {
                v.push(dt.as_secs_f64() * 1e6 / 2.0);
            }
        }
        Ok(v)
    }

    pub fn bandwidth(&mut self, size: usize, count: usize) -> io::Result<Duration> {
        self.control(OP_BW, size, count)?;
        let out_msg = vec![0xa5u8; size];
        let mut credits = window_msgs(self.link, size);
        let mut sent = 0;
        let t0 = Instant::now();
        loop {
            while credits > 0 && sent < count {
                self.link.send(&out_msg)?;
                credits -= 1;
                sent += 1;
            }
            let n = self.link.recv(&mut self.buf)?;
            let grant = words(&self.buf[..n.min(4)])[0] as usize;
            if grant == 0 {
                return Ok(t0.elapsed());
            }
            credits += grant;
        }
    }

    /// Ends the session; the server's answer confirms it stopped cleanly.
    pub fn finish(&mut self) -> io::Result<()> {
        self.control(OP_END, 0, 0)
    }
}

/// A connected client that can measure.
pub trait Bench {
    /// One-way latency samples (µs) of `iters` ping-pongs after `warmup`.
    fn latency(&mut self, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<f64>>;
    /// Time to stream `count` messages of `size` bytes.
    fn bandwidth(&mut self, size: usize, count: usize) -> io::Result<Duration>;
}

impl Bench for LinkClient<'_> {
    fn latency(&mut self, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<f64>> {
        LinkClient::latency(self, size, iters, warmup)
    }
    fn bandwidth(&mut self, size: usize, count: usize) -> io::Result<Duration> {
        LinkClient::bandwidth(self, size, count)
    }
}

/// Runs the sweep of `o` (latency sizes, then bandwidth sizes unless
/// `bw` is false) and returns the rows.
pub fn sweep(o: &Options, name: &str, b: &mut dyn Bench, bw: bool) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &s in &o.sizes {
        let iters = o.iters.unwrap_or_else(|| lat_iters(s, o.quick));
        let samples = b.latency(s, iters, (iters / 10).max(10))?;
        rows.push(Row::latency(name, s, samples));
    }
    if bw {
        for &s in &o.bw_sizes {
            let count = o.bw_iters.or(o.iters).unwrap_or_else(|| bw_count(s, o.quick));
            let t = b.bandwidth(s, count)?;
            rows.push(Row::bandwidth(name, s, count, t));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_roundtrip_and_stats() {
        let r = Row::latency("via", 64, (1..=1000).map(|x| x as f64).collect());
        assert_eq!(r.t_min_us, 1.0);
        assert_eq!(r.t_typical_us, 501.0);
        assert_eq!(r.t_p99_us, 991.0);
        let back = parse_json_array(&json_array(&[r.clone(), Row::bandwidth("raw", 1 << 20, 100, Duration::from_secs(1))]));
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].t_typical_us, 501.0);
        assert_eq!(back[1].transport, "raw");
        assert!((back[1].mb_per_s - 104.8576).abs() < 1e-3);
    }
}
