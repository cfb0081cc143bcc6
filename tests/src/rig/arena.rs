//! [`Arena`]: a host's memory in the rig, page-aligned, laid out in
//! [`page`]s whose registration is known, so that a test can tell which
//! bytes the engine may write and check that it wrote no others.

use std::alloc::Layout;
use std::ops::Range;

pub const PAGE: usize = 4096;

/// Where each part of an arena starts (in pages) and how long it is.
pub mod page {
    /// Never registered.
    pub const GUARD_LO: usize = 0;
    /// Descriptor slots, registered under the VI's tag, RDMA off.
    pub const DESCS: usize = 1;
    /// Message buffers, registered under the VI's tag, RDMA off.
    pub const BUFS: usize = 2;
    /// The RDMA window: the VI's tag, RDMA write and read on.
    pub const WINDOW: usize = 4;
    /// Registered under the VI's tag with RDMA off.
    pub const CLOSED: usize = 6;
    /// Registered with RDMA on, under another protection tag.
    pub const FOREIGN: usize = 7;
    /// Never registered.
    pub const GUARD_HI: usize = 8;
    pub const COUNT: usize = 9;
}

/// Bytes per descriptor slot in [`page::DESCS`]: a control segment and
/// up to [`SLOT_SEGMENTS`] segments.
pub const SLOT_BYTES: usize = 256;
pub const SLOT_SEGMENTS: usize = (SLOT_BYTES - 32) / 16;
pub const SLOTS: usize = PAGE / SLOT_BYTES;

/// Byte range (offsets in the arena) of pages `first..first + n`.
pub fn pages(first: usize, n: usize) -> Range<usize> {
    first * PAGE..(first + n) * PAGE
}

/// Owned, zeroed, page-aligned memory the engine reaches by address.
pub struct Arena {
    ptr: *mut u8,
}

fn layout() -> Layout {
    Layout::from_size_align(page::COUNT * PAGE, PAGE).expect("constant layout")
}

impl Arena {
    pub fn new() -> Arena {
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout()) };
        assert!(!ptr.is_null(), "allocating a rig arena");
        Arena { ptr }
    }

    pub fn len(&self) -> usize {
        page::COUNT * PAGE
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address of byte `off` (what descriptors and frames carry).
    pub fn addr(&self, off: usize) -> usize {
        self.ptr as usize + off
    }

    /// A copy of the whole arena.
    pub fn snapshot(&self) -> Vec<u8> {
        self.read(0..self.len())
    }

    /// A copy of bytes `range`.
    pub fn read(&self, range: Range<usize>) -> Vec<u8> {
        assert!(range.start <= range.end && range.end <= self.len(), "read past the arena");
        // SAFETY: the range was just checked to be in the arena; the engine
        // only writes it inside its calls, never while this copy is taken.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }.to_vec()
    }

    /// Copies `data` to offset `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len(), "write past the arena");
        // SAFETY: the destination range was just checked to be in the arena.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `Arena::new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout()) };
    }
}

/// The first offset outside `allowed` where `before` and `after` differ.
pub fn first_change(before: &[u8], after: &[u8], allowed: &[Range<usize>]) -> Option<usize> {
    (0..before.len()).find(|&i| before[i] != after[i] && !allowed.iter().any(|r| r.contains(&i)))
}
