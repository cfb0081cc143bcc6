//! The tulip/VFIO path for real: runs `qemu/run.sh`, which boots a q35 guest
//! with the emulated intel-iommu and 2, then 4, emulated tulip NICs, binds
//! them to vfio-pci with via-agent and runs `via-guest-suite` in it (see
//! qemu/run.sh and tests/src/bin/via-guest-suite/). Needs
//! qemu-system-x86, linux-image-amd64 and busybox-static (.ci/run installs
//! them); without them these tests fail and say what is missing.
//!
//! Checked here from run.sh's summary line of each boot
//! (`qemu/run.sh: N NICs: B tulips bound; guest: P passed, F failed, K
//! planned in ...`): a result for 2 and for 4 NICs, as many tulips bound
//! as given, nothing failed, every planned check passed and some were
//! planned, and the 4-NIC checks (all-to-all over 4, CG on 4 ranks) ran.
//! An `--only` naming no check fails before booting, naming the known ones.

use std::process::{Command, Output};

fn run_sh(args: &[&str]) -> (Output, String, String) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash").arg(format!("{root}/qemu/run.sh")).args(args).current_dir(root).output().expect("running qemu/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// One boot's summary line, as numbers.
#[derive(Debug)]
struct BootResult {
    nics: usize,
    bound: usize,
    passed: usize,
    failed: usize,
    planned: usize,
}

/// Parses `qemu/run.sh: N NICs: B tulips bound; guest: P passed, F failed, K planned in ...`.
fn boot_result(line: &str) -> Option<BootResult> {
    let rest = line.strip_prefix("qemu/run.sh: ")?;
    let (nics, rest) = rest.split_once(" NICs: ")?;
    let (bound, rest) = rest.split_once(" tulips bound; guest: ")?;
    let (passed, rest) = rest.split_once(" passed, ")?;
    let (failed, rest) = rest.split_once(" failed, ")?;
    let (planned, _) = rest.split_once(" planned")?;
    let n = |s: &str| s.trim().parse().ok();
    Some(BootResult { nics: n(nics)?, bound: n(bound)?, passed: n(passed)?, failed: n(failed)?, planned: n(planned)? })
}

#[test]
fn guest_suite_passes_on_tulips_through_vfio() {
    let (out, stdout, stderr) = run_sh(&[]);
    // The summary lines, shown with --nocapture.
    for l in stdout.lines().filter(|l| l.starts_with("qemu/run.sh:") || l.starts_with("guest:") || l.starts_with("FAIL")) {
        println!("{l}");
    }
    assert!(out.status.success(), "qemu/run.sh failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    let results: Vec<BootResult> = stdout.lines().filter_map(boot_result).collect();
    assert_eq!(results.iter().map(|r| r.nics).collect::<Vec<_>>(), [2, 4], "expected one result for 2 and one for 4 NICs: {results:?}\n{stdout}");
    for r in &results {
        assert_eq!(r.bound, r.nics, "{} NICs given, {} tulips bound to vfio-pci: {r:?}", r.nics, r.bound);
        assert_eq!(r.failed, 0, "{r:?}");
        assert!(r.planned > 0, "no check planned: {r:?}");
        assert_eq!(r.passed, r.planned, "not every planned check passed: {r:?}");
    }
    // The 4-NIC boot plans more checks than the 2-NIC one (CG on 4 ranks).
    assert!(results[1].planned > results[0].planned, "the 4-NIC boot planned no more checks than the 2-NIC one: {results:?}");
    for check in ["tulips_bound_match_the_nics_given", "all_to_all_2_nics", "all_to_all_4_nics", "cg_class_s_2_ranks", "cg_class_s_4_ranks"] {
        assert!(stdout.lines().any(|l| l == format!("PASS {check}")), "no \"PASS {check}\" in the guests' output:\n{stdout}");
    }
}

#[test]
fn only_naming_no_check_fails_before_booting() {
    let (out, stdout, stderr) = run_sh(&["--nics", "2", "--only", "nosuchcheck"]);
    assert!(!out.status.success(), "qemu/run.sh --only nosuchcheck passed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("no check matches \"nosuchcheck\""), "the error does not name the unknown check:\n{stderr}");
    assert!(stderr.contains("open_every_nic") && stderr.contains("cg_class_s_2_ranks"), "the error does not list the known checks:\n{stderr}");
    assert!(!stdout.contains("booting a guest"), "a guest was booted for an unknown check:\n{stdout}");
}
