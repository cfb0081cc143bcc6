//! The VIA wire format: typed views over byte slices (smoltcp's `wire`
//! style) with checked constructors, and `Repr` structs for parse/emit.
//!
//! A VIA frame is an Ethernet II frame of EtherType [`ETHERTYPE`] (IEEE
//! local experimental 0x88B5) whose payload starts with the fixed
//! [`VIA_HEADER_LEN`]-byte header below, followed by `payload_len` bytes.
//! All fields are big-endian.
//!
//! ```text
//!  0 version u8        1 kind u8          2 flags u16
//!  4 dst_ep u32        8 src_ep u32
//! 12 dst_vi u16       14 src_vi u16      16 generation u32
//! 20 psn u32          24 ack u32 (next PSN expected from the peer)
//! 28 msg_len u32      32 offset u32 (of this fragment in the message)
//! 36 imm u32          40 rdma_addr u64   48 rdma_handle u32
//! 52 credits u16      54 payload_len u16 56 msg_seq u32   60 check u32
//! ```
//!
//! `check`, when the [`flags::CHECKSUM`] bit is set, is the CRC-32C of the
//! frame from the EtherType to the end of the payload, taken with `check`
//! zero ([`frame_checksum`]). The MAC addresses are left out: composite
//! devices rewrite them on the way.
//!
//! With [`flags::AUTH`] instead (a cluster secret is configured), `check`
//! is zero and the payload is followed by a [`TAG_LEN`]-byte tag, the
//! keyed MAC of the VIA header and the payload ([`crate::tag`]);
//! `payload_len` does not count it.
//!
//! A payload longer than `payload_len` can say (65,535 bytes) is never
//! in a frame: only a sender on the same host may lend one (its address,
//! not its bytes, goes with the headers: a whole message at once), and
//! then `payload_len` says 65,535 and the lent record the length
//! ([`Frame::new_checked_lent`], [`lent_payload_len`]).
//!
//! In a standalone ACK (kind `Ack`), `rdma_addr` is the selective
//! acknowledgement: bit `i` set when the receiver holds PSN `ack + 1 + i`
//! past a gap. With `ACK_REQ`, the ACK is a NAK: the receiver has a gap
//! at `ack` (and the sender transmits the holes the bitmap shows, or, when
//! it is empty, everything from `ack`).

use crate::mac::MacAddr;

/// Bytes of the nonce each side puts into a connection request or accept
/// (for the derivation of the connection's frame keys).
pub const NONCE_LEN: usize = 16;
pub type Nonce = [u8; NONCE_LEN];

pub const ETHERTYPE: u16 = 0x88B5;
/// The UDP port VIA datagrams go to and come from when VIA travels in
/// UDP/IPv4 (`via_softnic::udp`): our EtherType's number.
pub const VIA_UDP_PORT: u16 = ETHERTYPE;
pub const ETH_HEADER_LEN: usize = 14;
pub const VIA_HEADER_LEN: usize = 64;
/// Ethernet + VIA header: the bytes in front of every fragment's payload.
pub const FRAME_HEADER_LEN: usize = ETH_HEADER_LEN + VIA_HEADER_LEN;
pub const VERSION: u8 = 1;
/// Byte offset, within the Ethernet frame, of the destination endpoint id
/// (what per-process receive filters match on).
pub const DST_EP_OFFSET: usize = ETH_HEADER_LEN + 4;
/// Endpoint id that every endpoint accepts (connection management).
pub const ANY_ENDPOINT: u32 = 0;

/// What a frame is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A fragment of a send/receive message.
    Data = 1,
    /// A standalone acknowledgement.
    Ack = 2,
    /// A fragment of an RDMA write.
    RdmaWrite = 3,
    /// A request to read remote memory.
    RdmaReadReq = 4,
    /// Data answering an RDMA read request.
    RdmaReadResp = 5,
    /// A remote atomic (extension): `imm` names the operation, `rdma_addr`
    /// and `rdma_handle` the 8-byte target, the payload its two operands
    /// (little-endian u64s: the addend or the compare value, then the
    /// swap value). Sequenced like a read request.
    AtomicReq = 6,
    /// The target's 8 bytes before the atomic (little-endian), answering
    /// an `AtomicReq` (its PSN and message number echoed).
    AtomicResp = 7,
    /// Client asks a server to connect (payload: [`ConnRepr`]).
    ConnRequest = 16,
    /// The server saw the request and a ConnectWait matched it; decision pending.
    ConnPending = 17,
    ConnAccept = 18,
    ConnReject = 19,
    /// No ConnectWait on that discriminator at this endpoint.
    ConnNoMatch = 20,
    /// The peer tore the connection down.
    Disconnect = 22,
    /// Peer-to-peer connection request (both sides request).
    PeerRequest = 23,
    /// The deciding side of a peer-to-peer match: the connection is made
    /// (carries the generation).
    PeerAccept = 24,
    /// Name service: who has this name (broadcast), or, with an empty
    /// name, what is your name (unicast). Payload: [`ConnRepr`] with the
    /// query id in `request_id` and the name in `discriminator`.
    NameQuery = 25,
    /// The answer: the sender's MAC has the name in `discriminator`.
    NameReply = 26,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Ack,
            3 => Kind::RdmaWrite,
            4 => Kind::RdmaReadReq,
            5 => Kind::RdmaReadResp,
            6 => Kind::AtomicReq,
            7 => Kind::AtomicResp,
            16 => Kind::ConnRequest,
            17 => Kind::ConnPending,
            18 => Kind::ConnAccept,
            19 => Kind::ConnReject,
            20 => Kind::ConnNoMatch,
            22 => Kind::Disconnect,
            23 => Kind::PeerRequest,
            24 => Kind::PeerAccept,
            25 => Kind::NameQuery,
            26 => Kind::NameReply,
            _ => return None,
        })
    }

    /// Frames handled by the connection manager rather than a VI.
    pub fn is_connection_management(self) -> bool {
        self as u8 >= 16
    }
}

