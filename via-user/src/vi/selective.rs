//! Selective repeat on the sending side of a reliable VI: which frames
//! past the oldest unacknowledged one (`una`) the peer holds, by its last
//! SACK bitmap, and which holes below them go again. Bit `i` of each
//! bitmap is PSN `una + i`; the bitmaps slide as `una` moves.

/// Selective-repeat state of one VI's sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectiveRepeat {
    /// Frames the peer holds past a gap.
    sacked: u64,
    /// Holes to transmit again.
    resend: u64,
    /// Holes already transmitted again since the last timeout.
    resent: u64,
}

/// The sender's view of a SACK: the PSNs from `una` up to the highest one
/// the peer holds that it does not hold, limited to the `sent` frames
/// transmitted. `sacked` is relative to `una` as well (bit 0, `una`
/// itself, is never set: the peer would have acknowledged it).
pub fn holes(sacked: u64, sent: u32) -> u64 {
    if sacked == 0 {
        return 0;
    }
    let top = 63 - sacked.leading_zeros(); // highest held, relative to una
    let below = (1u64 << top) - 1; // bits 0..top
    !sacked & below & low_bits(sent)
}

/// The lowest `len` bits: the `len` frames from `una` on (the ones
/// transmitted, or a run of holes).
fn low_bits(len: u32) -> u64 {
    if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    }
}

impl SelectiveRepeat {
    /// `una` moved forward by `shift` frames. The peer expects `una` now,
    /// so it does not hold it, whatever an older SACK said: a frame it
    /// held past a gap and then refused when the gap filled (receiver not
    /// ready) is expected again, and is a hole until it is resent. (With
    /// bit 0 left set, a timeout resent only what lay past the frames held
    /// and the connection stalled for good: `mttl-check comm` with a pool
    /// smaller than the windows, about one run in ten.)
    #[inline]
    pub fn slide(&mut self, shift: u32) {
        for bits in [&mut self.sacked, &mut self.resend, &mut self.resent] {
            *bits = bits.checked_shr(shift).unwrap_or(0);
        }
        self.sacked &= !1;
    }

    /// The peer's SACK bitmap `peer_bits` (its bit `i`: PSN `una + 1 + i`),
    /// of which only the `sent` frames from `una` on count.
    pub fn on_sack(&mut self, peer_bits: u64, sent: u32) {
        self.sacked = (peer_bits << 1) & low_bits(sent);
    }

    /// Does the peer hold anything past a gap?
    pub fn holds_any(&self) -> bool {
        self.sacked != 0
    }

    /// A NAK: the holes not yet sent again are queued. True when any was.
    pub fn on_nak(&mut self, sent: u32) -> bool {
        let new = holes(self.sacked, sent) & !self.resent;
        self.resend |= new;
        self.resent |= new;
        new != 0
    }

    /// The retransmission timer expired with `sent` frames unacknowledged:
    /// every hole goes again. Returns how far past `una` transmission then
    /// resumes (past the highest frame held), or None when the peer holds
    /// nothing (go-back-N from `una`).
    pub fn on_timeout(&mut self, sent: u32) -> Option<u32> {
        if self.sacked == 0 {
            if sent != 0 {
                (self.resend, self.resent) = (0, 0);
            }
            return None;
        }
        self.resend = holes(self.sacked, sent);
        self.resent = self.resend;
        Some(64 - self.sacked.leading_zeros())
    }

    /// Are holes waiting to go again?
    #[inline]
    pub fn pending(&self) -> bool {
        self.resend != 0
    }

    /// Takes the lowest hole waiting and the holes right after it, at most
    /// `max` in all: the first one's offset from `una`, and how many. (A
    /// run goes again in one transmission, as it went the first time: a
    /// device that carries it as one datagram loses all of it or none.)
    pub fn next_run(&mut self, max: u32) -> Option<(u32, u32)> {
        if self.resend == 0 || max == 0 {
            return None;
        }
        let bit = self.resend.trailing_zeros();
        let len = (!(self.resend >> bit)).trailing_zeros().min(max);
        self.resend &= !(low_bits(len) << bit);
        Some((bit, len))
    }

