//! libfabric over shared memory (`ofi-shm` in the demo): `fi_pingpong`,
//! the tool libfabric ships, with its `shm` provider on reliable
//! datagram endpoints (`-p shm -e rdm`), server on CPU 0 and client on
//! CPU 1 like every transport: 64 B latency (`usec/xfer`, half a round
//! trip, averaged over the iterations: the tool prints no median).
//! Without `fi_pingpong` (`apt-get install libfabric-bin`) the demo says
//! so and leaves it out.

use crate::common::Row;
use std::process::{Command, Stdio};

/// Is `fi_pingpong` here?
pub fn available() -> bool {
    Command::new("fi_pingpong").arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// The 64 B latency row.
pub fn run(lat_iters: usize) -> Result<Vec<Row>, String> {
    let port = crate::tool::free_port("ofi-shm")?.to_string();
    let common: Vec<String> = ["-p", "shm", "-e", "rdm", "-S", "64", "-I", &lat_iters.to_string()].map(String::from).to_vec();
    let mut server = common.clone();
    server.extend(["-B".to_string(), port.clone()]);
    let mut client = common;
    client.extend(["-P".to_string(), port, "127.0.0.1".to_string()]);
    // Columns: bytes, #sent, #ack, total, time, MB/sec, usec/xfer, Mxfers/sec.
    let usec = crate::tool::server_client("ofi-shm", "fi_pingpong", &[], &server, &client, |out| {
        out.lines().find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 8 && w[0] == "64").then(|| w[6].parse::<f64>().ok()).flatten()
        })
    })?;
    Ok(vec![Row::latency("ofi-shm", 64, vec![usec])])
}