/// The operations an `AtomicReq` names in its `imm`.
pub mod atomic_op {
    /// Fetch-and-add: the first operand is the addend.
    pub const FETCH_ADD: u32 = 1;
    /// Compare-and-swap: the first operand is compared, the second stored.
    pub const CMP_SWAP: u32 = 2;
}

/// Flag bits of the `flags` field.
pub mod flags {
    /// First fragment of a message.
    pub const FIRST: u16 = 0x0001;
    /// Last fragment of a message.
    pub const LAST: u16 = 0x0002;
    /// `imm` carries immediate data.
    pub const IMMEDIATE: u16 = 0x0004;
    /// `ack` is valid.
    pub const ACK: u16 = 0x0008;
    /// The sender wants an acknowledgement now (it is short of window).
    pub const ACK_REQ: u16 = 0x0010;
    /// The frame belongs to a reliable connection (sequence checked).
    pub const RELIABLE: u16 = 0x0020;
    /// On an `Ack`: the message `msg_seq` failed at the peer; `imm` holds
    /// the `VIP_STATUS_*` error bits its descriptor completes with, and
    /// `ack` acknowledges everything before what failed.
    pub const ERROR: u16 = 0x0040;
    /// With [`ERROR`]: the peer broke the connection over it.
    pub const FATAL: u16 = 0x0080;
    /// `check` holds the frame's checksum ([`super::frame_checksum`]).
    pub const CHECKSUM: u16 = 0x0100;
    /// A [`super::TAG_LEN`]-byte authentication tag follows the payload
    /// ([`super::seal_authenticated`]).
    pub const AUTH: u16 = 0x0200;
    /// On an `Ack` (extension: receiver-not-ready mode): the message at
    /// `ack` found no receive posted and was not taken; the sender holds
    /// it and sends it again after a back-off.
    pub const RNR: u16 = 0x0400;
}

pub use crate::tag::TAG_LEN;

/// Byte offset, within the Ethernet frame, of the `check` field.
pub const CHECK_OFFSET: usize = ETH_HEADER_LEN + 60;

/// Marks the frame whose headers are `head` ([`FRAME_HEADER_LEN`] bytes)
/// and whose payload is `payload`, in pieces, as checksummed (and not
/// authenticated: no tag follows), and writes its checksum into `check`.
pub fn seal<'a>(head: &mut [u8], payload: impl IntoIterator<Item = &'a [u8]>) {
    let fl = (be16(head, ETH_HEADER_LEN + 2) & !flags::AUTH) | flags::CHECKSUM;
    head[ETH_HEADER_LEN + 2..ETH_HEADER_LEN + 4].copy_from_slice(&fl.to_be_bytes());
    let c = frame_checksum(head, payload);
    head[CHECK_OFFSET..CHECK_OFFSET + 4].copy_from_slice(&c.to_be_bytes());
}

/// Marks the frame whose headers are `head` and whose payload is
/// `payload` as authenticated (`check` zero) and returns the tag under
/// `key` that must follow the payload.
pub fn seal_authenticated<'a>(head: &mut [u8], key: &crate::tag::Key, payload: impl IntoIterator<Item = &'a [u8]>) -> crate::tag::Tag {
    mark_authenticated(head);
    crate::tag::frame_tag(key, head, payload)
}

