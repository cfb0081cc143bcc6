//! The frame checksum's speed: CRC-32C of frame-sized buffers with three
//! lanes side by side (what the engine uses where the instruction is
//! fast) against one running CRC and against the eight tables, in the
//! same run, and which of them this process chose. Run: `cargo bench -p
//! via-wire --bench crc32c`.

use std::hint::black_box;
use std::time::Instant;
use via_wire::crc32c;

/// Nanoseconds per call of `f` on `data`, the best of five batches.
fn ns_per_call(f: fn(u32, &[u8]) -> u32, data: &[u8]) -> f64 {
    let calls = (200_000_000 / data.len().max(64)).max(100);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut x = crc32c::START;
        for _ in 0..calls {
            x = f(x, black_box(data));
        }
        black_box(x);
        best = best.min(t.elapsed().as_nanos() as f64 / calls as f64);
    }
    best
}

fn main() {
    let data: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    println!("chosen: {:?} (VIA_CRC32C=sse42|tables to decide)", crc32c::Implementation::chosen());
    println!("{:>8} {:>14} {:>14} {:>10} {:>12} {:>10}", "bytes", "one lane ns", "three lanes ns", "speed-up", "three GB/s", "tables ns");
    for len in [64, 1500, 9000, 32768, 57344, 65536] {
        let d = &data[..len];
        assert_eq!(crc32c::update(crc32c::START, d), crc32c::update_one_lane(crc32c::START, d));
        let one = ns_per_call(crc32c::update_one_lane, d);
        let three = ns_per_call(crc32c::update, d);
        let with_tables: fn(u32, &[u8]) -> u32 = |c, d| crc32c::update_with(crc32c::Implementation::Tables, c, d);
        assert_eq!(with_tables(crc32c::START, d), crc32c::update(crc32c::START, d));
        let tables = ns_per_call(with_tables, d);
        println!("{len:>8} {one:>14.1} {three:>14.1} {:>10.2} {:>12.1} {tables:>10.1}", one / three, len as f64 / three);
    }
}
