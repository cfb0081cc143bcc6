//! Where a small frame's cache lines should be when the other core asks
//! for them: hints to the processor, never needed for correctness.
//!
//! A slot's lines cross between the two cores twice a message: the sender
//! takes them for writing (a read for ownership, which takes them from the
//! receiver's cache, where they were read last), the receiver then takes
//! them back. Two hints shorten both crossings where the cores share only
//! the last-level cache (docs/DESIGN-NOTES.md, "The machine's two states"):
//! - [`demote`] (`CLDEMOTE`), once a frame is published, pushes its lines
//!   from the sender's private caches to the shared one, where the
//!   receiver's read finds them without asking the sender's core;
//! - [`own`] (`PREFETCHW`), after a publish, asks for the next slot's
//!   lines past the first for writing, so that the next frame's writes do
//!   not wait for them (the first line, which the owner polls, is left
//!   alone: taking it would only make the owner's poll fetch it back).
//!
//! Both instructions are hints in the hint-NOP space: a processor without
//! them runs them as NOPs, and neither faults. Elsewhere than x86-64 both
//! do nothing.

/// The most of a slot's bytes (its prefix and frame) that are hinted:
/// three lines, what a 64-byte message takes boxed (two) or as a frame
/// (an RDMA write's), and MTTL's requests and replies. A larger frame's
/// copy is the processor's streaming business (`payload_copy`).
pub(super) const HINTED_BYTES: usize = 192;

/// Pushes the line holding `p` towards the cache the cores share.
#[inline(always)]
pub(super) fn demote(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: CLDEMOTE is a hint: it changes no architectural state and
    // raises no fault for any address (Intel SDM vol. 2A, CLDEMOTE).
    unsafe {
        std::arch::asm!("cldemote [{}]", in(reg) p, options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the line holding `p` in this core's cache, owned for writing.
#[inline(always)]
pub(super) fn own(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW is a hint: it reads nothing into the program and
    // cannot fault (Intel SDM vol. 2B, PREFETCHW).
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// [`demote`]s the lines of the first `used` bytes from `s` (a line's
/// start; `used` at most [`HINTED_BYTES`]).
#[inline(always)]
pub(super) fn demote_used(s: *const u8, used: usize) {
    demote(s);
    demote(s.wrapping_add(64));
    if used > 128 {
        demote(s.wrapping_add(128));
    }
}

/// [`own`]s the lines past the first of the first `used` bytes from `s`
/// (a line's start; `used` at most [`HINTED_BYTES`]).
#[inline(always)]
pub(super) fn own_used_after_first(s: *const u8, used: usize) {
    own(s.wrapping_add(64));
    if used > 128 {
        own(s.wrapping_add(128));
    }
}
