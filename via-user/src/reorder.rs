//! Selective repeat on the receiving side: the frames of a reliable VI
//! that arrived ahead of a gap (up to [`REORDER_SPAN`] PSNs past the one
//! expected) are kept as copies until the gap fills, and then replayed in
//! order; the selective-acknowledgement bitmap built from them tells the
//! sender which of the [`SACK_BITS`] frames past the gap it need not send
//! again. Holes further on are reported when the expected PSN reaches
//! them (the receiver NAKs every new gap it replays up to).
//!
//! Frames in order, the common case, never come here: they are placed
//! straight from the device. The sender keeps at most `REORDER_SPAN`
//! frames in flight, so every frame it sent fits.

use via_wire::seq_lt;

/// How far past the expected PSN frames are kept: the most frames a
/// sender keeps in flight. 1,024 frames of 1,472 bytes are 1.5 MB, what a
/// link of several GB/s needs in flight over a few hundred microseconds
/// of round trip (the slots are made at the first frame out of order).
pub const REORDER_SPAN: u32 = 1024;
/// The width of the SACK bitmap on the wire (bit `i`: PSN `expected + 1 +
/// i` is held).
pub const SACK_BITS: u32 = 64;

/// Emptied frame buffers kept for reuse.
const SPARE: usize = 8;

/// What [`ReorderBuffer::store`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Kept. `new_hole`: it lies past a PSN nothing has arrived for that
    /// the sender has not yet been told about (the first frame past the
    /// expected one, or one past the highest held frame plus one).
    Kept { new_hole: bool },
    /// Already held.
    Duplicate,
    /// Too far ahead (or not ahead at all): not kept.
    OutOfSpan,
}

/// The frames held past a gap of one VI.
#[derive(Default)]
pub struct ReorderBuffer {
    /// Slot `psn % REORDER_SPAN`: the PSN held there and its frame.
    /// Allocated at the first frame out of order.
    slots: Vec<Option<(u32, Vec<u8>)>>,
    held: u32,
    /// The highest PSN held (meaningful while `held > 0`).
    hi: u32,
    spare: Vec<Vec<u8>>,
}

impl ReorderBuffer {
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Keeps `frame` (PSN `psn`) while `expected` has not arrived.
    pub fn store(&mut self, expected: u32, psn: u32, frame: &[u8]) -> Stored {
        let ahead = psn.wrapping_sub(expected);
        if ahead == 0 || ahead > REORDER_SPAN {
            return Stored::OutOfSpan;
        }
        if self.slots.is_empty() {
            self.slots = (0..REORDER_SPAN).map(|_| None).collect();
        }
        let slot = &mut self.slots[(psn % REORDER_SPAN) as usize];
        if slot.as_ref().is_some_and(|(p, _)| *p == psn) {
            return Stored::Duplicate;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        // A slot can only hold another PSN if it fell behind `expected`
        // without being replayed, which draining prevents; replace it.
        if let Some((_, old)) = slot.replace((psn, buf)) {
            self.spare.push(old);
        } else {
            self.held += 1;
        }
        let new_hole = if self.held == 1 { true } else { seq_lt(self.hi.wrapping_add(1), psn) };
        if self.held == 1 || seq_lt(self.hi, psn) {
            self.hi = psn;
        }
        Stored::Kept { new_hole }
    }

    /// Takes the frame for PSN `expected`, if held.
    pub fn take(&mut self, expected: u32) -> Option<Vec<u8>> {
        if self.held == 0 {
            return None;
        }
        let slot = &mut self.slots[(expected % REORDER_SPAN) as usize];
        if slot.as_ref().is_none_or(|(p, _)| *p != expected) {
            return None;
        }
        self.held -= 1;
        slot.take().map(|(_, b)| b)
    }

    /// Returns a frame buffer from [`ReorderBuffer::take`] for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE {
            self.spare.push(buf);
        }
    }

    /// The SACK bitmap: bit `i` set when PSN `expected + 1 + i` is held.
    pub fn bitmap(&self, expected: u32) -> u64 {
        if self.held == 0 {
            return 0;
        }
        let mut bits = 0u64;
        for i in 0..SACK_BITS {
            let psn = expected.wrapping_add(1 + i);
            if self.slots[(psn % REORDER_SPAN) as usize].as_ref().is_some_and(|(p, _)| *p == psn) {
                bits |= 1 << i;
            }
        }
        bits
    }

    /// Forgets everything held (a new connection).
    pub fn clear(&mut self) {
        for s in self.slots.iter_mut() {
            if let Some((_, b)) = s.take() {
                if self.spare.len() < SPARE {
                    self.spare.push(b);
                }
            }
        }
        self.held = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_past_a_gap_are_kept_and_taken_in_order() {
        let mut r = ReorderBuffer::default();
        assert_eq!(r.store(10, 10, b"x"), Stored::OutOfSpan, "the expected one is not held");
        assert_eq!(r.store(10, 9, b"x"), Stored::OutOfSpan, "behind");
        assert_eq!(r.store(10, 10 + REORDER_SPAN + 1, b"x"), Stored::OutOfSpan, "too far");
        assert_eq!(r.store(10, 12, b"c"), Stored::Kept { new_hole: true });
        assert_eq!(r.store(10, 13, b"d"), Stored::Kept { new_hole: false });
        assert_eq!(r.store(10, 13, b"d"), Stored::Duplicate);
        assert_eq!(r.store(10, 16, b"g"), Stored::Kept { new_hole: true }, "14 and 15 missing past 13");
        assert_eq!(r.store(10, 14, b"e"), Stored::Kept { new_hole: false });
        assert_eq!(r.bitmap(10), 0b10_1110, "12, 13, 14 and 16 (bits 1, 2, 3, 5)");
        assert_eq!(r.take(10), None);
        // 10 and 11 arrive in order elsewhere; then 12..14 are replayed.
        for (psn, want) in [(12, b"c"), (13, b"d"), (14, b"e")] {
            let b = r.take(psn).unwrap();
            assert_eq!(&b, want);
            r.recycle(b);
        }
        assert_eq!(r.take(15), None);
        assert_eq!(r.bitmap(15), 1, "16 held past the gap at 15");
        assert!(!r.is_empty());
        r.clear();
        assert!(r.is_empty() && r.bitmap(15) == 0);
    }

    #[test]
    fn frames_past_the_sack_bitmap_are_kept_and_reported_once_reached() {
        let mut r = ReorderBuffer::default();
        let far = 10 + SACK_BITS + 100;
        assert_eq!(r.store(10, 11, b"a"), Stored::Kept { new_hole: true });
        assert_eq!(r.store(10, far, b"z"), Stored::Kept { new_hole: true });
        assert_eq!(r.bitmap(10), 1, "only 11 lies inside the bitmap");
        assert_eq!(r.bitmap(far - 2), 1 << 1, "reached: far is expected + 2");
        assert_eq!(r.take(far).as_deref(), Some(&b"z"[..]));
    }

    #[test]
    fn psns_wrap() {
        let mut r = ReorderBuffer::default();
        let e = u32::MAX - 1;
        assert_eq!(r.store(e, 1, b"z"), Stored::Kept { new_hole: true });
        assert_eq!(r.bitmap(e), 1 << 2, "PSN 1 is e + 3");
        assert_eq!(r.take(1).as_deref(), Some(&b"z"[..]));
    }
}
