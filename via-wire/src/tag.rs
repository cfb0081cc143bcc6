//! The frame tag: the keyed MAC an authenticated frame carries after its
//! payload in place of the CRC-32C ([`crate::flags::AUTH`]).
//!
//! The MAC is AEGISMAC-128L with a 128-bit tag (RFC 10032 section 7, the
//! `aegis` crate), at every frame size. It is the one AEGIS function that
//! allows a `(key, nonce)` pair to authenticate many different inputs, so
//! it needs no nonce per frame: a retransmission whose piggybacked ACK
//! changed is safe. Each [`Key`] keeps the MAC state initialised under its
//! key (and the fixed all-zero nonce), and each frame starts from a copy of
//! it. The tag covers the VIA header and the payload (`check` included,
//! which an authenticated sender leaves zero): 64 bytes, two whole
//! AEGIS-128L blocks, so the payload is absorbed from a block boundary. The
//! Ethernet header is left out: the MAC addresses because composite devices
//! rewrite them, the EtherType because only ours reaches the parser. Which
//! key a frame is tagged with, and where keys come from, is the kernel
//! agent's business (`via_kernel_agent::auth`). Why AEGIS:
//! docs/DESIGN-NOTES.md, "Frame authentication".

use std::fmt;

use aegis::aegis128l::Aegis128LMac;

use crate::{ETH_HEADER_LEN, FRAME_HEADER_LEN};

/// Bytes of the authentication tag that follows an authenticated frame's payload.
pub const TAG_LEN: usize = 16;
/// Bytes of a MAC key (AEGIS-128L's key).
pub const KEY_LEN: usize = 16;

pub type Tag = [u8; TAG_LEN];

/// A MAC key: its bytes and the AEGISMAC-128L state initialised under
/// them, which every tag starts from (a copy: the ten initialisation
/// rounds are paid once per key, not per frame).
#[derive(Clone)]
pub struct Key {
    bytes: [u8; KEY_LEN],
    mac: Aegis128LMac<TAG_LEN>,
}

impl Key {
    /// The key whose bytes are `bytes`.
    pub fn new(bytes: [u8; KEY_LEN]) -> Key {
        Key { bytes, mac: Aegis128LMac::new(&bytes) }
    }

    /// The key's bytes.
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.bytes
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Key {}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

/// The tag of the frame whose headers are `head` ([`FRAME_HEADER_LEN`]
/// bytes, flags as sent) and whose payload is `payload`, in pieces:
/// AEGISMAC-128L under `key` of the VIA header and the payload.
pub fn frame_tag<'a>(key: &Key, head: &[u8], payload: impl IntoIterator<Item = &'a [u8]>) -> Tag {
    let mut mac = key.mac.clone();
    mac.update(&head[ETH_HEADER_LEN..FRAME_HEADER_LEN]);
    for p in payload {
        mac.update(p);
    }
    mac.finalize()
}

/// Does `tag` authenticate the frame (headers `head`, payload `payload`)
/// under `key`? Compared in constant time.
pub fn tag_ok(key: &Key, head: &[u8], payload: &[u8], tag: &[u8]) -> bool {
    let want = frame_tag(key, head, [payload]);
    tag.len() == TAG_LEN && want.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_anywhere_covered_fails() {
        // A small message's frame, an MTU-sized one and a large one: the
        // same MAC at every size.
        for (key, n) in [(Key::new([9; KEY_LEN]), 64usize), (Key::new([5; KEY_LEN]), 1422), (Key::new([3; KEY_LEN]), 9000)] {
            flipped_bits_fail(&key, n);
        }
    }

    #[test]
    fn the_tag_is_aegismac_128l_of_the_covered_bytes() {
        // The same tag as the crate's one-shot MAC over the covered bytes
        // in one piece, whatever the pieces: pieces are only how the
        // payload lies in memory.
        let key = Key::new(*b"0123456789abcdef");
        let head: Vec<u8> = (0..FRAME_HEADER_LEN as u8).collect();
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let mut whole = head[ETH_HEADER_LEN..].to_vec();
        whole.extend_from_slice(&payload);
        let mut one = Aegis128LMac::<TAG_LEN>::new(b"0123456789abcdef");
        one.update(&whole);
        let want = one.finalize();
        assert_eq!(frame_tag(&key, &head, [&payload[..]]), want);
        assert_eq!(frame_tag(&key, &head, [&payload[..1], &payload[1..33], &payload[33..]]), want);
        // And the state a key keeps is not used up by a tag.
        assert_eq!(frame_tag(&key, &head, [&payload[..]]), want);
    }

    fn flipped_bits_fail(key: &Key, n: usize) {
        let mut head = [0u8; FRAME_HEADER_LEN];
        for (i, b) in head.iter_mut().enumerate() {
            *b = i as u8;
        }
        let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let tag = frame_tag(key, &head, [&payload[..40], &payload[40..]]);
        assert!(tag_ok(key, &head, &payload, &tag));
        for bit in ETH_HEADER_LEN * 8..FRAME_HEADER_LEN * 8 {
            let mut h = head;
            h[bit / 8] ^= 1 << (bit % 8);
            assert!(!tag_ok(key, &h, &payload, &tag), "header bit {bit}");
        }
        for bit in (0..payload.len() * 8).step_by(if n > 1000 { 7 } else { 1 }) {
            let mut p = payload.clone();
            p[bit / 8] ^= 1 << (bit % 8);
            assert!(!tag_ok(key, &head, &p, &tag), "payload bit {bit}");
        }
        for bit in 0..TAG_LEN * 8 {
            let mut t = tag;
            t[bit / 8] ^= 1 << (bit % 8);
            assert!(!tag_ok(key, &head, &payload, &t), "tag bit {bit}");
        }
        for byte in 0..KEY_LEN {
            let mut k = *key.bytes();
            k[byte] ^= 1;
            assert!(!tag_ok(&Key::new(k), &head, &payload, &tag), "another key (byte {byte})");
        }
        assert!(!tag_ok(key, &head, &payload, &tag[..15]), "a short tag");
        // A byte more or less of payload is another message.
        assert!(!tag_ok(key, &head, &payload[..n - 1], &tag), "a shorter payload");
        let mut longer = payload.clone();
        longer.push(0);
        assert!(!tag_ok(key, &head, &longer, &tag), "a longer payload");
        // The Ethernet header is not covered (composite devices rewrite
        // the MAC addresses; only our EtherType reaches the parser).
        let mut h = head;
        h[..ETH_HEADER_LEN].fill(0xee);
        assert!(tag_ok(key, &h, &payload, &tag));
    }
}
