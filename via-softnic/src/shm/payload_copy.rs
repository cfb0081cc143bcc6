//! How a large frame's payload is written into a ring slot: through the
//! cache (`memcpy`) or around it (streaming stores, which write whole
//! lines without reading them first), whichever moves frames faster here
//! and now, found by timing both ends' copies.
//!
//! Why both: the slot's lines are read next by the receiver, on another
//! core. Where the two cores share their last-level cache, a copy through
//! the cache is the fastest way there is: the receiver takes the lines
//! from the shared cache. Where they do not, every line the sender
//! writes must first be fetched back from the receiver's cache, which
//! read it last (the read for ownership), and the receiver must then
//! fetch it across again; streaming stores need no such read and leave
//! the lines in memory, which both ends reach at the same speed wherever
//! they run. This machine's two vCPUs move between those placements (a
//! cache line handed between them takes 0.06 us in one, 0.18 us in the
//! other, sometimes from one demo round to the next); over the bare wire
//! 1 MiB messages move at 25-32 GB/s through the cache in the first and
//! 4.5-11 GB/s in the second, and streamed at 11-17 GB/s in both
//! (docs/BENCHMARKS.md has the runs).
//!
//! So the choice is made all the time, and by both ends' costs, because
//! the sender's alone misleads: its streaming stores are always cheap for
//! it (they wait for nothing), while the receiver pays for them in the
//! first placement. The receiver times each large frame it takes (its
//! copy out of the slot and the engine's placement, [`ReadTimer`]) and
//! publishes a running cost per way in its port's control block
//! ([`ReadCosts`]: the record's length word says how it was written);
//! the sender times its own copies ([`PayloadCopy`]). Frames go the way
//! whose slower end is the faster (the two ends work in a pipeline), and
//! one in [`EXPLORE`] goes the other way, so that both ends' figures for
//! it stay current. A way not yet timed at both ends is not chosen: the
//! cache is used until the figures say otherwise. A sending device keeps
//! one choice: sending to several ports, it goes by the figures of the
//! port its last deciding copy went to (a choice kept per target port
//! would be the cure, if mixed receivers ever mattered).
//!
//! `shm:<wire>,copy=cached|streaming` fixes the way (the default, `timed`,
//! chooses). Streaming needs x86-64 (SSE2's `movntdq`, in every x86-64
//! processor); elsewhere every copy goes through the cache.

use std::sync::atomic::{AtomicU32, Ordering};

/// Payload pieces at least this long are copied the chosen way (and
/// frames this long are timed by the receiver); shorter ones through the
/// cache (the receiver reads them soon and they are few lines).
pub(super) const STREAM_MIN: usize = 16 * 1024;

/// One copy in this many goes the other way, to keep its costs current;
/// the sender looks at the receiver's figures as often.
pub(super) const EXPLORE: u32 = 32;

/// The receiver publishes its figures once every this many large frames.
const PUBLISH_EVERY: u32 = 16;

/// A way of copying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Way {
    Cached,
    Streaming,
}

/// What `copy=` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Policy {
    Timed,
    Always(Way),
}

impl Policy {
    /// `copy=<value>`.
    pub fn parse(v: &str) -> Option<Policy> {
        match v {
            "timed" => Some(Policy::Timed),
            "cached" => Some(Policy::Always(Way::Cached)),
            "streaming" => Some(Policy::Always(Way::Streaming)),
            _ => None,
        }
    }
}

/// A running cost per way: counter ticks per KiB, 0 while unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Costs([u32; 2]);

impl Costs {
    pub fn get(&self, w: Way) -> u32 {
        self.0[w as usize]
    }

    /// Adds a copy of `len` bytes the way `w` that took `ticks`: each
    /// sample weighs an eighth, and one more than four times the average
    /// (the copy was interrupted) counts as four times.
    pub fn note(&mut self, w: Way, ticks: u64, len: usize) {
        let per_kib = u32::try_from(ticks.saturating_mul(1024) / (len as u64).max(1)).unwrap_or(u32::MAX).max(1);
        let c = &mut self.0[w as usize];
        *c = if *c == 0 { per_kib } else { (*c - *c / 8).saturating_add(per_kib.min(c.saturating_mul(4)) / 8).max(1) };
    }
}

/// Where a port's owner publishes what taking a large frame costs it,
/// by the way the frame was written (in the port's control block, on a
/// line of its own: written once every [`PUBLISH_EVERY`] large frames,
/// read by senders once every [`EXPLORE`]).
#[repr(C)]
#[derive(Default)]
pub(super) struct ReadCosts([AtomicU32; 2]);

impl ReadCosts {
    pub fn load(&self) -> Costs {
        Costs([self.0[0].load(Ordering::Relaxed), self.0[1].load(Ordering::Relaxed)])
    }

    fn store(&self, c: Costs) {
        self.0[0].store(c.0[0], Ordering::Relaxed);
        self.0[1].store(c.0[1], Ordering::Relaxed);
    }

    /// Forgets the figures (a port's new owner starts afresh).
    pub fn clear(&self) {
        self.store(Costs::default());
    }
}

