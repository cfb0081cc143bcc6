//! The build's profile (scripts/rustc-pgo, pgo/): which compiles take
//! it, and that the one committed can be read by this toolchain (a
//! profile of another LLVM would be left out of every optimized build,
//! silently). The wrapper is run with a stand-in rustc that prints what
//! it was given.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_path_buf()
}

/// A stand-in rustc in a fresh folder: answers `-vV` with LLVM `major`,
/// otherwise prints its arguments one a line.
fn stand_in(major: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new();
    let path = dir.0.join("rustc");
    std::fs::write(&path, format!("#!/bin/sh\nif [ \"$1\" = -vV ]; then echo 'LLVM version: {major}.1.2'; exit 0; fi\nfor a in \"$@\"; do echo \"$a\"; done\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, path)
}

/// A folder of this test's, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("via-pgo-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The profile's LLVM major version, as pgo/LLVM records it.
fn profile_major() -> String {
    std::fs::read_to_string(root().join("pgo/LLVM")).expect("pgo/LLVM: the profile's LLVM major version").trim().to_string()
}

/// The arguments the wrapper handed rustc for `args`, with `env` set.
fn wrapped(rustc: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let out = Command::new(root().join("scripts/rustc-pgo")).arg(rustc).args(args).env_remove("VIA_PGO").env_remove("VIA_PGO_GENERATE").envs(env.iter().copied()).output().expect("running scripts/rustc-pgo");
    assert!(out.status.success(), "the wrapper failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

const OPTIMIZED: [&str; 6] = ["--crate-name", "via_user", "via-user/src/lib.rs", "-C", "opt-level=3", "--crate-type=lib"];

#[test]
fn optimized_compiles_take_the_profile_and_nothing_else_changes() {
    let (_dir, rustc) = stand_in(&profile_major());
    let want = format!("-Cprofile-use={}", root().join("pgo/via.profdata").display());
    let got = wrapped(&rustc, &OPTIMIZED, &[]);
    assert_eq!(got[..OPTIMIZED.len()], OPTIMIZED.map(String::from), "the arguments pass unchanged, in order");
    assert_eq!(got[OPTIMIZED.len()..], [want.clone()], "an optimized compile takes the profile");
    // A registry crate too (fat LTO guides its decisions only where every
    // part was compiled with the profile).
    let dep = ["--crate-name", "libc", "/root/.cargo/registry/src/libc/src/lib.rs", "-C", "opt-level=3"];
    assert_eq!(wrapped(&rustc, &dep, &[]).last(), Some(&want));
}

#[test]
fn other_compiles_go_to_rustc_unchanged() {
    let (_dir, rustc) = stand_in(&profile_major());
    let cases: [(&[&str], &[(&str, &str)]); 5] = [
        (&["--crate-name", "via_user", "via-user/src/lib.rs", "-C", "opt-level=1"], &[]),
        (&["--crate-name", "build_script_build", "build.rs", "-C", "opt-level=0"], &[]),
        (&["--crate-name", "frame_parser", "fuzz_targets/frame_parser.rs", "-C", "opt-level=3", "-Zsanitizer=address"], &[]),
        (&["--crate-name", "via_user", "via-user/src/lib.rs", "-C", "opt-level=3", "-Cprofile-generate=/tmp/x"], &[]),
        (&OPTIMIZED, &[("VIA_PGO", "0")]),
    ];
    for (args, env) in cases {
        assert_eq!(wrapped(&rustc, args, env), args.iter().map(|a| a.to_string()).collect::<Vec<_>>(), "{args:?} with {env:?}");
    }
    let query = ["-", "--crate-name", "___", "--print=file-names", "--crate-type", "bin"];
    assert_eq!(wrapped(&rustc, &query, &[]), query, "cargo's questions pass");
}

#[test]
fn a_toolchain_of_another_llvm_builds_without_the_profile() {
    let other = (profile_major().parse::<u32>().expect("a number in pgo/LLVM") + 1).to_string();
    let (_dir, rustc) = stand_in(&other);
    assert_eq!(wrapped(&rustc, &OPTIMIZED, &[]), OPTIMIZED.map(String::from));
}

#[test]
fn making_a_profile_instruments_what_would_take_it() {
    let (_dir, rustc) = stand_in(&profile_major());
    let got = wrapped(&rustc, &OPTIMIZED, &[("VIA_PGO_GENERATE", "/tmp/counts")]);
    assert_eq!(got.last().map(String::as_str), Some("-Cprofile-generate=/tmp/counts"));
    assert!(!got.iter().any(|a| a.contains("profile-use")));
}

/// The committed profile is for this toolchain's LLVM, and cargo is told
/// to use the wrapper: otherwise optimized builds go without the profile
/// and nothing says so. When this fails after a toolchain update, make the
/// profile again: `scripts/pgo-profile.sh` (root; `apt-get install
/// llvm-N` for its llvm-profdata).
#[test]
fn the_committed_profile_is_this_toolchains() {
    let meta = root().join("pgo/via.profdata").metadata().expect("pgo/via.profdata: the build's profile (scripts/pgo-profile.sh)");
    assert!(meta.len() > 1024, "pgo/via.profdata holds {} bytes", meta.len());
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into())).arg("-vV").output().expect("rustc -vV");
    let text = String::from_utf8_lossy(&out.stdout);
    let major = text.lines().find_map(|l| l.strip_prefix("LLVM version: ")).and_then(|v| v.split('.').next()).expect("rustc -vV names its LLVM").to_string();
    assert_eq!(profile_major(), major, "pgo/via.profdata was made for LLVM {}, rustc's is {major}: run scripts/pgo-profile.sh", profile_major());
    let config = std::fs::read_to_string(root().join(".cargo/config.toml")).expect(".cargo/config.toml");
    assert!(config.lines().any(|l| l.trim() == "rustc-wrapper = \"scripts/rustc-pgo\""), ".cargo/config.toml names the wrapper");
}
