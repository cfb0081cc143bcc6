//! UCX over shared memory (`ucx-shm` in the demo): `ucx_perftest`, the
//! tool UCX ships, with `UCX_TLS=sm,self` (its shared-memory transports,
//! as between two processes of one host), server on CPU 0 and client on
//! CPU 1 like every transport: `tag_lat` at 64 B (its median, one-way) and
//! `tag_bw` at 1 MiB. Without `ucx_perftest` (`apt-get install ucx-utils`)
//! the demo says so and leaves it out.

use crate::common::Row;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Is `ucx_perftest` here?
pub fn available() -> bool {
    Command::new("ucx_perftest").arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// A free TCP port on the loopback, for the tool's own handshake.
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("ucx-shm: a port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("ucx-shm: a port: {e}"))
}

/// One `ucx_perftest` test (`tag_lat` or `tag_bw`) of `size` bytes, `iters`
/// times; returns the client's `Final:` line split into its columns.
fn perftest(test: &str, size: usize, iters: usize) -> Result<Vec<f64>, String> {
    let port = free_port()?.to_string();
    let args = |c: &mut Command| {
        c.env("UCX_TLS", "sm,self").args(["-t", test, "-s", &size.to_string(), "-n", &iters.to_string(), "-p", &port]);
    };
    let mut server = Command::new("taskset");
    server.args(["-c", "0", "ucx_perftest"]).stdout(Stdio::null()).stderr(Stdio::piped());
    args(&mut server);
    let mut server = server.spawn().map_err(|e| format!("ucx-shm: server: {e}"))?;
    crate::cleanup::track(server.id());
    // The client is refused until the server listens: it tries again
    // (each try is a process that gives up at once) while the server
    // runs, for at most 5 s.
    let mut last = String::new();
    for _ in 0..500 {
        let mut client = Command::new("taskset");
        client.args(["-c", "1", "ucx_perftest", "127.0.0.1"]);
        args(&mut client);
        let out = client.output().map_err(|e| format!("ucx-shm: client: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(line) = text.lines().find_map(|l| l.trim().strip_prefix("Final:")) {
            let _ = server.wait();
            return Ok(line.split_whitespace().filter_map(|w| w.parse().ok()).collect());
        }
        last = format!("{} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim());
        if server.try_wait().is_ok_and(|s| s.is_some()) {
            let mut err = String::new();
            if let Some(mut e) = server.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("ucx-shm: {test}: the server stopped: {} (client: {last})", err.trim()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = server.kill();
    let _ = server.wait();
    Err(format!("ucx-shm: {test}: {last}"))
}

/// The 64 B latency row and the 1 MiB bandwidth row.
pub fn run(lat_iters: usize) -> Result<Vec<Row>, String> {
    // Columns: iterations, latency 50 %ile, average, overall (us);
    // bandwidth average, overall (MiB/s); message rate average, overall.
    let lat = perftest("tag_lat", 64, lat_iters)?;
    let bw = perftest("tag_bw", 1 << 20, 2000)?;
    let (Some(&median), Some(&mib)) = (lat.get(1), bw.get(5)) else {
        return Err(format!("ucx-shm: unexpected ucx_perftest output: {lat:?} {bw:?}"));
    };
    let mut b = Row::bandwidth("ucx-shm", 1 << 20, 2000, Duration::from_secs(1));
    b.mb_per_s = mib * 1.048576; // MiB/s to MB/s, as the demo's figures
    Ok(vec![Row::latency("ucx-shm", 64, vec![median]), b])
}
