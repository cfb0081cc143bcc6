//! What every fragment of one message repeats of the first fragment's
//! headers, as a key the receiver checks each later fragment against in
//! a few wide compares (header prediction): the Ethernet addresses and
//! EtherType, the version and kind, the endpoints, VIs and generation,
//! the message's length, immediate data, RDMA address and handle,
//! credits and message number. What a fragment may change is left out:
//! its flags (checked apart: [`ContinuationKey::flags`]), PSN, ACK,
//! offset, payload length and check.
//!
//! The sender's side of the same fact: a fragment's headers are its
//! predecessor's with the per-fragment fields written again
//! ([`next_fragment`]).
//!
//! A frame that matches the key is a later fragment of the same message
//! from the same sender to the same endpoint and VI, as far as its
//! headers say: the receiver may skip the checks the first fragment
//! passed and go on from its reassembly state. One that does not match is
//! no error: the general path takes it.

use crate::frame::{flags, ETH_HEADER_LEN, FRAME_HEADER_LEN};

/// The byte ranges of the headers (Ethernet included) that a message's
/// fragments repeat: Ethernet header, version and kind; endpoints, VIs
/// and generation; message length; immediate, RDMA address and handle,
/// credits; message number (the layout in [`crate::frame`]).
const REPEATED: [(usize, usize); 5] = [
    (0, ETH_HEADER_LEN + 2),
    (ETH_HEADER_LEN + 4, ETH_HEADER_LEN + 20),
    (ETH_HEADER_LEN + 28, ETH_HEADER_LEN + 32),
    (ETH_HEADER_LEN + 36, ETH_HEADER_LEN + 54),
    (ETH_HEADER_LEN + 56, ETH_HEADER_LEN + 60),
];

/// Where the five 16-byte words compared start: they cover the headers
/// (the last overlaps the one before it).
const WORDS: [usize; 5] = [0, 16, 32, 48, FRAME_HEADER_LEN - 16];

const fn repeated(byte: usize) -> bool {
    let mut i = 0;
    while i < REPEATED.len() {
        if REPEATED[i].0 <= byte && byte < REPEATED[i].1 {
            return true;
        }
        i += 1;
    }
    false
}

/// The mask of the word at `start`: the bytes of it that are repeated
/// (little-endian: byte `j` of the word is bits `8j..8j + 8`).
const fn mask_at(start: usize) -> u128 {
    let mut m = 0u128;
    let mut j = 0;
    while j < 16 {
        if repeated(start + j) {
            m |= 0xff << (8 * j);
        }
        j += 1;
    }
    m
}

const MASKS: [u128; 5] = [mask_at(WORDS[0]), mask_at(WORDS[1]), mask_at(WORDS[2]), mask_at(WORDS[3]), mask_at(WORDS[4])];

/// Flags only a message's first or last fragment carries, or any one
/// fragment may ask with: left out of [`ContinuationKey::flags`].
const PER_FRAGMENT: u16 = flags::FIRST | flags::LAST | flags::ACK_REQ;

#[inline(always)]
fn word(head: &[u8; FRAME_HEADER_LEN], at: usize) -> u128 {
    u128::from_le_bytes(head[at..at + 16].try_into().expect("16 bytes inside the headers"))
}

/// The repeated part of a message's first fragment's headers (see the
/// module comment). The default key is of no message: its EtherType is
/// zero, so no VIA frame repeats it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContinuationKey {
    words: [u128; 5],
    flags: u16,
}

impl ContinuationKey {
    /// The key of the message whose first fragment has headers `head`.
    pub fn of_first(head: &[u8; FRAME_HEADER_LEN]) -> Self {
        let flags = u16::from_be_bytes([head[ETH_HEADER_LEN + 2], head[ETH_HEADER_LEN + 3]]);
        ContinuationKey { words: std::array::from_fn(|i| word(head, WORDS[i]) & MASKS[i]), flags: flags & !PER_FRAGMENT }
    }

    /// The flags a middle fragment of the message carries: the first's
    /// without FIRST, LAST and ACK_REQ.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Do the headers `head` repeat what the key holds? (Their flags are
    /// not compared: [`ContinuationKey::flags`].)
    #[inline(always)]
    pub fn repeated_by(&self, head: &[u8; FRAME_HEADER_LEN]) -> bool {
        let mut diff = 0;
        for i in 0..WORDS.len() {
            diff |= (word(head, WORDS[i]) & MASKS[i]) ^ self.words[i];
        }
        diff == 0
    }
}

