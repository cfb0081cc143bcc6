//! The fuzz targets' bodies (`via_tests::rig::scenarios`) on the seed
//! inputs in `fuzz/seeds/`, so `cargo test` runs them without cargo fuzz
//! (inputs that once failed are in `fuzz_regressions.rs`). The
//! receive_path seeds (written by `fuzz/receive_path_seeds.py`) are also
//! checked to still do what their names say, so that a change of the
//! input format cannot quietly turn them into runs that test nothing.

use std::path::{Path, PathBuf};
use via_tests::rig::receive_path::{run_receive_path, Summary};
use via_tests::rig::scenarios;

fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    assert!(!paths.is_empty(), "no seeds in {}", dir.display());
    paths
}

/// Runs `body` on every seed of `target`, then fails naming each seed
/// whose run failed (its panic message is printed above).
fn each_seed(target: &str, body: impl Fn(&str, &[u8])) {
    let mut failed = Vec::new();
    for p in seeds(target) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let data = std::fs::read(&p).unwrap();
        eprintln!("{}", p.display());
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&name, &data))).is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "{target} seeds failed: {failed:?}");
}

fn run(target: &str, body: fn(&[u8])) {
    each_seed(target, |_, data| body(data));
}

#[test]
fn frame_parser_seeds() {
    run("frame_parser", scenarios::parse_frame);
}

/// Each seed passes the oracle; those named for a foreign frame had it
/// dropped as another connection's, those named for a violation broke
/// the connection (but the one whose violation came out of sequence),
/// and the genuine messages of every seed that did not break arrived.
#[test]
fn receive_path_seeds() {
    each_seed("receive_path", |name, data| {
        let s: Summary = run_receive_path(data);
        eprintln!("  {s:?}");
        if name.starts_with("stale_") || name.starts_with("foreign_") || name.starts_with("mixed_") {
            assert!(s.rx_stale >= 1, "{name}: no frame reached the victim's check of the connection: {s:?}");
        }
        let breaks = name.starts_with("violation_") && name != "violation_stale_psn";
        assert_eq!(s.broken, breaks, "{name}: {s:?}");
        assert_eq!(s.rdma_prot_errors, u64::from(breaks), "{name}: {s:?}");
        if !breaks {
            assert!(s.to_victim >= 3, "{name}: the genuine messages ran: {s:?}");
        }
    });
}

#[test]
fn descriptors_seeds() {
    run("descriptors", scenarios::post_descriptors);
}
