//! Frame authentication across two real hosts (namespaces joined by a
//! veth pair, one `via-testpeer` each, AF_PACKET): with the same cluster
//! secret on both, every message arrives intact and every frame was
//! authenticated; with different secrets, or a secret on one side only,
//! the connection fails with an error that says so (never a hang, never a
//! connection). Needs root.

use std::path::PathBuf;
use std::process::Output;
use via_tests::{assert_ok, hosts_file, Proc, TestNet};

const PEER: &str = env!("CARGO_BIN_EXE_via-testpeer");
const SIZES: &str = "0,1,1419,1420,1421,2847,65536,1048576";

/// A fresh secret file, mode 0600, in a private directory.
fn secret(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("via-auth-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let p = dir.join("secret");
    via_kernel_agent::auth::create_secret_file(&p).unwrap();
    p
}

/// Runs the `sizes` scenario, the server on host a with `server_secret`,
/// the client on host b with `client_secret`; returns both outputs.
fn run(net: &TestNet, server_secret: Option<&PathBuf>, client_secret: Option<&PathBuf>) -> (Output, Output) {
    let mut cmd = net.command(&net.a, PEER, &["server", "sizes", "--dev", &net.dev_a(), "--level", "rel", "--sizes", SIZES]);
    cmd.env_remove("VIA_SECRET");
    if let Some(s) = server_secret {
        cmd.env("VIA_SECRET", s);
    }
    let mut server = Proc::spawn("server", cmd);
    let mac = server.expect_line("READY");
    let hosts = hosts_file(&std::env::temp_dir(), &[("server", &mac)]);
    let mut cmd = net.command(&net.b, PEER, &["client", "sizes", "--dev", &net.dev_b(), "--peer", "server", "--level", "rel", "--sizes", SIZES]);
    cmd.env("VIA_HOSTS", &hosts).env_remove("VIA_SECRET");
    if let Some(s) = client_secret {
        cmd.env("VIA_SECRET", s);
    }
    let client = Proc::spawn("client", cmd).finish();
    let _ = std::fs::remove_file(hosts);
    if !client.status.success() {
        server.kill(); // it waits for a connection that will not come
    }
    (client, server.finish())
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The number after `key` on the client's `AUTH` line.
fn auth_counter(out: &str, key: &str) -> u64 {
    let line = out.lines().find(|l| l.starts_with("AUTH ")).unwrap_or_else(|| panic!("no AUTH line in {out}"));
    let mut words = line.split_whitespace();
    words.find(|w| *w == key).and_then(|_| words.next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn the_same_secret_on_both_hosts_authenticates_every_frame() {
    let net = TestNet::new(1500);
    let s = secret("same");
    let (client, server) = run(&net, Some(&s), Some(&s));
    assert_ok("client", &client);
    assert_ok("server", &server);
    let out = text(&client);
    assert!(out.contains("OK 8"), "{out}");
    // 1 MiB each way alone is over 700 frames each way.
    assert!(auth_counter(&out, "authenticated") > 700, "{out}");
    assert_eq!(auth_counter(&out, "bad_auth"), 0, "{out}");
    assert_eq!(auth_counter(&out, "bad_checksum"), 0, "{out}");
}

#[test]
fn different_secrets_fail_to_connect_and_say_why() {
    let net = TestNet::new(1500);
    let (a, b) = (secret("a"), secret("b"));
    let (client, _server) = run(&net, Some(&a), Some(&b));
    let out = text(&client);
    assert!(!client.status.success(), "connected with different secrets: {out}");
    assert!(out.contains("ConnectRequest") && out.contains("cluster secret"), "{out}");
    assert!(!out.contains("OK "), "{out}");
}

#[test]
fn a_keyed_server_refuses_an_unkeyed_client_at_once() {
    let net = TestNet::new(1500);
    let s = secret("server-only");
    let (client, _server) = run(&net, Some(&s), None);
    let out = text(&client);
    assert!(!client.status.success(), "an unkeyed client connected to a keyed server: {out}");
    assert!(out.contains("VIP_REJECT") || out.contains("refused the connection"), "{out}");
    assert!(out.contains("cluster secret"), "{out}");
}

#[test]
fn a_keyed_client_learns_that_the_server_has_no_secret() {
    let net = TestNet::new(1500);
    let s = secret("client-only");
    let (client, _server) = run(&net, None, Some(&s));
    let out = text(&client);
    assert!(!client.status.success(), "a keyed client connected to an unkeyed server: {out}");
    assert!(out.contains("no authenticated answer") && out.contains("cluster secret"), "{out}");
}

#[test]
fn a_secret_readable_by_others_is_refused_naming_the_file_and_mode() {
    use std::os::unix::fs::PermissionsExt;
    let net = TestNet::new(1500);
    let s = secret("loose");
    std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = net.command(&net.a, PEER, &["server", "sizes", "--dev", &net.dev_a(), "--level", "rel", "--sizes", "1"]);
    cmd.env("VIA_SECRET", &s);
    let out = Proc::spawn("server", cmd).finish();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(&s.display().to_string()) && t.contains("0644"), "{t}");
}
