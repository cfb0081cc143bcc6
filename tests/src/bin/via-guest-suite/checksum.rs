//! The check `the_frame_checksum_takes_the_faster_way_here`: the CRC-32C
//! of the engine's frames (via-wire's `crc32c`) is computed either by the
//! SSE4.2 `crc32` instruction or by eight tables, whichever the process
//! timed faster at its first CRC. In this guest the processor is QEMU's
//! TCG, which says it has SSE4.2 but runs `crc32` one bit at a time, so
//! the choice matters here as nowhere else we run.
//!
//! Times both again over frame-sized buffers (1436 bytes, the best of five
//! batches) and prints them with the choice; fails if the choice is more
//! than 1.5 times slower than the other (a choice made by noise, or a
//! timing that does not pick the faster way).

use std::hint::black_box;
use std::time::Instant;
use via_wire::crc32c::{self, Implementation};

/// Nanoseconds per CRC of `data` through `imp`: the best of five batches.
fn ns_per_crc(imp: Implementation, data: &[u8]) -> f64 {
    const CALLS: u32 = 200;
    (0..5)
        .map(|_| {
            let t = Instant::now();
            let mut c = crc32c::START;
            for _ in 0..CALLS {
                c = crc32c::update_with(imp, c, black_box(data));
            }
            black_box(c);
            t.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .fold(f64::MAX, f64::min)
}

pub fn the_frame_checksum_takes_the_faster_way_here(_: &[String]) -> Result<(), String> {
    let chosen = Implementation::chosen();
    let data: Vec<u8> = (0..1436u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let tables = ns_per_crc(Implementation::Tables, &data);
    if !crc32c::has_sse42() {
        println!("  checksum: no SSE4.2 here; tables {tables:.0} ns a 1436-byte frame");
        return if chosen == Implementation::Tables { Ok(()) } else { Err(format!("chose {chosen:?} on a CPU without SSE4.2")) };
    }
    let sse42 = ns_per_crc(Implementation::Sse42, &data);
    println!("  checksum: chose {chosen:?}; a 1436-byte frame takes {sse42:.0} ns by the instruction, {tables:.0} ns by the tables");
    let (mine, other) = match chosen {
        Implementation::Sse42 => (sse42, tables),
        Implementation::Tables => (tables, sse42),
    };
    if mine > 1.5 * other {
        return Err(format!("chose {chosen:?} at {mine:.0} ns a frame where the other way takes {other:.0} ns"));
    }
    Ok(())
}
