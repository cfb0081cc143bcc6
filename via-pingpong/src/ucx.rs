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

/// One `ucx_perftest` test (`tag_lat` or `tag_bw`) of `size` bytes, `iters`
/// times; returns the client's `Final:` line split into its columns.
fn perftest(test: &str, size: usize, iters: usize) -> Result<Vec<f64>, String> {
    let port = crate::tool::free_port("ucx-shm")?.to_string();
    let args: Vec<String> = ["-t", test, "-s", &size.to_string(), "-n", &iters.to_string(), "-p", &port].map(String::from).to_vec();
    let client: Vec<String> = std::iter::once("127.0.0.1".to_string()).chain(args.iter().cloned()).collect();
    crate::tool::server_client(&format!("ucx-shm: {test}"), "ucx_perftest", &[("UCX_TLS", "sm,self")], &args, &client, |out| {
        out.lines().find_map(|l| l.trim().strip_prefix("Final:")).map(|line| line.split_whitespace().filter_map(|w| w.parse().ok()).collect())
    })
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