    /// The `len` holes from `bit` could not go now: they wait again.
    pub fn put_back_run(&mut self, bit: u32, len: u32) {
        self.resend |= low_bits(len).checked_shl(bit).unwrap_or(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl SelectiveRepeat {
        /// The lowest hole waiting, alone.
        fn next_hole(&mut self) -> Option<u32> {
            self.next_run(1).map(|(bit, _)| bit)
        }

        fn put_back(&mut self, bit: u32) {
            self.put_back_run(bit, 1);
        }
    }

    #[test]
    fn a_frame_held_then_refused_is_a_hole_once_una_reaches_it() {
        let mut s = SelectiveRepeat::default();
        // The peer expects una and holds una+1..=una+4.
        s.on_sack(0b1111, 10);
        // It takes una (the ACK moves una by one, with no SACK: a
        // piggybacked ACK), then refuses una+1, which it had held, for
        // want of a receive: it expects una+1 again.
        s.slide(1);
        assert_eq!(s.sacked & 1, 0, "the new una is not held");
        assert_eq!(s.on_timeout(9), Some(4), "resume past una+4 (held)");
        assert_eq!(s.next_run(64), Some((0, 1)), "una goes again: a hole");
    }

    #[test]
    fn holes_are_what_was_sent_below_the_highest_held_and_not_held() {
        assert_eq!(holes(0, 64), 0, "no SACK: nothing known");
        assert_eq!(holes(0b10100, 64), 0b01011, "una, una+1 and una+3");
        assert_eq!(holes(1 << 63, 64), (1 << 63) - 1);
        assert_eq!(holes(0b10000, 2), 0b11, "only what was sent");
    }

    #[test]
    fn a_nak_resends_each_hole_once_until_a_timeout() {
        let mut s = SelectiveRepeat::default();
        assert!(!s.on_nak(10), "nothing held: nothing to resend selectively");
        s.on_sack(0b1001, 10); // holds una+1 and una+4
        assert!(s.holds_any());
        assert!(s.on_nak(10), "holes una, una+2, una+3");
        assert_eq!([s.next_hole(), s.next_hole()], [Some(0), Some(2)]);
        s.put_back(2);
        assert_eq!([s.next_hole(), s.next_hole(), s.next_hole()], [Some(2), Some(3), None]);
        assert!(!s.on_nak(10), "each hole once");
        assert_eq!(s.on_timeout(10), Some(5), "after a timeout every hole again, then from una+5");
        assert!(s.pending());
        s.slide(3); // una moved past 3 frames: holes una+0 (was +3)
        assert_eq!([s.next_hole(), s.next_hole()], [Some(0), None]);
        s.slide(64);
        assert!(!s.holds_any() && s.on_timeout(4).is_none());
    }

    #[test]
    fn holes_go_again_in_runs() {
        let mut s = SelectiveRepeat::default();
        s.on_sack(1 << 62, 64); // holds una+63 only: holes una..una+62
        assert!(s.on_nak(64));
        assert_eq!(s.next_run(32), Some((0, 32)), "at most what was asked");
        s.put_back_run(10, 22); // only ten of them went
        assert_eq!(s.next_run(64), Some((10, 53)), "the rest of the run, and the holes after it");
        assert_eq!(s.next_run(64), None);
        s.on_sack(0b1011_0000, 64); // holds una+5, +6, +8
        s.on_timeout(64);
        assert_eq!([s.next_run(8), s.next_run(8), s.next_run(8)], [Some((0, 5)), Some((7, 1)), None], "runs stop at what the peer holds");
    }

    #[test]
    fn only_frames_sent_are_held() {
        let mut s = SelectiveRepeat::default();
        s.on_sack(u64::MAX, 3);
        assert!(s.on_nak(3), "una is a hole below una+1 and una+2");
        assert_eq!([s.next_hole(), s.next_hole()], [Some(0), None]);
    }
}
