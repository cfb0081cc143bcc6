//! CPU cost of the engine per message, without the kernel: two NICs in one
//! thread joined by a queue device (no system call), a ping-pong of 64-byte
//! messages through the full Rust API, as send/receive and as RDMA writes
//! polled in memory (the ratio is what the demo's noisy wire hides). Run: `cargo bench -p via-user
//! --bench engine_cost`; under `valgrind --tool=callgrind` it gives the
//! instruction count of the post/complete path. `SIZE=65536 VOUCHED=1
//! DEVICE=queue` is a message of 46 fragments over a path that vouches for
//! its frames (no CRC, as VIA in UDP): the per-fragment cost.

mod harness;

use harness::{connected_pair, half, End, Mode};
use std::time::{Duration, Instant};

/// Engine time per one-way 64-byte message in `mode`.
fn measure(mode: Mode, iters: u32) -> Duration {
    let (mut a, mut b) = connected_pair(mode, false);
    let ra = a.mem.remote(half()..2 * half()).unwrap();
    let rb = b.mem.remote(half()..2 * half()).unwrap();
    let t0 = Instant::now();
    ping_pong(mode, &mut a, &mut b, &ra, &rb, iters);
    let t = t0.elapsed() / iters / 2;
    if std::env::var_os("COUNTERS").is_some() {
        // Which path the messages took (frames, boxed sends, ACKs).
        let shown = |c: via_user::Counters| c.pairs().into_iter().filter(|&(_, v)| v != 0).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        eprintln!("a: {}\nb: {}", shown(a.nic.counters()), shown(b.nic.counters()));
    }
    t
}

/// The measured loop, on its own for `valgrind --tool=callgrind
/// --collect-atstart=no --toggle-collect=*ping_pong*` (setup excluded).
#[inline(never)]
fn ping_pong(mode: Mode, a: &mut End, b: &mut End, ra: &via_user::RemoteBuffer, rb: &via_user::RemoteBuffer, iters: u32) {
    // Sends complete when the peer's next message acknowledges them, so
    // each side keeps a few send descriptors and reaps what completed.
    for i in 0..iters {
        let tag = (i % 255) as u8 + 1;
        a.ping(mode, rb, tag);
        b.pong(mode, tag);
        b.ping(mode, ra, tag);
        a.pong(mode, tag);
        a.reap();
        b.reap();
    }
}

fn main() {
    let iters = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000u32);
    // ONLY=send or ONLY=write: one measurement of one mode (for callgrind).
    match std::env::var("ONLY").as_deref() {
        Ok("send") => return println!("send/receive {:?}", measure(Mode::SendRecv, iters)),
        Ok("write") => return println!("RDMA write {:?}", measure(Mode::RdmaWrite, iters)),
        _ => {}
    }
    // Alternate the modes so drift of the machine hits both alike.
    let (mut send, mut write) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        send.push(measure(Mode::SendRecv, iters));
        write.push(measure(Mode::RdmaWrite, iters));
    }
    send.sort();
    write.sort();
    let (s, w) = (send[1], write[1]);
    println!("engine cost per one-way 64 B message (both ends, no kernel), medians of 3:");
    println!("  send/receive  {s:?}");
    println!("  RDMA write    {w:?}   (RDMA write / send = {:.3})", w.as_secs_f64() / s.as_secs_f64());
}
