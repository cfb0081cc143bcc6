//! Registered memory and descriptors in the Rust API.
//!
//! A [`MemoryRegion`] is memory the API allocates and registers with a NIC
//! (`VipRegisterMem`); it is deregistered and freed when the last clone is
//! dropped. A [`Descriptor`] is a `VIP_DESCRIPTOR` living in a slot of a
//! registered block it shares with the NIC's other descriptors of its
//! size and tag ([`blocks`]); it keeps the regions its segments point
//! into alive, so a posted descriptor can never refer to freed memory.
//!
//! The engine writes into a region while a receive descriptor pointing into
//! it is posted: read a buffer after its descriptor completed, and do not
//! change a send buffer while its descriptor is posted (the VIA contract).

mod blocks;

use blocks::Slot;
use crate::descriptor::{self, control, descriptor_bytes, status, AddressSegment, AtomicOperands, DataSegment, Pvoid64};
use crate::error::{Result, ViaError};
use crate::nic::Nic;
use std::alloc::Layout;
use std::ops::Range;
use std::sync::Arc;
use via_kernel_agent::memory::{MemAttributes, Ptag};

struct RegionInner {
    nic: Nic,
    ptr: *mut u8,
    layout: Layout,
    handle: u32,
}

// SAFETY: the region is plain memory; all access goes through raw-pointer
// copies (the engine's under its lock), never through shared references
// that assume immutability.
unsafe impl Send for RegionInner {}
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        let _ = self.nic.raw().deregister(self.ptr as usize, self.handle);
        // SAFETY: allocated in `MemoryRegion::new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Registered memory (`VipRegisterMem` on memory the API allocates).
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<RegionInner>,
}

impl MemoryRegion {
    /// Allocates `len` zeroed bytes aligned to `align` and registers them.
    pub fn new(nic: &Nic, len: usize, align: usize, attrs: MemAttributes) -> Result<MemoryRegion> {
        let layout = Layout::from_size_align(len.max(1), align.max(1)).map_err(|e| ViaError::invalid(format!("region layout: {e}")))?;
        // SAFETY: the layout has nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(ViaError::resource(format!("cannot allocate {len} bytes")));
        }
        // SAFETY: the allocation stays until `RegionInner::drop`, which
        // deregisters it first.
        let handle = match unsafe { nic.raw().register(ptr as usize, layout.size(), attrs) } {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: just allocated with `layout`.
                unsafe { std::alloc::dealloc(ptr, layout) };
                return Err(e);
            }
        };
        Ok(MemoryRegion { inner: Arc::new(RegionInner { nic: nic.clone(), ptr, layout, handle }) })
    }

    /// The memory handle (`VIP_MEM_HANDLE`).
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr
    }

    pub fn len(&self) -> usize {
        self.inner.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(ViaError::invalid(format!("range {off}+{len} is outside the region of {} bytes", self.len())));
        }
        Ok(())
    }

    /// Copies `data` into the region at `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        // SAFETY: in bounds (checked); raw copy, no reference held.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.inner.ptr.add(off), data.len()) };
        Ok(())
    }

    /// Copies bytes at `off` out of the region into `out`.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.check(off, out.len())?;
        // SAFETY: in bounds (checked); raw copy, no reference held.
        unsafe { std::ptr::copy_nonoverlapping(self.inner.ptr.add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// A copy of `range`.
    pub fn to_vec(&self, range: Range<usize>) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.append_to(range, &mut v)?;
        Ok(v)
    }

    /// Appends the bytes of `range` to `out` (one copy, no zero-filling
    /// first: a message of tens of KB costs one pass over it, not two).
    pub fn append_to(&self, range: Range<usize>, out: &mut Vec<u8>) -> Result<()> {
        self.check(range.start, range.len())?;
        out.reserve(range.len());
        let at = out.len();
        // SAFETY: the source is in bounds (checked); `reserve` made room
        // for `range.len()` bytes after `at`, which the copy initialises
        // before `set_len` covers them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.ptr.add(range.start), out.as_mut_ptr().add(at), range.len());
            out.set_len(at + range.len());
        }
        Ok(())
    }

    fn same(&self, other: &MemoryRegion) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// `VipQueryMem`: the region's protection tag and RDMA enable bits.
    pub fn attributes(&self) -> Result<MemAttributes> {
        self.inner.nic.raw().query_mem(self.inner.ptr as usize, self.inner.handle)
    }

    /// `VipSetMemAttributes`: changes the protection tag (it must exist)
    /// and the RDMA enable bits. Checks made from now on use the new ones.
    pub fn set_attributes(&self, attrs: MemAttributes) -> Result<()> {
        self.inner.nic.raw().set_mem_attributes(self.inner.ptr as usize, self.inner.handle, attrs)
    }

    /// The address and handle a peer needs to RDMA into or out of
    /// `range` of this region (send it to the peer in a message).
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteBuffer> {
        self.check(range.start, range.len())?;
        Ok(RemoteBuffer { addr: self.inner.ptr as u64 + range.start as u64, handle: self.inner.handle, len: range.len() as u64 })
    }
}

