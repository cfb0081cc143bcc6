//! VIA over UDP/IPv4: the encapsulation that lets VIA frames cross routers
//! (device `udp:<ifname>`), as RoCE v2 put InfiniBand's transport in UDP.
//!
//! On the wire a frame is an Ethernet header to the next hop, an IPv4
//! header (20 bytes, don't-fragment), a UDP header (port [`VIA_UDP_PORT`]
//! both ways) and the VIA frame without its Ethernet header.
//!
//! The UDP checksum guards the frame. With the virtio-net header (the
//! default) every datagram asks for it to be offloaded: the NIC fills it,
//! or the kernel where the NIC cannot, and over veth nobody needs to, as
//! nothing can corrupt it there. Such a path is `checksummed`, and the
//! engine leaves out its own CRC-32C. On receive a datagram is vouched for
//! when the kernel saw its checksum good or knows it was made on this
//! host (the ring slot's `TP_STATUS_CSUM_VALID` / `TP_STATUS_CSUMNOTREADY`),
//! else when its checksum adds up here; one that does not is dropped. A
//! datagram without a checksum (`gso=off`: no offload, so the VIA frame
//! carries its CRC) is not vouched for, and the engine checks the CRC. The provider builds all
//! of it and sends it on the same AF_PACKET path as raw frames: no kernel
//! socket carries data.
//!
//! Hosts are named by their IPv4 identity ([`MacAddr::for_ipv4`]), so the
//! engine above sees raw VIA frames as always: on receive, the device
//! writes an Ethernet header made from the datagram's addresses in front
//! of the VIA header, in the ring slot ([`Outer::unwrap`]); on transmit it
//! takes the identity in the frame's destination field for the IPv4
//! address and asks the kernel's tables for the next hop (`next_hop`).

mod next_hop;

pub(crate) use next_hop::{Hop, NextHops};

use std::net::Ipv4Addr;
use via_device::{MacAddr, ETHERTYPE, ETH_HEADER_LEN};

/// The UDP port VIA datagrams go to and come from: our EtherType's
/// number. `udp:<ifname>,port=<n>` chooses another.
pub use via_device::VIA_UDP_PORT;
/// Where the IPv4 header starts in a frame.
pub(crate) const IPV4_START: usize = ETH_HEADER_LEN;
const IPV4_LEN: usize = 20;
const UDP_LEN: usize = 8;
/// What the encapsulation adds to a raw VIA frame: the IPv4 and UDP
/// headers (its Ethernet header stays, readdressed).
pub(crate) const ENCAP_LEN: usize = IPV4_LEN + UDP_LEN;
/// The outer headers: Ethernet, IPv4, UDP.
pub(crate) const OUTER_LEN: usize = ETH_HEADER_LEN + ENCAP_LEN;
/// IPv4 "don't fragment": frames are cut to the path's MTU by the engine.
const DONT_FRAGMENT: u16 = 0x4000;
const TTL: u8 = 64;
const PROTO_UDP: u8 = 17;

/// Why a received frame is not a VIA datagram for us (counted, dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotOurs {
    /// Not IPv4 with a 20-byte header carrying UDP to our port, or a
    /// fragment: the kernel filter drops these, but frames already in the
    /// ring when it was attached went past it.
    Other,
    /// Lengths that disagree with the frame, or a bad IPv4 checksum.
    Malformed,
    /// An empty datagram: the probe a sender makes the kernel send to
    /// resolve its next hop (`next_hop`).
    Probe,
    /// A UDP checksum that does not add up: corrupted on the way.
    BadChecksum,
}

/// This host's side of the encapsulation: its addresses and the IPv4
/// identification counter.
#[derive(Debug)]
pub(crate) struct Outer {
    mac: MacAddr,
    ip: Ipv4Addr,
    port: u16,
    id: u16,
}

impl Outer {
    /// `mac` is the interface's Ethernet address, `ip` its IPv4 address.
    pub fn new(mac: MacAddr, ip: Ipv4Addr, port: u16) -> Outer {
        Outer { mac, ip, port, id: 0 }
    }

