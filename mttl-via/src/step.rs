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
use crate::thread::{self, ThreadId};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

/// A step as it arrived: the message, read from byte `at` on.
pub(crate) struct Mail {
    pub bytes: Vec<u8>,
    pub at: usize,
}

/// Steps that arrived before their receiver asked, by (sender, tag), and
/// the thread waiting for each.
#[derive(Default)]
struct Mailbox {
    mail: HashMap<(usize, u64), VecDeque<Mail>>,
    waiters: HashMap<(usize, u64), ThreadId>,
}

thread_local! {
    // The runtime's thread (every user-level thread runs on it).
    static MAILBOX: RefCell<Mailbox> = RefCell::new(Mailbox::default());
}

/// Files a step from `node` under `tag` for its receiver, and wakes it.
pub(crate) fn deliver(node: usize, tag: u64, m: Mail) {
    let waiter = MAILBOX.with(|b| {
        let mut b = b.borrow_mut();
        b.mail.entry((node, tag)).or_default().push_back(m);
        b.waiters.remove(&(node, tag))
    });
    if let Some(t) = waiter {
        thread::wake(t);
    }
}

/// The oldest step from `node` under `tag`; without one, the current
/// thread is noted as waiting for it.
fn take_or_wait(node: usize, tag: u64) -> Option<Mail> {
    MAILBOX.with(|b| {
        let mut b = b.borrow_mut();
        let m = b.mail.get_mut(&(node, tag)).and_then(VecDeque::pop_front);
        if b.mail.get(&(node, tag)).is_some_and(VecDeque::is_empty) {
            b.mail.remove(&(node, tag));
        }
        if m.is_none() {
            b.waiters.insert((node, tag), thread::current().expect("a collective outside a user-level thread"));
        }
        m
    })
}

/// Sends step `payload` to `node` under `tag`.
pub(crate) fn send(node: usize, tag: u64, payload: &[u8]) {
    let mut head = [0u8; 16];
    head[0] = kind::COLL;
    head[8..].copy_from_slice(&tag.to_le_bytes());
    if node == crate::runtime::my_pe() {
        deliver(node, tag, Mail { bytes: payload.to_vec(), at: 0 });
    } else if let Err(e) = with(|rt| rt.comm.nsendv(node, &[&head, payload])) {
        fatal(e)
    }
}

/// Waits for the step from `node` under `tag` and lends its bytes to `f`.
pub(crate) fn recv<R>(node: usize, tag: u64, f: impl FnOnce(&[u8]) -> R) -> R {
    loop {
        match take_or_wait(node, tag) {
            Some(m) => return f(&m.bytes[m.at..]),
            None => thread::block(),
        }
    }
}