/// A range of a peer's registered memory, the target of RDMA (what a
/// `VIP_ADDRESS_SEGMENT` names, plus the length the peer offered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteBuffer {
    pub addr: u64,
    pub handle: u32,
    pub len: u64,
}

impl RemoteBuffer {
    /// Encoded size: address, handle, length, big-endian.
    pub const BYTES: usize = 20;

    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.handle.to_be_bytes());
        b[12..20].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<RemoteBuffer> {
        if b.len() < Self::BYTES {
            return Err(ViaError::invalid(format!("a remote buffer takes {} bytes, got {}", Self::BYTES, b.len())));
        }
        Ok(RemoteBuffer {
            addr: u64::from_be_bytes(b[0..8].try_into().unwrap()),
            handle: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            len: u64::from_be_bytes(b[12..20].try_into().unwrap()),
        })
    }

    /// The part of this buffer starting `off` bytes in (no bounds check:
    /// the target checks every access).
    pub fn offset(&self, off: u64) -> RemoteBuffer {
        RemoteBuffer { addr: self.addr.wrapping_add(off), handle: self.handle, len: self.len.saturating_sub(off) }
    }
}

/// The operation a descriptor asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send (on the send queue) or receive (on the receive queue).
    SendRecv,
    /// Write the local segments into the remote buffer.
    RdmaWrite(RemoteBuffer),
    /// Read the remote buffer into the local segments (reliable VIs).
    RdmaRead(RemoteBuffer),
    /// Extension (`vipl_ext.h`): add `add` to the 8 bytes at the start of
    /// the remote buffer (8-byte aligned; the target's region and VI need
    /// RDMA write enabled), atomically; the value before lands in the one
    /// local segment, of 8 bytes, in this host's byte order. Reliable VIs.
    /// It runs once at the target, even when its request is sent again.
    FetchAdd { remote: RemoteBuffer, add: u64 },
    /// Extension: if the 8 bytes at the start of the remote buffer equal
    /// `compare`, store `swap` there, atomically; the value before lands
    /// in the local segment as for [`Op::FetchAdd`].
    CompareSwap { remote: RemoteBuffer, compare: u64, swap: u64 },
}

impl Op {
    /// The remote buffer an RDMA operation or atomic names.
    fn remote(&self) -> Option<RemoteBuffer> {
        match *self {
            Op::SendRecv => None,
            Op::RdmaWrite(r) | Op::RdmaRead(r) | Op::FetchAdd { remote: r, .. } | Op::CompareSwap { remote: r, .. } => Some(r),
        }
    }

    /// An atomic's operands (addend or compare value, swap value).
    fn atomic_operands(&self) -> Option<AtomicOperands> {
        match *self {
            Op::FetchAdd { add, .. } => Some(AtomicOperands { compare_add: add, swap: 0 }),
            Op::CompareSwap { compare, swap, .. } => Some(AtomicOperands { compare_add: compare, swap }),
            _ => None,
        }
    }
}

/// A `VIP_DESCRIPTOR` in registered memory, with room for a fixed number
/// of data segments.
pub struct Descriptor {
    /// Its memory: a slot of a registered block the NIC shares among its
    /// descriptors ([`blocks`]).
    mem: Slot,
    max_segs: usize,
    /// Regions the segments point into, kept alive while the descriptor is.
    refs: Vec<MemoryRegion>,
}

