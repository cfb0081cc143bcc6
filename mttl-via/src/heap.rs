//! The global heap of one process: the memory `GlobalPtr`s point into
//! (registered with the NIC on VIA, so peers reach it by RDMA), handed
//! out first-fit in 64-byte-aligned blocks. Offsets, not addresses, cross
//! the wire.

use std::collections::{BTreeMap, HashMap};

const ALIGN: u64 = 64;

pub(crate) struct HeapAlloc {
    base: *mut u8,
    len: u64,
    /// Free blocks: offset → length, coalesced.
    free: BTreeMap<u64, u64>,
    /// Blocks handed out: offset → length.
    used: HashMap<u64, u64>,
}

impl HeapAlloc {
    pub fn new(base: *mut u8, len: usize) -> HeapAlloc {
        let mut free = BTreeMap::new();
        // Offset 0 is never handed out, so a zero GlobalPtr is "null".
        if len as u64 > ALIGN {
            free.insert(ALIGN, len as u64 - ALIGN);
        }
        HeapAlloc { base, len: len as u64, free, used: HashMap::new() }
    }

    /// A zeroed block of `bytes` (at least 1), or None when the heap is full.
    pub fn alloc(&mut self, bytes: usize) -> Option<u64> {
        let want = (bytes.max(1) as u64).div_ceil(ALIGN) * ALIGN;
        let (&off, &len) = self.free.iter().find(|(_, &l)| l >= want)?;
        self.free.remove(&off);
        if len > want {
            self.free.insert(off + want, len - want);
        }
        self.used.insert(off, want);
        // SAFETY: [off, off + want) is inside the heap and handed out to nobody else.
        unsafe { std::ptr::write_bytes(self.base.add(off as usize), 0, want as usize) };
        Some(off)
    }

    /// Gives block `off` back. Returns false if it is not a block in use.
    pub fn free(&mut self, off: u64) -> bool {
        let Some(mut len) = self.used.remove(&off) else { return false };
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
        true
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
}
