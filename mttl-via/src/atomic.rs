//! Remote atomics on `GlobalPtr<u64>`: fetch-and-add and compare-and-swap
//! on a word of any process's heap. Over VIA each is one remote atomic
//! (the `vipl_ext.h` extension: the owner's processor takes no part, its
//! provider runs the atomic once even when the request is sent again);
//! where the transport has none (TCP) a message the owner's loop answers.
//! Atomic with respect to one another and to the owner's own atomics on
//! the word (`GlobalPtr::fetch_add` on a local pointer), not to plain
//! reads and writes of it.

use crate::comm::AtomicOp;
use crate::global::{await_direct, take_landing, GlobalPtr};
use crate::heap::HeapAlloc;
use crate::runtime::{self, kind, status, with};
use std::sync::atomic::AtomicU64;

impl GlobalPtr<u64> {
    /// Adds `v` (wrapping) to the word here; returns its value before.
    pub fn fetch_add(self, v: u64) -> u64 {
        self.atomic(AtomicOp::FetchAdd(v))
    }

    /// Stores `swap` into the word here if it equals `compare`; returns
    /// its value before (equal to `compare` when the swap happened).
    pub fn compare_swap(self, compare: u64, swap: u64) -> u64 {
        self.atomic(AtomicOp::CompareSwap { compare, swap })
    }

    fn atomic(self, op: AtomicOp) -> u64 {
        let off = self.heap_offset();
        assert!(off.is_multiple_of(8), "{self:?}: an atomic needs an 8-byte aligned word");
        if self.is_local() {
            return local(off, op).unwrap_or_else(|| panic!("{self:?}: an atomic runs past the heap"));
        }
        let pe = self.pe();
        match with(|rt| rt.start_atomic(pe, off, op)) {
            Some(Ok((h, landing))) => {
                await_direct(h);
                let mut b = [0u8; 8];
                take_landing(landing, &mut b); // the value before, from the completed atomic
                u64::from_ne_bytes(b)
            }
            Some(Err(e)) => panic!("an atomic at {self:?}: {e}"),
            None => by_message(pe, off, op).unwrap_or_else(|why| panic!("an atomic at {self:?}: {why}")),
        }
    }
}

/// Runs `op` on the word at `off` of our heap; None when it is outside.
fn local(off: u64, op: AtomicOp) -> Option<u64> {
    with(|rt| local_in(&rt.heap, off, op))
}

/// [`local`] on `heap` (the scheduler's loop holds the runtime already).
fn local_in(heap: &HeapAlloc, off: u64, op: AtomicOp) -> Option<u64> {
    let p = heap.slice(off, 8)?;
    // SAFETY: an 8-byte aligned word inside our heap (the heap is page
    // aligned, `off` a multiple of 8), which lives as long as the runtime;
    // AtomicU64 has u64's size and alignment.
    Some(op.apply(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }))
}

/// The atomic as a message to the owner ([`kind::ATOMIC`]).
fn by_message(pe: usize, off: u64, op: AtomicOp) -> Result<u64, String> {
    let (code, a, b) = match op {
        AtomicOp::FetchAdd(v) => (0u8, v, 0),
        AtomicOp::CompareSwap { compare, swap } => (1, compare, swap),
    };
    let token = with(|rt| {
        let t = rt.new_token();
        let mut m = Vec::with_capacity(30);
        m.push(kind::ATOMIC);
        m.extend_from_slice(&t.to_le_bytes());
        m.extend_from_slice(&off.to_le_bytes());
        m.push(code);
        m.extend_from_slice(&a.to_le_bytes());
        m.extend_from_slice(&b.to_le_bytes());
        rt.send(pe, &m);
        t
    });
    match runtime::wait_reply(token) {
        (status::OK, v) => v.try_into().map(u64::from_le_bytes).map_err(|_| "a reply of other than 8 bytes".to_string()),
        (_, why) => Err(String::from_utf8_lossy(&why).into_owned()),
    }
}

/// The owner's side of [`kind::ATOMIC`] (rank `rank`, its heap `heap`):
/// `msg` past the token; the reply.
pub(crate) fn serve(rank: usize, heap: &HeapAlloc, mut msg: &[u8]) -> Result<[u8; 8], String> {
    let off = runtime::u64_at(&mut msg).map_err(|e| e.to_string())?;
    let (&code, mut rest) = msg.split_first().ok_or("an atomic without its operation")?;
    let a = runtime::u64_at(&mut rest).map_err(|e| e.to_string())?;
    let b = runtime::u64_at(&mut rest).map_err(|e| e.to_string())?;
    let op = match code {
        0 => AtomicOp::FetchAdd(a),
        1 => AtomicOp::CompareSwap { compare: a, swap: b },
        c => return Err(format!("rank {rank}: unknown atomic {c}")),
    };
    if !off.is_multiple_of(8) {
        return Err(format!("rank {rank}: an atomic at heap offset {off:#x}, not 8-byte aligned"));
    }
    local_in(heap, off, op).map(u64::to_le_bytes).ok_or_else(|| format!("rank {rank}: an atomic at heap offset {off:#x} is outside the heap"))
}
