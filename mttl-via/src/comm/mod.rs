//! The communication layer: MTTL's eight primitives, the porting boundary.
//!
//! | primitive | here |
//! |---|---|
//! | `_pmttl_cominit` | [`cominit`] |
//! | `_pmttl_comfinish` | [`Transport::comfinish`] |
//! | `_pmttl_prob` | [`Transport::prob`] |
//! | `_pmttl_asend` | [`Transport::asend`] |
//! | `_pmttl_nsend` | [`Transport::nsend`] |
//! | `_pmttl_senddone` | [`Transport::senddone`] |
//! | `_pmttl_brecnode` | [`Transport::brecnode`] |
//! | `_pmttl_brecany` | [`Transport::brecany`] |
//!
//! Two implementations: [`via`] (one reliable VI per peer, one CQ, the
//! pending-VI list of [`pending`]) and [`tcp`] (one socket per peer, the
//! baseline). Messages are byte strings of any length, delivered once and
//! in order per pair of processes. Optionally a transport moves bulk data
//! into a peer's heap directly ([`Bulk`], RDMA on VIA).

pub mod credit;
pub mod pending;
pub mod tcp;
pub mod via;

use crate::boot::Boot;

pub use crate::error::{CommError, Result};

/// Names one non-blocking send for [`Transport::senddone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendHandle {
    pub node: usize,
    pub seq: u64,
}

/// The first byte of a message that a [`Bulk::put`] raises at its target;
/// four bytes of `imm` follow. Runtime message kinds stay below it.
pub const BULK_NOTICE: u8 = 0xB0;

/// MTTL's communication primitives over one transport.
pub trait Transport {
    /// "via" or "tcp".
    fn name(&self) -> &'static str;
    /// `_pmttl_comfinish`: waits until every send is delivered, then
    /// closes. Call after the runtime's shutdown handshake.
    fn comfinish(&mut self) -> Result<()>;
    /// `_pmttl_prob`: the node whose message `brecany` would return now,
    /// without blocking.
    fn prob(&mut self) -> Result<Option<usize>>;
    /// `_pmttl_asend`: sends `msg` to `node`; returns at once (the bytes
    /// are copied). Delivery goes on at every call that makes progress
    /// (`prob`, `brec*`, `senddone`, `comfinish`), so that sends made in a
    /// row leave in one batch.
    fn asend(&mut self, node: usize, msg: &[u8]) -> Result<()> {
        self.nsendv(node, &[msg]).map(|_| ())
    }
    /// `_pmttl_nsend`: like `asend`, with a handle to test completion.
    fn nsend(&mut self, node: usize, msg: &[u8]) -> Result<SendHandle> {
        self.nsendv(node, &[msg])
    }
    /// `nsend` of the message made of `parts` in order, gathered straight
    /// into the transport's buffers (a header and a payload need not be
    /// joined first).
    fn nsendv(&mut self, node: usize, parts: &[&[u8]]) -> Result<SendHandle>;
    /// `_pmttl_senddone`: has the send `h` been delivered?
    fn senddone(&mut self, h: SendHandle) -> Result<bool>;
    /// [`Transport::senddone`] as of the last call that made progress,
    /// without making any: for looking at many handles after one poll.
    fn delivered(&self, h: SendHandle) -> bool;
    /// `_pmttl_brecnode`: blocks until a message from `node` arrives; puts
    /// it in `out`. Messages from other nodes met meanwhile stay pending,
    /// in arrival order.
    fn brecnode(&mut self, node: usize, out: &mut Vec<u8>) -> Result<()>;
    /// `_pmttl_brecany`: blocks until a message from any node arrives (the
    /// oldest pending one first); puts it in `out` and returns its node.
    fn brecany(&mut self, out: &mut Vec<u8>) -> Result<usize>;
    /// Direct transfers into peers' heaps, where the transport has them.
    fn bulk(&mut self) -> Option<&mut dyn Bulk> {
        None
    }
    /// The run is ending: from now on a peer closing its connection is
    /// expected. Before this call a close is an error (the peer stopped).
    fn closing(&mut self);
    /// The state of the layer in words, for diagnosing a stuck run.
    fn describe(&self) -> String {
        String::new()
    }
    /// The memory that `GlobalPtr`s point into (registered for RDMA on
    /// VIA): base and length.
    fn heap(&mut self) -> (*mut u8, usize);
    /// The device's own counters (frames by path, drops), where the
    /// transport has a device.
    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// Peers this process holds a connection to (made, or being made);
    /// None where every pair is connected at start-up.
    fn connections(&self) -> Option<usize> {
        None
    }
}

