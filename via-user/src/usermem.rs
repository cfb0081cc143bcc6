//! The only place the engine touches application memory: reading posted
//! descriptors, writing their completion fields, gathering send payloads and
//! scattering received ones. Every caller first checks the range against the
//! registration table, so each access here is inside memory the application
//! registered and promised (by the VIA contract) to keep alive while
//! registered.

use crate::descriptor::{descriptor_bytes, AddressSegment, AtomicOperands, ControlSegment, DataSegment};
use via_kernel_agent::memory::{MemError, Ptag, RegistrationTable};

/// Checks that the descriptor at `addr` with handle `handle` lies in memory
/// registered under `ptag`, reads its control segment and checks its
/// segments fit too. Returns the control segment.
pub fn read_control(mem: &RegistrationTable, addr: usize, handle: u32, ptag: Ptag) -> Result<ControlSegment, MemError> {
    let region = *mem.check(handle, addr, descriptor_bytes(0), ptag)?;
    // SAFETY: the 32 bytes at `addr` were just checked to be registered
    // memory; `addr` is 64-byte aligned (checked by the caller).
    let cs = unsafe { std::ptr::read_volatile(addr as *const ControlSegment) };
    if !region.contains(addr, descriptor_bytes(cs.seg_count as usize)) {
        return Err(MemError::OutOfBounds);
    }
    Ok(cs)
}

/// Is the descriptor at `addr`, with its `segs` segments, still in memory
/// registered as `handle` under `ptag`? Checked before its segments are
/// read again after posting: the application may have deregistered (and
/// unmapped) it since.
pub fn descriptor_registered(mem: &RegistrationTable, addr: usize, handle: u32, segs: usize, ptag: Ptag) -> bool {
    mem.check(handle, addr, descriptor_bytes(segs), ptag).is_ok()
}

/// Reads data segment `i` of the descriptor at `addr`.
///
/// # Safety
/// The descriptor with at least `i + 1` segments lies in registered
/// memory, checked under the engine lock held since: by [`read_control`]
/// when it is posted, by [`descriptor_registered`] when it is read after
/// posting (the application may have deregistered it meanwhile).
pub unsafe fn read_segment(addr: usize, i: usize) -> DataSegment {
    // SAFETY: the caller's promise; segments are 16-byte aligned in a
    // 64-byte aligned descriptor.
    unsafe { std::ptr::read_volatile((addr + 32 + 16 * i) as *const DataSegment) }
}

/// The control-segment words of the descriptor at `addr` a kept post
/// compares, little-endian as they lie: the count-and-control word (bytes
/// 12..16: `SegCount | Control << 16`) and the immediate data and length
/// (bytes 20..28: `ImmediateData | Length << 32`).
///
/// # Safety
/// As for [`read_segment`]: the descriptor lies in registered memory
/// checked under the engine lock held since.
pub unsafe fn read_control_words(addr: usize) -> (u32, u64) {
    // SAFETY: the caller's promise; the words lie in the 32-byte control
    // segment of a 64-byte aligned descriptor, each at its alignment (the
    // 8 bytes at 20 as two 4-byte words).
    unsafe {
        let control = std::ptr::read_volatile((addr + 12) as *const u32);
        let imm = std::ptr::read_volatile((addr + 20) as *const u32);
        let len = std::ptr::read_volatile((addr + 24) as *const u32);
        (control, u64::from(imm) | u64::from(len) << 32)
    }
}

/// Data segment `i` of the descriptor at `addr` as one 16-byte word,
/// little-endian as it lies: `address | handle << 64 | length << 96`.
///
/// # Safety
/// As for [`read_segment`].
pub unsafe fn read_segment_word(addr: usize, i: usize) -> u128 {
    // SAFETY: the caller's promise; a segment is 16-byte aligned.
    unsafe { std::ptr::read_volatile((addr + 32 + 16 * i) as *const u128) }
}

/// Reads segment 0 of the RDMA descriptor at `addr` as the remote
/// address segment.
///
/// # Safety
/// As for [`read_segment`] with `i` 0: the descriptor has a segment and
/// was checked against the registration table.
pub unsafe fn read_address_segment(addr: usize) -> AddressSegment {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::read_volatile((addr + 32) as *const AddressSegment) }
}