impl Descriptor {
    /// A descriptor with room for `max_segs` data segments, registered under `ptag`.
    pub fn new(nic: &Nic, ptag: Ptag, max_segs: usize) -> Result<Descriptor> {
        let bytes = descriptor_bytes(max_segs.max(2) + 1); // + an RDMA address segment
        let mem = blocks::take(nic, ptag, bytes)?;
        Ok(Descriptor { mem, max_segs: max_segs.max(1), refs: Vec::new() })
    }

    /// Address of the descriptor.
    pub fn addr(&self) -> usize {
        self.mem.addr()
    }

    /// Memory handle of the descriptor's own memory.
    pub fn handle(&self) -> u32 {
        self.mem.handle()
    }

    fn cs(&self) -> descriptor::ControlSegment {
        // SAFETY: the control segment is the first 32 bytes of our region.
        unsafe { std::ptr::read_volatile(self.addr() as *const descriptor::ControlSegment) }
    }

    /// The field of the control segment at `offset` (`offset_of!`), read
    /// alone: a whole-segment volatile read copies all 32 bytes to use 4.
    #[inline(always)]
    fn cs_field<T: Copy>(&self, offset: usize) -> T {
        debug_assert!(offset + std::mem::size_of::<T>() <= std::mem::size_of::<descriptor::ControlSegment>());
        // SAFETY: the control segment is the first 32 bytes of our region
        // (aligned to DESCRIPTOR_ALIGNMENT), and `offset` is one of its
        // fields' (the callers pass `offset_of!` with the field's type).
        unsafe { std::ptr::read_volatile((self.addr() + offset) as *const T) }
    }

    /// Fills in a send/receive descriptor over `segments` (region, byte
    /// range), with optional immediate data.
    pub fn set(&mut self, segments: &[(&MemoryRegion, Range<usize>)], imm: Option<u32>) -> Result<()> {
        self.set_op(Op::SendRecv, segments, imm, false)
    }

    /// Fills in a descriptor for `op` over the local `segments`, with
    /// optional immediate data (sends and RDMA writes) and the QFENCE bit
    /// (wait for earlier RDMA reads of the VI before starting).
    pub fn set_op(&mut self, op: Op, segments: &[(&MemoryRegion, Range<usize>)], imm: Option<u32>, fence: bool) -> Result<()> {
        let remote = op.remote();
        let operands = op.atomic_operands();
        // An atomic's operands take the segment after the address segment.
        let first = usize::from(remote.is_some()) + usize::from(operands.is_some());
        if operands.is_some() && (segments.len() != 1 || imm.is_some()) {
            return Err(ViaError::invalid("an atomic has one local segment (8 bytes, for the value before) and no immediate data"));
        }
        if segments.len() > self.max_segs {
            return Err(ViaError::invalid(format!("{} data segments, the descriptor has room for {}", segments.len(), self.max_segs)));
        }
        let mut total: u64 = 0;
        for (r, range) in segments {
            r.check(range.start, range.len())?;
            total += range.len() as u64;
        }
        if total > u32::MAX as u64 {
            return Err(ViaError::invalid("descriptor longer than 4 GiB"));
        }
        self.refs.clear();
        for (r, _) in segments {
            if !self.refs.iter().any(|x| x.same(r)) {
                self.refs.push((*r).clone());
            }
        }
        let opbits = match op {
            Op::SendRecv => control::OP_SENDRECV,
            Op::RdmaWrite(_) => control::OP_RDMAWRITE,
            Op::RdmaRead(_) => control::OP_RDMAREAD,
            Op::FetchAdd { .. } => control::OP_ATOMIC | control::ATOMIC_FETCH_ADD,
            Op::CompareSwap { .. } => control::OP_ATOMIC | control::ATOMIC_CMP_SWAP,
        };
        let cs = descriptor::ControlSegment {
            seg_count: (first + segments.len()) as u16,
            control: opbits | if imm.is_some() { control::IMMEDIATE } else { 0 } | if fence { control::QFENCE } else { 0 },
            immediate_data: imm.unwrap_or(0),
            length: total as u32,
            ..Default::default()
        };
        let base = self.addr();
        // SAFETY: the descriptor region holds the control segment and
        // room for `first + segments.len()` segments (checked above).
        unsafe {
            std::ptr::write_volatile(base as *mut descriptor::ControlSegment, cs);
            if let Some(r) = remote {
                let a = AddressSegment { data: Pvoid64 { address_bits: r.addr }, handle: r.handle, reserved: 0 };
                std::ptr::write_volatile((base + 32) as *mut AddressSegment, a);
            }
            if let Some(o) = operands {
                std::ptr::write_volatile((base + 48) as *mut AtomicOperands, o);
            }
            for (i, (r, range)) in segments.iter().enumerate() {
                let ds = DataSegment { data: Pvoid64 { address_bits: (r.as_ptr() as usize + range.start) as u64 }, handle: r.handle(), length: range.len() as u32 };
                std::ptr::write_volatile((base + 32 + 16 * (first + i)) as *mut DataSegment, ds);
            }
        }
        Ok(())
    }

