//! DMA memory and the bus-address (IOVA) space.
//!
//! [`DmaMemory`] is page-aligned, zeroed anonymous memory that the driver
//! owns (rings, receive buffers, transmit header buffers). [`IovaSpace`]
//! hands out bus addresses for it and for registered user memory. Every
//! IOVA lies below 4 GiB, in a window that avoids the x86 interrupt range
//! at 0xFEE0_0000: the 2114x's descriptors carry 32-bit addresses, and a
//! NIC with 64-bit ones (the 82574) is content with them too.

use std::io;

pub const PAGE: usize = 4096;
/// First IOVA handed out.
pub const IOVA_START: u64 = 0x1000_0000;
/// End (exclusive) of the IOVA window.
pub const IOVA_END: u64 = 0xF000_0000;

/// Rounds `[addr, addr + len)` out to whole pages: (start, size).
pub fn page_span(addr: usize, len: usize) -> (usize, usize) {
    let start = addr & !(PAGE - 1);
    let end = (addr + len.max(1)).div_ceil(PAGE) * PAGE;
    (start, end - start)
}

/// Page-aligned zeroed memory, unmapped on drop.
pub struct DmaMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by this value alone; the raw pointer is not
// shared with other threads except through `&mut` access to the owner.
unsafe impl Send for DmaMemory {}

impl DmaMemory {
    pub fn new(len: usize) -> io::Result<DmaMemory> {
        let len = len.div_ceil(PAGE) * PAGE;
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DmaMemory { ptr: p.cast(), len })
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The byte at `off` (caller keeps `off` in bounds).
    pub fn at(&self, off: usize) -> *mut u8 {
        assert!(off < self.len, "DMA memory offset {off} out of {} bytes", self.len);
        // SAFETY: in bounds, asserted above.
        unsafe { self.ptr.add(off) }
    }
}

impl Drop for DmaMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// First-fit allocator of page-aligned IOVA ranges in the 32-bit window.
#[derive(Debug)]
pub struct IovaSpace {
    /// Free ranges (start, size), sorted by start, never adjacent.
    free: Vec<(u64, u64)>,
}

impl Default for IovaSpace {
    fn default() -> Self {
        IovaSpace { free: vec![(IOVA_START, IOVA_END - IOVA_START)] }
    }
}

impl IovaSpace {
    /// A page-aligned range of `size` bytes (a multiple of the page size).
    pub fn alloc(&mut self, size: u64) -> Option<u64> {
        debug_assert_eq!(size % PAGE as u64, 0);
        let i = self.free.iter().position(|&(_, s)| s >= size)?;
        let (start, s) = self.free[i];
        if s == size {
            self.free.remove(i);
        } else {
            self.free[i] = (start + size, s - size);
        }
        Some(start)
    }

    /// Returns a range from [`IovaSpace::alloc`], merging neighbours.
    pub fn release(&mut self, start: u64, size: u64) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, size));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Free bytes left.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, s)| s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_whole_pages() {
        assert_eq!(page_span(0x1000, 1), (0x1000, 0x1000));
        assert_eq!(page_span(0x1fff, 2), (0x1000, 0x2000));
        assert_eq!(page_span(0x1000, 0x1000), (0x1000, 0x1000));
        assert_eq!(page_span(0x1010, 0), (0x1000, 0x1000));
    }

    #[test]
    fn ranges_stay_below_4_gib_and_are_reused() {
        let mut s = IovaSpace::default();
        let total = s.free_bytes();
        let a = s.alloc(0x2000).unwrap();
        let b = s.alloc(0x1000).unwrap();
        let c = s.alloc(0x3000).unwrap();
        assert_eq!((a, b, c), (IOVA_START, IOVA_START + 0x2000, IOVA_START + 0x3000));
        s.release(b, 0x1000);
        assert_eq!(s.alloc(0x1000), Some(b), "a freed hole is reused first");
        s.release(a, 0x2000);
        s.release(b, 0x1000);
        s.release(c, 0x3000);
        assert_eq!(s.free_bytes(), total);
        assert_eq!(s.free.len(), 1, "neighbours merge back into one range");
        assert!(s.alloc(IOVA_END - IOVA_START + 0x1000).is_none());
        let big = s.alloc(IOVA_END - IOVA_START).unwrap();
        assert!(big + (IOVA_END - IOVA_START) <= 1 << 32);
    }
}
