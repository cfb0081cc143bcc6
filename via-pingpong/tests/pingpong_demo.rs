//! `via-pingpong --demo` end to end: it runs every transport between two
//! namespaces it creates, reports rows for each, and removes the namespaces
//! afterwards — also when interrupted. Needs root.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_via-pingpong");

fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&format!("via-pp-a-{pid}")) || l.contains(&format!("via-pp-b-{pid}"))).map(String::from).collect()
}

fn need_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root: the demo creates network namespaces");
}

#[test]
fn demo_reports_every_transport_and_cleans_up() {
    need_root();
    let child = Command::new(EXE)
        .args(["--demo", "--quick", "--json", "--sizes", "0,64,5000", "--bw-sizes", "64,100000", "--rounds", "1", "--transports", "raw,via,via-unrel,via-write,via-read,udp,tcp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed: {}", String::from_utf8_lossy(&out.stderr));
    for t in ["raw", "via", "via-unrel", "via-write", "via-read", "udp", "tcp"] {
        for size in [0, 64, 5000] {
            let row = format!("\"transport\":\"{t}\",\"op\":\"lat\",\"bytes\":{size},");
            assert!(stdout.contains(&row), "no latency row for {t} at {size} B in:\n{stdout}");
        }
    }
    for t in ["raw", "via", "via-write", "via-read", "udp", "tcp"] {
        let row = format!("\"transport\":\"{t}\",\"op\":\"bw\",\"bytes\":100000,");
        assert!(stdout.contains(&row), "no bandwidth row for {t}");
    }
    assert!(namespaces_of(pid).is_empty(), "namespaces left behind: {:?}", namespaces_of(pid));
}

#[test]
fn interrupted_demo_removes_its_hosts() {
    need_root();
    let mut child = Command::new(EXE).args(["--demo", "--transports", "tcp,via", "--rounds", "3"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    // Wait (bounded) until the demo has created its hosts, then interrupt it.
    let t0 = Instant::now();
    while namespaces_of(pid).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the demo never created its namespaces");
        assert!(child.try_wait().unwrap().is_none(), "the demo ended before creating its namespaces");
        std::thread::yield_now();
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(!status.success(), "an interrupted demo reports failure");
    assert!(namespaces_of(pid).is_empty(), "namespaces left behind after SIGINT: {:?}", namespaces_of(pid));
    // The veth pair goes with them, wherever the signal found it.
    let links = Command::new("ip").args(["-o", "link", "show"]).output().expect("ip link show");
    let name = format!("vppa{}", pid % 10_000_000);
    assert!(!String::from_utf8_lossy(&links.stdout).contains(&format!(" {name}@")), "{name} left behind after SIGINT");
}

#[test]
fn help_documents_the_demo() {
    let out = Command::new(EXE).arg("--help").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("--demo") && s.contains("--json") && s.contains("--plot"));
    let bad = Command::new(EXE).arg("--bogus").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--bogus"));
}

#[test]
fn without_root_the_demo_runs_via_over_loopback() {
    need_root(); // to drop to another user
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", EXE, "--demo", "--quick", "--json", "--sizes", "64", "--bw-sizes", "4096"])
        .output()
        .expect("setpriv (util-linux) runs the demo as user nobody");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not root") && err.contains("loopback"), "the fallback says so: {err}");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("\"transport\":\"via\",\"op\":\"lat\",\"bytes\":64,"), "{s}");
    assert!(s.contains("\"transport\":\"via\",\"op\":\"bw\",\"bytes\":4096,"), "{s}");
    assert!(!s.contains("\"transport\":\"raw\""));
}

#[test]
fn an_unknown_demo_transport_is_refused_before_anything_runs() {
    let out = Command::new(EXE).args(["--demo", "--transports", "via-shm,ompi-shm"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown demo transport \"ompi-shm\"") && err.contains("name via-shm"), "{err}");
    assert!(out.stdout.is_empty(), "nothing ran: {}", String::from_utf8_lossy(&out.stdout));
}
