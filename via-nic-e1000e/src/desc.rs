//! Legacy receive and transmit descriptors (82574 datasheet, "Legacy
//! Receive Descriptor Format" and "Legacy Transmit Descriptor Format"):
//! 16 bytes each, a 64-bit buffer address and a second quadword of
//! length, command and status, little-endian.

/// Bytes of one descriptor.
pub const DESC_LEN: usize = 16;

/// Receive status (third dword, bits 7:0) and errors (bits 15:8).
pub mod rx {
    /// Descriptor done: the NIC wrote the frame back.
    pub const DD: u32 = 1 << 0;
    /// End of packet: the frame ends in this buffer.
    pub const EOP: u32 = 1 << 1;
    /// The errors byte: CRC, symbol, sequence, carrier extension, RX data.
    pub const ERRORS: u32 = 0xFF << 8;
}

/// Transmit command (second dword, bits 31:24) and status (third dword).
pub mod tx {
    /// End of packet.
    pub const EOP: u32 = 1 << 24;
    /// Insert the Ethernet FCS.
    pub const IFCS: u32 = 1 << 25;
    /// Report status: the NIC sets DD once it is done with the descriptor.
    pub const RS: u32 = 1 << 27;
    /// Descriptor done (status).
    pub const DD: u32 = 1 << 0;
}

/// What a written-back receive descriptor holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxDone {
    /// A whole good frame of this many bytes (CRC stripped).
    Frame(usize),
    /// A frame with errors, or one longer than its buffer: dropped.
    Bad,
}

/// Decodes a receive descriptor's length/checksum dword `len_word` and
/// status/errors dword `status` (DD set), for a buffer of `buf` bytes.
pub fn rx_done(len_word: u32, status: u32, buf: usize) -> RxDone {
    let len = (len_word & 0xFFFF) as usize;
    if status & rx::EOP == 0 || status & rx::ERRORS != 0 || len == 0 || len > buf {
        RxDone::Bad
    } else {
        RxDone::Frame(len)
    }
}

/// The second quadword's low dword of a transmit descriptor for `len`
/// bytes, `last` when the frame ends with it.
pub fn tx_command(len: usize, last: bool) -> u32 {
    debug_assert!(len <= 0xFFFF);
    len as u32 | tx::IFCS | tx::RS | if last { tx::EOP } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_write_back() {
        assert_eq!(rx_done(60, rx::DD | rx::EOP, 2048), RxDone::Frame(60));
        assert_eq!(rx_done(1514 | 0xABCD << 16, rx::DD | rx::EOP, 2048), RxDone::Frame(1514), "the checksum half is not the length");
        assert_eq!(rx_done(60, rx::DD, 2048), RxDone::Bad, "a frame that spills into the next buffer");
        assert_eq!(rx_done(60, rx::DD | rx::EOP | 1 << 8, 2048), RxDone::Bad, "a CRC error");
        assert_eq!(rx_done(4000, rx::DD | rx::EOP, 2048), RxDone::Bad, "longer than its buffer");
        assert_eq!(rx_done(0, rx::DD | rx::EOP, 2048), RxDone::Bad);
    }

    #[test]
    fn transmit_commands() {
        assert_eq!(tx_command(14, false), 14 | tx::IFCS | tx::RS);
        assert_eq!(tx_command(1500, true), 1500 | tx::IFCS | tx::RS | tx::EOP);
    }
}