/// Marks the frame whose headers are `head` as authenticated (`check`
/// zero), as [`seal_authenticated`] does before it computes the tag: for
/// frames whose tags are computed together ([`crate::tag::frame_tags4`]).
pub fn mark_authenticated(head: &mut [u8]) {
    let fl = (be16(head, ETH_HEADER_LEN + 2) & !flags::CHECKSUM) | flags::AUTH;
    head[ETH_HEADER_LEN + 2..ETH_HEADER_LEN + 4].copy_from_slice(&fl.to_be_bytes());
    head[CHECK_OFFSET..CHECK_OFFSET + 4].fill(0);
}

/// The checksum of the frame whose headers are `head` (at least
/// [`FRAME_HEADER_LEN`] bytes; its `check` field is taken as zero) and
/// whose payload is `payload`, in pieces.
fn frame_checksum<'a>(head: &[u8], payload: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    use crate::crc32c::{finish, update, START};
    // The covered header bytes in one piece, `check` zeroed: one call of
    // whole words where three pieces each ended in single bytes (this is
    // on every frame's path, both ends).
    const COVERED: usize = FRAME_HEADER_LEN - 12;
    let mut covered = [0u8; COVERED];
    covered.copy_from_slice(&head[12..FRAME_HEADER_LEN]);
    covered[CHECK_OFFSET - 12..CHECK_OFFSET - 8].fill(0);
    let mut c = update(START, &covered);
    for p in payload {
        c = update(c, p);
    }
    finish(c)
}

/// Why a frame could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    Truncated,
    NotVia,
    BadVersion,
    BadKind,
    BadLength,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "frame shorter than the VIA header",
            WireError::NotVia => "not a VIA EtherType",
            WireError::BadVersion => "unknown VIA version",
            WireError::BadKind => "unknown frame kind",
            WireError::BadLength => "payload length inconsistent with the frame",
        })
    }
}

impl std::error::Error for WireError {}

// One bounds check per field (a slice of the field's width), not one per
// byte.
#[inline(always)]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("a 2-byte slice"))
}
#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("a 4-byte slice"))
}
#[inline(always)]
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("an 8-byte slice"))
}

/// A read view of a whole VIA Ethernet frame (Ethernet header included).
#[derive(Clone, Copy, Debug)]
pub struct Frame<T: AsRef<[u8]>> {
    buf: T,
}

impl<'a> Frame<&'a [u8]> {
    /// A view of headers alone, as built for sending (before the payload
    /// is gathered): the header fields' accessors; [`Frame::payload`] is
    /// empty. Unchecked: the caller built them.
    pub fn of_headers(head: &'a [u8; FRAME_HEADER_LEN]) -> Self {
        Frame { buf: &head[..] }
    }
}


