//! Boxed messages: a small send between processes of one host that goes
//! into the receiver's ring as a 40-byte header and its payload instead
//! of a VIA frame ([`BoxRepr`]), and completes at the sender once the
//! receiver placed it, which the receiver says in a word of shared memory
//! ([`PlacedWord`]) instead of an ACK frame, and again in the header of
//! each boxed message it sends back ([`BoxRepr::placed`]): a reply
//! completes the sends it answers without that word being read.
//!
//! A device that can carry them (the shared-memory wire, alone or in a
//! composite) answers [`crate::FrameDevice::box_route`] for a peer with a
//! [`BoxRoute`]; the engine then hands it boxed messages
//! ([`crate::FrameDevice::transmit_boxed`]), and the receiving device hands
//! them up with [`crate::RxMeta::boxed`] set. Boxed messages and frames to
//! the same peer share one ring, so they arrive in the order sent.

use crate::MacAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a boxed message's header; its payload follows.
pub const BOX_HEADER_LEN: usize = 40;

/// The header's flags: the message carries immediate data; an
/// acknowledgement of the receiver's framed stream; the count of the
/// receiver's own boxed messages the sender placed.
const IMMEDIATE: u16 = 1;
const ACK: u16 = 2;
const PLACED: u16 = 4;

/// A boxed message's header: who sent it (the connection's words, checked
/// by the receiver as a frame's are), to which VI, and what it carries.
///
/// Layout (little-endian): source MAC 0..6, destination VI 6..8, source
/// endpoint 8..12, source VI 12..14, flags 14..16, connection generation
/// 16..20, immediate data 20..24, payload length 24..28, the sender's
/// port on the wire 28..30 (written by its device), reserved 30..32, the
/// acknowledged PSN 32..36, the count of the receiver's boxed messages
/// placed 36..40.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoxRepr {
    pub src_mac: MacAddr,
    pub dst_vi: u16,
    pub src_ep: u32,
    pub src_vi: u16,
    pub generation: u32,
    pub imm: Option<u32>,
    pub len: u32,
    /// The sender's port on its wire (set by the sending device).
    pub src_port: u16,
    /// The PSN the sender expects next of the receiver's framed stream
    /// (an ACK carried, as a reliable VI's frames carry one).
    pub ack: Option<u32>,
    /// How many of the receiver's boxed messages on this connection the
    /// sender placed (wrapping): what its [`PlacedWord`] says, carried so
    /// that a reply completes the receiver's sends without that word's
    /// cache line crossing between the cores.
    pub placed: Option<u32>,
}

/// Where the sending device writes its port into an emitted header.
pub const BOX_PORT_OFFSET: usize = 28;
/// Where the source VI is, for a device that finds the placed word.
pub const BOX_SRC_VI_OFFSET: usize = 12;

impl BoxRepr {
    /// Writes the header.
    #[inline]
    pub fn emit(&self, out: &mut [u8; BOX_HEADER_LEN]) {
        out[0..6].copy_from_slice(&self.src_mac.0);
        out[6..8].copy_from_slice(&self.dst_vi.to_le_bytes());
        out[8..12].copy_from_slice(&self.src_ep.to_le_bytes());
        out[12..14].copy_from_slice(&self.src_vi.to_le_bytes());
        out[16..20].copy_from_slice(&self.generation.to_le_bytes());
        out[28..30].copy_from_slice(&self.src_port.to_le_bytes());
        out[30..32].copy_from_slice(&[0, 0]);
        write_message_words(out, self.imm, self.len, self.ack, self.placed);
    }

    /// The header and payload of a received boxed message; None when the
    /// bytes are not one (see [`BoxView::new_checked`]).
    pub fn parse(b: &[u8]) -> Option<(BoxRepr, &[u8])> {
        let v = BoxView::new_checked(b)?;
        let repr = BoxRepr {
            src_mac: v.src_mac(),
            dst_vi: v.dst_vi(),
            src_ep: v.src_ep(),
            src_vi: v.src_vi(),
            generation: v.generation(),
            imm: v.imm(),
            len: v.len(),
            src_port: v.src_port(),
            ack: v.ack(),
            placed: v.placed(),
        };
        Some((repr, v.payload()))
    }
}

