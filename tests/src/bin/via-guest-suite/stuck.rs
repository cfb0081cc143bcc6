//! The suite's own watchdog: a check that runs for [`STUCK_AFTER`] without
//! ending is reported with what every thread of the suite and of its child
//! processes is doing (state, wait channel, system call, kernel stack), then
//! failed, and the suite ends with its result line. qemu/run.sh's watchdog
//! (120 s of silence) would otherwise end the guest with only QEMU's view
//! of the vCPUs, and a hang inside the guest (a wait that never ends, a
//! process stuck in the kernel during VFIO teardown) would say nothing of
//! where it is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a check may run before it is reported stuck: under
/// qemu/run.sh's 120 s of silence, so the report reaches the log.
pub const STUCK_AFTER: Duration = Duration::from_secs(110);

/// The check running now and since when.
static CURRENT: Mutex<Option<(String, Instant)>> = Mutex::new(None);
/// Checks passed and failed so far (for the result line of a stuck suite).
pub static PASSED: AtomicUsize = AtomicUsize::new(0);
pub static FAILED: AtomicUsize = AtomicUsize::new(0);

/// Notes that check `name` starts (`Some`) or that none runs (`None`).
pub fn running(name: Option<&str>) {
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = name.map(|n| (n.to_string(), Instant::now()));
}

/// Starts the watchdog for a suite of `planned` checks.
pub fn watch(planned: usize) {
    std::thread::spawn(move || loop {
        // A watchdog's period, not a synchronisation: it only looks.
        std::thread::sleep(Duration::from_secs(1));
        let stuck = CURRENT.lock().unwrap_or_else(|p| p.into_inner()).as_ref().filter(|(_, t0)| t0.elapsed() >= STUCK_AFTER).map(|(n, _)| n.clone());
        let Some(name) = stuck else { continue };
        println!("STUCK {name}: running for {} s; what the suite's processes are doing:", STUCK_AFTER.as_secs());
        let me = std::process::id();
        for pid in std::iter::once(me).chain(children(me)) {
            describe(pid);
        }
        println!("FAIL {name}: no end after {} s (threads above)", STUCK_AFTER.as_secs());
        let (p, f) = (PASSED.load(Ordering::SeqCst), FAILED.load(Ordering::SeqCst) + 1);
        println!("guest: {p} passed, {f} failed, {planned} planned");
        std::process::exit(1);
    });
}

/// The processes whose parent is `pid`, and theirs.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // The fields after the command's closing parenthesis: state, ppid, ...
        let ppid = stat.rsplit_once(") ").and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
            out.extend(children(p));
        }
    }
    out
}

/// Prints each thread of process `pid`: name, state, wait channel, the
/// system call it is in, and its kernel stack.
fn describe(pid: u32) {
    let read = |p: String| std::fs::read_to_string(&p).unwrap_or_else(|e| format!("({p}: {e})"));
    println!("  process {pid}: {}", read(format!("/proc/{pid}/cmdline")).replace('\0', " ").trim());
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let tid = t.file_name().to_string_lossy().to_string();
        let base = format!("/proc/{pid}/task/{tid}");
        let stat = read(format!("{base}/stat"));
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.split_whitespace().next()).unwrap_or("?").to_string();
        println!("    thread {tid} ({}) state {state} wchan {} syscall {}", read(format!("{base}/comm")).trim(), read(format!("{base}/wchan")).trim(), read(format!("{base}/syscall")).trim());
        for l in read(format!("{base}/stack")).lines() {
            println!("      {l}");
        }
    }
}