/// The receiver's side: its running costs of taking large frames.
#[derive(Debug, Default)]
pub(super) struct ReadTimer {
    costs: Costs,
    since_publish: u32,
}

impl ReadTimer {
    /// Hands a frame of `len` bytes up (`f`), timed if it is large, by how
    /// it was written (`streamed`: its length word's flag); the figures
    /// go to `to` now and then.
    #[inline]
    pub fn hand_over(&mut self, streamed: bool, len: usize, to: &ReadCosts, f: impl FnOnce()) {
        if len < STREAM_MIN {
            return f();
        }
        let t0 = ticks();
        f();
        let way = if streamed { Way::Streaming } else { Way::Cached };
        self.note(way, ticks().wrapping_sub(t0), len, to);
    }

    /// Adds the taking of a large frame of `len` bytes, written `w`, that
    /// took `ticks`; publishes to `to` now and then.
    pub fn note(&mut self, w: Way, ticks: u64, len: usize, to: &ReadCosts) {
        self.costs.note(w, ticks, len);
        self.since_publish += 1;
        if self.since_publish >= PUBLISH_EVERY {
            self.since_publish = 0;
            to.store(self.costs);
        }
    }
}

/// The sender's side: the policy, its own running costs, the receiver's
/// as last read, the way chosen, and the copies since the last try of the
/// other way.
#[derive(Debug)]
pub(super) struct PayloadCopy {
    policy: Policy,
    own: Costs,
    peer: Costs,
    choice: Way,
    since_explore: u32,
    /// Pieces copied streaming (the device's `shm_tx_streamed`).
    pub streamed: u64,
}

impl PayloadCopy {
    pub fn new(policy: Policy) -> PayloadCopy {
        PayloadCopy { policy, own: Costs::default(), peer: Costs::default(), choice: Way::Cached, since_explore: 0, streamed: 0 }
    }

    /// The way the next large copy to the port whose figures are `read`
    /// goes: the chosen one, and every [`EXPLORE`]th the other, when the
    /// receiver's figures are read again and the choice made anew.
    pub fn next_way(&mut self, read: &ReadCosts) -> Way {
        if let Policy::Always(w) = self.policy {
            return w;
        }
        if !streaming_available() {
            return Way::Cached;
        }
        self.since_explore += 1;
        if self.since_explore < EXPLORE {
            return self.choice;
        }
        self.since_explore = 0;
        self.peer = read.load();
        self.choice = self.cheaper();
        other(self.choice)
    }

    /// The way whose slower end is faster, of the ways timed at both ends;
    /// the cache while either is not.
    fn cheaper(&self) -> Way {
        let cost = |w| match (self.own.get(w), self.peer.get(w)) {
            (0, _) | (_, 0) => None,
            (a, b) => Some(a.max(b)),
        };
        match (cost(Way::Cached), cost(Way::Streaming)) {
            (Some(c), Some(s)) if s < c => Way::Streaming,
            _ => Way::Cached,
        }
    }

    /// Copies `len` bytes from `src` to `dst` for the port whose figures
    /// are `read`: a large copy the way [`Self::next_way`] says, timed; a
    /// streamed copy is fenced before this returns (its stores are weakly
    /// ordered: the slot's sequence word, stored next, must not pass
    /// them). True if it went streaming.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes, and
    /// they do not overlap.
    #[inline]
    pub unsafe fn copy(&mut self, src: *const u8, dst: *mut u8, len: usize, read: &ReadCosts) -> bool {
        if len < STREAM_MIN {
            // SAFETY: as the caller promises.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            return false;
        }
        let w = self.next_way(read);
        let t0 = ticks();
        match w {
            // SAFETY: as the caller promises.
            Way::Cached => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
            // SAFETY: as the caller promises.
            Way::Streaming => unsafe { stream_copy(src, dst, len) },
        }
        if self.policy == Policy::Timed {
            self.own.note(w, ticks().wrapping_sub(t0), len);
        }
        self.streamed += u64::from(w == Way::Streaming);
        w == Way::Streaming
    }
}

fn other(w: Way) -> Way {
    match w {
        Way::Cached => Way::Streaming,
        Way::Streaming => Way::Cached,
    }
}

fn streaming_available() -> bool {
    cfg!(target_arch = "x86_64")
}