/// Reads segment 1 of the atomic descriptor at `addr` as its operands.
///
/// # Safety
/// As for [`read_segment`] with `i` 1: the descriptor has at least two
/// segments and was checked against the registration table.
pub unsafe fn read_atomic_operands(addr: usize) -> AtomicOperands {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::read_volatile((addr + 48) as *const AtomicOperands) }
}

/// Writes the completion fields of the descriptor at `addr`, if its memory
/// is still registered.
pub fn write_completion(mem: &RegistrationTable, addr: usize, handle: u32, length: u32, status: u32, imm: Option<u32>) -> bool {
    if mem.lookup(handle).map(|r| r.contains(addr, descriptor_bytes(0))) != Ok(true) {
        return false;
    }
    // SAFETY: the control segment lies in registered memory (checked above).
    unsafe { write_completion_unchecked(addr, length, status, imm) };
    true
}

/// [`write_completion`] of a descriptor whose control segment is known to
/// be registered.
///
/// # Safety
/// The control segment at `addr` was checked against the registration
/// table, and nothing was deregistered since (its epoch stands), under the
/// engine lock held since.
#[inline]
pub unsafe fn write_completion_unchecked(addr: usize, length: u32, status: u32, imm: Option<u32>) {
    let cs = addr as *mut ControlSegment;
    // SAFETY: the caller's promise. Status is written last so a poller
    // that sees DONE sees the rest.
    unsafe {
        if let Some(v) = imm {
            std::ptr::addr_of_mut!((*cs).immediate_data).write_volatile(v);
        }
        std::ptr::addr_of_mut!((*cs).length).write_volatile(length);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        std::ptr::addr_of_mut!((*cs).status).write_volatile(status);
    }
}

/// Zeroes `Length` and `Status` of the descriptor at `addr`.
///
/// # Safety
/// Its control segment was checked against the registration table
/// ([`read_control`]) under the engine lock held since.
pub unsafe fn clear_completion(addr: usize) {
    let cs = addr as *mut ControlSegment;
    // SAFETY: the caller's promise.
    unsafe {
        std::ptr::addr_of_mut!((*cs).length).write_volatile(0);
        std::ptr::addr_of_mut!((*cs).status).write_volatile(0);
    }
}

/// A view of `len` bytes of registered memory at `addr`, for the device to
/// gather from.
///
/// # Safety
/// `[addr, addr + len)` must have been checked against the registration
/// table, and the view must not outlive the registration.
pub unsafe fn bytes<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(addr as *const u8, len)
}

/// Copies `src` into registered memory at `addr`.
///
/// # Safety
/// `[addr, addr + src.len())` must have been checked against the
/// registration table.
pub unsafe fn copy_in(addr: usize, src: &[u8]) {
    std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len());
}

/// Runs remote atomic `code` ([`via_wire::atomic_op`]) on the 8 bytes
/// at `addr` with `operands` (two little-endian u64s: the addend or
/// compare value, the swap value); returns the value before. Atomic with
/// respect to the application's own atomics on the same word. None for an
/// unknown code (nothing is touched).
///
/// # Safety
/// `[addr, addr + 8)` was checked against the registration table under
/// the engine lock held since, and `addr` is 8-byte aligned.
pub unsafe fn atomic_at(addr: usize, code: u32, operands: &[u8; 16]) -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let a = u64::from_le_bytes(operands[..8].try_into().unwrap());
    let b = u64::from_le_bytes(operands[8..].try_into().unwrap());
    // SAFETY: the caller's promise: registered, aligned, live.
    let word = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
    match code {
        via_wire::atomic_op::FETCH_ADD => Some(word.fetch_add(a, Ordering::SeqCst)),
        via_wire::atomic_op::CMP_SWAP => Some(word.compare_exchange(a, b, Ordering::SeqCst, Ordering::SeqCst).unwrap_or_else(|old| old)),
        _ => None,
    }
}