    /// Writes raw control-segment fields, for tests of malformed
    /// descriptors (reserved bits, segment counts).
    pub fn set_raw_control(&mut self, control: u16, seg_count: u16, length: u32) {
        let base = self.addr() as *mut descriptor::ControlSegment;
        // SAFETY: the control segment is the first 32 bytes of our region.
        unsafe {
            std::ptr::addr_of_mut!((*base).control).write_volatile(control);
            std::ptr::addr_of_mut!((*base).seg_count).write_volatile(seg_count);
            std::ptr::addr_of_mut!((*base).length).write_volatile(length);
        }
    }

    /// The `Control` field (operation and flags) as last set.
    pub fn control(&self) -> u16 {
        self.cs_field::<u16>(std::mem::offset_of!(descriptor::ControlSegment, control))
    }

    /// The raw `Status` field.
    pub fn status(&self) -> u32 {
        self.cs_field::<u32>(std::mem::offset_of!(descriptor::ControlSegment, status))
    }

    /// Has the descriptor completed (successfully or not)?
    pub fn is_done(&self) -> bool {
        self.status() & status::DONE != 0
    }

    /// The error bits of the status (0 when it completed cleanly).
    pub fn errors(&self) -> u32 {
        self.status() & status::ERROR_MASK
    }

    /// `Length`: bytes received (receive) or sent (send).
    pub fn length(&self) -> u32 {
        self.cs_field::<u32>(std::mem::offset_of!(descriptor::ControlSegment, length))
    }

    /// The `ImmediateData` field as posted (what a send carries).
    pub fn immediate_data_sent(&self) -> u32 {
        self.cs_field::<u32>(std::mem::offset_of!(descriptor::ControlSegment, immediate_data))
    }

    /// Immediate data, when the status says it arrived.
    pub fn immediate(&self) -> Option<u32> {
        let cs = self.cs();
        (cs.status & status::IMMEDIATE != 0).then_some(cs.immediate_data)
    }

    /// `Ok` when the descriptor completed without error; otherwise an
    /// error naming the status bits.
    #[inline]
    pub fn check_ok(&self) -> Result<()> {
        let s = self.status();
        if s & (status::DONE | status::ERROR_MASK) != status::DONE {
            return Err(not_ok(s));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Descriptor {{ addr: {:#x}, status: {:#x}, length: {} }}", self.addr(), self.status(), self.length())
    }
}

/// Why a descriptor with status `s` is not a clean completion (the cold
/// half of [`Descriptor::check_ok`]).
#[cold]
#[inline(never)]
fn not_ok(s: u32) -> ViaError {
    if s & status::DONE == 0 {
        return ViaError::not_done();
    }
    ViaError::new(crate::VipReturn::DescriptorError, format!("descriptor completed with status {s:#x} ({})", status_names(s)))
}

/// Names of the error bits in a status word.
pub fn status_names(s: u32) -> String {
    let names = [
        (status::FORMAT_ERROR, "FORMAT"),
        (status::PROTECTION_ERROR, "PROTECTION"),
        (status::LENGTH_ERROR, "LENGTH"),
        (status::PARTIAL_ERROR, "PARTIAL"),
        (status::DESC_FLUSHED_ERROR, "DESC_FLUSHED"),
        (status::TRANSPORT_ERROR, "TRANSPORT"),
        (status::RDMA_PROT_ERROR, "RDMA_PROT"),
        (status::REMOTE_DESC_ERROR, "REMOTE_DESC"),
    ];
    let v: Vec<_> = names.iter().filter(|(b, _)| s & b != 0).map(|(_, n)| *n).collect();
    if v.is_empty() {
        "no error".into()
    } else {
        v.join("|")
    }
}
