//! The frame tag: the keyed MAC an authenticated frame carries after its
//! payload in place of the CRC-32C ([`crate::flags::AUTH`]).
//!
//! The MAC is AEGISMAC (RFC 10032 section 7, the `aegis` crate) with a
//! 128-bit tag: AEGISMAC-128L for a frame whose payload is shorter than
//! [`WIDE_FROM`] bytes, AEGISMAC-128X4 for a longer one. The header's
//! `payload_len` says which (it is covered, and a receiver checks it
//! against the bytes), so a frame is only ever checked under the one its
//! sender used. 128X4 runs four 128L lanes side by side: on a large
//! payload it is 1.5x (1,486 B) to 4.8x (64 KiB) as fast here (AES-NI and
//! VAES), on a small one its wider state costs more (DESIGN-NOTES, "Frame
//! authentication"). AEGISMAC allows a `(key, nonce)` pair to
//! authenticate many different inputs, so it needs no nonce per frame: a
//! retransmission whose piggybacked ACK changed is safe. Each [`Key`]
//! keeps both MAC states initialised (the fixed all-zero nonce; 128X4
//! under a subkey derived from the key, so that no key serves two
//! functions), and each frame starts from a copy of one. The tag covers
//! the VIA header and the payload (`check` included, which an
//! authenticated sender leaves zero): the header is 64 bytes, two whole
//! AEGIS-128L blocks, so the payload is absorbed from a block boundary.
//! The Ethernet header is left out: the MAC addresses because composite
//! devices rewrite them, the EtherType because only ours reaches the
//! parser. Which key a frame is tagged with, and where keys come from, is
//! the kernel agent's business (`via_kernel_agent::auth`). Four frames of
//! one length (a message's fragments) may be tagged or checked together
//! ([`frame_tags4`], [`unit_tags4`], computed in [`lanes`]): the same tags
//! as each gets alone. Why AEGIS: docs/DESIGN-NOTES.md, "Frame
//! authentication" and "Four frames at once".

use std::fmt;

use aegis::aegis128l::Aegis128LMac;
use aegis::aegis128x4::Aegis128X4Mac;

pub mod lanes;

use lanes::KeyState;
use crate::{ETH_HEADER_LEN, FRAME_HEADER_LEN, VIA_HEADER_LEN};

/// Bytes of the authentication tag that follows an authenticated frame's payload.
pub const TAG_LEN: usize = 16;
/// Bytes of a MAC key (AEGIS-128L's key).
pub const KEY_LEN: usize = 16;

pub type Tag = [u8; TAG_LEN];

/// Payloads of at least this many bytes are tagged with AEGISMAC-128X4,
/// shorter ones with AEGISMAC-128L. A batch's frames of one length under
/// it are tagged four at a time ([`frame_tags4`], 40 ns a 1,422-byte
/// frame against 158 with 128X4 alone, DESIGN-NOTES "Four frames at
/// once"), so it takes in an MTU 1500 link's frames; alone, 128L and
/// 128X4 cost about the same at 2 KB on one of the machines measured
/// (the other has 128X4 level with 128L at 640 B).
pub const WIDE_FROM: usize = 2048;

/// Where the header's `payload_len` lies (Ethernet header included).
const PAYLOAD_LEN_AT: usize = ETH_HEADER_LEN + 54;

/// What the subkey of AEGISMAC-128X4 is derived for (BLAKE3's
/// `derive_key`): tags of long payloads under a key of their own.
const CONTEXT_WIDE: &str = "via-rs 2026-11 frame tag subkey for long payloads (AEGISMAC-128X4)";

/// A MAC key: its bytes and the two MAC states initialised under it
/// (128X4's under the derived subkey), which every tag starts from (a
/// copy: the initialisation rounds are paid once per key, not per frame).
#[derive(Clone)]
pub struct Key {
    bytes: [u8; KEY_LEN],
    mac: Aegis128LMac<TAG_LEN>,
    wide: Aegis128X4Mac<TAG_LEN>,
    /// 128L's state for four frames at once, where the CPU has AVX-512
    /// with VAES ([`lanes`]).
    lanes: Option<KeyState>,
}

