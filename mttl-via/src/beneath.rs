//! The transport's operations bare, without the runtime's layers around
//! them: what `mttl-bench` holds MTTL's own operations against ("the VIA
//! operation beneath it"). Not for programs: they bypass the scheduler.

use crate::runtime::{fatal, kind, with};

/// One RDMA read of `len` bytes at heap offset `off` of process `pe` into
/// a block of this process's heap, posted and waited for in place (the
/// transport polled until it completes). None where the transport has no
/// RDMA reads (TCP) or the heap has no room; Some(false) if the transport
/// refused the range.
pub fn rdma_read(pe: usize, off: u64, len: usize) -> Option<bool> {
    with(|rt| {
        let r = match rt.start_read(pe, off, len)? {
            Ok((h, landing)) => {
                while !rt.comm.senddone(h).unwrap_or_else(|e| fatal(e)) {}
                rt.heap.free_landing(landing, len);
                true
            }
            Err(_) => false,
        };
        Some(r)
    })
}

/// One send/receive round trip with process `pe`: `payload` goes out in a
/// message its scheduler loop answers at once, with no thread, by 8
/// bytes (a small result's size), which this thread waits for in place
/// (`brecnode`). What a remote invocation does beneath its threads and
/// its encoding. Messages of `pe` met before the answer are handled as
/// the scheduler would handle them.
pub fn round_trip(pe: usize, payload: &[u8]) {
    echo(pe, kind::ECHO, payload)
}

/// [`round_trip`] with `payload` answered by itself: what a value written
/// into a peer's `Sync` and written back costs beneath the threads.
pub fn round_trip_whole(pe: usize, payload: &[u8]) {
    echo(pe, kind::ECHO_WHOLE, payload)
}

fn echo(pe: usize, how: u8, payload: &[u8]) {
    with(|rt| {
        let mut m = Vec::with_capacity(1 + payload.len());
        m.push(how);
        m.extend_from_slice(payload);
        rt.send(pe, &m);
        let mut buf = Vec::new();
        loop {
            rt.comm.brecnode(pe, &mut buf).unwrap_or_else(|e| fatal(e));
            if buf.first() == Some(&kind::ECHO_BACK) {
                return;
            }
            if let Err(e) = crate::scheduler::dispatch(rt, pe, &mut buf) {
                fatal(e)
            }
        }
    })
}
