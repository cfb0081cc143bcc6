//! One step of a collective: bytes from one process to another under a
//! tag, waited for by tag.
//!
//! Short steps, and every step over a transport without RDMA, travel
//! eagerly as one COLL message. Long steps over VIA go by rendezvous:
//! the receiver takes a landing block in its registered heap and tells
//! the sender where it is (CTS); the sender RDMA-writes the data there
//! from a staging block of its own heap and sends a LANDED notice behind
//! it. A reliable VI delivers in order, so the data is in place when the
//! notice arrives, and the receiver reads it where it landed: two copies
//! (into staging, off the wire) instead of five on the message path.
//! Either side falls back to the eager path when its heap has no room,
//! and the other follows: the receiver's CTS says "no landing", or the
//! sender sends the bytes instead of a notice.
//!
//! Receives are made ready ([`expect`]) before the matching send, so that
//! two processes exchanging long steps each tell the other where to
//! write before either waits for the other's CTS.

use crate::runtime::{fatal, kind, with};
use crate::thread;

/// Steps of at least this many bytes go by rendezvous where the transport
/// has RDMA (`MTTL_COLL_RDMA`, default 16 KiB).
fn rendezvous_bytes() -> usize {
    std::env::var("MTTL_COLL_RDMA").ok().and_then(|v| v.parse().ok()).unwrap_or(16 << 10)
}

/// A CTS "no landing block" offset.
const NO_LANDING: u64 = u64::MAX;

/// The mailbox key of the CTS for `tag` (tags use the low 63 bits).
fn cts_key(tag: u64) -> u64 {
    tag | 1 << 63
}

/// What arrived for a step.
pub(crate) enum Mail {
    /// The step's bytes: the message as it arrived, read from byte `at` on.
    Bytes { bytes: Vec<u8>, at: usize },
    /// The bytes are in the landing block this process offered.
    Landed,
}

impl Mail {
    fn bytes(&self) -> &[u8] {
        match self {
            Mail::Bytes { bytes, at } => &bytes[*at..],
            Mail::Landed => &[],
        }
    }
}

/// Does a `len`-byte step between us and another process go by rendezvous?
/// Both sides decide alike: same transport, same length.
fn by_rendezvous(rt: &mut crate::runtime::Runtime, len: usize) -> bool {
    len >= rendezvous_bytes() && rt.comm.bulk().is_some()
}

/// A receive made ready: where a long step from `node` may land.
#[must_use = "finish the receive"]
pub(crate) struct Incoming {
    node: usize,
    tag: u64,
    len: usize,
    landing: Option<u64>,
}

/// Makes ready the receive of a `len`-byte step from `node` under `tag`
/// (for a long step over VIA: takes a landing block and sends the CTS).
pub(crate) fn expect(node: usize, tag: u64, len: usize) -> Incoming {
    let landing = with(|rt| {
        if node == rt.rank || !by_rendezvous(rt, len) {
            return None;
        }
        let off = rt.heap.alloc(len);
        let mut m = [0u8; 17];
        m[0] = kind::COLL_CTS;
        m[1..9].copy_from_slice(&tag.to_le_bytes());
        m[9..].copy_from_slice(&off.unwrap_or(NO_LANDING).to_le_bytes());
        rt.send(node, &m);
        off
    });
    Incoming { node, tag, len, landing }
}

impl Incoming {
    /// Waits for the step and lends its bytes to `f`.
    pub(crate) fn finish<R>(self, f: impl FnOnce(&[u8]) -> R) -> R {
        let m = wait(self.node, self.tag);
        let out = match (&m, self.landing) {
            (Mail::Landed, Some(off)) => {
                let p = with(|rt| rt.heap.slice(off, self.len)).expect("landing block");
                // SAFETY: our landing block, allocated for this step; the
                // sender's RDMA write into it was placed before the LANDED
                // notice, and nothing writes it again until we free it.
                f(unsafe { std::slice::from_raw_parts(p, self.len) })
            }
            (Mail::Landed, None) => fatal(format!("rank {}: a LANDED notice from rank {} for a step without a landing block", crate::my_pe(), self.node)),
            (Mail::Bytes { .. }, _) => f(m.bytes()),
        };
        if let Some(off) = self.landing {
            with(|rt| rt.heap.free(off));
        }
        out
    }
}

/// Sends step `payload` to `node` under `tag` (for a long step over VIA:
/// waits for the receiver's CTS, then writes into its landing block).
pub(crate) fn send(node: usize, tag: u64, payload: &[u8]) {
    let mut head = [kind::COLL; 9];
    head[1..].copy_from_slice(&tag.to_le_bytes());
    let (local, rendezvous) = with(|rt| (node == rt.rank, by_rendezvous(rt, payload.len())));
    if local {
        return with(|rt| rt.mail(node, tag, Mail::Bytes { bytes: payload.to_vec(), at: 0 }));
    }
    if rendezvous {
        let cts = wait(node, cts_key(tag));
        let landing = match cts.bytes().try_into() {
            Ok(b) => u64::from_le_bytes(b),
            Err(_) => fatal(format!("rank {}: a {}-byte CTS from rank {node}", crate::my_pe(), cts.bytes().len())),
        };
        if landing != NO_LANDING && put(node, landing, payload) {
            head[0] = kind::COLL_LANDED;
            return with(|rt| rt.send(node, &head));
        }
    }
    with(|rt| {
        if let Err(e) = rt.comm.nsendv(node, &[&head, payload]) {
            fatal(e)
        }
    })
}

/// RDMA-writes `payload` at `landing` in `node`'s heap from a staging
/// block (freed once the write completes); false if our heap is full.
fn put(node: usize, landing: u64, payload: &[u8]) -> bool {
    with(|rt| {
        let Some(s) = rt.heap.alloc(payload.len()) else { return false };
        let dst = rt.heap.slice(s, payload.len()).expect("staging block");
        // SAFETY: our staging block, just allocated, `payload.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len()) };
        let bulk = rt.comm.bulk().expect("checked by by_rendezvous");
        let h = bulk.put(node, s as usize, landing as usize, payload.len(), None).unwrap_or_else(|e| fatal(e));
        rt.free_after(h, s);
        true
    })
}

/// Waits for what arrives from `node` under mailbox key `key`.
fn wait(node: usize, key: u64) -> Mail {
    loop {
        let got = with(|rt| rt.take_mail(node, key).ok_or_else(|| rt.wait_mail(node, key, thread::current().expect("a collective outside a user-level thread"))));
        match got {
            Ok(m) => return m,
            Err(()) => thread::block(),
        }
    }
}

/// Files a COLL_CTS message's body (`[tag][landing]`) from `node`.
pub(crate) fn on_cts(rt: &mut crate::runtime::Runtime, node: usize, msg: Vec<u8>, at: usize) -> Result<(), String> {
    let tag = msg.get(at..at + 8).ok_or_else(|| format!("from rank {node}: a truncated CTS"))?;
    let tag = u64::from_le_bytes(tag.try_into().unwrap());
    rt.mail(node, cts_key(tag), Mail::Bytes { bytes: msg, at: at + 8 });
    Ok(())
}