/// What `payload_len` says of a payload of `len` bytes: the length, or
/// 65,535 for a longer one (lent: the module comment).
pub fn lent_payload_len(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}
impl<T: AsRef<[u8]>> Frame<T> {
    /// Checks everything the accessors rely on: length, EtherType, version,
    /// kind and that `payload_len` fits in the frame.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let f = Self::check_header(buf)?;
        if FRAME_HEADER_LEN + f.payload_len() as usize + f.trailer_len() > f.buf.as_ref().len() {
            return Err(WireError::BadLength);
        }
        Ok(f)
    }

    /// For a frame whose payload (`lent_len` bytes) was lent by a sender
    /// on this host and is not in `buf`: `buf` must be exactly the headers,
    /// and `payload_len` must say `lent_len` ([`lent_payload_len`] of it).
    /// [`Frame::payload`] of such a frame is empty.
    pub fn new_checked_lent(buf: T, lent_len: usize) -> Result<Self, WireError> {
        let f = Self::check_header(buf)?;
        if f.buf.as_ref().len() != FRAME_HEADER_LEN || f.payload_len() != lent_payload_len(lent_len) {
            return Err(WireError::BadLength);
        }
        Ok(f)
    }

    fn check_header(buf: T) -> Result<Self, WireError> {
        let b = buf.as_ref();
        if b.len() < FRAME_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if be16(b, 12) != ETHERTYPE {
            return Err(WireError::NotVia);
        }
        let f = Frame { buf };
        if f.version() != VERSION {
            return Err(WireError::BadVersion);
        }
        if f.kind().is_none() {
            return Err(WireError::BadKind);
        }
        Ok(f)
    }

    /// The Ethernet and VIA headers, as a fixed-size array.
    #[inline(always)]
    pub fn headers(&self) -> &[u8; FRAME_HEADER_LEN] {
        self.buf.as_ref()[..FRAME_HEADER_LEN].try_into().expect("a checked frame holds its headers")
    }

    /// The VIA header, as a fixed-size array: one length check per
    /// accessor (which no constructor's frame fails), none per field.
    #[inline(always)]
    fn h(&self) -> &[u8; FRAME_HEADER_LEN - ETH_HEADER_LEN] {
        self.buf.as_ref()[ETH_HEADER_LEN..FRAME_HEADER_LEN].try_into().expect("a checked frame holds its headers")
    }

    /// The whole frame, as received.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }
    pub fn dst_mac(&self) -> MacAddr {
        let b: &[u8; 12] = self.buf.as_ref()[..12].try_into().expect("a checked frame holds its headers");
        MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
    pub fn src_mac(&self) -> MacAddr {
        let b: &[u8; 12] = self.buf.as_ref()[..12].try_into().expect("a checked frame holds its headers");
        MacAddr([b[6], b[7], b[8], b[9], b[10], b[11]])
    }
    pub fn version(&self) -> u8 {
        self.h()[0]
    }
    pub fn kind(&self) -> Option<Kind> {
        Kind::from_u8(self.h()[1])
    }
    pub fn flags(&self) -> u16 {
        be16(self.h(), 2)
    }
    pub fn dst_ep(&self) -> u32 {
        be32(self.h(), 4)
    }
    pub fn src_ep(&self) -> u32 {
        be32(self.h(), 8)
    }
    pub fn dst_vi(&self) -> u16 {
        be16(self.h(), 12)
    }
    pub fn src_vi(&self) -> u16 {
        be16(self.h(), 14)
    }
    pub fn generation(&self) -> u32 {
        be32(self.h(), 16)
    }
    pub fn psn(&self) -> u32 {
        be32(self.h(), 20)
    }
    pub fn ack(&self) -> u32 {
        be32(self.h(), 24)
    }
    pub fn msg_len(&self) -> u32 {
        be32(self.h(), 28)
    }
    pub fn offset(&self) -> u32 {
        be32(self.h(), 32)
    }
    pub fn imm(&self) -> u32 {
        be32(self.h(), 36)
    }
    pub fn rdma_addr(&self) -> u64 {
        be64(self.h(), 40)
    }
    pub fn rdma_handle(&self) -> u32 {
        be32(self.h(), 48)
    }
    pub fn credits(&self) -> u16 {
        be16(self.h(), 52)
    }
    pub fn payload_len(&self) -> u16 {
        be16(self.h(), 54)
    }
    pub fn msg_seq(&self) -> u32 {
        be32(self.h(), 56)
    }
    pub fn check(&self) -> u32 {
        be32(self.h(), 60)
    }
    /// Does the frame carry a checksum ([`flags::CHECKSUM`]), and does it
    /// match the headers and the payload in the frame?
    pub fn checksum_ok(&self) -> bool {
        self.flags() & flags::CHECKSUM != 0 && frame_checksum(self.headers(), [self.payload()]) == self.check()
    }
    /// Bytes after the payload that belong to the frame: the tag of an
    /// authenticated frame.
    pub fn trailer_len(&self) -> usize {
        if self.flags() & flags::AUTH != 0 {
            TAG_LEN
        } else {
            0
        }
    }
    /// The authentication tag, on a frame with [`flags::AUTH`] whose
    /// payload is in it.
    pub fn auth_tag(&self) -> Option<&[u8]> {
        let at = FRAME_HEADER_LEN + self.payload_len() as usize;
        (self.flags() & flags::AUTH != 0).then(|| self.buf.as_ref().get(at..at + TAG_LEN)).flatten()
    }
    /// Does the frame carry [`flags::AUTH`] and a tag that authenticates
    /// it under `key`?
    pub fn authentic(&self, key: &crate::tag::Key) -> bool {
        self.auth_tag().is_some_and(|t| crate::tag::tag_ok(key, self.headers(), self.payload(), t))
    }
    /// The payload, exactly `payload_len` bytes (Ethernet padding
    /// dropped); empty for a frame whose payload was lent.
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        let n = self.payload_len() as usize;
        self.buf.as_ref().get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + n).unwrap_or(&[])
    }
}

/// Every field of a VIA header, for building and for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderRepr {
    pub dst_mac: MacAddr,
    pub src_mac: MacAddr,
    pub kind: u8,
    pub flags: u16,
    pub dst_ep: u32,
    pub src_ep: u32,
    pub dst_vi: u16,
    pub src_vi: u16,
    pub generation: u32,
    pub psn: u32,
    pub ack: u32,
    pub msg_len: u32,
    pub offset: u32,
    pub imm: u32,
    pub rdma_addr: u64,
    pub rdma_handle: u32,
    pub credits: u16,
    pub payload_len: u16,
    pub msg_seq: u32,
    pub check: u32,
}

