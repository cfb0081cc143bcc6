//! One step of a collective: bytes from one process to another as one
//! COLL message `[COLL][0; 7][tag u64][payload]`, filed by (sender, tag)
//! until the receiver asks for it, and read in place (the header skipped,
//! not cut off; the payload 16 bytes in stays aligned as the message
//! buffer is).
//!
//! Long steps over VIA were tried two other ways and measured no better
//! (docs/BENCHMARKS.md, "NAS CG on MTTL"): a rendezvous (the receiver
//! offers a landing block, the sender RDMA-writes it) made an early
//! process wait for a late one before sending anything; eager RDMA into
//! standing landing zones saved three copies but cost two more frames
//! per step (the notice and the zone's release), which on a software NIC
//! cost as much.

use crate::runtime::{fatal, kind, with};
use crate::thread;

/// A step as it arrived: the message, read from byte `at` on.
pub(crate) struct Mail {
    pub bytes: Vec<u8>,
    pub at: usize,
}

/// Sends step `payload` to `node` under `tag`.
pub(crate) fn send(node: usize, tag: u64, payload: &[u8]) {
    let mut head = [0u8; 16];
    head[0] = kind::COLL;
    head[8..].copy_from_slice(&tag.to_le_bytes());
    with(|rt| {
        if node == rt.rank {
            rt.mail(node, tag, Mail { bytes: payload.to_vec(), at: 0 });
        } else if let Err(e) = rt.comm.nsendv(node, &[&head, payload]) {
            fatal(e)
        }
    })
}

/// Waits for the step from `node` under `tag` and lends its bytes to `f`.
pub(crate) fn recv<R>(node: usize, tag: u64, f: impl FnOnce(&[u8]) -> R) -> R {
    loop {
        let got = with(|rt| {
            let m = rt.take_mail(node, tag);
            if m.is_none() {
                rt.wait_mail(node, tag, thread::current().expect("a collective outside a user-level thread"));
            }
            m
        });
        match got {
            Some(m) => return f(&m.bytes[m.at..]),
            None => thread::block(),
        }
    }
}