impl Key {
    /// The key whose bytes are `bytes`.
    pub fn new(bytes: [u8; KEY_LEN]) -> Key {
        Key { bytes, mac: Aegis128LMac::new(&bytes), wide: Aegis128X4Mac::new(&wide_subkey(&bytes)), lanes: KeyState::new(&bytes) }
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

/// The subkey of AEGISMAC-128X4 for the key whose bytes are `bytes`.
fn wide_subkey(bytes: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    let derived = blake3::derive_key(CONTEXT_WIDE, bytes);
    let mut k = [0u8; KEY_LEN];
    k.copy_from_slice(&derived[..KEY_LEN]);
    k
}

/// The payload length the frame's header `head` states.
fn stated_payload_len(head: &[u8]) -> usize {
    via_stated_payload_len(&head[ETH_HEADER_LEN..])
}

/// The payload length the VIA header `via` (from its first byte) states.
fn via_stated_payload_len(via: &[u8]) -> usize {
    let at = PAYLOAD_LEN_AT - ETH_HEADER_LEN;
    usize::from(u16::from_be_bytes([via[at], via[at + 1]]))
}

/// The tags of four frames by their VIA headers (`vias`, [`VIA_HEADER_LEN`]
/// bytes each) and payloads, computed together: `None` unless every
/// header states its payload's length, one length for all four and under
/// [`WIDE_FROM`], and the CPU has the lanes.
fn tags4_checked(key: &Key, vias: [&[u8]; 4], payloads: [&[u8]; 4]) -> Option<[Tag; 4]> {
    let len = payloads[0].len();
    if len >= WIDE_FROM || (0..4).any(|j| vias[j].len() != VIA_HEADER_LEN || via_stated_payload_len(vias[j]) != len || payloads[j].len() != len) {
        return None;
    }
    lanes::tags4(key.lanes.as_ref()?, vias, payloads)
}

/// The tag of the frame whose headers are `head` ([`FRAME_HEADER_LEN`]
/// bytes, flags and `payload_len` as sent) and whose payload is
/// `payload`, in pieces: AEGISMAC under `key` of the VIA header and the
/// payload, 128L or 128X4 as `payload_len` says ([`WIDE_FROM`]).
pub fn frame_tag<'a>(key: &Key, head: &[u8], payload: impl IntoIterator<Item = &'a [u8]>) -> Tag {
    let covered_head = &head[ETH_HEADER_LEN..FRAME_HEADER_LEN];
    if stated_payload_len(head) >= WIDE_FROM {
        let mut mac = key.wide.clone();
        mac.update(covered_head);
        for p in payload {
            mac.update(p);
        }
        mac.finalize()
    } else {
        let mut mac = key.mac.clone();
        mac.update(covered_head);
        for p in payload {
            mac.update(p);
        }
        mac.finalize()
    }
}

/// The tags of four frames (headers `heads`, payloads `payloads`, each in
/// one piece) under `key`, computed side by side: the same tags as
/// [`frame_tag`] gives each. `None` when they cannot go together: a
/// payload of another length than the first's, one of [`WIDE_FROM`]
/// bytes or more, a header stating another length, or a CPU without the
/// instructions ([`lanes::lanes_available`]); then tag each alone.
pub fn frame_tags4(key: &Key, heads: [&[u8]; 4], payloads: [&[u8]; 4]) -> Option<[Tag; 4]> {
    if heads.iter().any(|h| h.len() < FRAME_HEADER_LEN) {
        return None;
    }
    tags4_checked(key, heads.map(|h| &h[ETH_HEADER_LEN..FRAME_HEADER_LEN]), payloads)
}

/// The tags of four frames given from their VIA headers on (`units[j]`:
/// header, payload, and anything after), as [`frame_tags4`] computes
/// them: for frames whose Ethernet headers are not written yet (a
/// superframe's units, `via_device::Ahead`). Each payload is as long as
/// its header states; `None` as [`frame_tags4`] says, or when a unit is
/// shorter than its header and payload.
pub fn unit_tags4(key: &Key, units: [&[u8]; 4]) -> Option<[Tag; 4]> {
    let mut payloads: [&[u8]; 4] = [&[]; 4];
    for (p, u) in payloads.iter_mut().zip(units) {
        let len = via_stated_payload_len(u.get(..VIA_HEADER_LEN)?);
        *p = u.get(VIA_HEADER_LEN..VIA_HEADER_LEN + len)?;
    }
    tags4_checked(key, units.map(|u| &u[..VIA_HEADER_LEN]), payloads)
}

/// Does `tag` authenticate the frame (headers `head`, payload `payload`)
/// under `key`? Not when the header states another payload length than
/// `payload` has. Compared in constant time.
pub fn tag_ok(key: &Key, head: &[u8], payload: &[u8], tag: &[u8]) -> bool {
    if stated_payload_len(head) != payload.len() {
        return false;
    }
    let want = frame_tag(key, head, [payload]);
    tag.len() == TAG_LEN && want.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_anywhere_covered_fails() {
        // A small message's frame, the longest tagged with 128L, the
        // shortest with 128X4, an MTU-sized one and a large one.
        for (key, n) in [(Key::new([9; KEY_LEN]), 64usize), (Key::new([8; KEY_LEN]), WIDE_FROM - 1), (Key::new([7; KEY_LEN]), WIDE_FROM), (Key::new([5; KEY_LEN]), 1422), (Key::new([3; KEY_LEN]), 9000)] {
            flipped_bits_fail(&key, n);
        }
    }

    /// Frame headers (bytes 0, 1, 2, ... but for `payload_len`) stating a
    /// payload of `n` bytes.
    fn head_for(n: usize) -> [u8; FRAME_HEADER_LEN] {
        let mut head = [0u8; FRAME_HEADER_LEN];
        for (i, b) in head.iter_mut().enumerate() {
            *b = i as u8;
        }
        head[PAYLOAD_LEN_AT..PAYLOAD_LEN_AT + 2].copy_from_slice(&(n as u16).to_be_bytes());
        head
    }

    #[test]
    fn a_short_payload_is_tagged_with_aegismac_128l_of_the_covered_bytes() {
        // The same tag as the crate's one-shot MAC over the covered bytes
        // in one piece, whatever the pieces: pieces are only how the
        // payload lies in memory.
        let key = Key::new(*b"0123456789abcdef");
        for n in [0, 300, 1422, WIDE_FROM - 1] {
            let head = head_for(n);
            let payload: Vec<u8> = (0..n as u32).map(|i| (i * 7) as u8).collect();
            let mut whole = head[ETH_HEADER_LEN..].to_vec();
            whole.extend_from_slice(&payload);
            let mut one = Aegis128LMac::<TAG_LEN>::new(b"0123456789abcdef");
            one.update(&whole);
            let want = one.finalize();
            assert_eq!(frame_tag(&key, &head, [&payload[..]]), want, "{n} bytes");
            let cut = n.min(33);
            assert_eq!(frame_tag(&key, &head, [&payload[..cut / 2], &payload[cut / 2..cut], &payload[cut..]]), want);
            // And the state a key keeps is not used up by a tag.
            assert_eq!(frame_tag(&key, &head, [&payload[..]]), want);
        }
    }

    #[test]
    fn a_long_payload_is_tagged_with_aegismac_128x4_under_the_derived_subkey() {
        let bytes = *b"0123456789abcdef";
        let key = Key::new(bytes);
        let sub = blake3::derive_key(CONTEXT_WIDE, &bytes);
        assert_ne!(&sub[..KEY_LEN], &bytes[..], "a key of its own");
        for n in [WIDE_FROM, 9000, 65000] {
            let head = head_for(n);
            let payload: Vec<u8> = (0..n as u32).map(|i| (i * 13) as u8).collect();
            let mut whole = head[ETH_HEADER_LEN..].to_vec();
            whole.extend_from_slice(&payload);
            let mut one = Aegis128X4Mac::<TAG_LEN>::new(sub[..KEY_LEN].try_into().unwrap());
            one.update(&whole);
            let want = one.finalize();
            assert_eq!(frame_tag(&key, &head, [&payload[..100], &payload[100..]]), want, "{n} bytes");
            assert!(tag_ok(&key, &head, &payload, &want));
            // 128L's tag of the same bytes, under the key or the subkey, is
            // not the frame's.
            for k in [bytes, sub[..KEY_LEN].try_into().unwrap()] {
                let mut narrow = Aegis128LMac::<TAG_LEN>::new(&k);
                narrow.update(&whole);
                assert!(!tag_ok(&key, &head, &payload, &narrow.finalize()), "{n} bytes: 128L's tag");
            }
        }
    }

    #[test]
    fn four_frames_tagged_together_get_the_tags_each_gets_alone() {
        let key = Key::new(*b"0123456789abcdef");
        if !lanes::lanes_available() || key.lanes.is_none() {
            eprintln!("no AVX-512 with VAES here: frames are tagged one at a time");
            return;
        }
        for n in [0, 1, 64, 1422, WIDE_FROM - 1] {
            let heads: Vec<[u8; FRAME_HEADER_LEN]> = (0..4u8)
                .map(|j| {
                    let mut h = head_for(n);
                    h[ETH_HEADER_LEN + 10] = j; // another frame's fields
                    h
                })
                .collect();
            let payloads: Vec<Vec<u8>> = (0..4u32).map(|j| (0..n as u32).map(|i| (i * 3 + j) as u8).collect()).collect();
            let tags = frame_tags4(&key, std::array::from_fn(|j| &heads[j][..]), std::array::from_fn(|j| &payloads[j][..])).expect("together");
            for j in 0..4 {
                assert_eq!(tags[j], frame_tag(&key, &heads[j], [&payloads[j][..]]), "{n} bytes, frame {j}");
                assert!(tag_ok(&key, &heads[j], &payloads[j], &tags[j]));
            }
        }
        // Not together: 128X4's lengths, unequal lengths, a misstated header.
        let big = vec![0u8; WIDE_FROM];
        let h = head_for(WIDE_FROM);
        assert!(frame_tags4(&key, [&h[..]; 4], [&big[..]; 4]).is_none());
        let (a, b) = (vec![0u8; 100], vec![0u8; 101]);
        let (ha, hb) = (head_for(100), head_for(101));
        assert!(frame_tags4(&key, [&ha[..], &ha[..], &hb[..], &ha[..]], [&a[..], &a[..], &b[..], &a[..]]).is_none());
        assert!(frame_tags4(&key, [&ha[..], &ha[..], &hb[..], &ha[..]], [&a[..]; 4]).is_none());
    }

    #[test]
    fn units_from_their_via_headers_get_the_frames_tags() {
        let key = Key::new(*b"0123456789abcdef");
        if !lanes::lanes_available() || key.lanes.is_none() {
            return;
        }
        let n = 1000;
        let frames: Vec<Vec<u8>> = (0..4u8)
            .map(|j| {
                let mut f = head_for(n).to_vec();
                f[0] = 0xee; // the Ethernet header is not covered
                f[ETH_HEADER_LEN + 9] = j;
                f.extend((0..n).map(|i| (i as u8) ^ j));
                f
            })
            .collect();
        let tags = unit_tags4(&key, std::array::from_fn(|j| &frames[j][ETH_HEADER_LEN..])).expect("together");
        for j in 0..4 {
            assert_eq!(tags[j], frame_tag(&key, &frames[j][..FRAME_HEADER_LEN], [&frames[j][FRAME_HEADER_LEN..]]));
        }
        // A unit cut short is refused, not read past.
        let short = &frames[3][ETH_HEADER_LEN..frames[3].len() - 1];
        assert!(unit_tags4(&key, [&frames[0][ETH_HEADER_LEN..], &frames[1][ETH_HEADER_LEN..], &frames[2][ETH_HEADER_LEN..], short]).is_none());
    }

    #[test]
    fn a_header_that_misstates_its_payload_is_not_authentic() {
        let key = Key::new([1; KEY_LEN]);
        let payload = vec![5u8; 700];
        let head = head_for(700);
        let tag = frame_tag(&key, &head, [&payload[..]]);
        assert!(tag_ok(&key, &head, &payload, &tag));
        assert!(!tag_ok(&key, &head_for(699), &payload, &tag));
        assert!(!tag_ok(&key, &head, &payload[..699], &tag));
    }

    fn flipped_bits_fail(key: &Key, n: usize) {
        let head = head_for(n);
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
        // A byte more or less of payload is another message, its header
        // saying so or not.
        assert!(!tag_ok(key, &head, &payload[..n - 1], &tag), "a shorter payload");
        assert!(!tag_ok(key, &head_for(n - 1), &payload[..n - 1], &tag), "a shorter payload, stated");
        let mut longer = payload.clone();
        longer.push(0);
        assert!(!tag_ok(key, &head, &longer, &tag), "a longer payload");
        assert!(!tag_ok(key, &head_for(n + 1), &longer, &tag), "a longer payload, stated");
        // The Ethernet header is not covered (composite devices rewrite
        // the MAC addresses; only our EtherType reaches the parser).
        let mut h = head;
        h[..ETH_HEADER_LEN].fill(0xee);
        assert!(tag_ok(key, &h, &payload, &tag));
    }
}
