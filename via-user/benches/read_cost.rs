//! CPU cost of an RDMA read in the engines, without the kernel: the
//! harness of `engine_cost` (two NICs in one thread, one device between
//! them), each end reading `SIZE` bytes (64 by default) of the other's
//! memory in turn, the other's engine serving the read when it makes
//! progress, as a passive target's does. One read, its request and its
//! response, both ends' work, is what MTTL's small remote read costs the
//! engines. Run: `cargo bench -p via-user --bench read_cost`; under
//! `valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect=*read_ping_pong*` it gives the instruction count
//! (`scripts/engine-instructions.sh`; `ONLY=read` measures once).
//! `DEVICE=queue|shm|composite`,
//! `VOUCHED=1` as for `engine_cost`. A bench of its own: a read loop in
//! `engine_cost` changed how the compiler inlined the send path there.

mod harness;

use harness::{connected_pair, half, size, End, Mode};
use std::time::{Duration, Instant};
use via_user::{Op, RemoteBuffer};

/// Reads `size()` bytes of `peer`'s receive half (`remote`) into our own
/// receive half, the peer's engine serving it, and waits for the read.
fn read_from(me: &mut End, peer: &End, remote: &RemoteBuffer) {
    let n = size();
    let mut d = me.spare.pop().expect("send descriptors");
    if d.length() as usize != n {
        d.set_op(Op::RdmaRead(*remote), &[(&me.mem, half()..half() + n)], None, false).unwrap();
    }
    me.vi.post_send(d).unwrap();
    loop {
        peer.nic.progress();
        if let Some(d) = me.vi.send_done().unwrap() {
            d.check_ok().unwrap();
            me.spare.push(d);
            return;
        }
    }
}

/// The measured loop, on its own for callgrind (setup excluded): each
/// side reads the other's memory in turn.
#[inline(never)]
fn read_ping_pong(a: &mut End, b: &mut End, ra: &RemoteBuffer, rb: &RemoteBuffer, iters: u32) {
    for _ in 0..iters {
        read_from(a, b, rb);
        read_from(b, a, ra);
    }
}

/// Engine time per read.
fn measure(iters: u32) -> Duration {
    let (mut a, mut b) = connected_pair(Mode::SendRecv, true);
    let ra = a.mem.remote(half()..2 * half()).unwrap();
    let rb = b.mem.remote(half()..2 * half()).unwrap();
    let t0 = Instant::now();
    read_ping_pong(&mut a, &mut b, &ra, &rb, iters);
    t0.elapsed() / iters / 2
}

fn main() {
    let iters = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000u32);
    // ONLY=read: one measurement (for callgrind).
    if std::env::var("ONLY").as_deref() == Ok("read") {
        return println!("RDMA read {:?}", measure(iters));
    }
    let mut t: Vec<Duration> = (0..3).map(|_| measure(iters)).collect();
    t.sort();
    println!("engine cost per RDMA read of {} B (request and response, both ends, no kernel), median of 3: {:?}", size(), t[1]);
}