/// Turns `head`, the headers of a message's fragment, into those of the
/// fragment after it: its `flags`, `psn`, `offset` and `payload_len`
/// written, the rest (the repeated part, the ACK, and a check not yet
/// sealed) kept.
#[inline(always)]
pub fn next_fragment(head: &mut [u8; FRAME_HEADER_LEN], flags: u16, psn: u32, offset: u32, payload_len: u16) {
    let h = &mut head[ETH_HEADER_LEN..];
    h[2..4].copy_from_slice(&flags.to_be_bytes());
    h[20..24].copy_from_slice(&psn.to_be_bytes());
    h[32..36].copy_from_slice(&offset.to_be_bytes());
    h[54..56].copy_from_slice(&payload_len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{HeaderRepr, Kind};
    use crate::MacAddr;

    fn first() -> HeaderRepr {
        HeaderRepr {
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            kind: Kind::RdmaWrite as u8,
            flags: flags::FIRST | flags::ACK | flags::RELIABLE | flags::IMMEDIATE,
            dst_ep: 7,
            src_ep: 9,
            dst_vi: 3,
            src_vi: 4,
            generation: 0x0102_0304,
            psn: 100,
            ack: 50,
            msg_len: 4000,
            offset: 0,
            imm: 0xdead_beef,
            rdma_addr: 0x1000_2000_3000,
            rdma_handle: 77,
            credits: 0,
            payload_len: 1400,
            msg_seq: 12,
            check: 0x1234_5678,
        }
    }

    fn emit(h: &HeaderRepr) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        h.emit(&mut b);
        b
    }

    #[test]
    fn the_default_key_is_repeated_by_no_frame() {
        let key = ContinuationKey::default();
        for h in [first(), HeaderRepr::default()] {
            assert!(!key.repeated_by(&emit(&h)));
        }
    }

    #[test]
    fn every_byte_is_repeated_or_per_fragment() {
        // The layout's per-fragment fields, and nothing else, are left out.
        let per_fragment = [(ETH_HEADER_LEN + 2, ETH_HEADER_LEN + 4), (ETH_HEADER_LEN + 20, ETH_HEADER_LEN + 28), (ETH_HEADER_LEN + 32, ETH_HEADER_LEN + 36), (ETH_HEADER_LEN + 54, ETH_HEADER_LEN + 56), (ETH_HEADER_LEN + 60, FRAME_HEADER_LEN)];
        for byte in 0..FRAME_HEADER_LEN {
            let varies = per_fragment.iter().any(|&(a, b)| a <= byte && byte < b);
            assert_eq!(repeated(byte), !varies, "byte {byte}");
        }
    }

    #[test]
    fn a_later_fragment_repeats_the_first() {
        let key = ContinuationKey::of_first(&emit(&first()));
        let mid = HeaderRepr { flags: flags::ACK | flags::RELIABLE | flags::IMMEDIATE, psn: 101, ack: 51, offset: 1400, payload_len: 1400, check: 0x9abc_def0, ..first() };
        assert!(key.repeated_by(&emit(&mid)));
        assert_eq!(key.flags(), mid.flags);
        let last = HeaderRepr { flags: mid.flags | flags::LAST | flags::ACK_REQ, psn: 102, offset: 2800, payload_len: 1200, ..mid };
        assert!(key.repeated_by(&emit(&last)), "flags are compared apart");
    }

    #[test]
    fn the_next_fragment_is_its_predecessor_with_the_per_fragment_fields() {
        let mid = HeaderRepr { flags: flags::ACK | flags::RELIABLE | flags::IMMEDIATE | flags::ACK_REQ, psn: 101, offset: 1400, payload_len: 1300, check: 0, ..first() };
        let mut head = emit(&HeaderRepr { check: 0, ..first() });
        next_fragment(&mut head, mid.flags, mid.psn, mid.offset, mid.payload_len);
        assert_eq!(head, emit(&mid));
        assert!(ContinuationKey::of_first(&emit(&first())).repeated_by(&head));
    }

    #[test]
    fn any_repeated_field_changed_is_another_message() {
        let key = ContinuationKey::of_first(&emit(&first()));
        let mid = HeaderRepr { flags: flags::ACK | flags::RELIABLE | flags::IMMEDIATE, psn: 101, offset: 1400, ..first() };
        let others = [
            HeaderRepr { dst_mac: MacAddr([2, 0, 0, 0, 0, 9]), ..mid },
            HeaderRepr { src_mac: MacAddr([2, 0, 0, 0, 0, 9]), ..mid },
            HeaderRepr { kind: Kind::Data as u8, ..mid },
            HeaderRepr { dst_ep: 8, ..mid },
            HeaderRepr { src_ep: 8, ..mid },
            HeaderRepr { dst_vi: 5, ..mid },
            HeaderRepr { src_vi: 5, ..mid },
            HeaderRepr { generation: 0x0102_0305, ..mid },
            HeaderRepr { msg_len: 4001, ..mid },
            HeaderRepr { imm: 1, ..mid },
            HeaderRepr { rdma_addr: 0x1000_2000_3001, ..mid },
            HeaderRepr { rdma_handle: 78, ..mid },
            HeaderRepr { credits: 1, ..mid },
            HeaderRepr { msg_seq: 13, ..mid },
        ];
        for (i, h) in others.iter().enumerate() {
            assert!(!key.repeated_by(&emit(h)), "change {i} went unnoticed");
        }
        let mut other_type = emit(&mid);
        other_type[13] ^= 1; // the EtherType
        assert!(!key.repeated_by(&other_type));
        let mut other_version = emit(&mid);
        other_version[ETH_HEADER_LEN] ^= 1;
        assert!(!key.repeated_by(&other_version));
    }
}
