//! The global heap of one process: the memory `GlobalPtr`s point into
//! (registered with the NIC on VIA, so peers reach it by RDMA), handed
//! out first-fit in 64-byte-aligned blocks. Offsets, not addresses, cross
//! the wire. Landing blocks (where a remote read or atomic lands, taken
//! and given back once per operation) of up to [`LANDING_MAX`] bytes are
//! kept per size class once given back, and handed out again without a
//! search, a map or zeroing.

use std::collections::{BTreeMap, HashMap};

const ALIGN: u64 = 64;
/// Landing blocks up to this size are kept per class (64 B to 4 KiB,
/// powers of two): what a remote read below the bulk threshold needs.
pub(crate) const LANDING_MAX: usize = 4096;
const LANDING_CLASSES: usize = 7;
/// Blocks of one class kept at most; more go back to the heap.
const LANDING_KEEP: usize = 1024;

pub(crate) struct HeapAlloc {
    base: *mut u8,
    len: u64,
    /// Free blocks: offset → length, coalesced.
    free: BTreeMap<u64, u64>,
    /// Blocks handed out: offset → length.
    used: HashMap<u64, u64>,
    /// Landing blocks given back, per class (64 << class bytes each).
    landing: [Vec<u64>; LANDING_CLASSES],
}

/// The class of a landing block of `bytes`, if small enough to keep.
fn landing_class(bytes: usize) -> Option<usize> {
    (bytes <= LANDING_MAX).then(|| (bytes.max(1).next_power_of_two().max(ALIGN as usize).trailing_zeros() - ALIGN.trailing_zeros()) as usize)
}

impl HeapAlloc {
    pub fn new(base: *mut u8, len: usize) -> HeapAlloc {
        let mut free = BTreeMap::new();
        // Offset 0 is never handed out, so a zero GlobalPtr is "null".
        if len as u64 > ALIGN {
            free.insert(ALIGN, len as u64 - ALIGN);
        }
        HeapAlloc { base, len: len as u64, free, used: HashMap::new(), landing: Default::default() }
    }

    /// A zeroed block of `bytes` (at least 1), or None when the heap is full.
    pub fn alloc(&mut self, bytes: usize) -> Option<u64> {
        let want = (bytes.max(1) as u64).div_ceil(ALIGN) * ALIGN;
        let off = self.carve(want)?;
        self.used.insert(off, want);
        // SAFETY: [off, off + want) is inside the heap and handed out to nobody else.
        unsafe { std::ptr::write_bytes(self.base.add(off as usize), 0, want as usize) };
        Some(off)
    }

    /// A block of `bytes` for a transfer to land in (not zeroed: the
    /// transfer writes what is read of it), given back with
    /// [`HeapAlloc::free_landing`] and the same `bytes`.
    pub fn alloc_landing(&mut self, bytes: usize) -> Option<u64> {
        match landing_class(bytes) {
            Some(c) => self.landing[c].pop().or_else(|| self.carve(ALIGN << c)),
            None => self.alloc(bytes),
        }
    }

    /// Gives back landing block `off` of `bytes` (as asked of
    /// [`HeapAlloc::alloc_landing`]): kept for the next of its class.
    pub fn free_landing(&mut self, off: u64, bytes: usize) {
        match landing_class(bytes) {
            Some(c) if self.landing[c].len() < LANDING_KEEP => self.landing[c].push(off),
            Some(c) => self.release(off, ALIGN << c),
            None => {
                self.free(off);
            }
        }
    }

    /// The first free block of `want` bytes (a multiple of [`ALIGN`]), cut
    /// off the free list.
    fn carve(&mut self, want: u64) -> Option<u64> {
        let (&off, &len) = self.free.iter().find(|(_, &l)| l >= want)?;
        self.free.remove(&off);
        if len > want {
            self.free.insert(off + want, len - want);
        }
        Some(off)
    }

    /// Gives block `off` back. Returns false if it is not a block in use.
    pub fn free(&mut self, off: u64) -> bool {
        let Some(len) = self.used.remove(&off) else { return false };
        self.release(off, len);
        true
    }

