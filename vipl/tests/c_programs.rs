//! The C programs of `tests/c/`, compiled with `cc` and run. With
//! `VIPL_PREFIX` set (as `.ci/run` does after `scripts/install-vipl.sh
//! PREFIX`) they are compiled against the installed header and library
//! through `pkg-config --cflags --libs vipl`; otherwise against
//! `include/vipl.h` and the `libvipl.so` of this build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The directory holding the libvipl.so of this build: the test binary's
/// `deps/`, where `cargo test` builds it (the copy one level up is only
/// refreshed by `cargo build`, and may be older).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps, deps.parent().unwrap()] {
        if d.join("libvipl.so").exists() {
            return d.to_path_buf();
        }
    }
    panic!("libvipl.so not found near {}", exe.display());
}

/// The compiler flags for the header and library: from pkg-config under
/// `VIPL_PREFIX`, or the build tree.
fn vipl_flags() -> Vec<String> {
    if let Some(prefix) = std::env::var_os("VIPL_PREFIX") {
        let pc = Path::new(&prefix).join("lib/pkgconfig");
        let out = Command::new("pkg-config").env("PKG_CONFIG_PATH", &pc).args(["--cflags", "--libs", "vipl"]).output().expect("running pkg-config");
        assert!(out.status.success(), "pkg-config vipl under {}: {}", pc.display(), String::from_utf8_lossy(&out.stderr));
        return String::from_utf8_lossy(&out.stdout).split_whitespace().map(String::from).collect();
    }
    vec![format!("-I{}", root().join("include").display()), format!("-L{}", lib_dir().display()), "-lvipl".into()]
}

/// Compiles `tests/c/<name>.c` into `out`.
fn build(name: &str, out: &Path) {
    let src = root().join("tests/c").join(format!("{name}.c"));
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-D_POSIX_C_SOURCE=200809L", "-D_ISOC11_SOURCE"])
        .arg(&src)
        .args(vipl_flags())
        .args(["-lpthread", "-o"])
        .arg(out)
        .output()
        .expect("running cc (the C compiler is needed for the C ABI tests)");
    assert!(cc.status.success(), "compiling {}: {}", src.display(), String::from_utf8_lossy(&cc.stderr));
}

/// Where the library the programs load lives.
fn lib_path() -> PathBuf {
    match std::env::var_os("VIPL_PREFIX") {
        Some(p) => Path::new(&p).join("lib"),
        None => lib_dir(),
    }
}

/// Compiles `tests/c/<name>.c` and runs it; returns its stdout.
fn build_and_run(name: &str, env: &[(&str, &str)]) -> String {
    let out = std::env::temp_dir().join(format!("vipl-{name}-{}", std::process::id()));
    build(name, &out);
    let lib = lib_path();
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

#[test]
fn every_provokable_error_return_in_a_test_host() {
    use via_tests::{assert_ok, Proc, TestNet};
    let exe = std::env::temp_dir().join(format!("vipl-errors-ns-{}", std::process::id()));
    build("errors", &exe);
    let net = TestNet::new(1500);
    let lib = lib_path();
    let cmd = net.command(&net.a, "env", &[&format!("LD_LIBRARY_PATH={}", lib.display()), "VIA_HOSTS=/dev/null", "VIA_NS_TIMEOUT_MS=50", exe.to_str().unwrap(), &net.dev_a()]);
    let out = Proc::spawn("errors", cmd).finish();
    let _ = std::fs::remove_file(&exe);
    assert_ok("errors", &out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK errors"));
}

/// `libvipl.a` next to the `libvipl.so` the other tests load.
fn static_archive() -> PathBuf {
    let a = lib_path().join("libvipl.a");
    assert!(a.exists(), "{} is missing (vipl builds a staticlib)", a.display());
    a
}

/// A program linked against the static archive still opens devices: the
/// drivers register themselves by being linked, and a static link keeps only
/// the archive members something refers to (libvipl names each driver's
/// registration so that they stay).
#[test]
fn a_program_linked_with_the_static_archive_opens_devices() {
    let src = root().join("tests/c/threads.c");
    let out = std::env::temp_dir().join(format!("vipl-static-threads-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-D_POSIX_C_SOURCE=200809L", "-D_ISOC11_SOURCE"])
        .arg(format!("-I{}", root().join("include").display()))
        .arg(&src)
        .arg(static_archive())
        // What a Rust staticlib needs from the C library (rustc --print native-static-libs).
        .args(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc", "-o"])
        .arg(&out)
        .output()
        .expect("running cc");
    assert!(cc.status.success(), "linking {} with libvipl.a: {}", src.display(), String::from_utf8_lossy(&cc.stderr));
    let ldd = Command::new("ldd").arg(&out).output().unwrap();
    assert!(!String::from_utf8_lossy(&ldd.stdout).contains("libvipl"), "the program must not load libvipl.so");
    let run = Command::new(&out).output().unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(run.status.success(), "statically linked threads.c failed ({}):\n{}\n{}", run.status, String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stdout).contains("OK threads"));
}

/// The extensions of `vipl_ext.h`: remote atomics built with
/// `VipExtAtomicDescriptor` and posted with `VipPostSend`, and a shared
/// receive queue (`VipExtCreateSrq` and the rest).
#[test]
fn extensions_from_c() {
    let out = build_and_run("atomics", &[]);
    assert!(out.contains("OK atomics") && out.contains("OK pool"), "{out}");
}

#[test]
fn calls_from_four_threads_at_once() {
    let out = build_and_run("threads", &[]);
    assert!(out.contains("OK threads"), "{out}");
}

/// Runs `tests/c/twohost.c` SCENARIO across two namespaces (server on host
/// a, client on host b); returns the client's stdout.
fn two_hosts(scenario: &str) -> String {
    use via_tests::{assert_ok, Proc, TestNet};
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let exe = BUILT.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("vipl-twohost-{}", std::process::id()));
        build("twohost", &p);
        p
    });
    let lib = lib_path();
    let net = TestNet::new(1500);
    let exe_s = exe.to_str().unwrap();
    let mut cmd = net.command(&net.a, "env", &[&format!("LD_LIBRARY_PATH={}", lib.display()), exe_s, "server", scenario, &net.dev_a()]);
    cmd.env("LD_LIBRARY_PATH", &lib);
    let mut server = Proc::spawn("server", cmd);
    let mac = server.expect_line("READY");
    let cmd = net.command(&net.b, "env", &[&format!("LD_LIBRARY_PATH={}", lib.display()), exe_s, "client", scenario, &net.dev_b(), &mac]);
    let mut client = Proc::spawn("client", cmd);
    let client_mac = client.expect_line("READY");
    server.write_line(&client_mac);
    let client = client.finish();
    let server = server.finish();
    assert_ok("C client", &client);
    assert_ok("C server", &server);
    String::from_utf8_lossy(&client.stdout).into_owned() + &String::from_utf8_lossy(&server.stdout)
}

