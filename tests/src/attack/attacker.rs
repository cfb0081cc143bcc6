//! The attacker on host M: an AF_PACKET socket on M's interface that sees
//! the VIA frames of the segment (the hub floods them all) and sends
//! frames it forged with the wire format ([`via_wire`]).
//!
//! It knows what anyone on the segment can learn from frames in clear:
//! MACs, endpoints, VI ids, generations, sequence numbers, memory handles
//! and addresses. It has not the hosts' cluster secret: what it sends
//! carries the CRC-32C anyone can compute ([`wire::seal`]) or, when it was
//! given a key of its own ([`Attacker::key`], a different secret's), a tag
//! under that key: a frame of the authenticated format that fails the
//! check.

use super::segment::{Segment, Station};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use via_wire::{self as wire, flags, ConnRepr, Frame, HeaderRepr, Kind, ETHERTYPE, FRAME_HEADER_LEN};
use via_wire::tag::Key;
use via_wire::MacAddr;

/// The raw socket on M and everything it has seen.
pub struct Attacker {
    fd: OwnedFd,
    pub mac: MacAddr,
    /// The key M tags its forgeries with (not the hosts'), or none: CRC only.
    pub key: Option<Key>,
    /// Every VIA frame seen on the segment (sent by A or B), in order.
    pub seen: Vec<Vec<u8>>,
}

impl Attacker {
    /// Opens the socket on M's interface, seeing every frame that reaches
    /// M (promiscuous, though the hub sends it everything anyway).
    pub fn open(seg: &Segment) -> Attacker {
        let ifname = seg.ifname(Station::M);
        let (fd, mac) = seg.within(Station::M, || open_socket(&ifname)).unwrap_or_else(|e| panic!("opening the attacker's socket on {ifname}: {e}"));
        Attacker { fd, mac, key: None, seen: Vec::new() }
    }

    /// Takes every frame already received, without waiting.
    pub fn drain(&mut self) {
        while self.receive(Duration::ZERO).is_some() {}
    }

    /// Waits (at most `timeout`) for a frame matching `want`, keeping
    /// every frame seen meanwhile; returns the match.
    pub fn sniff(&mut self, timeout: Duration, what: &str, mut want: impl FnMut(&Frame<&[u8]>) -> bool) -> Vec<u8> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(i) = self.receive(left) else {
                if left.is_zero() {
                    panic!("the attacker saw no {what} within {timeout:?} ({} frames seen)", self.seen.len());
                }
                continue;
            };
            let bytes = &self.seen[i];
            if Frame::new_checked(&bytes[..]).is_ok_and(|f| want(&f)) {
                return bytes.clone();
            }
        }
    }

    /// Headers of the frames seen so far that match `want`.
    pub fn seen_headers(&self, mut want: impl FnMut(&HeaderRepr) -> bool) -> Vec<HeaderRepr> {
        self.seen.iter().filter_map(|b| Frame::new_checked(&b[..]).ok()).map(|f| HeaderRepr::parse(&f)).filter(|h| want(h)).collect()
    }

    /// What the attacker knows of the sequenced stream `from` -> `to`
    /// after draining what it has received: the last frame of it seen
    /// (highest PSN, sends, RDMA writes or read requests).
    pub fn last_sequenced(&mut self, from: MacAddr, to: MacAddr) -> HeaderRepr {
        self.drain();
        let frames = self.seen_headers(|h| h.src_mac == from && h.dst_mac == to && matches!(Kind::from_u8(h.kind), Some(Kind::Data | Kind::RdmaWrite | Kind::RdmaReadReq)));
        frames.into_iter().reduce(|a, b| if wire::seq_lt(a.psn, b.psn) { b } else { a }).unwrap_or_else(|| panic!("the attacker saw no sequenced frame from {from} to {to}"))
    }

    /// Sends one frame, as given (its checksum must already be right).
    pub fn send_raw(&self, bytes: &[u8]) {
        // SAFETY: sends from a valid buffer on our bound socket.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        assert_eq!(n, bytes.len() as isize, "the attacker's send: {}", io::Error::last_os_error());
    }

    /// Forges and sends the frame with header `h` and `payload`, with the
    /// CRC anyone can compute, or tagged under M's own key.
    pub fn forge(&self, h: &HeaderRepr, payload: &[u8]) {
        match &self.key {
            None => self.send_raw(&forged(h, payload)),
            Some(k) => self.send_raw(&forged_tagged(h, payload, k)),
        }
    }

    /// Forges a connection-management frame carrying `conn`.
    pub fn forge_cm(&self, h: &HeaderRepr, conn: &ConnRepr) {
        let mut body = [0u8; 256];
        let n = conn.emit(&mut body);
        self.forge(&HeaderRepr { payload_len: n as u16, ..*h }, &body[..n]);
    }

    /// Receives one frame (waiting at most `timeout`) into `seen`;
    /// returns its index. Frames M sent itself are skipped.
    fn receive(&mut self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut buf = vec![0u8; 2048];
            // SAFETY: an all-zero sockaddr_ll is valid, filled in by recvfrom.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buf and from are valid for the lengths given.
            let n = unsafe { libc::recvfrom(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT, (&mut from as *mut libc::sockaddr_ll).cast(), &mut len) };
            if n >= 0 {
                if from.sll_pkttype == libc::PACKET_OUTGOING {
                    continue; // our own forgeries
                }
                buf.truncate(n as usize);
                self.seen.push(buf);
                return Some(self.seen.len() - 1);
            }
            let e = io::Error::last_os_error();
            assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted), "the attacker's receive: {e}");
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis().clamp(1, i32::MAX as u128) as i32) };
        }
    }
}

