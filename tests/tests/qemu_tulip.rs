//! The tulip/VFIO path for real: runs `qemu/run.sh`, which boots a q35 guest
//! with the emulated intel-iommu and 2, then 4, emulated tulip NICs, binds
//! them to vfio-pci with via-agent and runs `via-guest-suite` in it (see
//! qemu/run.sh and tests/src/bin/via-guest-suite/). Needs
//! qemu-system-x86, linux-image-amd64 and busybox-static (.ci/run installs
//! them); without them this test fails and says what is missing.

use std::process::Command;

#[test]
fn guest_suite_passes_on_tulips_through_vfio() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash").arg(format!("{root}/qemu/run.sh")).current_dir(root).output().expect("running qemu/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The summary lines, shown with --nocapture.
    for l in stdout.lines().filter(|l| l.starts_with("qemu/run.sh:") || l.starts_with("guest:") || l.starts_with("FAIL")) {
        println!("{l}");
    }
    assert!(out.status.success(), "qemu/run.sh failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    let results: Vec<_> = stdout.lines().filter(|l| l.starts_with("qemu/run.sh:") && l.contains("passed")).collect();
    assert_eq!(results.len(), 2, "expected a result for 2 and for 4 NICs:\n{stdout}");
    assert!(results.iter().all(|l| l.contains(" 0 failed")), "{results:?}");
}