    /// Our IPv4 identity: the address the engine above is known by.
    pub fn identity(&self) -> MacAddr {
        MacAddr::for_ipv4(self.ip)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Writes the outer headers of a datagram to `dst` through the
    /// Ethernet address `next_hop`, carrying `payload` bytes (the VIA
    /// frame past its Ethernet header).
    pub fn emit(&mut self, h: &mut [u8; OUTER_LEN], next_hop: MacAddr, dst: Ipv4Addr, payload: usize) {
        h[0..6].copy_from_slice(&next_hop.0);
        h[6..12].copy_from_slice(&self.mac.0);
        h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut h[IPV4_START..IPV4_START + IPV4_LEN];
        ip[0] = 0x45; // version 4, 5 words
        ip[1] = 0;
        ip[2..4].copy_from_slice(&((ENCAP_LEN + payload) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&self.id.to_be_bytes());
        self.id = self.id.wrapping_add(1);
        ip[6..8].copy_from_slice(&DONT_FRAGMENT.to_be_bytes());
        ip[8] = TTL;
        ip[9] = PROTO_UDP;
        ip[10..12].fill(0);
        ip[12..16].copy_from_slice(&self.ip.octets());
        ip[16..20].copy_from_slice(&dst.octets());
        let sum = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let udp = &mut h[IPV4_START + IPV4_LEN..];
        udp[0..2].copy_from_slice(&self.port.to_be_bytes());
        udp[2..4].copy_from_slice(&self.port.to_be_bytes());
        udp[4..6].copy_from_slice(&((UDP_LEN + payload) as u16).to_be_bytes());
        udp[6..8].fill(0); // no checksum (allowed over IPv4)
    }

    /// Writes the outer headers of a datagram whose UDP checksum is
    /// offloaded, and the virtio-net header that asks for it (`vnet`).
    /// With `unit`, a superframe: `payload` bytes of units of `unit` bytes
    /// each (the last may be shorter) that the kernel or the NIC cuts into
    /// one datagram per unit (UDP segmentation offload); carried whole
    /// (veth), the receiver cuts it at the same `unit`.
    pub fn emit_offloaded(&mut self, vnet: &mut [u8; VNET_LEN], h: &mut [u8; OUTER_LEN], next_hop: MacAddr, dst: Ipv4Addr, payload: usize, unit: Option<usize>) {
        self.emit(h, next_hop, dst, payload);
        // The field holds the pseudo-header's sum, which whoever fills the
        // checksum finishes (per unit, when segmenting).
        let sum = fold(pseudo_header_sum(self.ip, dst, UDP_LEN + payload));
        h[IPV4_START + IPV4_LEN + 6..OUTER_LEN].copy_from_slice(&sum.to_be_bytes());
        vnet_header(vnet, unit);
    }

    /// Checks that `frame` (as received, from its Ethernet header) is a
    /// VIA datagram for our port: where its payload (one unit, or a
    /// superframe's units) lies, and the Ethernet header of identities
    /// (destination ours or broadcast, source the sender's) that the raw
    /// frames it carries get. Trailing Ethernet padding is left out.
    ///
    /// `checked`: the kernel vouches for the UDP checksum (the ring slot
    /// says so), or `superframe`: it arrived whole, its checksum a partial
    /// sum (only frames made on this host come so). Otherwise a nonzero
    /// checksum is checked here.
    pub fn open(&self, frame: &[u8], checked: bool, superframe: bool) -> Result<Datagram, NotOurs> {
        if frame.len() < OUTER_LEN || frame[12..14] != [0x08, 0x00] {
            return Err(NotOurs::Other);
        }
        let ip = &frame[IPV4_START..IPV4_START + IPV4_LEN];
        let be16 = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        if ip[0] != 0x45 || ip[9] != PROTO_UDP || be16(ip, 6) & 0x3fff != 0 || be16(&frame[IPV4_START + IPV4_LEN..], 2) != self.port {
            return Err(NotOurs::Other);
        }
        let total = usize::from(be16(ip, 2));
        let udp_len = usize::from(be16(&frame[IPV4_START + IPV4_LEN..], 4));
        if total < ENCAP_LEN || IPV4_START + total > frame.len() || udp_len != total - IPV4_LEN || ipv4_checksum(ip) != 0 {
            return Err(NotOurs::Malformed);
        }
        if total == ENCAP_LEN {
            return Err(NotOurs::Probe);
        }
        let udp_sum = be16(&frame[IPV4_START + IPV4_LEN..], 6);
        let vouched = checked
            || match udp_sum {
                0 => false, // none: the VIA frame carries its CRC
                _ if superframe => false,
                _ if udp_checksum(ip, &frame[IPV4_START + IPV4_LEN..IPV4_START + total]) == 0 => true,
                _ => return Err(NotOurs::BadChecksum),
            };
        let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
        let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        let to = if dst == self.ip {
            self.identity()
        } else if dst.is_broadcast() || MacAddr(frame[0..6].try_into().unwrap()).is_broadcast() {
            MacAddr::BROADCAST
        } else {
            MacAddr::for_ipv4(dst)
        };
        let mut eth = [0u8; ETH_HEADER_LEN];
        eth[0..6].copy_from_slice(&to.0);
        eth[6..12].copy_from_slice(&MacAddr::for_ipv4(src).0);
        eth[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        Ok(Datagram { payload: OUTER_LEN..IPV4_START + total, eth, vouched })
    }

    /// [`Outer::open`], and the datagram's payload as one raw VIA frame,
    /// its Ethernet header written in place just before the payload.
    #[cfg(test)]
    pub fn unwrap<'a>(&self, frame: &'a mut [u8]) -> Result<&'a [u8], NotOurs> {
        let d = self.open(frame, false, false)?;
        Ok(d.unit(frame, d.payload.clone()))
    }
}

/// A VIA datagram found in a received frame.
#[derive(Clone, Debug)]
pub(crate) struct Datagram {
    /// Where its UDP payload lies in the frame.
    pub payload: std::ops::Range<usize>,
    /// The Ethernet header its raw frames get.
    pub eth: [u8; ETH_HEADER_LEN],
    /// Its UDP checksum vouches for it (see the module's doc).
    pub vouched: bool,
}

impl Datagram {
    /// The raw VIA frame of the unit at `at` (inside the payload, past its
    /// first [`ETH_HEADER_LEN`] bytes of outer headers or of the unit
    /// before, which this overwrites): its Ethernet header is written just
    /// before it.
    pub fn unit<'a>(&self, frame: &'a mut [u8], at: std::ops::Range<usize>) -> &'a [u8] {
        let raw = &mut frame[at.start - ETH_HEADER_LEN..at.end];
        raw[..ETH_HEADER_LEN].copy_from_slice(&self.eth);
        raw
    }
}

