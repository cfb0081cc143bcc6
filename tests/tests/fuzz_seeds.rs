//! The fuzz targets' bodies (`via_tests::rig::scenarios`) on the seed
//! inputs in `fuzz/seeds/`, so `cargo test` runs them without cargo fuzz
//! (inputs that once failed are in `fuzz_regressions.rs`).

use std::path::Path;
use via_tests::rig::scenarios;

fn run(target: &str, body: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut n = 0;
    for e in entries {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        eprintln!("{}", p.display()); // shown when it fails
        body(&data);
        n += 1;
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}

#[test]
fn frame_parser_seeds() {
    run("frame_parser", scenarios::parse_frame);
}

#[test]
fn receive_path_seeds() {
    run("receive_path", scenarios::receive_path);
}

#[test]
fn descriptors_seeds() {
    run("descriptors", scenarios::post_descriptors);
}