    /// Puts `[off, off + len)` back on the free list, merged with its
    /// free neighbours.
    fn release(&mut self, off: u64, mut len: u64) {
        let mut start = off;
        if let Some((&p, &pl)) = self.free.range(..off).next_back() {
            if p + pl == off {
                self.free.remove(&p);
                start = p;
                len += pl;
            }
        }
        if let Some(nl) = self.free.remove(&(start + len)) {
            len += nl;
        }
        self.free.insert(start, len);
    }

    /// Bytes free in all.
    #[cfg(test)]
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// The address of `[off, off + len)` if it lies inside the heap.
    pub fn slice(&self, off: u64, len: usize) -> Option<*mut u8> {
        let end = off.checked_add(len as u64)?;
        if off == 0 || end > self.len {
            return None;
        }
        // SAFETY: checked to lie inside the heap mapping.
        Some(unsafe { self.base.add(off as usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_disjoint_and_coalesce_when_freed() {
        let mut mem = vec![0u8; 1 << 16];
        let mut h = HeapAlloc::new(mem.as_mut_ptr(), mem.len());
        let total = h.free_bytes();
        let a = h.alloc(100).unwrap();
        let b = h.alloc(1).unwrap();
        let c = h.alloc(4000).unwrap();
        assert!(a + 128 <= b && b + 64 <= c);
        assert!(h.free(b));
        assert!(!h.free(b), "double free is refused");
        assert_eq!(h.alloc(64), Some(b), "first fit reuses the hole");
        for o in [a, b, c] {
            assert!(h.free(o));
        }
        assert_eq!(h.free_bytes(), total);
        assert_eq!(h.free.len(), 1, "everything merged back into one block");
        assert!(h.alloc(1 << 20).is_none());
        assert!(h.slice(0, 1).is_none() && h.slice(a, 1 << 16).is_none() && h.slice(a, 8).is_some());
    }

    #[test]
    fn landing_blocks_come_back_by_class() {
        assert_eq!(landing_class(1), Some(0));
        assert_eq!(landing_class(64), Some(0));
        assert_eq!(landing_class(65), Some(1));
        assert_eq!(landing_class(LANDING_MAX), Some(LANDING_CLASSES - 1));
        assert_eq!(landing_class(LANDING_MAX + 1), None);
        let mut mem = vec![0u8; 1 << 18];
        let mut h = HeapAlloc::new(mem.as_mut_ptr(), mem.len());
        let total = h.free_bytes();
        let a = h.alloc_landing(32).unwrap();
        let b = h.alloc_landing(100).unwrap();
        assert!(a + 64 <= b, "a 32-byte block takes 64 bytes");
        let c = h.alloc(64).unwrap();
        assert!(b + 128 <= c, "a 100-byte block takes 128 bytes");
        h.free_landing(a, 32);
        h.free_landing(b, 100);
        assert_eq!(h.alloc_landing(8), Some(a), "its class hands it out again");
        assert_eq!(h.alloc_landing(128), Some(b));
        assert!(!h.free(a), "a landing block is not a tracked block");
        h.free_landing(a, 8);
        h.free_landing(b, 128);
        // Large landing blocks are plain blocks.
        let big = h.alloc_landing(LANDING_MAX + 1).unwrap();
        h.free_landing(big, LANDING_MAX + 1);
        assert!(h.free(c));
        // Kept blocks are out of the free list until the class is full.
        assert_eq!(h.free_bytes(), total - 64 - 128);
        for _ in 0..LANDING_KEEP {
            let x = h.carve(64).unwrap();
            h.free_landing(x, 64);
        }
        assert_eq!(h.landing[0].len(), LANDING_KEEP, "the class is full");
        let x = h.carve(64).unwrap();
        let before = h.free_bytes();
        h.free_landing(x, 64);
        assert_eq!(h.free_bytes(), before + 64, "past the class's keep it goes back to the heap");
    }
}