/// The bytes of a frame with header `h` (its `payload_len` set from
/// `payload`) and the keyless checksum.
pub fn forged(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    HeaderRepr { payload_len: payload.len() as u16, ..*h }.emit(&mut head);
    wire::seal(&mut head, [payload]);
    let mut f = head.to_vec();
    f.extend_from_slice(payload);
    f
}

/// The bytes of a frame with header `h` and `payload` in the
/// authenticated format ([`flags::AUTH`], the tag after the payload),
/// tagged under `key`.
pub fn forged_tagged(h: &HeaderRepr, payload: &[u8], key: &Key) -> Vec<u8> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    HeaderRepr { payload_len: payload.len() as u16, ..*h }.emit(&mut head);
    let tag = wire::seal_authenticated(&mut head, key, [payload]);
    let mut f = head.to_vec();
    f.extend_from_slice(payload);
    f.extend_from_slice(&tag);
    f
}

/// A key of a secret nobody else has: what M tags with when it plays a
/// host of another cluster (or guesses).
pub fn stranger_key() -> Key {
    let mut s = [0u8; 32];
    via_kernel_agent::auth::fill_random(&mut s);
    via_kernel_agent::auth::ClusterSecret::from_bytes(&s).cm_key()
}

/// The next frame of a sequenced stream whose last frame was `last`:
/// same hosts, endpoints, VIs and generation, the next PSN and message
/// number, no acknowledgement; kind, flags and message fields for the
/// caller to set.
pub fn next_in_stream(last: &HeaderRepr) -> HeaderRepr {
    HeaderRepr {
        dst_mac: last.dst_mac,
        src_mac: last.src_mac,
        dst_ep: last.dst_ep,
        src_ep: last.src_ep,
        dst_vi: last.dst_vi,
        src_vi: last.src_vi,
        generation: last.generation,
        psn: last.psn.wrapping_add(1),
        msg_seq: last.msg_seq.wrapping_add(1),
        flags: last.flags & flags::RELIABLE,
        ..HeaderRepr::default()
    }
}

fn open_socket(ifname: &str) -> io::Result<(OwnedFd, MacAddr)> {
    let proto = ETHERTYPE.to_be();
    // SAFETY: plain socket creation; the fd is owned below.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as i32) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let cname = std::ffi::CString::new(ifname).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero is a valid sockaddr_ll; the fields are set below.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = ifindex as i32;
    // SAFETY: binds our socket to a valid sockaddr_ll of its size.
    if unsafe { libc::bind(raw, (&sa as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mreq = libc::packet_mreq { mr_ifindex: ifindex as i32, mr_type: libc::PACKET_MR_PROMISC as u16, mr_alen: 0, mr_address: [0; 8] };
    // SAFETY: a valid packet_mreq of its size.
    if unsafe { libc::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, (&mreq as *const libc::packet_mreq).cast(), std::mem::size_of::<libc::packet_mreq>() as u32) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fd, hardware_address(raw, &cname)?))
}

/// The MAC address of interface `name`, asked through socket `fd` (sysfs
/// shows the namespace it was mounted in, not this thread's).
fn hardware_address(fd: i32, name: &std::ffi::CStr) -> io::Result<MacAddr> {
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.to_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR fills the ifreq we pass.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR set the hwaddr member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data) {
        *d = s as u8;
    }
    Ok(MacAddr(mac))
}