/// The time-stamp counter (0 where there is none: no way is then ever
/// timed, and the cache stays chosen).
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC exists on every x86-64 processor and reads a register.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// Copies `len` bytes with streaming stores where the destination is
/// 16-byte aligned (the unaligned head and the tail through the cache),
/// then fences them.
///
/// # Safety
/// As [`PayloadCopy::copy`].
pub(super) unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = ((dst as usize).wrapping_neg() & 15).min(len);
        // SAFETY: every access below lies within the `len` bytes the
        // caller gave; the streamed stores go to 16-byte aligned addresses
        // (`dst + head` is aligned, and `i` steps by 64).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let mut i = head;
            while i + 64 <= len {
                let s = src.add(i).cast::<__m128i>();
                let d = dst.add(i).cast::<__m128i>();
                let (a, b, c, e) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                i += 64;
            }
            std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller promises.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_copy_is_the_bytes_copied_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in (0..300).chain([STREAM_MIN - 1, STREAM_MIN, 65_471, 65_536]) {
            for (so, d_off) in [(0, 0), (1, 0), (0, 1), (3, 13), (15, 15), (16, 0), (7, 64)] {
                let mut dst = vec![0xEEu8; len + 80];
                // SAFETY: both ranges lie inside their vectors.
                unsafe { stream_copy(src.as_ptr().add(so), dst.as_mut_ptr().add(d_off), len) };
                assert_eq!(&dst[d_off..d_off + len], &src[so..so + len], "len {len} offsets {so} {d_off}");
                assert!(dst[..d_off].iter().chain(&dst[d_off + len..]).all(|&b| b == 0xEE), "wrote outside: len {len} offsets {so} {d_off}");
            }
        }
    }

    /// `n` copies to a receiver whose figures are `read`, each noted at the
    /// sender as costing `own` ticks a 64 KiB frame the way it went:
    /// the ways taken.
    fn copies(c: &mut PayloadCopy, read: &ReadCosts, n: u32, own: impl Fn(Way) -> u64) -> Vec<Way> {
        (0..n)
            .map(|_| {
                let w = c.next_way(read);
                c.own.note(w, own(w), 65_536);
                w
            })
            .collect()
    }

    fn count(ways: &[Way], w: Way) -> usize {
        ways.iter().filter(|&&x| x == w).count()
    }

    #[test]
    fn the_way_whose_slower_end_is_faster_is_chosen_and_the_other_tried_every_so_often() {
        if !streaming_available() {
            return;
        }
        let mut c = PayloadCopy::new(Policy::Timed);
        let read = ReadCosts::default();
        let mut rx = ReadTimer::default();
        let cheap_to_stream = |w| if w == Way::Streaming { 5_000 } else { 20_000 };
        // Nothing from the receiver yet: the cache, streaming tried.
        let first = copies(&mut c, &read, 2 * EXPLORE, cheap_to_stream);
        assert_eq!(count(&first, Way::Streaming), 2, "{first:?}");
        // The receiver says both cost it little: the sender's own costs
        // decide (streaming).
        for w in [Way::Cached, Way::Streaming] {
            for _ in 0..PUBLISH_EVERY {
                rx.note(w, 1_000, 65_536, &read);
            }
        }
        let ways = copies(&mut c, &read, 3 * EXPLORE, cheap_to_stream);
        assert!(count(&ways[EXPLORE as usize..], Way::Streaming) >= 2 * EXPLORE as usize - 2, "{ways:?}");
        // The other placement: streamed frames cost the receiver five
        // times what its copy of cached ones does, more than either way
        // costs the sender. Cached wins, streaming tried once in EXPLORE.
        for _ in 0..8 * PUBLISH_EVERY {
            rx.note(Way::Streaming, 100_000, 65_536, &read);
            rx.note(Way::Cached, 21_000, 65_536, &read);
        }
        let ways = copies(&mut c, &read, 3 * EXPLORE, cheap_to_stream);
        assert_eq!(count(&ways[EXPLORE as usize..], Way::Streaming), 2, "{ways:?}");
    }

    #[test]
    fn a_way_not_timed_at_both_ends_is_not_chosen() {
        let mut c = PayloadCopy::new(Policy::Timed);
        let read = ReadCosts::default();
        // The sender times both ways; the receiver never publishes (it
        // cannot time, or is not there): the cache stays chosen.
        let ways = copies(&mut c, &read, 10 * EXPLORE, |w| if w == Way::Streaming { 1_000 } else { 50_000 });
        assert!(count(&ways, Way::Cached) >= 9 * EXPLORE as usize, "{ways:?}");
    }

    #[test]
    fn an_interrupted_copy_does_not_swing_a_figure() {
        let mut k = Costs::default();
        k.note(Way::Cached, 2_000, 65_536);
        let before = k.get(Way::Cached);
        // One copy took a millisecond (a context switch).
        k.note(Way::Cached, 3_000_000, 65_536);
        assert!(k.get(Way::Cached) <= before + before / 2, "{k:?}");
        assert_eq!(k.get(Way::Streaming), 0);
    }

    #[test]
    fn a_fixed_way_is_kept_and_not_timed() {
        let mut c = PayloadCopy::new(Policy::Always(Way::Streaming));
        let read = ReadCosts::default();
        assert!((0..3 * EXPLORE).all(|_| c.next_way(&read) == Way::Streaming));
        let src = vec![5u8; STREAM_MIN];
        let mut dst = vec![0u8; STREAM_MIN];
        // SAFETY: both hold STREAM_MIN bytes.
        assert!(unsafe { c.copy(src.as_ptr(), dst.as_mut_ptr(), STREAM_MIN, &read) });
        assert_eq!(src, dst);
        assert_eq!(c.streamed, 1);
        assert_eq!(c.own, Costs::default());
        assert_eq!(Policy::parse("cached"), Some(Policy::Always(Way::Cached)));
        assert_eq!(Policy::parse("timed"), Some(Policy::Timed));
        assert_eq!(Policy::parse("fast"), None);
    }
}
