//! The frame tag's cost per frame: each frame tagged alone (AEGISMAC-128L
//! under `WIDE_FROM` bytes of payload, 128X4 from there) against four
//! frames of one length tagged together (`tag::frame_tags4`), in the same
//! run. Run: `cargo bench -p via-wire --bench frame_tag`.

use std::hint::black_box;
use std::time::Instant;
use via_wire::tag::{frame_tag, frame_tags4, Key, WIDE_FROM};
use via_wire::{ETH_HEADER_LEN, FRAME_HEADER_LEN};

/// Nanoseconds per frame of `f` (which tags `frames` frames), the best of five batches.
fn ns_per_frame(frames: usize, f: &mut dyn FnMut() -> u8) -> f64 {
    let calls = 400_000 / frames;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut x = 0u8;
        for _ in 0..calls {
            x ^= f();
        }
        black_box(x);
        best = best.min(t.elapsed().as_nanos() as f64 / (calls * frames) as f64);
    }
    best
}

fn main() {
    let key = Key::new(*b"0123456789abcdef");
    println!("four at once: {}", if via_wire::tag::lanes::lanes_available() { "yes (AVX-512 with VAES)" } else { "no: frames are tagged alone" });
    println!("{:>8} {:>10} {:>14} {:>10}", "payload", "alone ns", "four at once", "speed-up");
    for len in [0usize, 64, 512, 1422, WIDE_FROM - 1] {
        let mut head = [7u8; FRAME_HEADER_LEN];
        head[ETH_HEADER_LEN + 54..ETH_HEADER_LEN + 56].copy_from_slice(&(len as u16).to_be_bytes());
        let payloads: Vec<Vec<u8>> = (0..4).map(|j| (0..len).map(|i| (i + j) as u8).collect()).collect();
        let alone = ns_per_frame(4, &mut || (0..4).fold(0, |x, j| x ^ frame_tag(&key, black_box(&head), [&payloads[j][..]])[0]));
        let Some(_) = frame_tags4(&key, [&head[..]; 4], std::array::from_fn(|j| &payloads[j][..])) else {
            println!("{len:>8} {alone:>10.1} {:>14} {:>10}", "-", "-");
            continue;
        };
        let four = ns_per_frame(4, &mut || frame_tags4(&key, [black_box(&head[..]); 4], std::array::from_fn(|j| &payloads[j][..])).expect("four")[3][0]);
        println!("{len:>8} {alone:>10.1} {four:>14.1} {:>10.2}", alone / four);
    }
}
