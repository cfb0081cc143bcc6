//! CG on MTTL as real processes: `mttl-run -n N -- cg --class X` for
//! classes S and W at 1 to 32 ranks and class A at 1, 2 and 4 ranks over
//! VIA (the software NIC; 32 ranks on this 2-core machine are heavily
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

fn cg(n: usize, transport: &str, class: &str) {
    let out = Command::new(mttl_run())
        .args(["-n", &n.to_string(), "--transport", transport, "--timeout", "600", "--", CG, "--class", class])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running mttl-run");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "class {class} at {n} ranks over {transport} failed:\n{text}");
    assert!(text.contains("[0]  VERIFICATION SUCCESSFUL"), "class {class} at {n} ranks over {transport}:\n{text}");
    let procs = text.lines().find(|l| l.contains("Total processes")).and_then(|l| l.split('=').nth(1)).map(|v| v.trim().to_string());
    assert_eq!(procs.as_deref(), Some(n.to_string().as_str()), "{text}");
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