#[test]
fn c_pingpong_with_a_cq_across_two_hosts() {
    let out = two_hosts("pingpong");
    assert!(out.contains("LATENCY_US"), "{out}");
}

#[test]
fn c_pingpong_with_recv_wait_across_two_hosts() {
    let out = two_hosts("pingwait");
    assert!(out.contains("LATENCY_US"), "{out}");
}

#[test]
fn c_pingpong_with_receives_through_a_cq_across_two_hosts() {
    let out = two_hosts("pingrcq");
    assert!(out.contains("LATENCY_US"), "{out}");
}

#[test]
fn c_rdma_write_with_immediate_data() {
    let out = two_hosts("rdmaimm");
    assert!(out.contains("OK rdmaimm"), "{out}");
}

#[test]
fn c_rejected_connection() {
    let out = two_hosts("reject");
    assert!(out.contains("OK reject"), "{out}");
}

#[test]
fn c_peer_to_peer_connection() {
    let out = two_hosts("peer");
    assert_eq!(out.matches("OK peer").count(), 2, "{out}");
}

/// Runs `tests/c/misuse.c MODE` (see its header); returns (stdout, stderr).
fn misuse(mode: &str, env: &[(&str, &str)]) -> (String, String) {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let exe = BUILT.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("vipl-misuse-{}", std::process::id()));
        build("misuse", &p);
        p
    });
    let run = Command::new(exe).arg(mode).env("LD_LIBRARY_PATH", lib_path()).envs(env.iter().copied()).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&run.stdout).into_owned(), String::from_utf8_lossy(&run.stderr).into_owned());
    assert!(run.status.success(), "misuse {mode} failed ({}):\n{out}\n{err}", run.status);
    assert!(out.contains(&format!("OK {mode}")), "{out}");
    (out, err)
}

#[test]
fn close_nic_is_refused_while_its_objects_exist_and_says_which() {
    let (_, err) = misuse("close", &[("VIPL_VERBOSE", "1")]);
    let refusal = err.lines().find(|l| l.contains("VipCloseNic: the NIC still has")).unwrap_or_else(|| panic!("no refusal message:\n{err}"));
    for what in ["1 VI", "1 CQ", "1 protection tag"] {
        assert!(refusal.contains(what), "{refusal}");
    }
    assert!(refusal.starts_with("vipl: VIP_INVALID_STATE"), "{refusal}");
}

#[test]
fn a_hundred_open_connect_close_cycles_leave_fds_threads_and_rss_at_baseline() {
    let (out, _) = misuse("cycles", &[]);
    assert!(out.contains("after 100 cycles"), "{out}");
}

#[test]
fn a_receive_whose_memory_is_deregistered_completes_with_a_protection_error() {
    misuse("recvgone", &[]);
}

#[test]
fn a_send_whose_buffer_is_deregistered_completes_alone_with_a_protection_error() {
    misuse("sendgone", &[]);
}

#[test]
fn waits_are_woken_by_disconnect_and_destroy() {
    misuse("wake", &[]);
}

#[test]
fn a_cq_of_another_nic_is_refused() {
    misuse("foreigncq", &[]);
}

#[test]
fn cq_overflow_reaches_the_error_callback_as_catastrophic_cq() {
    misuse("cqoverflow", &[]);
}
