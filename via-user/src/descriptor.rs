//! VIA 1.0 descriptors: the `#[repr(C)]` layout of `VIP_DESCRIPTOR` and its
//! segments, and the control and status bits, exactly as `vipl.h` has them.
//!
//! A descriptor lives in registered memory owned by the application: a
//! 32-byte control segment followed by `SegCount` 16-byte data (or, for
//! RDMA, address + data) segments. The engine reads it when it is posted and
//! writes `Length`, `Status` and `ImmediateData` back when it completes.

/// `VIP_DESCRIPTOR_ALIGNMENT`.
pub const DESCRIPTOR_ALIGNMENT: usize = 64;

/// `VIP_PVOID64`: an address carried in 64 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pvoid64 {
    pub address_bits: u64,
}

/// `VIP_CONTROL_SEGMENT` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlSegment {
    pub next: Pvoid64,
    pub next_handle: u32,
    pub seg_count: u16,
    pub control: u16,
    pub reserved: u32,
    pub immediate_data: u32,
    pub length: u32,
    pub status: u32,
}

/// `VIP_DATA_SEGMENT` (16 bytes): local memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataSegment {
    pub data: Pvoid64,
    pub handle: u32,
    pub length: u32,
}

/// `VIP_ADDRESS_SEGMENT` (16 bytes): the remote side of an RDMA operation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressSegment {
    pub data: Pvoid64,
    pub handle: u32,
    pub reserved: u32,
}

/// `VIP_DESCRIPTOR`: the control segment and the first two segments;
/// further segments follow in memory.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub cs: ControlSegment,
    pub ds: [DataSegment; 2],
}

/// The operands of a remote atomic (extension, `vipl_ext.h`): the
/// segment after the address segment of a descriptor whose operation is
/// [`control::OP_ATOMIC`]. Its local data segment (the 8 bytes that
/// receive the target's value before the operation) comes third.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicOperands {
    /// Fetch-and-add: the addend. Compare-and-swap: the value compared.
    pub compare_add: u64,
    /// Compare-and-swap: the value stored when the compare matched.
    pub swap: u64,
}

/// Bytes a descriptor with `segs` segments occupies.
pub const fn descriptor_bytes(segs: usize) -> usize {
    32 + 16 * segs
}

/// `VIP_CONTROL_*` bits of `ControlSegment::control`.
pub mod control {
    pub const OP_SENDRECV: u16 = 0x0;
    pub const OP_RDMAWRITE: u16 = 0x1;
    pub const OP_RDMAREAD: u16 = 0x2;
    pub const OP_RESERVED: u16 = 0x3;
    pub const OP_MASK: u16 = 0x3;
    pub const IMMEDIATE: u16 = 0x4;
    pub const QFENCE: u16 = 0x8;
    pub const RESERVED: u16 = 0xFFF0;
    /// Extension (`vipl_ext.h`): a remote atomic. VIA 1.0's reserved
    /// operation code, valid only with one of the two atomic bits below
    /// (alone it stays a FORMAT_ERROR). Segments: the address segment
    /// (the 8-byte, 8-aligned target), [`super::AtomicOperands`], one
    /// local data segment of 8 bytes for the value before the operation.
    pub const OP_ATOMIC: u16 = OP_RESERVED;
    /// With [`OP_ATOMIC`]: add `compare_add` to the target.
    pub const ATOMIC_FETCH_ADD: u16 = 0x10;
    /// With [`OP_ATOMIC`]: store `swap` if the target equals `compare_add`.
    pub const ATOMIC_CMP_SWAP: u16 = 0x20;
    /// The control bits an atomic may carry besides its operation bits.
    pub const ATOMIC_ALLOWED: u16 = OP_MASK | QFENCE | ATOMIC_FETCH_ADD | ATOMIC_CMP_SWAP;
}

/// `VIP_STATUS_*` bits of `ControlSegment::status`.
pub mod status {
    pub const DONE: u32 = 0x1;
    pub const FORMAT_ERROR: u32 = 0x2;
    pub const PROTECTION_ERROR: u32 = 0x4;
    pub const LENGTH_ERROR: u32 = 0x8;
    pub const PARTIAL_ERROR: u32 = 0x10;
    pub const DESC_FLUSHED_ERROR: u32 = 0x20;
    pub const TRANSPORT_ERROR: u32 = 0x40;
    pub const RDMA_PROT_ERROR: u32 = 0x80;
    pub const REMOTE_DESC_ERROR: u32 = 0x100;
    pub const ERROR_MASK: u32 = 0x1FE;
    pub const OP_SEND: u32 = 0x0;
    pub const OP_RECEIVE: u32 = 0x10000;
    pub const OP_RDMA_WRITE: u32 = 0x20000;
    pub const OP_REMOTE_RDMA_WRITE: u32 = 0x30000;
    pub const OP_RDMA_READ: u32 = 0x40000;
    /// Extension (`vipl_ext.h`): a remote atomic completed.
    pub const OP_ATOMIC: u32 = 0x50000;
    pub const OP_MASK: u32 = 0x70000;
    pub const IMMEDIATE: u32 = 0x80000;
    pub const RESERVED: u32 = 0xFFF0_FE00;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout_matches_vipl_h() {
        assert_eq!(size_of::<ControlSegment>(), 32);
        assert_eq!(offset_of!(ControlSegment, next), 0);
        assert_eq!(offset_of!(ControlSegment, next_handle), 8);
        assert_eq!(offset_of!(ControlSegment, seg_count), 12);
        assert_eq!(offset_of!(ControlSegment, control), 14);
        assert_eq!(offset_of!(ControlSegment, reserved), 16);
        assert_eq!(offset_of!(ControlSegment, immediate_data), 20);
        assert_eq!(offset_of!(ControlSegment, length), 24);
        assert_eq!(offset_of!(ControlSegment, status), 28);
        assert_eq!(size_of::<DataSegment>(), 16);
        assert_eq!(offset_of!(DataSegment, handle), 8);
        assert_eq!(offset_of!(DataSegment, length), 12);
        assert_eq!(size_of::<AddressSegment>(), 16);
        assert_eq!(size_of::<Descriptor>(), 64);
        assert_eq!(align_of::<Descriptor>(), DESCRIPTOR_ALIGNMENT);
        assert_eq!(descriptor_bytes(2), 64);
        assert_eq!(size_of::<AtomicOperands>(), size_of::<DataSegment>());
    }
}