/// Writes the words that change from message to message (the flags,
/// immediate data, length, ACK and placed count) into header `out`: what
/// [`BoxRepr::emit`] writes of them and [`BoxTemplate::header`] fills in.
#[inline(always)]
fn write_message_words(out: &mut [u8; BOX_HEADER_LEN], imm: Option<u32>, len: u32, ack: Option<u32>, placed: Option<u32>) {
    let flags = if imm.is_some() { IMMEDIATE } else { 0 } | if ack.is_some() { ACK } else { 0 } | if placed.is_some() { PLACED } else { 0 };
    out[14..16].copy_from_slice(&flags.to_le_bytes());
    out[20..24].copy_from_slice(&imm.unwrap_or(0).to_le_bytes());
    out[24..28].copy_from_slice(&len.to_le_bytes());
    out[32..36].copy_from_slice(&ack.unwrap_or(0).to_le_bytes());
    out[36..40].copy_from_slice(&placed.unwrap_or(0).to_le_bytes());
}

/// A received boxed message read in place, field by field as asked (the
/// receive path reads the destination VI, the connection's words and
/// what the flags say, and builds no [`BoxRepr`]).
#[derive(Clone, Copy, Debug)]
pub struct BoxView<'a> {
    h: &'a [u8; BOX_HEADER_LEN],
    payload: &'a [u8],
}