impl HeaderRepr {
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> HeaderRepr {
        HeaderRepr {
            dst_mac: f.dst_mac(),
            src_mac: f.src_mac(),
            kind: f.h()[1],
            flags: f.flags(),
            dst_ep: f.dst_ep(),
            src_ep: f.src_ep(),
            dst_vi: f.dst_vi(),
            src_vi: f.src_vi(),
            generation: f.generation(),
            psn: f.psn(),
            ack: f.ack(),
            msg_len: f.msg_len(),
            offset: f.offset(),
            imm: f.imm(),
            rdma_addr: f.rdma_addr(),
            rdma_handle: f.rdma_handle(),
            credits: f.credits(),
            payload_len: f.payload_len(),
            msg_seq: f.msg_seq(),
            check: f.check(),
        }
    }

    /// Writes the Ethernet and VIA headers into `out[..FRAME_HEADER_LEN]`.
    pub fn emit(&self, out: &mut [u8; FRAME_HEADER_LEN]) {
        out[0..6].copy_from_slice(&self.dst_mac.0);
        out[6..12].copy_from_slice(&self.src_mac.0);
        out[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        let h: &mut [u8; FRAME_HEADER_LEN - ETH_HEADER_LEN] = (&mut out[ETH_HEADER_LEN..]).try_into().expect("a frame header's VIA part");
        h[0] = VERSION;
        h[4..8].copy_from_slice(&self.dst_ep.to_be_bytes());
        h[8..12].copy_from_slice(&self.src_ep.to_be_bytes());
        h[12..14].copy_from_slice(&self.dst_vi.to_be_bytes());
        h[14..16].copy_from_slice(&self.src_vi.to_be_bytes());
        h[16..20].copy_from_slice(&self.generation.to_be_bytes());
        h[52..54].copy_from_slice(&self.credits.to_be_bytes());
        h[60..64].copy_from_slice(&self.check.to_be_bytes());
        let HeaderRepr { kind, flags, psn, ack, msg_len, offset, imm, rdma_addr, rdma_handle, payload_len, msg_seq, .. } = *self;
        StreamRepr { kind, flags, psn, ack, msg_len, offset, imm, rdma_addr, rdma_handle, payload_len, msg_seq }.put(h);
    }
}

/// The fields of a frame on a VI's connection that change from frame to
/// frame. The others (addresses, endpoints, VIs, generation) are the same
/// for every frame of the connection: written once into a template with
/// [`HeaderRepr::emit`], and copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamRepr {
    pub kind: u8,
    pub flags: u16,
    pub psn: u32,
    pub ack: u32,
    pub msg_len: u32,
    pub offset: u32,
    pub imm: u32,
    pub rdma_addr: u64,
    pub rdma_handle: u32,
    pub payload_len: u16,
    pub msg_seq: u32,
}

/// The headers every frame of one connection shares ([`StreamRepr`]'s
/// fields zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderTemplate([u8; FRAME_HEADER_LEN]);

impl Default for HeaderTemplate {
    fn default() -> Self {
        HeaderTemplate([0; FRAME_HEADER_LEN])
    }
}

impl HeaderTemplate {
    /// The template of the connection `conn` describes (its addresses,
    /// endpoints, VIs and generation; the other fields are ignored).
    pub fn new(conn: &HeaderRepr) -> Self {
        let mut t = [0u8; FRAME_HEADER_LEN];
        HeaderRepr { dst_mac: conn.dst_mac, src_mac: conn.src_mac, dst_ep: conn.dst_ep, src_ep: conn.src_ep, dst_vi: conn.dst_vi, src_vi: conn.src_vi, generation: conn.generation, ..HeaderRepr::default() }.emit(&mut t);
        HeaderTemplate(t)
    }

    /// The template's bytes (a frame of kind 0: not a valid frame alone).
    pub fn as_bytes(&self) -> &[u8; FRAME_HEADER_LEN] {
        &self.0
    }
}

impl StreamRepr {
    /// Writes the headers of the frame of `template`'s connection with
    /// these fields into `out`.
    #[inline]
    pub fn emit(&self, template: &HeaderTemplate, out: &mut [u8; FRAME_HEADER_LEN]) {
        *out = template.0;
        self.put((&mut out[ETH_HEADER_LEN..]).try_into().expect("a frame header's VIA part"));
    }

    /// Writes these fields into the VIA header `h` (the Ethernet header's
    /// successor); the others are left as they are. (A fixed-size array:
    /// every store's bounds are known when compiled.)
    #[inline(always)]
    fn put(&self, h: &mut [u8; FRAME_HEADER_LEN - ETH_HEADER_LEN]) {
        h[1] = self.kind;
        h[2..4].copy_from_slice(&self.flags.to_be_bytes());
        h[20..24].copy_from_slice(&self.psn.to_be_bytes());
        h[24..28].copy_from_slice(&self.ack.to_be_bytes());
        h[28..32].copy_from_slice(&self.msg_len.to_be_bytes());
        h[32..36].copy_from_slice(&self.offset.to_be_bytes());
        h[36..40].copy_from_slice(&self.imm.to_be_bytes());
        h[40..48].copy_from_slice(&self.rdma_addr.to_be_bytes());
        h[48..52].copy_from_slice(&self.rdma_handle.to_be_bytes());
        h[54..56].copy_from_slice(&self.payload_len.to_be_bytes());
        h[56..60].copy_from_slice(&self.msg_seq.to_be_bytes());
    }
}