/// Bytes of a virtio-net header (`struct virtio_net_hdr`), which frames
/// carry in front of their Ethernet header on a socket with
/// `PACKET_VNET_HDR`.
pub(crate) const VNET_LEN: usize = 10;
/// virtio-net header fields (virtio spec §5.1.6; little-endian).
const VNET_F_NEEDS_CSUM: u8 = 1;
const VNET_GSO_UDP_L4: u8 = 5;

/// A virtio-net header that asks for the UDP checksum to be filled in,
/// and with `unit` for a superframe of `unit`-byte units (UDP
/// segmentation).
pub(crate) fn vnet_header(v: &mut [u8; VNET_LEN], unit: Option<usize>) {
    v.fill(0);
    v[0] = VNET_F_NEEDS_CSUM;
    v[6..8].copy_from_slice(&((IPV4_START + IPV4_LEN) as u16).to_le_bytes()); // csum_start: the UDP header
    v[8..10].copy_from_slice(&6u16.to_le_bytes()); // csum_offset: its checksum field
    if let Some(unit) = unit {
        v[1] = VNET_GSO_UDP_L4;
        v[2..4].copy_from_slice(&(OUTER_LEN as u16).to_le_bytes()); // hdr_len
        v[4..6].copy_from_slice(&(unit as u16).to_le_bytes()); // gso_size
    }
}

/// The unit size a received frame's virtio-net header gives, if it is a
/// superframe carried whole.
pub(crate) fn vnet_unit(v: &[u8; VNET_LEN]) -> Option<usize> {
    let size = usize::from(u16::from_le_bytes([v[4], v[5]]));
    (v[1] == VNET_GSO_UDP_L4 && size > 0).then_some(size)
}

/// The most UDP payload one datagram carries (an IPv4 total length of
/// 65,535).
pub(crate) const MAX_PAYLOAD: usize = 65535 - ENCAP_LEN;

/// The Internet checksum of an IPv4 header (RFC 791 §3.1, RFC 1071): 0
/// over a header whose checksum field is right.
fn ipv4_checksum(h: &[u8]) -> u16 {
    !fold(ones_sum(h))
}

/// The UDP checksum (RFC 768) of datagram `udp` (header and payload) in
/// the IPv4 packet whose header is `ip`: 0 over a datagram whose checksum
/// field is right (or holds 0xffff for a sum of zero).
fn udp_checksum(ip: &[u8], udp: &[u8]) -> u16 {
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    !fold(pseudo_header_sum(src, dst, udp.len()) + ones_sum(udp))
}

