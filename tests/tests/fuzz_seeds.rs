//! The fuzz targets' bodies (`via_tests::rig::scenarios`) on the seed
//! inputs in `fuzz/seeds/` and on every input that once made a target fail
//! (`fuzz/regressions/`), so `cargo test` runs them without cargo fuzz.

use std::path::Path;
use via_tests::rig::scenarios;

fn run_dir(dir: &Path, body: fn(&[u8])) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for e in entries {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        eprintln!("{}", p.display()); // shown when it fails
        body(&data);
        n += 1;
    }
    n
}

fn run(target: &str, body: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let seeds = run_dir(&fuzz.join("seeds").join(target), body);
    assert!(seeds > 0, "no seeds for {target} in {}", fuzz.display());
    run_dir(&fuzz.join("regressions").join(target), body);
}

#[test]
fn frame_parser_seeds_and_regressions() {
    run("frame_parser", scenarios::parse_frame);
}

#[test]
fn receive_path_seeds_and_regressions() {
    run("receive_path", scenarios::receive_path);
}

#[test]
fn descriptors_seeds_and_regressions() {
    run("descriptors", scenarios::post_descriptors);
}