/// Wraparound-safe sequence comparison: is `a` before `b`?
pub fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Wraparound-safe `a <= b`.
pub fn seq_le(a: u32, b: u32) -> bool {
    a == b || seq_lt(a, b)
}

/// Connection attributes exchanged by the connection manager.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnRepr {
    /// `VIP_RELIABILITY_LEVEL` bits of the VI.
    pub reliability: u16,
    pub enable_rdma_write: bool,
    pub enable_rdma_read: bool,
    pub max_transfer_size: u32,
    /// The sender's device MTU (carried in 16 bits).
    pub mtu: u32,
    /// Request identifier, chosen by the requester (retransmissions repeat it).
    pub request_id: u32,
    /// Discriminator the request is addressed to (server's local address);
    /// on a peer-to-peer request, the requester's own.
    pub discriminator: Vec<u8>,
    /// Peer-to-peer requests only: the discriminator of the peer sought.
    /// Encoded after `discriminator` as a u16 length and the bytes; absent
    /// (empty) on every other frame.
    pub peer_discriminator: Vec<u8>,
    /// The sender's fresh nonce for key derivation ([`crate::tag`]), on a
    /// request or accept of a host with a cluster secret. Encoded between
    /// the fixed part and `discriminator`, flagged by bit 0 of byte 3.
    pub nonce: Option<Nonce>,
}

/// Longest discriminator carried on the wire.
pub const MAX_DISCRIMINATOR: usize = 64;

/// Bit of a [`ConnRepr`]'s byte 3: a nonce follows the fixed part.
const NONCE_PRESENT: u8 = 1;

impl ConnRepr {
    pub const FIXED_LEN: usize = 16;

    pub fn len(&self) -> usize {
        let peer = if self.peer_discriminator.is_empty() { 0 } else { 2 + self.peer_discriminator.len() };
        Self::FIXED_LEN + self.nonce_len() + self.discriminator.len() + peer
    }

    fn nonce_len(&self) -> usize {
        if self.nonce.is_some() {
            NONCE_LEN
        } else {
            0
        }
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn parse(p: &[u8]) -> Result<ConnRepr, WireError> {
        if p.len() < Self::FIXED_LEN {
            return Err(WireError::Truncated);
        }
        let dlen = be16(p, 14) as usize;
        let nlen = if p[3] & NONCE_PRESENT != 0 { NONCE_LEN } else { 0 };
        let d0 = Self::FIXED_LEN + nlen;
        if dlen > MAX_DISCRIMINATOR || p.len() < d0 + dlen {
            return Err(WireError::BadLength);
        }
        let nonce = (nlen != 0).then(|| p[Self::FIXED_LEN..d0].try_into().expect("NONCE_LEN bytes"));
        let mut peer_discriminator = Vec::new();
        let rest = &p[d0 + dlen..];
        if rest.len() >= 2 {
            let plen = be16(rest, 0) as usize;
            if plen > MAX_DISCRIMINATOR || rest.len() < 2 + plen {
                return Err(WireError::BadLength);
            }
            peer_discriminator = rest[2..2 + plen].to_vec();
        }
        Ok(ConnRepr {
            reliability: be16(p, 0),
            enable_rdma_write: p[2] & 1 != 0,
            enable_rdma_read: p[2] & 2 != 0,
            max_transfer_size: be32(p, 4),
            mtu: be16(p, 8) as u32,
            request_id: be32(p, 10),
            discriminator: p[d0..d0 + dlen].to_vec(),
            peer_discriminator,
            nonce,
        })
    }

    /// Writes the attributes into `out`, returning the bytes used.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let n = self.len();
        let o = &mut out[..n];
        o[0..2].copy_from_slice(&self.reliability.to_be_bytes());
        o[2] = self.enable_rdma_write as u8 | (self.enable_rdma_read as u8) << 1;
        o[3] = if self.nonce.is_some() { NONCE_PRESENT } else { 0 };
        o[4..8].copy_from_slice(&self.max_transfer_size.to_be_bytes());
        o[8..10].copy_from_slice(&(self.mtu.min(u16::MAX as u32) as u16).to_be_bytes());
        o[10..14].copy_from_slice(&self.request_id.to_be_bytes());
        o[14..16].copy_from_slice(&(self.discriminator.len() as u16).to_be_bytes());
        let d0 = Self::FIXED_LEN + self.nonce_len();
        if let Some(nonce) = &self.nonce {
            o[Self::FIXED_LEN..d0].copy_from_slice(nonce);
        }
        let d = d0 + self.discriminator.len();
        o[d0..d].copy_from_slice(&self.discriminator);
        if !self.peer_discriminator.is_empty() {
            o[d..d + 2].copy_from_slice(&(self.peer_discriminator.len() as u16).to_be_bytes());
            o[d + 2..].copy_from_slice(&self.peer_discriminator);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HeaderRepr {
        HeaderRepr {
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            kind: Kind::Data as u8,
            flags: flags::FIRST | flags::LAST | flags::ACK,
            dst_ep: 0x01020304,
            src_ep: 0x0a0b0c0d,
            dst_vi: 7,
            src_vi: 9,
            generation: 0xdeadbeef,
            psn: u32::MAX,
            ack: 5,
            msg_len: 1 << 20,
            offset: 1436,
            imm: 42,
            rdma_addr: 0x1122334455667788,
            rdma_handle: 0x99,
            credits: 3,
            payload_len: 4,
            msg_seq: 77,
            check: 0,
        }
    }

    #[test]
    fn stream_fields_over_a_template_equal_the_whole_header() {
        let whole = sample();
        let template = HeaderTemplate::new(&whole);
        let fields = StreamRepr {
            kind: whole.kind,
            flags: whole.flags,
            psn: whole.psn,
            ack: whole.ack,
            msg_len: whole.msg_len,
            offset: whole.offset,
            imm: whole.imm,
            rdma_addr: whole.rdma_addr,
            rdma_handle: whole.rdma_handle,
            payload_len: whole.payload_len,
            msg_seq: whole.msg_seq,
        };
        let mut out = [0xAAu8; FRAME_HEADER_LEN];
        fields.emit(&template, &mut out);
        let mut expect = [0u8; FRAME_HEADER_LEN];
        HeaderRepr { credits: 0, check: 0, ..whole }.emit(&mut expect);
        assert_eq!(out, expect);
    }

    #[test]
    fn emit_parse_roundtrip() {
        let r = sample();
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        r.emit(&mut hdr);
        let mut buf = hdr.to_vec();
        buf.extend_from_slice(b"abcd");
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&f), r);
        assert_eq!(f.payload(), b"abcd");
        assert_eq!(&buf[DST_EP_OFFSET..DST_EP_OFFSET + 4], &0x01020304u32.to_be_bytes());
    }

