//! The VFIO path for real: runs `qemu/run.sh`, which boots a q35 guest with
//! the emulated intel-iommu once for each of its default boots — 2 and 4
//! tulips, 2 and 4 e1000e (82574L) NICs, and a mixed pair (one tulip, one
//! e1000e) — binds them to vfio-pci with via-agent and runs
//! `via-guest-suite` in it (see qemu/run.sh and
//! tests/src/bin/via-guest-suite/). Needs qemu-system-x86,
//! linux-image-amd64 and busybox-static (.ci/run installs them); without
//! them these tests fail and say what is missing.
//!
//! Checked here from run.sh's summary line of each boot
//! (`qemu/run.sh: N KIND NICs: B bound; guest: P passed, F failed, K
//! planned in ...`) and the guest's output before it: a result for each
//! default boot, in order; as many NICs bound as given, and of the kinds
//! given; nothing failed, every planned check passed and some were
//! planned; the 4-NIC checks (all-to-all over 4, CG on 4 ranks) ran on
//! both kinds; and run.sh's closing count of boots per kind. An `--only`
//! naming no check, and a boot it cannot make, fail before booting.

use std::process::{Command, Output};

fn run_sh(args: &[&str]) -> (Output, String, String) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash").arg(format!("{root}/qemu/run.sh")).args(args).current_dir(root).output().expect("running qemu/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// One boot's summary line, as numbers, and what the guest printed in
/// that boot (from run.sh's last `booting a guest` line before it).
struct BootResult {
    kind: String,
    nics: usize,
    bound: usize,
    passed: usize,
    failed: usize,
    planned: usize,
    output: Vec<String>,
}

/// The summary's numbers and how many lines the guest printed (its lines
/// themselves are shown where a check on them fails).
impl std::fmt::Debug for BootResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BootResult { kind, nics, bound, passed, failed, planned, output } = self;
        write!(f, "{nics} {kind} NICs: {bound} bound, {passed} passed, {failed} failed, {planned} planned ({} lines of output)", output.len())
    }
}

impl BootResult {
    /// Whether the guest printed `line` in this boot.
    fn printed(&self, line: &str) -> bool {
        self.output.iter().any(|l| l == line)
    }
}

/// Parses `qemu/run.sh: N KIND NICs: B bound; guest: P passed, F failed, K planned in ...`.
fn boot_result(line: &str) -> Option<BootResult> {
    let rest = line.strip_prefix("qemu/run.sh: ")?;
    let (nics, rest) = rest.split_once(' ')?;
    let (kind, rest) = rest.split_once(" NICs: ")?;
    let (bound, rest) = rest.split_once(" bound; guest: ")?;
    let (passed, rest) = rest.split_once(" passed, ")?;
    let (failed, rest) = rest.split_once(" failed, ")?;
    let (planned, _) = rest.split_once(" planned")?;
    let n = |s: &str| s.trim().parse().ok();
    Some(BootResult { kind: kind.to_string(), nics: n(nics)?, bound: n(bound)?, passed: n(passed)?, failed: n(failed)?, planned: n(planned)?, output: Vec::new() })
}

/// Every boot's result in run.sh's output, each with the guest's lines.
fn boot_results(stdout: &str) -> Vec<BootResult> {
    let mut results = Vec::new();
    let mut output = Vec::new();
    for l in stdout.lines() {
        if l.starts_with("qemu/run.sh: booting a guest with ") {
            output.clear();
        } else if let Some(mut r) = boot_result(l) {
            r.output = std::mem::take(&mut output);
            results.push(r);
        } else {
            output.push(l.to_string());
        }
    }
    results
}

#[test]
fn guest_suite_passes_on_every_nic_kind_through_vfio() {
    let (out, stdout, stderr) = run_sh(&[]);
    // The summary lines, shown with --nocapture.
    for l in stdout.lines().filter(|l| l.starts_with("qemu/run.sh:") || l.starts_with("guest:") || l.starts_with("FAIL")) {
        println!("{l}");
    }
    assert!(out.status.success(), "qemu/run.sh failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    let results = boot_results(&stdout);
    let boots: Vec<(&str, usize)> = results.iter().map(|r| (r.kind.as_str(), r.nics)).collect();
    assert_eq!(boots, [("tulip", 2), ("tulip", 4), ("e1000e", 2), ("e1000e", 4), ("mixed", 2)], "expected one result for each default boot: {results:?}\n{stdout}");
    for r in &results {
        let what = format!("{} {} NICs", r.nics, r.kind);
        assert_eq!(r.bound, r.nics, "{what}: {} bound to vfio-pci", r.bound);
        assert_eq!(r.failed, 0, "{what}: {r:?}");
        assert!(r.planned > 0, "{what}: no check planned: {r:?}");
        assert_eq!(r.passed, r.planned, "{what}: not every planned check passed: {r:?}");
        // Bound by kind as given: a mixed boot's NICs alternate, so a pair is one of each.
        let kinds = match r.kind.as_str() {
            "mixed" => format!("tulip:{},e1000e:{}", r.nics.div_ceil(2), r.nics / 2),
            k => format!("{k}:{}", r.nics),
        };
        let bound_line = format!("guest: {} NICs bound to vfio-pci ({kinds}), {} given ({kinds}),", r.nics, r.nics);
        assert!(r.output.iter().any(|l| l.starts_with(&bound_line)), "{what}: the guest did not print {bound_line:?}:\n{}", r.output.join("\n"));
        let mut checks = vec!["nics_bound_match_the_nics_given".to_string(), "open_every_nic".into(), format!("all_to_all_{}_nics", r.nics), "cg_class_s_2_ranks".into()];
        if r.nics >= 4 {
            checks.push("cg_class_s_4_ranks".into());
        }
        if r.kind == "e1000e" {
            checks.push("jumbo_frames_on_two_e1000e".into());
        }
        for check in checks {
            assert!(r.printed(&format!("PASS {check}")), "{what}: no \"PASS {check}\" in the guest's output:\n{}", r.output.join("\n"));
        }
    }
    // Each kind's 4-NIC boot plans more checks than its 2-NIC one (CG on 4 ranks).
    for k in [0, 2] {
        assert!(results[k + 1].planned > results[k].planned, "the {} 4-NIC boot planned no more checks than the 2-NIC one: {results:?}", results[k].kind);
    }
    // The closing count of boots per kind.
    for (kind, boots) in [("tulip", 2), ("e1000e", 2), ("mixed", 1)] {
        let line = format!("qemu/run.sh: {kind}: {boots} passed, 0 failed (boots)");
        assert!(stdout.lines().any(|l| l == line), "no {line:?} in run.sh's output:\n{stdout}");
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

#[test]
fn a_boot_it_cannot_make_fails_before_booting() {
    for (arg, says) in [("mixed:1", "--boot mixed:1: the suite needs at least 2 NICs"), ("virtio:2", "--boot virtio:2: expected KIND:N, KIND one of tulip, e1000e, mixed")] {
        let (out, stdout, stderr) = run_sh(&["--boot", "tulip:2", "--boot", arg]);
        assert!(!out.status.success(), "qemu/run.sh --boot {arg} passed:\n{stdout}\n{stderr}");
        assert!(stderr.contains(says), "--boot {arg}: the error does not say {says:?}:\n{stderr}");
        assert!(!stdout.contains("booting a guest"), "--boot {arg}: a guest was booted:\n{stdout}");
    }
}