/// Direct access to a peer's heap: placement (RDMA write with immediate
/// data) and reads (RDMA read).
pub trait Bulk {
    /// Writes `len` bytes at `src_off` of our heap to `dst_off` of `node`'s
    /// heap; when they are placed, `node`'s `brecany` returns the message
    /// `[BULK_NOTICE, imm (4 bytes LE)]`. The source must stay unchanged
    /// until `senddone` of the returned handle.
    fn put(&mut self, node: usize, src_off: usize, dst_off: usize, len: usize, imm: u32) -> Result<SendHandle>;
    /// Reads `len` bytes at `src_off` of `node`'s heap into `dst_off` of
    /// ours (an RDMA read: the peer's processor takes no part, its
    /// provider answers); done at `senddone` of the returned handle. A
    /// range outside either heap is refused here, before anything is sent.
    fn get(&mut self, node: usize, src_off: usize, dst_off: usize, len: usize) -> Result<SendHandle>;
    /// Runs `op` on the 8-byte word at `off` of `node`'s heap (8-byte
    /// aligned), atomically and once (a remote atomic: the peer's
    /// processor takes no part); the word's value before lands at
    /// `result_off` of ours, done at `senddone` of the returned handle.
    fn atomic(&mut self, node: usize, off: usize, op: AtomicOp, result_off: usize) -> Result<SendHandle>;
    /// Smallest transfer worth sending this way.
    fn threshold(&self) -> usize;
}

/// A 64-bit atomic on a word of a heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Add the value (wrapping).
    FetchAdd(u64),
    /// Store `swap` if the word equals `compare`.
    CompareSwap { compare: u64, swap: u64 },
}

impl AtomicOp {
    /// Runs the atomic on `word`; the value before.
    pub fn apply(self, word: &std::sync::atomic::AtomicU64) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        match self {
            AtomicOp::FetchAdd(v) => word.fetch_add(v, SeqCst),
            AtomicOp::CompareSwap { compare, swap } => word.compare_exchange(compare, swap, SeqCst, SeqCst).unwrap_or_else(|old| old),
        }
    }
}

/// `_pmttl_cominit`: connects this process to every other one, over the
/// transport `boot` names.
pub fn cominit(boot: &mut Boot, heap_bytes: usize) -> Result<Box<dyn Transport>> {
    match boot.transport.as_str() {
        "via" => Ok(Box::new(via::ViaTransport::cominit(boot, heap_bytes)?)),
        "tcp" => Ok(Box::new(tcp::TcpTransport::cominit(boot, heap_bytes)?)),
        other => Err(CommError(format!("unknown transport {other:?} (MTTL_TRANSPORT must be via or tcp)"))),
    }
}

/// A page-aligned heap for transports without registration.
pub(crate) struct PlainHeap {
    ptr: *mut u8,
    len: usize,
}

impl PlainHeap {
    pub(crate) fn new(len: usize) -> Result<PlainHeap> {
        let len = len.max(4096);
        // SAFETY: anonymous private mapping; checked for failure below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(CommError(format!("mapping a {} MiB heap: {}", len >> 20, std::io::Error::last_os_error())));
        }
        Ok(PlainHeap { ptr: p.cast(), len })
    }

    pub(crate) fn get(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }
}

impl Drop for PlainHeap {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