    #[test]
    fn a_lent_frame_says_its_length_up_to_what_the_field_holds() {
        for (len, said) in [(0, 0), (4, 4), (65_535, 65_535), (65_536, 65_535), (1 << 20, 65_535)] {
            assert_eq!(lent_payload_len(len), said);
            let mut hdr = [0u8; FRAME_HEADER_LEN];
            HeaderRepr { payload_len: said, msg_len: len as u32, offset: 0, ..sample() }.emit(&mut hdr);
            assert!(Frame::new_checked_lent(&hdr[..], len).is_ok(), "{len}");
            // A record that says a length the field would say otherwise
            // is refused. (Past 65,535 the field tells no lengths apart:
            // the record's, bounded by the message's, is the one.)
            assert_eq!(Frame::new_checked_lent(&hdr[..], 65_534).err(), (len != 65_534).then_some(WireError::BadLength), "{len}");
        }
    }

    #[test]
    fn checked_rejects() {
        let r = sample();
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        r.emit(&mut hdr);
        assert_eq!(Frame::new_checked(&hdr[..10]).unwrap_err(), WireError::Truncated);
        // payload_len says 4, frame has none
        assert_eq!(Frame::new_checked(&hdr[..]).unwrap_err(), WireError::BadLength);
        let mut b = hdr;
        b[12] = 0x08;
        assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), WireError::NotVia);
        let mut b = hdr;
        b[ETH_HEADER_LEN] = 9;
        assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), WireError::BadVersion);
        let mut b = hdr;
        b[ETH_HEADER_LEN + 1] = 200;
        assert_eq!(Frame::new_checked(&b[..]).unwrap_err(), WireError::BadKind);
    }

    #[test]
    fn the_checksum_covers_what_it_says() {
        // What the checksum is, spelled out: from the EtherType to the end
        // of the headers with `check` as zero, then the payload; the MAC
        // addresses are not covered and `check` itself does not count.
        let reference = |h: &[u8], payload: &[u8]| {
            use crate::crc32c::{finish, update, START};
            let c = update(update(update(START, &h[12..CHECK_OFFSET]), &[0; 4]), &h[CHECK_OFFSET + 4..FRAME_HEADER_LEN]);
            finish(update(c, payload))
        };
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        sample().emit(&mut hdr);
        let payload: Vec<u8> = (0..200u8).collect();
        seal(&mut hdr, [&payload[..70], &payload[70..]]);
        let check = u32::from_be_bytes(hdr[CHECK_OFFSET..CHECK_OFFSET + 4].try_into().unwrap());
        assert_eq!(check, reference(&hdr, &payload));
        let mut other_macs = hdr;
        other_macs[..12].fill(0xab);
        assert_eq!(frame_checksum(&other_macs, [&payload[..]]), check);
        let mut other_ep = hdr;
        other_ep[DST_EP_OFFSET] ^= 1;
        assert_ne!(frame_checksum(&other_ep, [&payload[..]]), check);
    }

    #[test]
    fn sequence_wraps() {
        assert!(seq_lt(u32::MAX, 0));
        assert!(seq_lt(u32::MAX - 5, 3));
        assert!(!seq_lt(3, u32::MAX - 5));
        assert!(seq_le(4, 4));
        assert!(seq_lt(1, 2));
    }

    #[test]
    fn conn_roundtrip() {
        let c = ConnRepr {
            reliability: 2,
            enable_rdma_write: true,
            enable_rdma_read: false,
            max_transfer_size: 1 << 20,
            mtu: 9000,
            request_id: 0xabcdef01,
            discriminator: b"pingpong".to_vec(),
            peer_discriminator: Vec::new(),
            nonce: None,
        };
        let mut buf = [0u8; 160];
        let n = c.emit(&mut buf);
        assert_eq!(ConnRepr::parse(&buf[..n]).unwrap(), c);
        assert!(ConnRepr::parse(&buf[..n - 1]).is_err());
        let mut bad = buf;
        bad[14..16].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(ConnRepr::parse(&bad[..n]).unwrap_err(), WireError::BadLength);
        // A peer-to-peer request carries both discriminators.
        let p = ConnRepr { peer_discriminator: b"other side".to_vec(), ..c.clone() };
        let n = p.emit(&mut buf);
        assert_eq!(n, ConnRepr::FIXED_LEN + 8 + 2 + 10);
        assert_eq!(ConnRepr::parse(&buf[..n]).unwrap(), p);
        assert_eq!(ConnRepr::parse(&buf[..n - 1]).unwrap_err(), WireError::BadLength);
        // A keyed host's request carries its nonce.
        let k = ConnRepr { nonce: Some([0x5a; NONCE_LEN]), ..p.clone() };
        let n = k.emit(&mut buf);
        assert_eq!(n, ConnRepr::FIXED_LEN + 16 + 8 + 2 + 10);
        assert_eq!(ConnRepr::parse(&buf[..n]).unwrap(), k);
        assert_eq!(ConnRepr::parse(&buf[..ConnRepr::FIXED_LEN + 10]).unwrap_err(), WireError::BadLength);
    }

    #[test]
    fn authenticated_frames_carry_their_tag_after_the_payload() {
        let key = crate::tag::Key::new([3u8; crate::tag::KEY_LEN]);
        let mut hdr = [0u8; FRAME_HEADER_LEN];
        sample().emit(&mut hdr);
        let payload = *b"abcd";
        let tag = seal_authenticated(&mut hdr, &key, [&payload[..]]);
        let mut buf = hdr.to_vec();
        buf.extend_from_slice(&payload);
        // Without its tag the frame is too short for what it says.
        assert_eq!(Frame::new_checked(&buf[..]).unwrap_err(), WireError::BadLength);
        buf.extend_from_slice(&tag);
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(f.flags() & (flags::AUTH | flags::CHECKSUM), flags::AUTH);
        assert_eq!(f.payload(), b"abcd", "the tag is not payload");
        assert_eq!(f.trailer_len(), TAG_LEN);
        assert_eq!(f.auth_tag(), Some(&tag[..]));
        assert!(f.authentic(&key));
        assert!(!f.authentic(&crate::tag::Key::new([4u8; crate::tag::KEY_LEN])), "another key");
        assert!(!f.checksum_ok(), "no CRC on an authenticated frame");
        // A flipped bit anywhere from the EtherType on fails it: in the
        // EtherType the frame is not ours, from the VIA header on the tag fails.
        for bit in 12 * 8..buf.len() * 8 {
            let mut b = buf.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            if let Ok(f) = Frame::new_checked(&b[..]) {
                assert!(!f.authentic(&key), "bit {bit} flipped and still authentic");
            }
        }
        // A plain frame has no tag.
        let mut plain = [0u8; FRAME_HEADER_LEN];
        sample().emit(&mut plain);
        let mut p = plain.to_vec();
        p.extend_from_slice(b"abcd");
        let f = Frame::new_checked(&p[..]).unwrap();
        assert_eq!((f.auth_tag(), f.trailer_len(), f.authentic(&key)), (None, 0, false));
    }
}
