//! CG on MTTL as real processes: `mttl-run -n N -- cg --class X` for
//! classes S and W at 1 to 32 ranks and class A at 1, 2 and 4 ranks over
//! VIA (the software NIC alone, `--nic-only`; class S also once through
//! mttl-run's default composite device; 32 ranks on this 2-core machine are heavily
//! oversubscribed, so blocking waits must sleep), and class S over TCP.
//! Each run must print NPB's "VERIFICATION SUCCESSFUL". Needs root.

use std::path::PathBuf;
use std::process::Command;

const CG: &str = env!("CARGO_BIN_EXE_cg");

/// `mttl-run`, from the same target directory (built if missing: it is
/// another package's binary).
fn mttl_run() -> PathBuf {
    let path = PathBuf::from(CG).with_file_name("mttl-run");
    if !path.exists() {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-p", "mttl-via", "--bin", "mttl-run"]);
        if CG.contains("/release/") {
            c.arg("--release");
        }
        assert!(c.status().expect("cargo build").success(), "building mttl-run");
    }
    path
}

/// A run over `transport`; over VIA on the software NIC alone unless
/// `composite` (mttl-run's default: shared memory between its ranks).
fn cg_on(n: usize, transport: &str, class: &str, composite: bool) {
    let device: &[&str] = if transport == "via" && !composite { &["--nic-only"] } else { &[] };
    let out = Command::new(mttl_run())
        .args(["-n", &n.to_string(), "--transport", transport, "--timeout", "600"])
        .args(device)
        .args(["--", CG, "--class", class])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running mttl-run");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "class {class} at {n} ranks over {transport} failed:\n{text}");
    assert!(text.contains("[0]  VERIFICATION SUCCESSFUL"), "class {class} at {n} ranks over {transport}:\n{text}");
    let procs = text.lines().find(|l| l.contains("Total processes")).and_then(|l| l.split('=').nth(1)).map(|v| v.trim().to_string());
    assert_eq!(procs.as_deref(), Some(n.to_string().as_str()), "{text}");
}

fn cg(n: usize, transport: &str, class: &str) {
    cg_on(n, transport, class, false)
}

#[test]
fn classes_s_and_w_verify_at_1_to_32_ranks_over_via() {
    for class in ["S", "W"] {
        for n in [1, 2, 4, 8, 16, 32] {
            cg(n, "via", class);
        }
    }
}

#[test]
fn class_a_verifies_at_1_2_4_ranks_over_via() {
    for n in [1, 2, 4] {
        cg(n, "via", "A");
    }
}

#[test]
fn class_s_verifies_over_tcp() {
    for n in [1, 2, 4, 8] {
        cg(n, "tcp", "S");
    }
}

#[test]
fn class_s_verifies_over_the_composite_device() {
    cg_on(4, "via", "S", true);
}

/// The benchmark table's program: one round of class S at 1 and 2 ranks
/// gives a row per cell (both layers verified, or it fails) and the
/// speed-up line.
#[test]
fn cg_bench_prints_the_table() {
    mttl_run();
    let out = Command::new(env!("CARGO_BIN_EXE_cg-bench")).args(["--classes", "S", "--ranks", "1,2", "--rounds", "1"]).output().expect("running cg-bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("S ")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert_eq!(rows[1].split_whitespace().nth(1), Some("2"), "{text}");
    assert!(rows[1].contains(" of 1 "), "one round compared: {text}");
    assert!(text.contains("class S: speed-up of 2 ranks over 1 (medians): VIA "), "{text}");
}

/// `--against-npb` alternates with the program in the folder it is given,
/// run under Open MPI's mpirun. NPB is not ours to ship, so the folder
/// here holds our own `cg` as `bin/cg.S.x` (it prints NPB's report): what
/// is checked is the harness (mpirun, the report's parsing, the rounds and
/// the table), not NPB.
#[test]
fn cg_bench_against_npb_runs_the_given_binary_under_mpirun() {
    mttl_run();
    if Command::new("mpirun").arg("--version").output().is_err() {
        panic!("needs Open MPI's mpirun: apt-get install openmpi-bin");
    }
    let dir = std::env::temp_dir().join(format!("cg-bench-npb-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cg"), dir.join("bin/cg.S.x")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cg-bench")).args(["--classes", "S", "--ranks", "1", "--rounds", "2", "--device", "composite", "--against-npb"]).arg(&dir).output().expect("running cg-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}{err}");
    assert!(text.contains("against NPB-MPI CG on Open MPI (shared memory, vader), 2 alternating rounds"), "{text}");
    let rows: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("S ")).collect();
    assert_eq!(rows.len(), 1, "{text}");
    assert!(rows[0].contains(" of 2 "), "two rounds compared: {text}");
    assert_eq!(err.matches(" npb: ").count(), 2, "two runs of the NPB side: {err}");
}

/// Without NPB's binary the harness says how to build it, and fails.
#[test]
fn cg_bench_against_npb_without_npb_says_how_to_build_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_cg-bench")).args(["--classes", "A", "--ranks", "1", "--against-npb", "/nonexistent/npb"]).output().expect("running cg-bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no cg.A.x in /nonexistent/npb") && err.contains("make cg CLASS=A"), "{err}");
}