impl<'a> BoxView<'a> {
    /// A view of `b` if it is a boxed message: a whole header, no unknown
    /// flag, and a payload as long as the header says.
    #[inline]
    pub fn new_checked(b: &'a [u8]) -> Option<BoxView<'a>> {
        let (h, payload) = b.split_first_chunk::<BOX_HEADER_LEN>()?;
        let v = BoxView { h, payload };
        if v.flags() & !(IMMEDIATE | ACK | PLACED) != 0 || payload.len() != v.len() as usize {
            return None;
        }
        Some(v)
    }

    #[inline]
    fn u16_at(&self, i: usize) -> u16 {
        u16::from_le_bytes([self.h[i], self.h[i + 1]])
    }

    #[inline]
    fn u32_at(&self, i: usize) -> u32 {
        u32::from_le_bytes([self.h[i], self.h[i + 1], self.h[i + 2], self.h[i + 3]])
    }

    #[inline]
    fn flags(&self) -> u16 {
        self.u16_at(14)
    }

    pub fn src_mac(&self) -> MacAddr {
        MacAddr([self.h[0], self.h[1], self.h[2], self.h[3], self.h[4], self.h[5]])
    }

    #[inline]
    pub fn dst_vi(&self) -> u16 {
        self.u16_at(6)
    }

    pub fn src_ep(&self) -> u32 {
        self.u32_at(8)
    }

    pub fn src_vi(&self) -> u16 {
        self.u16_at(12)
    }

    #[inline]
    pub fn generation(&self) -> u32 {
        self.u32_at(16)
    }

    /// Was it sent on the connection from `mac`'s endpoint `ep`, VI `vi`,
    /// generation `generation` (its connection's words, compared whole)?
    #[inline]
    pub fn is_from(&self, mac: MacAddr, ep: u32, vi: u16, generation: u32) -> bool {
        let [a, b, c, d, e, f] = mac.0;
        let [p, q, r, s] = ep.to_le_bytes();
        let [x, y] = vi.to_le_bytes();
        // Bytes 0..6 and 8..14 (skipping the destination VI at 6..8), as
        // one word each, then the generation at 16..20.
        let want0 = u64::from_le_bytes([a, b, c, d, e, f, 0, 0]);
        let want1 = u64::from_le_bytes([p, q, r, s, x, y, 0, 0]);
        let got0 = u64::from_le_bytes(self.h[0..8].try_into().unwrap()) & 0xffff_ffff_ffff;
        let got1 = u64::from_le_bytes(self.h[8..16].try_into().unwrap()) & 0xffff_ffff_ffff;
        got0 == want0 && got1 == want1 && self.generation() == generation
    }

    #[inline]
    pub fn imm(&self) -> Option<u32> {
        (self.flags() & IMMEDIATE != 0).then(|| self.u32_at(20))
    }

    #[inline]
    pub fn len(&self) -> u32 {
        self.u32_at(24)
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn src_port(&self) -> u16 {
        self.u16_at(BOX_PORT_OFFSET)
    }

    #[inline]
    pub fn ack(&self) -> Option<u32> {
        (self.flags() & ACK != 0).then(|| self.u32_at(32))
    }

    #[inline]
    pub fn placed(&self) -> Option<u32> {
        (self.flags() & PLACED != 0).then(|| self.u32_at(36))
    }

    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

/// A connection's boxed-message header with its constant words written
/// once (source MAC, endpoint and VI, destination VI, generation), as
/// via-wire's `HeaderTemplate` is for a connection's frames: each message
/// fills in only what changes ([`BoxTemplate::header`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoxTemplate([u8; BOX_HEADER_LEN]);

impl Default for BoxTemplate {
    fn default() -> BoxTemplate {
        BoxTemplate([0; BOX_HEADER_LEN])
    }
}

impl BoxTemplate {
    /// The template of `conn`'s connection (its per-message fields are
    /// not kept).
    pub fn new(conn: &BoxRepr) -> BoxTemplate {
        let mut h = [0u8; BOX_HEADER_LEN];
        BoxRepr { imm: None, len: 0, src_port: 0, ack: None, placed: None, ..*conn }.emit(&mut h);
        BoxTemplate(h)
    }

    /// The header of a message of `len` bytes with `imm`, `ack` and
    /// `placed`: what [`BoxRepr::emit`] writes for the connection's
    /// words with these.
    #[inline]
    pub fn header(&self, imm: Option<u32>, len: u32, ack: Option<u32>, placed: Option<u32>) -> [u8; BOX_HEADER_LEN] {
        let mut out = self.0;
        write_message_words(&mut out, imm, len, ack, placed);
        out
    }
}

/// A word of shared memory in which the receiver of a connection's boxed
/// messages says how many it placed: the connection's generation in the
/// high 32 bits, the count (wrapping) in the low 32. Only that receiver
/// stores it; the sender reads it to complete its sends.
#[derive(Clone, Copy, Debug)]
pub struct PlacedWord(NonNull<AtomicU64>);

// SAFETY: a pointer to an atomic word in a mapping that lives as long as
// the device that handed it out (`PlacedWord::new`), wherever that device
// is moved; the word may be used from any thread.
unsafe impl Send for PlacedWord {}

impl PlacedWord {
    /// # Safety
    /// `word` must stay mapped while the device that hands this out lives
    /// (its users hold that device).
    pub unsafe fn new(word: &AtomicU64) -> PlacedWord {
        PlacedWord(NonNull::from(word))
    }

    /// The count placed on connection `generation`, if the word is that
    /// connection's.
    #[inline]
    pub fn placed(&self, generation: u32) -> Option<u32> {
        // SAFETY: mapped while the device lives (`new`), which the caller holds.
        let w = unsafe { self.0.as_ref() }.load(Ordering::Acquire);
        ((w >> 32) as u32 == generation).then_some(w as u32)
    }

    /// Says that `count` messages of connection `generation` were placed
    /// (after they were: the sender completes them when it reads this).
    #[inline]
    pub fn set(&self, generation: u32, count: u32) {
        // SAFETY: as in `placed`.
        unsafe { self.0.as_ref() }.store(u64::from(generation) << 32 | u64::from(count), Ordering::Release);
    }
}

/// Where a VI's boxed messages go: the receiving port on the wire as it
/// was found (a port that changed hands since takes nothing), and the
/// word in which that receiver says what it placed.
#[derive(Clone, Copy, Debug)]
pub struct BoxRoute {
    pub port: u32,
    pub generation: u32,
    pub placed: PlacedWord,
    /// The longest payload that goes boxed (longer ones go as frames:
    /// the device may carry those better, lent for one).
    pub max_len: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let h = BoxRepr { src_mac: MacAddr([2, 0, 0, 0, 0, 9]), dst_vi: 7, src_ep: 0x0102_0304, src_vi: 3, generation: 99, imm: Some(0xdead_beef), len: 5, src_port: 12, ack: Some(77), placed: Some(0xffff_fffe) };
        let mut b = [0u8; BOX_HEADER_LEN + 5];
        h.emit((&mut b[..BOX_HEADER_LEN]).try_into().unwrap());
        b[BOX_HEADER_LEN..].copy_from_slice(b"hello");
        let (back, payload) = BoxRepr::parse(&b).unwrap();
        assert_eq!(back, h);
        assert_eq!(payload, b"hello");
        let bare = BoxRepr { imm: None, ack: None, placed: None, ..h };
        bare.emit((&mut b[..BOX_HEADER_LEN]).try_into().unwrap());
        assert_eq!(BoxRepr::parse(&b).unwrap().0, bare);
    }

    #[test]
    fn a_view_says_whom_a_message_is_from() {
        let h = BoxRepr { src_mac: MacAddr([2, 0, 0, 0, 0, 9]), dst_vi: 7, src_ep: 0x0102_0304, src_vi: 3, generation: 99, len: 1, ..BoxRepr::default() };
        let mut b = [0u8; BOX_HEADER_LEN + 1];
        h.emit((&mut b[..BOX_HEADER_LEN]).try_into().unwrap());
        let v = BoxView::new_checked(&b).unwrap();
        assert!(v.is_from(h.src_mac, h.src_ep, h.src_vi, h.generation));
        assert!(!v.is_from(MacAddr([2, 0, 0, 0, 0, 8]), h.src_ep, h.src_vi, h.generation), "another MAC");
        assert!(!v.is_from(h.src_mac, h.src_ep + 1, h.src_vi, h.generation), "another endpoint");
        assert!(!v.is_from(h.src_mac, h.src_ep, h.src_vi + 1, h.generation), "another VI");
        assert!(!v.is_from(h.src_mac, h.src_ep, h.src_vi, h.generation + 1), "another connection");
        // The destination VI and the flags are not the sender's words.
        b[6] = 8;
        b[14] = 1;
        assert!(BoxView::new_checked(&b).unwrap().is_from(h.src_mac, h.src_ep, h.src_vi, h.generation));
    }

    #[test]
    fn a_template_writes_what_emit_writes() {
        let conn = BoxRepr { src_mac: MacAddr([2, 0, 0, 0, 0, 9]), dst_vi: 7, src_ep: 0x0102_0304, src_vi: 3, generation: 99, ..BoxRepr::default() };
        let t = BoxTemplate::new(&BoxRepr { imm: Some(1), len: 9, ack: Some(2), placed: Some(3), ..conn });
        for (imm, len, ack, placed) in [(None, 0, None, None), (Some(0xdead_beef), 64, Some(77), Some(0xffff_fffe)), (Some(0), 1, None, Some(5)), (None, 65_000, Some(0), None)] {
            let mut want = [0u8; BOX_HEADER_LEN];
            BoxRepr { imm, len, ack, placed, ..conn }.emit(&mut want);
            assert_eq!(t.header(imm, len, ack, placed), want, "imm {imm:?} len {len} ack {ack:?} placed {placed:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_a_boxed_message_are_refused() {
        let h = BoxRepr { len: 4, ..BoxRepr::default() };
        let mut b = [0u8; BOX_HEADER_LEN + 4];
        h.emit((&mut b[..BOX_HEADER_LEN]).try_into().unwrap());
        assert!(BoxRepr::parse(&b).is_some());
        assert!(BoxRepr::parse(&b[..BOX_HEADER_LEN + 3]).is_none(), "payload shorter than its length");
        assert!(BoxRepr::parse(&b[..10]).is_none(), "shorter than a header");
        b[14] = 0x80; // an unknown flag
        assert!(BoxRepr::parse(&b).is_none());
    }

    #[test]
    fn a_placed_word_answers_only_for_its_connection() {
        let w = AtomicU64::new(0);
        // SAFETY: `w` outlives the word.
        let p = unsafe { PlacedWord::new(&w) };
        p.set(5, 3);
        assert_eq!(p.placed(5), Some(3));
        assert_eq!(p.placed(6), None, "another connection's count");
    }
}
