//! SVG plots of a run: one-way latency against message size (log-log) and
//! bandwidth against message size (log x), one line per transport, in the
//! manner of the latency and bandwidth figures of the VIA papers.

use crate::common::Row;
use std::io;
use std::path::Path;
use via_plot::{chart, Point};

/// Writes `latency.svg` and `bandwidth.svg` into `dir`.
pub fn write(dir: &Path, rows: &[Row]) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // Colours follow the order of all transports, so both plots agree.
    let mut transports: Vec<&str> = Vec::new();
    for r in rows {
        if !transports.contains(&r.transport.as_str()) {
            transports.push(&r.transport);
        }
    }
    let points = |op: &str, y: fn(&Row) -> f64| -> Vec<Point> { rows.iter().filter(|r| r.op == op).map(|r| Point { series: &r.transport, bytes: r.bytes, value: y(r) }).collect() };
    std::fs::write(dir.join("latency.svg"), chart(&points("lat", |r| r.t_typical_us), &transports, "one-way latency, t_typical [usec]", true))?;
    std::fs::write(dir.join("bandwidth.svg"), chart(&points("bw", |r| r.mb_per_s), &transports, "bandwidth [MB/s]", false))?;
    Ok(())
}
