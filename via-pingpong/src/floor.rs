//! The shared-memory floor (`shm-floor` in the demo): two processes,
//! pinned like every transport's server (CPU 0) and client (CPU 1), hand
//! one cache line back and forth: a counter each side advances in turn,
//! busy-polled, each round trip timed like every transport's. No
//! shared-memory transport can go below it; the demo prints via-shm
//! against it.

use crate::common::Row;
use std::io;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The counter's cache line in a fresh shared file.
struct Line {
    path: String,
    ptr: *mut AtomicU64,
}

impl Line {
    fn create() -> io::Result<Line> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = format!("/dev/shm/via-pingpong-floor-{}-{nanos}", std::process::id());
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        f.set_len(4096)?;
        Line::map(&path, f)
    }

    fn open(path: &str) -> io::Result<Line> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        Line::map(path, f)
    }

    fn map(path: &str, f: std::fs::File) -> io::Result<Line> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a 4 KiB file we opened; the
        // pointer is checked before use.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Line { path: path.to_string(), ptr: p.cast() })
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page-aligned, 4 KiB and lives as long as
        // `self`; other processes touch it only through atomics.
        unsafe { &*self.ptr }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped.
        unsafe { libc::munmap(self.ptr.cast(), 4096) };
    }
}

/// Waits until the word holds `v`; false after `limit`.
fn wait_for(w: &AtomicU64, v: u64, limit: Duration) -> bool {
    let t0 = Instant::now();
    let mut spins = 0u32;
    while w.load(Ordering::Acquire) != v {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1 << 16) && t0.elapsed() > limit {
            return false;
        }
    }
    true
}

/// One side of the probe (`via-pingpong shm-floor serve|time PATH N`):
/// `serve` answers each odd count with the next even one; `time` sets the
/// odd counts and times each round trip (N timed, a tenth more first to
/// warm up), and returns the row.
pub fn side(role: &str, path: &str, iters: usize) -> io::Result<Option<Row>> {
    let line = Line::open(path)?;
    let w = line.word();
    let warmup = iters / 10;
    let total = (iters + warmup) as u64;
    let stopped = || io::Error::new(io::ErrorKind::TimedOut, "the floor probe's other side stopped");
    if role == "serve" {
        for i in 0..total {
            if !wait_for(w, 2 * i + 1, Duration::from_secs(10)) {
                return Err(stopped());
            }
            w.store(2 * i + 2, Ordering::Release);
        }
        return Ok(None);
    }
    let mut samples = Vec::with_capacity(iters);
    for i in 0..total {
        let t0 = Instant::now();
        w.store(2 * i + 1, Ordering::Release);
        if !wait_for(w, 2 * i + 2, Duration::from_secs(10)) {
            return Err(stopped());
        }
        if i >= warmup as u64 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(Some(Row::latency("shm-floor", 64, samples)))
}

/// The floor's one-way latency: both sides as processes of their own,
/// pinned like the transports' server (CPU 0) and client (CPU 1).
pub fn latency(iters: usize) -> Result<Row, String> {
    let line = Line::create().map_err(|e| format!("shm-floor: the shared line: {e}"))?;
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let start = |role: &str, cpu: &str| {
        let mut c = Command::new(&exe);
        c.args(["shm-floor", role, &line.path, &iters.to_string()]).stdout(Stdio::piped()).stderr(Stdio::piped());
        if pinned {
            c.args(["--cpu", cpu]);
        }
        let child = c.spawn().map_err(|e| e.to_string())?;
        crate::cleanup::track(child.id());
        Ok::<_, String>(child)
    };
    let server = start("serve", "0")?;
    let client = start("time", "1")?;
    let (s, c) = (server.wait_with_output(), client.wait_with_output());
    let _ = std::fs::remove_file(&line.path);
    let (s, c) = (s.map_err(|e| e.to_string())?, c.map_err(|e| e.to_string())?);
    if !s.status.success() || !c.status.success() {
        return Err(format!("shm-floor: serve {}, time {}: {}{}", s.status, c.status, String::from_utf8_lossy(&s.stderr).trim(), String::from_utf8_lossy(&c.stderr).trim()));
    }
    crate::common::parse_json_array(&String::from_utf8_lossy(&c.stdout)).into_iter().next().ok_or_else(|| "shm-floor: no row from the timing side".to_string())
}
