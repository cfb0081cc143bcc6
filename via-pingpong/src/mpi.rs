//! Open MPI over shared memory (`ompi-shm` in the demo): the baseline a
//! user of one host compares via-shm with. `probe/mpi_shm.c`, embedded
//! here, is built with the host's `mpicc` when the demo first needs it and
//! run by `mpirun -n 2 --bind-to core` (its two ranks on CPUs 0 and 1, as
//! every transport's server and client are pinned): a 64-byte ping-pong
//! and windows of 64 1 MiB messages, Open MPI's own choice of transport
//! (vader, its shared memory, between two processes of one host). Without
//! Open MPI installed (`apt-get install openmpi-bin libopenmpi-dev`) the
//! demo says so and leaves it out.

use crate::common::Row;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const SOURCE: &str = include_str!("../probe/mpi_shm.c");

/// Windows of 64 1 MiB messages the bandwidth is timed over.
const WINDOWS: usize = 16;

/// Is Open MPI here (both its compiler wrapper and its launcher)?
pub fn available() -> bool {
    ["mpicc", "mpirun"].iter().all(|t| Command::new(t).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// The probe built once per process, in a directory of its own.
fn probe() -> Result<&'static PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("via-pingpong-mpi-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("ompi-shm: {}: {e}", dir.display()))?;
            let (src, exe) = (dir.join("mpi_shm.c"), dir.join("mpi_shm"));
            std::fs::write(&src, SOURCE).map_err(|e| format!("ompi-shm: {e}"))?;
            let out = Command::new("mpicc").arg("-O2").arg("-o").arg(&exe).arg(&src).output().map_err(|e| format!("ompi-shm: mpicc: {e}"))?;
            if !out.status.success() {
                return Err(format!("ompi-shm: mpicc failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
            Ok(exe)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One run of the probe: the 64 B latency row and the 1 MiB bandwidth row.
pub fn run(lat_iters: usize) -> Result<Vec<Row>, String> {
    let exe = probe()?;
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "-n", "2", "--bind-to", "core"])
        .arg(exe)
        .args([lat_iters.to_string(), WINDOWS.to_string()])
        .output()
        .map_err(|e| format!("ompi-shm: mpirun: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<f64>().ok());
    match (out.status.success(), field("lat_us "), field("bw_mbs ")) {
        (true, Some(lat), Some(bw)) => {
            let mut b = Row::bandwidth("ompi-shm", 1 << 20, WINDOWS * 64, Duration::from_secs(1));
            b.mb_per_s = bw;
            Ok(vec![Row::latency("ompi-shm", 64, vec![lat]), b])
        }
        _ => Err(format!("ompi-shm: mpirun gave {}: {} {}", out.status, text.trim(), String::from_utf8_lossy(&out.stderr).trim())),
    }
}
