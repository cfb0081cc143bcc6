//! Receive and transmit descriptors (21143 HRM §4.2): four little-endian
//! 32-bit words in DMA memory, shared with the NIC. The driver writes the
//! control and buffer words first and hands a descriptor over by setting
//! OWN in the status word last; the NIC clears OWN when it is done.
//!
//! This module only encodes and decodes the words; reading and writing
//! them in shared memory is the ring's job.

/// Bytes in one descriptor (descriptor skip length 0: rings are contiguous).
pub const DESC_LEN: usize = 16;
/// Status word: the NIC owns the descriptor.
pub const OWN: u32 = 1 << 31;
/// Largest size either buffer field can hold (11 bits).
pub const MAX_BUFFER: usize = 0x7ff;

/// RDES0 bits (§4.2.1).
pub mod rx {
    /// Error summary.
    pub const ES: u32 = 1 << 15;
    /// First descriptor of a frame.
    pub const FS: u32 = 1 << 9;
    /// Last descriptor of a frame.
    pub const LS: u32 = 1 << 8;
    /// RDES1: receive end of ring.
    pub const RER: u32 = 1 << 25;
}

/// TDES1 bits (§4.2.2).
pub mod tx {
    /// Interrupt on completion.
    pub const IC: u32 = 1 << 31;
    /// Last segment of the frame.
    pub const LS: u32 = 1 << 30;
    /// First segment of the frame.
    pub const FS: u32 = 1 << 29;
    /// Setup packet.
    pub const SET: u32 = 1 << 27;
    /// Transmit end of ring.
    pub const TER: u32 = 1 << 25;
}

/// One descriptor's four words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    pub status: u32,
    pub control: u32,
    pub buf1: u32,
    pub buf2: u32,
}

impl Desc {
    /// The words as they lie in memory.
    pub fn to_bytes(self) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        for (i, w) in [self.status, self.control, self.buf1, self.buf2].into_iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8; DESC_LEN]) -> Desc {
        let w = |i: usize| u32::from_le_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
        Desc { status: w(0), control: w(1), buf1: w(2), buf2: w(3) }
    }
}

/// The two buffer sizes of a control word (bits 10:0 and 21:11).
pub fn sizes(len1: usize, len2: usize) -> u32 {
    debug_assert!(len1 <= MAX_BUFFER && len2 <= MAX_BUFFER);
    (len1 as u32 & 0x7ff) | ((len2 as u32 & 0x7ff) << 11)
}

/// A receive descriptor handed to the NIC: one buffer of `len` bytes at
/// bus address `buf`; `last` marks the end of the ring.
pub fn rx_ready(buf: u32, len: usize, last: bool) -> Desc {
    Desc { status: OWN, control: sizes(len, 0) | if last { rx::RER } else { 0 }, buf1: buf, buf2: 0 }
}

/// A transmit descriptor for one whole frame: `len1` bytes at `buf1` (the
/// header) followed by `len2` bytes at `buf2` (the payload, possibly in the
/// user's registered memory).
pub fn tx_frame(buf1: u32, len1: usize, buf2: u32, len2: usize, last: bool) -> Desc {
    Desc { status: OWN, control: tx::FS | tx::LS | sizes(len1, len2) | if last { tx::TER } else { 0 }, buf1, buf2: if len2 == 0 { 0 } else { buf2 } }
}

/// A transmit descriptor carrying the 192-byte setup frame at `buf`.
pub fn tx_setup(buf: u32, last: bool) -> Desc {
    Desc { status: OWN, control: tx::SET | sizes(crate::setup::SETUP_FRAME_LEN, 0) | if last { tx::TER } else { 0 }, buf1: buf, buf2: 0 }
}

/// What a receive descriptor the NIC gave back says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxDone {
    /// A whole good frame of this many bytes, FCS excluded.
    Frame(usize),
    /// An error, a frame split over descriptors, or a length that cannot
    /// be: the buffer is recycled and the frame counted as dropped.
    Bad,
}

/// Decodes RDES0 of a descriptor the NIC has released (OWN clear). The
/// frame length field (bits 29:16) counts the 4-byte FCS.
pub fn rx_done(status: u32, buffer_len: usize) -> RxDone {
    let whole = status & (rx::FS | rx::LS) == (rx::FS | rx::LS);
    let len = ((status >> 16) & 0x3fff) as usize;
    if status & rx::ES != 0 || !whole || len < 14 + 4 || len > buffer_len {
        return RxDone::Bad;
    }
    RxDone::Frame(len - 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_little_endian_in_order() {
        let d = Desc { status: 0x8000_0000, control: 0x0102_0304, buf1: 0x1000, buf2: 0xdead_beef };
        let b = d.to_bytes();
        assert_eq!(&b[0..4], &[0, 0, 0, 0x80]);
        assert_eq!(&b[4..8], &[4, 3, 2, 1]);
        assert_eq!(&b[12..16], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(Desc::from_bytes(&b), d);
    }

    #[test]
    fn transmit_descriptor_gathers_header_and_payload() {
        let d = tx_frame(0x1000_0000, 60, 0x2000_0040, 1400, false);
        assert_eq!(d.status, OWN);
        assert_eq!(d.control & 0x7ff, 60);
        assert_eq!((d.control >> 11) & 0x7ff, 1400);
        assert_eq!(d.control & (tx::FS | tx::LS), tx::FS | tx::LS);
        assert_eq!(d.control & (tx::TER | tx::SET | tx::IC), 0);
        assert_eq!((d.buf1, d.buf2), (0x1000_0000, 0x2000_0040));
        let last = tx_frame(0x1000_0000, 60, 0x2000_0040, 0, true);
        assert_ne!(last.control & tx::TER, 0);
        assert_eq!(last.buf2, 0, "no second buffer when it is empty");
    }

    #[test]
    fn setup_descriptor_is_192_bytes_with_set() {
        let d = tx_setup(0x1000, true);
        assert_eq!(d.control & 0x7ff, 192);
        assert_ne!(d.control & tx::SET, 0);
        assert_eq!(d.control & (tx::FS | tx::LS), 0);
        assert_ne!(d.control & tx::TER, 0);
    }

    #[test]
    fn receive_descriptor_and_completion() {
        let d = rx_ready(0x3000, 1536, true);
        assert_eq!(d.status, OWN);
        assert_eq!(d.control, 1536 | rx::RER);
        // A 64-byte frame as the NIC reports it: length counts the FCS.
        let st = rx::FS | rx::LS | ((64 + 4) << 16);
        assert_eq!(rx_done(st, 1536), RxDone::Frame(64));
        assert_eq!(rx_done(st | rx::ES, 1536), RxDone::Bad);
        assert_eq!(rx_done(rx::FS | ((64 + 4) << 16), 1536), RxDone::Bad, "frame continues in the next descriptor");
        assert_eq!(rx_done(rx::FS | rx::LS | (2000 << 16), 1536), RxDone::Bad, "longer than the buffer");
        assert_eq!(rx_done(rx::FS | rx::LS | (10 << 16), 1536), RxDone::Bad, "shorter than a header");
    }
}