/// The sum of the UDP pseudo-header's 16-bit words (RFC 768).
fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: usize) -> u64 {
    let (s, d) = (src.octets(), dst.octets());
    [[s[0], s[1]], [s[2], s[3]], [d[0], d[1]], [d[2], d[3]]].iter().map(|w| u64::from(u16::from_be_bytes(*w))).sum::<u64>() + u64::from(PROTO_UDP) + udp_len as u64
}

/// The ones'-complement sum of `b` as big-endian 16-bit words (a last odd
/// byte padded with zero), not yet folded: eight bytes at a time, as
/// RFC 1071 §2(C) allows (the sum is the same in any word size, folded).
fn ones_sum(b: &[u8]) -> u64 {
    let mut sum: u64 = 0;
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_be_bytes(w.try_into().unwrap());
        // Add the two 32-bit halves: no carry out of 64 bits is possible
        // for any frame this device sees (under 2^32 of them).
        sum += (v >> 32) + (v & 0xffff_ffff);
    }
    let rest = words.remainder();
    for pair in rest.chunks(2) {
        sum += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    sum
}

/// Folds a ones'-complement sum to 16 bits.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

    /// A datagram from `from` (its outer headers) carrying `via` (a raw
    /// VIA frame past its Ethernet header) to `to`.
    fn datagram(from: &mut Outer, to: Ipv4Addr, via: &[u8]) -> Vec<u8> {
        let mut h = [0u8; OUTER_LEN];
        from.emit(&mut h, MacAddr([2, 0, 0, 0, 0, 0xee]), to, via.len());
        [&h[..], via].concat()
    }

    #[test]
    fn a_datagram_unwraps_into_the_raw_frame_between_identities() {
        let mut a = Outer::new(MacAddr([2, 0, 0, 0, 0, 1]), A, VIA_UDP_PORT);
        let b = Outer::new(MacAddr([2, 0, 0, 0, 0, 2]), B, VIA_UDP_PORT);
        let via: Vec<u8> = (0..100u8).collect();
        let mut d = datagram(&mut a, B, &via);
        // Known fields of the outer headers, and a checksum that checks.
        assert_eq!(d[..6], [2, 0, 0, 0, 0, 0xee]);
        assert_eq!(d[6..12], [2, 0, 0, 0, 0, 1]);
        assert_eq!(ipv4_checksum(&d[14..34]), 0);
        assert_eq!(u16::from_be_bytes([d[16], d[17]]) as usize, 28 + via.len());
        assert_eq!(u16::from_be_bytes([d[36], d[37]]), VIA_UDP_PORT);
        d.extend_from_slice(&[0; 7]); // Ethernet padding
        let raw = b.unwrap(&mut d).unwrap();
        assert_eq!(raw[0..6], MacAddr::for_ipv4(B).0);
        assert_eq!(raw[6..12], MacAddr::for_ipv4(A).0);
        assert_eq!(raw[12..14], ETHERTYPE.to_be_bytes());
        assert_eq!(&raw[14..], &via[..]);
        // The identification advances per datagram.
        let d2 = datagram(&mut a, B, &via);
        assert_ne!(d2[18..20], datagram(&mut a, B, &via)[18..20]);
    }

    #[test]
    fn broadcasts_unwrap_to_the_broadcast_address() {
        let mut a = Outer::new(MacAddr([2, 0, 0, 0, 0, 1]), A, VIA_UDP_PORT);
        let b = Outer::new(MacAddr([2, 0, 0, 0, 0, 2]), B, VIA_UDP_PORT);
        let mut d = datagram(&mut a, Ipv4Addr::BROADCAST, &[1; 70]);
        assert_eq!(b.unwrap(&mut d).unwrap()[..6], MacAddr::BROADCAST.0);
    }

    #[test]
    fn what_is_not_a_via_datagram_is_refused_with_its_reason() {
        let mut a = Outer::new(MacAddr([2, 0, 0, 0, 0, 1]), A, VIA_UDP_PORT);
        let b = Outer::new(MacAddr([2, 0, 0, 0, 0, 2]), B, VIA_UDP_PORT);
        let good = datagram(&mut a, B, &[7; 80]);
        let spoiled = |at: usize, v: u8| {
            let mut d = good.clone();
            d[at] = v;
            d
        };
        assert_eq!(b.unwrap(&mut spoiled(12, 0x86)), Err(NotOurs::Other));
        assert_eq!(b.unwrap(&mut spoiled(23, 6)), Err(NotOurs::Other));
        assert_eq!(b.unwrap(&mut spoiled(37, 0)), Err(NotOurs::Other));
        assert_eq!(b.unwrap(&mut spoiled(21, 8)), Err(NotOurs::Other)); // a fragment
        assert_eq!(b.unwrap(&mut spoiled(30, 99)), Err(NotOurs::Malformed)); // the checksum no longer checks
        assert_eq!(b.unwrap(&mut spoiled(17, 200)), Err(NotOurs::Malformed)); // longer than the frame
        assert_eq!(b.unwrap(&mut good[..40].to_vec()), Err(NotOurs::Other));
        let mut probe = datagram(&mut a, B, &[]);
        assert_eq!(b.unwrap(&mut probe), Err(NotOurs::Probe));
        // Every truncation is refused, never a panic.
        for n in 0..good.len() {
            assert!(b.unwrap(&mut good[..n].to_vec()).is_err());
        }
    }

    /// The UDP checksum by the book, 16 bits at a time (RFC 1071 §4.1):
    /// what the fast sum is checked against.
    fn udp_checksum_by_words(d: &[u8]) -> u16 {
        let ip = &d[14..34];
        let udp = &d[34..];
        let mut pseudo = [&ip[12..20], &[0, PROTO_UDP], &(udp.len() as u16).to_be_bytes()[..]].concat();
        pseudo.extend_from_slice(udp);
        if pseudo.len() % 2 == 1 {
            pseudo.push(0);
        }
        let mut sum: u32 = pseudo.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// A datagram from `a` to `B` carrying `via`, its UDP checksum filled
    /// in as a NIC (or the kernel) fills an offloaded one: the complement
    /// of the sum that starts from the partial sum `emit_offloaded` left.
    fn offloaded(a: &mut Outer, via: &[u8]) -> Vec<u8> {
        let (mut h, mut v) = ([0u8; OUTER_LEN], [0u8; VNET_LEN]);
        a.emit_offloaded(&mut v, &mut h, MacAddr([2, 0, 0, 0, 0, 0xee]), B, via.len(), None);
        assert_eq!(v[0], VNET_F_NEEDS_CSUM, "the checksum is asked for");
        assert_eq!((u16::from_le_bytes([v[6], v[7]]), u16::from_le_bytes([v[8], v[9]])), (34, 6), "where it goes");
        let mut d = [&h[..], via].concat();
        let sum = !fold(ones_sum(&d[34..]));
        d[40..42].copy_from_slice(&(if sum == 0 { 0xffff } else { sum }).to_be_bytes());
        d
    }

    #[test]
    fn the_udp_checksum_vouches_for_the_frame_and_a_bad_one_is_dropped() {
        let mut a = Outer::new(MacAddr([2, 0, 0, 0, 0, 1]), A, VIA_UDP_PORT);
        let b = Outer::new(MacAddr([2, 0, 0, 0, 0, 2]), B, VIA_UDP_PORT);
        // Odd and even lengths, across the eight-byte words of the sum.
        for len in [1, 2, 7, 8, 9, 63, 64, 65, 1471, 1472] {
            let via: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let good = offloaded(&mut a, &via);
            assert_eq!(udp_checksum_by_words(&good), 0, "{len} bytes: the fast sum fills what the book checks");
            let d = b.open(&good, false, false).unwrap();
            assert!(d.vouched, "{len} bytes: a checksum that adds up vouches");
            for at in [34, 40, 42, good.len() - 1] {
                let mut bad = good.clone();
                bad[at] ^= 0x10;
                assert_eq!(b.open(&bad, false, false).err(), Some(NotOurs::BadChecksum), "{len} bytes, byte {at} spoiled");
                // What the kernel vouches for is not checked again, and a
                // superframe carried whole holds a partial sum.
                assert!(b.open(&bad, true, false).unwrap().vouched);
                assert!(!b.open(&bad, false, true).unwrap().vouched);
            }
        }
        // No checksum: not vouched for (the VIA frame carries its CRC).
        let plain = datagram(&mut a, B, &[5; 100]);
        assert!(!b.open(&plain, false, false).unwrap().vouched);
    }
}
