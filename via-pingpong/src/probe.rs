//! The C probe (`probe/sockprobe.c`, built by via-user's build script and
//! embedded here): the simplest fast TCP and UDP ping-pong, one busy-polled
//! `send`/`recv` per message, against which the demo holds its own `tcp`
//! and `udp` baselines. Demo transports `c-tcp` and `c-udp` (64 B latency).

use crate::common::Row;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

static PROBE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sockprobe"));

/// The probe's binary written to a private file; removed when dropped.
pub struct Probe {
    path: PathBuf,
}

impl Probe {
    /// Writes the embedded probe out; an error says why it is missing.
    pub fn install() -> Result<Probe, String> {
        if PROBE.is_empty() {
            return Err("the C probe was not built (no C compiler when via-pingpong was built)".into());
        }
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::env::temp_dir().join(format!("via-sockprobe-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o700).open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        std::io::Write::write_all(&mut f, PROBE).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Probe { path })
    }

    /// One latency run of `proto` ("tcp" or "udp") at `size` bytes: the
    /// server in namespace `server_ns` on `ip:port`, pinned to CPU 0, the
    /// client in `client_ns` on CPU 1 (as the demo pins every transport).
    #[allow(clippy::too_many_arguments)] // where and how the pair runs, as the demo's other runs are given
    pub fn latency(&self, proto: &str, server_ns: &str, client_ns: &str, ip: &str, port: u16, size: usize, count: usize) -> Result<Row, String> {
        let exe = self.path.to_string_lossy().to_string();
        let args = |ns: &str, role: &str, cpu: &str| -> Vec<String> {
            ["netns", "exec", ns, &exe, role, proto, ip, &port.to_string(), &size.to_string(), &count.to_string(), cpu].map(String::from).to_vec()
        };
        let mut server = Command::new("ip").args(args(server_ns, "server", "0")).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
        crate::cleanup::track(server.id());
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "READY" {
            let _ = server.kill();
            let mut err = String::new();
            let _ = server.stderr.take().unwrap().read_to_string(&mut err);
            return Err(format!("c-{proto} server did not start: {}", err.trim()));
        }
        let out = Command::new("ip").args(args(client_ns, "client", "1")).output().map_err(|e| e.to_string())?;
        let sres = server.wait().map_err(|e| e.to_string())?;
        crate::cleanup::untrack(server.id());
        if !out.status.success() || !sres.success() {
            return Err(format!("c-{proto}: client {}, server {}: {}", out.status, sres, String::from_utf8_lossy(&out.stderr).trim()));
        }
        parse(&format!("c-{proto}"), size, &String::from_utf8_lossy(&out.stdout)).ok_or_else(|| format!("c-{proto}: cannot read {:?}", String::from_utf8_lossy(&out.stdout)))
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads the client's line `t_min_us=.. t_typical_us=.. t_p99_us=.. iters=N`.
fn parse(name: &str, size: usize, out: &str) -> Option<Row> {
    let field = |k: &str| out.split_whitespace().find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse::<f64>().ok());
    let mut r = Row::latency(name, size, vec![field("t_typical_us")?]);
    r.t_min_us = field("t_min_us")?;
    r.t_p99_us = field("t_p99_us")?;
    r.iters = field("iters")? as usize;
    Some(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_probe_line() {
        let r = super::parse("c-tcp", 64, "t_min_us=2.100 t_typical_us=3.250 t_p99_us=5.000 iters=9000\n").unwrap();
        assert_eq!((r.t_min_us, r.t_typical_us, r.t_p99_us, r.iters), (2.1, 3.25, 5.0, 9000));
        assert!(super::parse("c-tcp", 64, "garbage").is_none());
    }

    #[test]
    fn the_probe_is_embedded() {
        // via-user's build script compiles probe/sockprobe.c; a build
        // machine without a C compiler could not link Rust either.
        assert!(super::PROBE.starts_with(b"\x7fELF"), "the C probe is missing from via-pingpong");
    }
}
