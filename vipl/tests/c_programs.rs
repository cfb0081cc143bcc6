//! The C programs of `tests/c/`, compiled with `cc` against the shipped
//! `include/vipl.h` and the `libvipl.so` this build made, then run.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The directory holding the libvipl.so of this build (next to the test
/// binary's `deps/`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps.parent().unwrap(), deps] {
        if d.join("libvipl.so").exists() {
            return d.to_path_buf();
        }
    }
    panic!("libvipl.so not found near {}", exe.display());
}

/// Compiles `tests/c/<name>.c` and runs it; returns its stdout.
fn build_and_run(name: &str, env: &[(&str, &str)]) -> String {
    let out = std::env::temp_dir().join(format!("vipl-{name}-{}", std::process::id()));
    let src = root().join("tests/c").join(format!("{name}.c"));
    let lib = lib_dir();
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-D_POSIX_C_SOURCE=200809L", "-D_ISOC11_SOURCE", "-I"])
        .arg(root().join("include"))
        .arg(&src)
        .arg("-L")
        .arg(&lib)
        .args(["-lvipl", "-lpthread", "-o"])
        .arg(&out)
        .output()
        .expect("running cc (the C compiler is needed for the C ABI tests)");
    assert!(cc.status.success(), "compiling {}: {}", src.display(), String::from_utf8_lossy(&cc.stderr));
    let run = Command::new(&out).env("LD_LIBRARY_PATH", &lib).envs(env.iter().copied()).output().unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(run.status.success(), "{name} failed ({}):\n{}\n{}", run.status, String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn layouts_and_all_41_functions_link() {
    let out = build_and_run("layout", &[]);
    assert!(out.contains("OK 41 functions"), "{out}");
}

#[test]
fn every_provokable_error_return() {
    let out = build_and_run("errors", &[("VIA_HOSTS", "/dev/null"), ("VIA_NS_TIMEOUT_MS", "50")]);
    assert!(out.contains("OK errors"), "{out}");
}
