//! Running another project's benchmark tool as a baseline: its server
//! pinned to CPU 0, its client to CPU 1 (as every transport of the demo),
//! both in this namespace over the loopback for their own handshake. The
//! client is refused until the server listens, and the tools give no sign
//! that they do: the client tries again (each try a process that gives up
//! at once) while the server runs, for at most 5 s.

use std::process::{Command, Stdio};
use std::time::Duration;

/// A free TCP port on the loopback, for a tool's own handshake.
pub fn free_port(what: &str) -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("{what}: a port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("{what}: a port: {e}"))
}

/// Runs `program` as server (`server_args`) and client (`client_args`),
/// each with `env`; returns what `result` finds in the client's output.
pub fn server_client<T>(what: &str, program: &str, env: &[(&str, &str)], server_args: &[String], client_args: &[String], result: impl Fn(&str) -> Option<T>) -> Result<T, String> {
    let command = |cpu: &str, args: &[String]| {
        let mut c = Command::new("taskset");
        c.args(["-c", cpu, program]).args(args).envs(env.iter().copied());
        c
    };
    let mut server = command("0", server_args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|e| format!("{what}: server: {e}"))?;
    crate::cleanup::track(server.id());
    let mut last = String::new();
    for _ in 0..500 {
        let out = command("1", client_args).output().map_err(|e| format!("{what}: client: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(v) = result(&text) {
            let _ = server.wait();
            return Ok(v);
        }
        last = format!("{} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim());
        if server.try_wait().is_ok_and(|s| s.is_some()) {
            let mut err = String::new();
            if let Some(mut e) = server.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("{what}: the server stopped: {} (client: {last})", err.trim()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = server.kill();
    let _ = server.wait();
    Err(format!("{what}: {last}"))
}
