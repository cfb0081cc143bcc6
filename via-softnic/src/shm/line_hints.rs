//! Where a small frame's cache lines should be when the other core asks
//! for them: hints to the processor, never needed for correctness.
//!
//! A slot's lines cross between the two cores twice a message: the sender
//! takes them for writing (a read for ownership, which takes them from the
//! receiver's cache, where they were read last), the receiver then takes
//! them back. Two hints shorten both crossings where the cores share only
//! the last-level cache (docs/DESIGN-NOTES.md, "Where a small frame's
//! lines wait": 64 B over the wire 0.42 -> 0.26 us on an Intel Xeon):
//! - [`demote`] (`CLDEMOTE`), once a frame is published, pushes its lines
//!   from the sender's private caches to the shared one, where the
//!   receiver's read finds them without asking the sender's core;
//! - [`own`] (`PREFETCHW`), after a publish, asks for the next slot's
//!   lines past the first for writing, so that the next frame's writes do
//!   not wait for them (the first line, which the owner polls, is left
//!   alone: taking it would only make the owner's poll fetch it back).
//!
//! Both instructions are hints in the hint-NOP space: a processor without
//! them runs them as NOPs, and neither faults; each is used only where
//! CPUID says the processor has it ([`LineHints::detect`]), and
//! `shm:<wire>,hints=off` turns both off. Elsewhere than x86-64 both do
//! nothing.

/// The most of a slot's bytes (its prefix and frame) that are hinted:
/// three lines, what a 64-byte message takes boxed (two) or as a frame
/// (an RDMA write's), and MTTL's requests and replies. A larger frame's
/// copy is the processor's streaming business (`payload_copy`).
pub(super) const HINTED_BYTES: usize = 192;

/// Which hints this processor has, found once when a device opens.
#[derive(Clone, Copy, Debug)]
pub(super) struct LineHints {
    demote: bool,
    own: bool,
}

impl LineHints {
    /// The hints the processor says it has (CPUID: `cldemote`, leaf 7
    /// ECX bit 25; `prefetchw`, leaf 0x8000_0001 ECX bit 8), or none when
    /// `wanted` is false. Both instructions decode as NOPs where absent,
    /// but a hint the processor lacks would cost its decoding for nothing.
    pub(super) fn detect(wanted: bool) -> LineHints {
        #[cfg(target_arch = "x86_64")]
        if wanted {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            // (CPUID exists on every x86-64 processor; each leaf is asked
            // for only within the maxima it reports.)
            let (basic, extended) = (__cpuid(0).eax, __cpuid(0x8000_0000).eax);
            let demote = basic >= 7 && __cpuid_count(7, 0).ecx & (1 << 25) != 0;
            let own = extended >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0;
            return LineHints { demote, own };
        }
        let _ = wanted;
        LineHints { demote: false, own: false }
    }

    /// Does it use any hint?
    #[cfg(test)]
    pub(super) fn any(&self) -> bool {
        self.demote || self.own
    }

    /// Slot `s`'s first `used` bytes were just published: if at most
    /// [`HINTED_BYTES`], its first two lines (the third too past 128
    /// bytes) go to the shared cache.
    #[inline(always)]
    pub(super) fn published(&self, s: *const u8, used: usize) {
        if self.demote && used <= HINTED_BYTES {
            demote_used(s, used);
        }
    }

    /// The next frame goes into slot `next`: if the frame just published
    /// took at most [`HINTED_BYTES`], `next`'s second line (the third too
    /// past 128 bytes) is taken for writing.
    #[inline(always)]
    pub(super) fn next_slot(&self, next: *const u8, used: usize) {
        if self.own && used <= HINTED_BYTES {
            own_used_after_first(next, used);
        }
    }
}

/// Pushes the line holding `p` towards the cache the cores share.
#[inline(always)]
fn demote(p: *const u8) {
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
fn own(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW is a hint: it reads nothing into the program and
    // cannot fault (Intel SDM vol. 2B, PREFETCHW).
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// [`demote`]s the first two lines from `s` (a line's start), and the
/// third when `used` (at most [`HINTED_BYTES`]) passes 128 bytes. A
/// message of one line (a boxed one of up to 8 bytes) has its second
/// demoted too, one hint more: the first version, a loop over exactly
/// the lines used, measured slower (e052cc3; why is not known).
#[inline(always)]
fn demote_used(s: *const u8, used: usize) {
    demote(s);
    demote(s.wrapping_add(64));
    if used > 128 {
        demote(s.wrapping_add(128));
    }
}

/// [`own`]s the second line from `s` (a line's start), and the third
/// when `used` (at most [`HINTED_BYTES`]) passes 128 bytes.
#[inline(always)]
fn own_used_after_first(s: *const u8, used: usize) {
    own(s.wrapping_add(64));
    if used > 128 {
        own(s.wrapping_add(128));
    }
}
