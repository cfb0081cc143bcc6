//! [`PacketDevice`]: a frame device over an AF_PACKET socket bound to one
//! Linux interface. It owns the socket, its PACKET_MMAP receive ring
//! (TPACKET_V2, frames handed out in place), the `sendmmsg` transmit path
//! (one system call per batch, gathered straight from the caller's buffers)
//! and the per-endpoint classic BPF receive filter (`bpf`). Frames are raw
//! VIA frames (EtherType 0x88B5) on one Ethernet segment, or with
//! [`PacketOptions::udp_port`] VIA in UDP/IPv4 datagrams that cross routers
//! (`crate::udp`).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use via_device::MAX_GATHER;
use via_device::{DST_EP_OFFSET, ETHERTYPE, ETH_HEADER_LEN};
use via_device::{Ahead, Capabilities, FrameDevice, MacAddr, Path, RxFilter, RxMeta, RxWatch, RxWatches, TxFrame};
use crate::bpf;
use crate::udp::{vnet_unit, Hop, NextHops, NotOurs, Outer, ENCAP_LEN, MAX_PAYLOAD, OUTER_LEN, VNET_LEN};
use std::net::Ipv4Addr;

/// Frames handed to the kernel per `sendmmsg` call.
pub const TX_BATCH: usize = 64;

const TPACKET_V2: c_int = 1;
const PACKET_QDISC_BYPASS: c_int = 20;
const PACKET_IGNORE_OUTGOING: c_int = 23;
const PACKET_OUTGOING: u8 = 4;
/// The protocol number that binds a packet socket to every EtherType.
const ETH_P_ALL: u16 = 0x0003;
const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;
/// Bytes the kernel reserves in front of an Ethernet frame in a TPACKET_V2
/// slot: TPACKET_ALIGN(TPACKET2_HDRLEN + 16), i.e. the network header offset.
const SLOT_NET_OFFSET: usize = align16(align16(size_of::<libc::tpacket2_hdr>()) + size_of::<libc::sockaddr_ll>() + 16);
/// Extra room per slot beyond MTU (a VLAN tag and then some).
const SLOT_SLACK: usize = 32;
/// The receive ring's size: 8 MiB of slots, from 64 slots (of up to 128
/// KiB: the superframes of VIA in UDP, a 64 KiB-MTU link) to 4,096 (of 2
/// KiB: MTU 1500, as many frames as a 6 MiB burst). The receiver's
/// first look at a slot costs a page walk when the ring's pages are more
/// than the TLB holds: 256 slots of 128 KiB took a 64 KiB via-udp
/// message 22.5 us one way, 64 slots 17.6 us (DESIGN-NOTES, "The ring's
/// pages").
const RING_BYTES: usize = 8 << 20;
const RING_MIN_FRAMES: usize = 64;
const RING_MAX_FRAMES: usize = 4096;
/// The most slots an explicit count may ask for.
const RING_LIMIT_FRAMES: usize = 1 << 16;
/// Largest MTU the ring is sized for (the loopback interface has 65536).
const MAX_MTU: usize = 65536;
const SEND_BUFFER: c_int = 4 << 20;

const fn align16(x: usize) -> usize {
    (x + 15) & !15
}

/// The shape of the receive ring: power-of-two frame slots packed into
/// page-multiple blocks, as `PACKET_RX_RING` requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingGeometry {
    pub frame_size: usize,
    pub frame_nr: usize,
    pub block_size: usize,
    pub block_nr: usize,
}

impl RingGeometry {
    pub(crate) fn for_mtu(mtu: usize, page_size: usize, frames: Option<usize>) -> RingGeometry {
        let frame_size = (SLOT_NET_OFFSET + mtu + SLOT_SLACK).next_power_of_two();
        let block_size = frame_size.max(page_size.next_power_of_two());
        let per_block = block_size / frame_size;
        let wanted = frames.unwrap_or_else(|| (RING_BYTES / frame_size).clamp(RING_MIN_FRAMES, RING_MAX_FRAMES)).clamp(1, RING_LIMIT_FRAMES);
        let block_nr = wanted.div_ceil(per_block);
        RingGeometry { frame_size, frame_nr: block_nr * per_block, block_size, block_nr }
    }

    fn bytes(&self) -> usize {
        self.block_size * self.block_nr
    }
}

/// Choices made when opening a [`PacketDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketOptions {
    /// Hand frames straight to the driver (PACKET_QDISC_BYPASS), skipping
    /// the interface's queueing discipline: lower latency, but also no
    /// `tc` shaping or netem loss for our frames. On by default;
    /// `VIA_QDISC_BYPASS=0` turns it off.
    pub qdisc_bypass: bool,
    /// Carry frames in UDP/IPv4 datagrams to and from this port
    /// (`crate::udp`; device `udp:<ifname>`) instead of raw Ethernet
    /// frames. The interface needs an IPv4 address, and hosts are named
    /// by their IPv4 identities. Off by default.
    pub udp_port: Option<u16>,
    /// UDP mode: send runs of full-size frames to one host as superframes
    /// of up to 64 KiB that the kernel or the NIC cuts into datagrams
    /// (UDP segmentation offload, `PACKET_VNET_HDR`), and take superframes
    /// that arrive whole (veth) apart again. Both ends need it (a peer
    /// without it cannot take superframes whole). On by default;
    /// `udp:<ifname>,gso=off` turns it off.
    pub udp_gso: bool,
    /// Before a wait spins on the receive ring, prefetch the first
    /// [`RX_PREFETCH_BYTES`] of the next [`RX_PREFETCH_SLOTS`] slots, where
    /// the kernel writes the next frames ([`PacketDevice::rx_watch`]). On
    /// by default; `VIA_RX_PREFETCH=0` turns it off.
    pub rx_prefetch: bool,
    /// Slots in the receive ring, rounded up to whole blocks; None picks
    /// them from the ring's byte budget ([`RingGeometry::for_mtu`]).
    /// `VIA_RX_RING_FRAMES=N` sets them.
    pub rx_ring_frames: Option<usize>,
}

impl Default for PacketOptions {
    fn default() -> Self {
        PacketOptions { qdisc_bypass: true, udp_port: None, udp_gso: true, rx_prefetch: true, rx_ring_frames: None }
    }
}

impl PacketOptions {
    /// The defaults, adjusted by `VIA_QDISC_BYPASS` and `VIA_RX_PREFETCH`
    /// (`0` turns either off) and `VIA_RX_RING_FRAMES` (a slot count;
    /// anything else is ignored).
    pub fn from_env() -> Self {
        let off = |var: &str| matches!(std::env::var(var).as_deref().map(str::trim), Ok("0"));
        let frames = std::env::var("VIA_RX_RING_FRAMES").ok().and_then(|v| v.trim().parse().ok()).filter(|&n: &usize| n > 0);
        PacketOptions { qdisc_bypass: !off("VIA_QDISC_BYPASS"), rx_prefetch: !off("VIA_RX_PREFETCH"), rx_ring_frames: frames, ..PacketOptions::default() }
    }
}

/// Slots whose first bytes a spinning wait prefetches (the next, and the
/// one after it: a message may come behind an ACK).
const RX_PREFETCH_SLOTS: usize = 2;
/// Bytes of each: the slot's header line and the three lines after it,
/// where a frame of up to 142 bytes lies (a 64-byte VIA message; the
/// frame starts 66 bytes in). On veth here (2026-12-07, same binary,
/// the prefetch switched by `VIA_RX_PREFETCH`, five alternating rounds):
/// a 64-byte VIA ping-pong took 1.38-1.41 us one way with it against
/// 1.42-1.46 without. Prefetching three lines, whose last ends before
/// such a frame does, gained nothing (1.43-1.45); eight lines lost a
/// little of it (1.42-1.44); 0- and 1024-byte messages did not move.
const RX_PREFETCH_BYTES: usize = 256;

/// Counters kept by the device (see [`FrameDevice::stats`]).
#[derive(Default, Debug)]
struct Stats {
    rx_frames: u64,
    tx_frames: u64,
    rx_filtered_in_software: u64,
    rx_outgoing_skipped: u64,
    rx_truncated: u64,
    rx_bad_slot: u64,
    tx_oversize: u64,
    /// UDP mode: frames that were not VIA datagrams for our port, or were
    /// malformed; resolution probes received; frames dropped for want of a
    /// route through our interface, or to a destination that is not an
    /// IPv4 identity.
    rx_not_ours: u64,
    rx_malformed: u64,
    rx_probes: u64,
    /// UDP datagrams whose checksum did not add up.
    rx_bad_udp_checksum: u64,
    tx_unreachable: u64,
    /// UDP mode with segmentation offload: superframes sent, and received
    /// whole.
    tx_superframes: u64,
    rx_superframes: u64,
    /// The kernel's PACKET_STATISTICS, which reset on every read.
    kernel_packets: Cell<u64>,
    kernel_drops: Cell<u64>,
}

/// An Ethernet interface reached through AF_PACKET.
pub struct PacketDevice {
    ring: Ring,
    tx: TxScratch,
    fd: OwnedFd,
    ifname: String,
    ifindex: c_int,
    mac: MacAddr,
    mtu: usize,
    /// The EtherType the socket is bound to (what the kernel hands us).
    bound_ethertype: u16,
    filter: Option<RxFilter>,
    /// Whether PACKET_QDISC_BYPASS is in effect.
    qdisc_bypass: bool,
    /// [`PacketOptions::rx_prefetch`].
    rx_prefetch: bool,
    /// UDP mode's state; None for raw frames.
    udp: Option<UdpMode>,
    /// Raw frames on an interface whose frames never leave memory (a veth
    /// pair, loopback): nothing on their way can corrupt them, so the
    /// device vouches for them and the engine seals them with no CRC
    /// ([`memory_only`]).
    vouched: bool,
    stats: Stats,
}

/// What UDP mode adds to the device.
struct UdpMode {
    outer: Outer,
    hops: NextHops,
    /// The batch being sent as datagrams: each one's virtio-net header
    /// (with segmentation offload) and outer headers, and how many frames
    /// it carries.
    plan: TxPlan,
}

/// How a batch of frames goes out: as messages of one or more frames
/// each, with the headers that go in front of each message.
#[derive(Default)]
struct TxPlan {
    vnets: Vec<[u8; VNET_LEN]>,
    heads: Vec<[u8; OUTER_LEN]>,
    /// Frames per message.
    frames: Vec<usize>,
    /// Segmentation offload is on: messages start with their virtio-net
    /// header, and runs of fragments go as superframes.
    vnet: bool,
}

impl fmt::Debug for PacketDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacketDevice")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mac", &self.mac)
            .field("mtu", &self.mtu)
            .field("ring", &self.ring.geometry)
            .field("filter", &self.filter)
            .field("qdisc_bypass", &self.qdisc_bypass)
            .field("udp", &self.udp.as_ref().map(|u| &u.outer))
            .field("vouched", &self.vouched)
            .finish_non_exhaustive()
    }
}

impl PacketDevice {
    /// Opens `ifname` (in the calling thread's network namespace): an
    /// AF_PACKET socket bound to it for EtherType 0x88B5, with its receive
    /// ring mapped. Options come from [`PacketOptions::from_env`].
    pub fn open(ifname: &str) -> io::Result<PacketDevice> {
        Self::open_with(ifname, PacketOptions::from_env())
    }

    /// Opens `ifname` for VIA in UDP/IPv4 datagrams on `port`
    /// (`crate::udp`): [`PacketDevice::open`] with [`PacketOptions::udp_port`].
    pub fn open_udp(ifname: &str, port: u16, gso: bool) -> io::Result<PacketDevice> {
        Self::open_with(ifname, PacketOptions { udp_port: Some(port), udp_gso: gso, ..PacketOptions::from_env() })
    }

    /// [`PacketDevice::open`] with explicit options.
    pub fn open_with(ifname: &str, options: PacketOptions) -> io::Result<PacketDevice> {
        let no_such = || io::Error::new(io::ErrorKind::NotFound, format!("no such interface: {ifname}"));
        if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains(['/', '\0']) || ifname.chars().any(char::is_whitespace) {
            return Err(no_such());
        }
        let fd = sys::packet_socket().map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => io::Error::new(e.kind(), format!("AF_PACKET needs CAP_NET_RAW (run as root): {e}")),
            _ => context("creating an AF_PACKET socket", e),
        })?;
        let raw = fd.as_raw_fd();
        let nodev = |what: &'static str| {
            move |e: io::Error| if e.raw_os_error() == Some(libc::ENODEV) { no_such() } else { context(what, e) }
        };
        let ifindex = sys::if_index(raw, ifname).map_err(nodev("reading the interface index"))?;
        let mtu = sys::if_mtu(raw, ifname).map_err(nodev("reading the interface MTU"))?;
        let (hwtype, mac) = sys::if_hwaddr(raw, ifname).map_err(nodev("reading the interface address"))?;
        if hwtype != ARPHRD_ETHER && hwtype != ARPHRD_LOOPBACK {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface {ifname} is not Ethernet (ARPHRD type {hwtype})")));
        }
        if mtu > MAX_MTU {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface {ifname} has MTU {mtu}, more than the {MAX_MTU} supported")));
        }
        // An interface without a driver to name (the ioctl refused) is
        // taken for one whose frames may cross a wire.
        let vouched = options.udp_port.is_none() && memory_only(hwtype, sys::if_driver(raw, ifname).ok().as_deref());
        let udp = match options.udp_port {
            None => None,
            Some(port) => {
                let ip = sys::if_ipv4(raw, ifname).map_err(|e| match e.raw_os_error() {
                    Some(libc::EADDRNOTAVAIL) => io::Error::new(io::ErrorKind::AddrNotAvailable, format!("interface {ifname} has no IPv4 address, which VIA over UDP needs")),
                    _ => nodev("reading the interface's IPv4 address")(e),
                })?;
                if mtu <= ENCAP_LEN {
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface {ifname} has MTU {mtu}: no room for a VIA frame in a UDP datagram")));
                }
                let plan = TxPlan { vnets: vec![[0; VNET_LEN]; TX_BATCH], heads: vec![[0; OUTER_LEN]; TX_BATCH], frames: Vec::with_capacity(TX_BATCH), vnet: options.udp_gso };
                Some(UdpMode { outer: Outer::new(mac, ip, port), hops: NextHops::open(ifname, port)?, plan })
            }
        };

        // The ring goes in before the bind: until the bind the socket
        // (protocol 0) receives nothing, so no frame lands in the ordinary
        // receive queue where the ring would never see it.
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2).map_err(|e| context("selecting TPACKET_V2", e))?;
        // Superframes arrive whole on some links (veth): slots for the
        // largest datagram, and each frame's virtio-net header in front of
        // it (set before the ring, as the kernel requires).
        let vnet = udp.as_ref().is_some_and(|u| u.plan.vnet);
        if vnet {
            sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VNET_HDR, &(1 as c_int)).map_err(|e| context("asking for virtio-net headers (PACKET_VNET_HDR)", e))?;
        }
        let geometry = RingGeometry::for_mtu(if vnet { MAX_MTU } else { mtu }, sys::page_size(), options.rx_ring_frames);
        let req = libc::tpacket_req {
            tp_block_size: geometry.block_size as u32,
            tp_block_nr: geometry.block_nr as u32,
            tp_frame_size: geometry.frame_size as u32,
            tp_frame_nr: geometry.frame_nr as u32,
        };
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req).map_err(|e| context(&format!("setting up the receive ring {geometry:?}"), e))?;
        let ring = Ring::map(raw, geometry, vnet)?;

        // Our own transmissions must not come back to us. Kernels before 4.20
        // lack the option; receive then skips PACKET_OUTGOING slots itself.
        let _ = sys::setsockopt(raw, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &(1 as c_int));
        // Best effort: straight to the driver, and room for big batches.
        let qdisc_bypass = options.qdisc_bypass && sys::setsockopt(raw, libc::SOL_PACKET, PACKET_QDISC_BYPASS, &(1 as c_int)).is_ok();
        let _ = sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, &SEND_BUFFER);
        // UDP mode lets the kernel keep only our datagrams from the start
        // (the filter checks the EtherType itself). It binds to every
        // EtherType, not to IPv4: bound to IPv4 on one interface, the
        // socket is on that interface's list of IPv4 handlers, which the
        // kernel walks after the global one where its IP layer (`ip_rcv`)
        // is, so each datagram went through prerouting and the port rule
        // first (over veth, inside the sender's system call); a tap of
        // every type is served before any handler (DESIGN-NOTES, "Who
        // sees a datagram first").
        let bound_ethertype = match &udp {
            None => ETHERTYPE,
            Some(u) => {
                sys::attach_filter(raw, &bpf::udp_program(u.outer.port(), None)?).map_err(|e| context("attaching the UDP receive filter", e))?;
                ETH_P_ALL
            }
        };
        sys::bind(raw, ifindex, bound_ethertype).map_err(nodev("binding to the interface"))?;

        Ok(PacketDevice {
            ring,
            tx: TxScratch::new(),
            fd,
            ifname: ifname.to_string(),
            ifindex,
            rx_prefetch: options.rx_prefetch,
            mac,
            mtu,
            bound_ethertype,
            filter: None,
            qdisc_bypass,
            udp,
            vouched,
            stats: Stats::default(),
        })
    }

    /// The interface name this device was opened on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The kernel's index of the interface.
    pub fn ifindex(&self) -> i32 {
        self.ifindex
    }

    /// Whether frames skip the interface's queueing discipline.
    pub fn qdisc_bypass(&self) -> bool {
        self.qdisc_bypass
    }

    /// Frame slots in the receive ring.
    pub fn ring_frames(&self) -> usize {
        self.ring.geometry.frame_nr
    }

    fn poll_kernel_stats(&self) {
        if let Ok(s) = sys::packet_statistics(self.fd.as_raw_fd()) {
            let st = &self.stats;
            st.kernel_packets.set(st.kernel_packets.get() + u64::from(s.tp_packets));
            st.kernel_drops.set(st.kernel_drops.get() + u64::from(s.tp_drops));
        }
    }
}

impl FrameDevice for PacketDevice {
    fn mac(&self) -> MacAddr {
        match &self.udp {
            Some(u) => u.outer.identity(),
            None => self.mac,
        }
    }

    fn mtu(&self) -> usize {
        match self.udp {
            Some(_) => self.mtu - ENCAP_LEN,
            None => self.mtu,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: self.vouched, needs_pinning: false, reorders: false, serves_peers: false }
    }

    /// Datagrams with the UDP checksum offloaded need no CRC of their own
    /// (the receiving device vouches for them); raw frames do.
    fn path_to(&mut self, _head: &[u8]) -> Path {
        Path { mtu: FrameDevice::mtu(self), checksummed: self.vouched || self.udp.as_ref().is_some_and(|u| u.plan.vnet), both_ends: false, lends_from: None }
    }

    fn wait_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        let program = match &self.udp {
            Some(_) if filter.ethertype != ETHERTYPE => {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} carries VIA frames in UDP; a filter for EtherType {:#06x} cannot apply", self.ifname, filter.ethertype)));
            }
            Some(u) => bpf::udp_program(u.outer.port(), Some(&filter))?,
            None => bpf::ethernet_program(&filter)?,
        };
        sys::attach_filter(self.fd.as_raw_fd(), &program).map_err(|e| context("attaching the receive filter", e))?;
        if self.udp.is_none() && filter.ethertype != self.bound_ethertype {
            sys::bind(self.fd.as_raw_fd(), self.ifindex, filter.ethertype).map_err(|e| context("rebinding to the filter's EtherType", e))?;
            self.bound_ethertype = filter.ethertype;
        }
        // Frames already in the ring went past no filter (or the old one):
        // receive checks every frame against this one as well.
        self.filter = Some(filter);
        Ok(())
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.receive_lent(budget, &mut |f, _| sink(f))
    }

    /// Raw frames come vouched for only on an interface whose frames never
    /// leave memory (no FCS is seen here: [`memory_only`]); a UDP
    /// datagram's frames are vouched for by its checksum (see `udp`).
    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        let (ring, st) = (&mut self.ring, &mut self.stats);
        let mut delivered = 0;
        // Skipped slots do not count against the budget, but one lap is the
        // most a call ever walks.
        let mut walked = 0;
        while delivered < budget && walked < ring.geometry.frame_nr {
            let i = ring.next;
            if ring.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            walked += 1;
            via_device::probe::seen();
            if via_device::probe::ENABLED {
                via_device::probe::stamped(ring.stamp_ns(i));
            }
            match ring.frame(i) {
                Slot::Frame(frame, _, _) if self.udp.is_none() => {
                    if self.filter.is_some_and(|f| !f.matches(frame)) {
                        st.rx_filtered_in_software += 1;
                    } else {
                        sink(frame, RxMeta { vouched: self.vouched, ..RxMeta::default() });
                        via_device::probe::mark(via_device::probe::Stage::Delivered);
                        delivered += 1;
                    }
                }
                Slot::Frame(frame, unit, checked) => match self.udp.as_ref().unwrap().outer.open(frame, checked, unit.is_some()) {
                    // A datagram's payload is one raw frame, or a
                    // superframe's units of `unit` bytes, each handed on
                    // with its Ethernet header written in front of it.
                    Ok(d) => {
                        st.rx_superframes += u64::from(unit.is_some_and(|u| u < d.payload.len()));
                        let step = unit.unwrap_or(d.payload.len()).max(1);
                        for at in d.payload.clone().step_by(step) {
                            let next = (at + step).min(d.payload.end);
                            prefetch(&frame[next..(at + 2 * step).min(d.payload.end)]);
                            let (this, rest) = frame.split_at_mut(next);
                            let raw = d.unit(this, at..next);
                            if self.filter.is_some_and(|f| !f.matches(raw)) {
                                st.rx_filtered_in_software += 1;
                            } else {
                                let ahead = Ahead { bytes: &rest[..d.payload.end - next], stride: step };
                                sink(raw, RxMeta { vouched: d.vouched, ahead, ..RxMeta::default() });
                                delivered += 1;
                            }
                        }
                    }
                    Err(why) => {
                        *match why {
                            NotOurs::Other => &mut st.rx_not_ours,
                            NotOurs::Malformed => &mut st.rx_malformed,
                            NotOurs::Probe => &mut st.rx_probes,
                            NotOurs::BadChecksum => &mut st.rx_bad_udp_checksum,
                        } += 1
                    }
                },
                Slot::Outgoing => st.rx_outgoing_skipped += 1,
                Slot::Truncated => st.rx_truncated += 1,
                Slot::Bad => st.rx_bad_slot += 1,
            }
            ring.status(i).store(libc::TP_STATUS_KERNEL, Ordering::Release);
            // (A compare, not `%`: a division per frame on the receive path.)
            ring.next = if i + 1 == ring.geometry.frame_nr { 0 } else { i + 1 };
        }
        st.rx_frames += delivered as u64;
        Ok(delivered)
    }

    /// The status word of the ring slot the kernel fills next.
    /// Before a wait spins there, the first lines of the next slots are
    /// prefetched ([`PacketOptions::rx_prefetch`]).
    fn rx_watch(&self, w: &mut RxWatches) {
        if self.rx_prefetch {
            self.ring.prefetch_next();
        }
        let status = self.ring.status(self.ring.next);
        if status.load(Ordering::Acquire) & libc::TP_STATUS_USER != 0 {
            w.ready();
        }
        // SAFETY: the slot lies in the ring's mapping, which lives as long
        // as the device (it is unmapped when the ring is dropped).
        w.push(unsafe { RxWatch::u32(status, libc::TP_STATUS_USER, 0) });
    }

    /// The ring's next slot is the user's.
    fn rx_pending(&self) -> Option<bool> {
        Some(self.ring.status(self.ring.next).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0)
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let mtu = FrameDevice::mtu(self);
        let max = ETH_HEADER_LEN + mtu;
        for (i, f) in frames.iter().enumerate() {
            let len = f.len();
            if len > max || len < ETH_HEADER_LEN {
                self.stats.tx_oversize += u64::from(len > max);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("frame {i} of the batch is {len} bytes; {} takes {ETH_HEADER_LEN}..={max} (MTU {mtu} + {ETH_HEADER_LEN})", self.ifname),
                ));
            }
        }
        let mut sent = 0;
        while sent < frames.len() {
            let chunk = &frames[sent..frames.len().min(sent + TX_BATCH)];
            // UDP mode addresses the chunk first: it may stop at a frame
            // whose next hop is not resolved yet, or that goes nowhere.
            let (ready, stop) = match &mut self.udp {
                None => (chunk.len(), Stop::No),
                Some(u) => u.address(chunk),
            };
            if ready > 0 {
                let plan = self.udp.as_ref().map(|u| &u.plan);
                match self.tx.send(self.fd.as_raw_fd(), &chunk[..ready], plan) {
                    Ok(n) => {
                        if let Some(u) = &self.udp {
                            self.stats.tx_superframes += u.plan.superframes_in(n) as u64;
                        }
                        sent += n;
                        if n < ready {
                            break;
                        }
                    }
                    // A full transmit path, or an error after part of the batch
                    // went out (the next call reports it): the caller retries.
                    Err(e) if is_backpressure(&e) || sent > 0 => break,
                    Err(e) => return Err(context(&format!("sendmmsg on {}", self.ifname), e)),
                }
            }
            match stop {
                Stop::No => {}
                // Its next hop is being resolved: the caller sends it again.
                Stop::Pending => break,
                // Dropped, as a frame to a host that is not there: a
                // reliable VI's retransmissions give up on it in time.
                Stop::Unreachable(dst) => {
                    if self.stats.tx_unreachable == 0 {
                        eprintln!("via udp:{}: no route to {dst} through {}; frames to it are dropped (counted in tx_unreachable)", self.ifname, self.ifname);
                    }
                    self.stats.tx_unreachable += 1;
                    sent += 1;
                }
            }
        }
        self.stats.tx_frames += sent as u64;
        Ok(sent)
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        self.poll_kernel_stats();
        let s = &self.stats;
        let mut v = vec![
            ("rx_frames", s.rx_frames),
            ("tx_frames", s.tx_frames),
            ("rx_filtered_in_software", s.rx_filtered_in_software),
            ("rx_outgoing_skipped", s.rx_outgoing_skipped),
            ("rx_truncated", s.rx_truncated),
            ("rx_bad_slot", s.rx_bad_slot),
            ("tx_oversize", s.tx_oversize),
            ("rx_not_ours", s.rx_not_ours),
            ("rx_malformed", s.rx_malformed),
            ("rx_probes", s.rx_probes),
            ("rx_bad_udp_checksum", s.rx_bad_udp_checksum),
            ("tx_unreachable", s.tx_unreachable),
            ("tx_superframes", s.tx_superframes),
            ("rx_superframes", s.rx_superframes),
            ("kernel_rx_packets", s.kernel_packets.get()),
            ("kernel_rx_drops", s.kernel_drops.get()),
        ];
        if let Some(u) = &self.udp {
            // Probes sent to resolve next hops, and whether our socket
            // holds the UDP port (else another program's answers for it).
            // And the datagrams the kernel's IP stack processed too (0
            // under the port rule: `via-agent udp-port`).
            v.extend([("tx_probes", u.hops.probes), ("udp_port_held", u64::from(u.hops.holds_port)), ("kernel_udp_drops", u.hops.kernel_udp_drops())]);
        }
        v
    }
}

/// Whether an interface's frames never leave this host's memory, so that
/// nothing on their way can corrupt them: the loopback interface, and a
/// veth pair (driver `veth`: the kernel hands each frame to the peer
/// interface as it is). Not a NIC, whose FCS check a driver may turn off
/// (`rx-all`) and which AF_PACKET does not show us; not a tap, whose
/// frames come from a program that may have taken them from anywhere;
/// not a bridge or VLAN, whose frames may come from either.
fn memory_only(hwtype: u16, driver: Option<&str>) -> bool {
    hwtype == ARPHRD_LOOPBACK || driver == Some("veth")
}

/// Asks for the cache lines of `bytes`: a superframe's next unit, while
/// the engine handles this one. The kernel wrote the ring slot on the
/// sending core; the engine's first look at each unit's header, then its
/// copy of the payload, waited for those lines one after another (64 KiB
/// one-way over veth at MTU 1500, six alternating runs: 19.9-20.5 us
/// without, 17.5-18.3 us with).
#[inline]
fn prefetch(bytes: &[u8]) {
    prefetch_lines(bytes.as_ptr(), bytes.len());
}

/// Prefetches the lines of the `len` bytes at `at`, which need not be
/// ours to read now: nothing is dereferenced (the receive ring's slots
/// the kernel has yet to fill, [`Ring::prefetch_next`]).
#[inline]
fn prefetch_lines(at: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: a prefetch is a hint: it reads nothing into the program
        // and cannot fault, whatever the address.
        unsafe { core::arch::x86_64::_mm_prefetch(at.wrapping_add(off).cast::<i8>(), core::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}

/// Where addressing a chunk of frames stopped.
enum Stop {
    /// It did not: every frame has its outer headers.
    No,
    /// At a frame whose next hop is being resolved.
    Pending,
    /// At a frame that goes nowhere (no route, or not an IPv4 identity).
    Unreachable(MacAddr),
}

impl UdpMode {
    /// Plans `chunk` as datagrams (`self.plan`), in order, up to the first
    /// frame that cannot go now: how many frames are planned, and why it
    /// stopped. With `gso`, a run of frames to one endpoint of one host,
    /// all of the first's length but the last (a message's fragments), goes
    /// as one superframe of up to [`MAX_PAYLOAD`] bytes. (To one endpoint:
    /// the receiver's kernel filter looks at the first unit's endpoint
    /// only.)
    fn address(&mut self, chunk: &[TxFrame<'_>]) -> (usize, Stop) {
        let p = &mut self.plan;
        p.frames.clear();
        let mut i = 0;
        while i < chunk.len() {
            let f = &chunk[i];
            let dst = MacAddr(f.header[..6].try_into().unwrap());
            let ip = match dst.ipv4() {
                _ if dst.is_broadcast() => Ipv4Addr::BROADCAST,
                Some(ip) => ip,
                None => return (i, Stop::Unreachable(dst)),
            };
            let next_hop = match self.hops.lookup(ip) {
                Hop::Ready(mac) => mac,
                Hop::Pending => return (i, Stop::Pending),
                Hop::Unreachable => return (i, Stop::Unreachable(dst)),
            };
            let unit = f.len() - ETH_HEADER_LEN;
            let (mut j, mut payload) = (i + 1, unit);
            while p.vnet && j < chunk.len() {
                let g = &chunk[j];
                if !same_endpoint(g, f) || g.len() > f.len() || chunk[j - 1].len() != f.len() || payload + g.len() - ETH_HEADER_LEN > MAX_PAYLOAD {
                    break;
                }
                payload += g.len() - ETH_HEADER_LEN;
                j += 1;
            }
            let m = p.frames.len();
            if p.vnet {
                // The UDP checksum offloaded; a run as one superframe.
                self.outer.emit_offloaded(&mut p.vnets[m], &mut p.heads[m], next_hop, ip, payload, (j - i > 1).then_some(unit));
            } else {
                self.outer.emit(&mut p.heads[m], next_hop, ip, unit);
            }
            p.frames.push(j - i);
            i = j;
        }
        (chunk.len(), Stop::No)
    }
}

impl TxPlan {
    /// Superframes among the messages that carry the plan's first
    /// `frames` frames.
    fn superframes_in(&self, frames: usize) -> usize {
        let mut left = frames;
        self.frames.iter().take_while(|&&c| {
            let whole = c <= left;
            left = left.saturating_sub(c);
            whole
        }).filter(|&&c| c > 1).count()
    }
}

/// Do two frames go to the same endpoint of the same host (destination
/// address and endpoint word)?
fn same_endpoint(a: &TxFrame<'_>, b: &TxFrame<'_>) -> bool {
    const KEY: [std::ops::Range<usize>; 2] = [0..6, DST_EP_OFFSET..DST_EP_OFFSET + 4];
    KEY.into_iter().all(|r| matches!((a.header.get(r.clone()), b.header.get(r)), (Some(x), Some(y)) if x == y))
}

fn is_backpressure(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS)) || e.kind() == io::ErrorKind::WouldBlock
}

fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// What one ring slot holds, once checked.
enum Slot<'a> {
    /// Ours to read, and to rewrite in place (UDP mode does), until the
    /// slot goes back to the kernel; with the unit size of a superframe
    /// that arrived whole (from its virtio-net header), and whether the
    /// kernel vouches for its transport checksum (checked it, or made the
    /// frame on this host).
    Frame(&'a mut [u8], Option<usize>, bool),
    /// One of our own transmissions (kernels without PACKET_IGNORE_OUTGOING).
    Outgoing,
    /// Larger than the slot; the kernel kept only a prefix.
    Truncated,
    /// Offsets that do not fit the slot.
    Bad,
}

/// The mapped PACKET_RX_RING and our position in it.
struct Ring {
    base: NonNull<u8>,
    geometry: RingGeometry,
    /// The next slot the kernel will fill, in order.
    next: usize,
    /// Frames are preceded by a virtio-net header (PACKET_VNET_HDR).
    vnet: bool,
}

// SAFETY: the ring is a private shared mapping of our own socket; nothing
// about it is tied to the thread that created it, and `&mut` access to the
// device serialises its use.
unsafe impl Send for Ring {}

impl Ring {
    fn map(fd: RawFd, geometry: RingGeometry, vnet: bool) -> io::Result<Ring> {
        let base = sys::mmap_ring(fd, geometry.bytes()).map_err(|e| context("mapping the receive ring", e))?;
        Ok(Ring { base, geometry, next: 0, vnet })
    }

    fn slot(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.geometry.frame_nr);
        // Stays inside the mapping: i < frame_nr, and frame_nr slots of
        // frame_size bytes is what was mapped.
        self.base.as_ptr().wrapping_add(i * self.geometry.frame_size)
    }

    /// Prefetches the first [`RX_PREFETCH_BYTES`] of the next
    /// [`RX_PREFETCH_SLOTS`] slots.
    fn prefetch_next(&self) {
        let mut i = self.next;
        for _ in 0..RX_PREFETCH_SLOTS {
            // (The kernel may be writing there: no reference is made.)
            prefetch_lines(self.slot(i), RX_PREFETCH_BYTES);
            i = if i + 1 == self.geometry.frame_nr { 0 } else { i + 1 };
        }
    }

    /// The status word of slot `i`, shared with the kernel.
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: a slot starts at a multiple of frame_size (≥ 16) from a
        // page-aligned base, so it is aligned for u32; tp_status is the first
        // field of tpacket2_hdr; the mapping lives as long as `self`.
        unsafe { AtomicU32::from_ptr(self.slot(i).cast()) }
    }

    /// When the kernel put slot `i`'s frame there (its software time
    /// stamp, CLOCK_REALTIME), in nanoseconds: for the turnaround probe.
    fn stamp_ns(&self, i: usize) -> u64 {
        // SAFETY: as in `frame`: a released slot's tpacket2_hdr.
        let hdr = unsafe { self.slot(i).cast::<libc::tpacket2_hdr>().read() };
        u64::from(hdr.tp_sec) * 1_000_000_000 + u64::from(hdr.tp_nsec)
    }

    /// The frame in slot `i`; only for a slot whose status we read as
    /// TP_STATUS_USER (with Acquire), so the kernel has finished with it.
    fn frame(&mut self, i: usize) -> Slot<'_> {
        let slot = self.slot(i);
        // SAFETY: the slot holds a tpacket2_hdr followed by a sockaddr_ll
        // (both well inside frame_size ≥ 128); the kernel wrote them before
        // releasing the slot to us, and any bit pattern is a valid value.
        let (hdr, pkttype) = unsafe {
            let hdr = slot.cast::<libc::tpacket2_hdr>().read();
            let sll = slot.add(align16(size_of::<libc::tpacket2_hdr>())).cast::<libc::sockaddr_ll>().read_unaligned();
            (hdr, sll.sll_pkttype)
        };
        let (mac, len, snap) = (usize::from(hdr.tp_mac), hdr.tp_len as usize, hdr.tp_snaplen as usize);
        if pkttype == PACKET_OUTGOING {
            return Slot::Outgoing;
        }
        if mac < size_of::<libc::tpacket2_hdr>() || snap > self.geometry.frame_size || mac > self.geometry.frame_size - snap {
            return Slot::Bad;
        }
        if snap < len {
            return Slot::Truncated;
        }
        let unit = if self.vnet {
            if mac < size_of::<libc::tpacket2_hdr>() + VNET_LEN {
                return Slot::Bad;
            }
            let mut v = [0u8; VNET_LEN];
            // SAFETY: the kernel wrote the virtio-net header just before the
            // frame, inside this slot (mac was checked to leave room for it).
            unsafe { std::ptr::copy_nonoverlapping(slot.add(mac - VNET_LEN), v.as_mut_ptr(), VNET_LEN) };
            vnet_unit(&v)
        } else {
            None
        };
        // SAFETY: mac + snap ≤ frame_size was checked, so the bytes lie in
        // this slot, which the kernel does not touch until we hand it back
        // (after the returned borrow of `self` ends, which is exclusive:
        // no other view of the slot exists meanwhile).
        let checked = hdr.tp_status & (libc::TP_STATUS_CSUM_VALID | libc::TP_STATUS_CSUMNOTREADY) != 0;
        Slot::Frame(unsafe { std::slice::from_raw_parts_mut(slot.add(mac), snap) }, unit, checked)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        sys::munmap_ring(self.base, self.geometry.bytes());
    }
}

/// Preallocated `sendmmsg` arguments: one message per frame of a batch,
/// each gathering the header and the payload pieces.
struct TxScratch {
    msgs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    /// A superframe's units copied into one run of bytes when they are
    /// small ([`STAGED_UNIT_MAX`]): the kernel copies one piece faster
    /// than a unit's two each, by more than this copy costs
    /// (`scripts/tx-path-probe.sh`: 4-8 % of a 64 KB round trip over veth
    /// at MTU 1500, DESIGN-NOTES "The TPACKET TX ring").
    staged: Vec<u8>,
}

/// The largest unit (frame) a superframe is staged for: at MTU 1500 its
/// units are, at MTU 9000 they are not (fewer, larger pieces, whose copy
/// costs more than the kernel saves: 64 KiB one-way 9.0-9.3 us staged
/// against 8.5-8.7 gathered, alternating quick demos).
const STAGED_UNIT_MAX: usize = 2048;

/// A frame's header and pieces, and at most two more for the message it
/// starts (UDP mode: the virtio-net and outer headers).
const IOVS_PER_FRAME: usize = 3 + MAX_GATHER;

// SAFETY: the raw pointers inside are rewritten from the caller's borrowed
// frames at the start of every `send` and not used after it returns; they
// carry no thread affinity.
unsafe impl Send for TxScratch {}

impl TxScratch {
    fn new() -> TxScratch {
        TxScratch { msgs: (0..TX_BATCH).map(|_| sys::zeroed()).collect(), iovs: (0..TX_BATCH * IOVS_PER_FRAME).map(|_| sys::zeroed()).collect(), staged: Vec::new() }
    }

    /// Sends up to [`TX_BATCH`] frames with one `sendmmsg`; how many went.
    /// With a `plan` (UDP mode) the frames go as its messages: each its
    /// virtio-net header (if the plan has them), its outer headers, and its
    /// frames past their Ethernet headers; else one message per frame.
    fn send(&mut self, fd: RawFd, frames: &[TxFrame<'_>], plan: Option<&TxPlan>) -> io::Result<usize> {
        let n_frames = frames.len().min(TX_BATCH);
        // Raw frames go one message each; a plan says how many per message.
        let messages = plan.map_or(n_frames, |p| p.frames.len());
        // Superframes may be staged (UDP mode with segmentation offload),
        // and some message of the batch is one.
        let staging = plan.is_some_and(|p| p.vnet) && messages < n_frames;
        if staging {
            // Room to stage every superframe of the batch (grown once, not
            // moved while the iovecs below point into it).
            let need: usize = frames[..n_frames].iter().map(|f| f.len()).filter(|&l| l <= STAGED_UNIT_MAX).sum();
            if self.staged.len() < need {
                self.staged.resize(need, 0);
            }
        }
        let (mut used, mut at, mut staged_at) = (0, 0, 0);
        let mut n = 0;
        for m in 0..messages {
            let count = plan.map_or(1, |p| p.frames[m]);
            if at + count > n_frames {
                break;
            }
            let first = used;
            let iovs = &mut self.iovs;
            let mut push = |part: &[u8]| {
                if !part.is_empty() {
                    // The kernel only reads through iov_base on send.
                    iovs[used] = libc::iovec { iov_base: part.as_ptr() as *mut c_void, iov_len: part.len() };
                    used += 1;
                }
            };
            if let Some(p) = plan {
                if p.vnet {
                    push(&p.vnets[m]);
                }
                push(&p.heads[m]);
            }
            let units = &frames[at..at + count];
            // (A superframe's first unit is its largest: all but the last
            // are the plan's unit size, so `need` above made room for it.)
            if staging && count > 1 && units[0].len() <= STAGED_UNIT_MAX {
                // A superframe: its units' bytes in one run.
                let start = staged_at;
                for f in units {
                    for part in std::iter::once(&f.header[ETH_HEADER_LEN..]).chain(f.pieces().iter().copied()) {
                        self.staged[staged_at..staged_at + part.len()].copy_from_slice(part);
                        staged_at += part.len();
                    }
                }
                push(&self.staged[start..staged_at]);
            } else {
                for f in units {
                    push(if plan.is_some() { &f.header[ETH_HEADER_LEN..] } else { f.header });
                    for piece in f.pieces() {
                        push(piece);
                    }
                }
            }
            let msg = &mut self.msgs[m];
            msg.msg_hdr.msg_name = std::ptr::null_mut(); // the bound interface and protocol
            msg.msg_hdr.msg_namelen = 0;
            msg.msg_hdr.msg_iov = self.iovs[first..].as_mut_ptr();
            msg.msg_hdr.msg_iovlen = (used - first) as _;
            msg.msg_len = 0;
            at += count;
            n += 1;
        }
        // SAFETY: msgs[..n] are initialised message headers whose iovecs
        // point into `frames`, borrowed for the whole call; the kernel reads
        // them and writes only msg_len.
        via_device::probe::sending();
        let r = unsafe { libc::sendmmsg(fd, self.msgs.as_mut_ptr(), n as _, libc::MSG_DONTWAIT) };
        via_device::probe::sent();
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(plan.map_or(r as usize, |p| p.frames[..r as usize].iter().sum()))
        }
    }
}

/// Thin wrappers over the system calls, each confining its `unsafe`.
mod sys {
    use std::ffi::{c_int, c_void};
    use std::io;
    use std::mem::size_of;
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};
    use std::ptr::NonNull;
    use via_device::MacAddr;

    /// C structs for which all-zero bytes are a valid value.
    ///
    /// # Safety
    /// Implement only for plain C structs of integers, arrays and pointers.
    pub unsafe trait Zeroable: Sized {}
    // SAFETY: plain C structs of integers, arrays, pointers and unions thereof.
    unsafe impl Zeroable for libc::mmsghdr {}
    // SAFETY: as above.
    unsafe impl Zeroable for libc::iovec {}
    // SAFETY: as above.
    unsafe impl Zeroable for libc::ifreq {}
    // SAFETY: as above.
    unsafe impl Zeroable for libc::sockaddr_ll {}
    // SAFETY: as above.
    unsafe impl Zeroable for libc::tpacket_stats {}

    pub fn zeroed<T: Zeroable>() -> T {
        // SAFETY: `Zeroable` promises all-zero bytes are a valid T.
        unsafe { std::mem::zeroed() }
    }

    fn check(r: c_int) -> io::Result<c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    pub fn packet_socket() -> io::Result<OwnedFd> {
        // SAFETY: plain socket creation; protocol 0 receives nothing until bind.
        let fd = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn setsockopt<T>(fd: RawFd, level: c_int, name: c_int, value: &T) -> io::Result<()> {
        // SAFETY: passes a live T and its exact size; the kernel only reads it.
        check(unsafe { libc::setsockopt(fd, level, name, (value as *const T).cast(), size_of::<T>() as u32) }).map(drop)
    }

    pub fn attach_filter(fd: RawFd, program: &[libc::sock_filter]) -> io::Result<()> {
        let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
        // The kernel copies the program during the call.
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
    }

    pub fn packet_statistics(fd: RawFd) -> io::Result<libc::tpacket_stats> {
        let mut st: libc::tpacket_stats = zeroed();
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `st`.
        check(unsafe { libc::getsockopt(fd, libc::SOL_PACKET, libc::PACKET_STATISTICS, (&mut st as *mut libc::tpacket_stats).cast(), &mut len) })?;
        Ok(st)
    }

    pub fn bind(fd: RawFd, ifindex: c_int, ethertype: u16) -> io::Result<()> {
        let mut sll: libc::sockaddr_ll = zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ethertype.to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: passes a live sockaddr_ll and its size; the kernel only reads it.
        check(unsafe { libc::bind(fd, (&sll as *const libc::sockaddr_ll).cast(), size_of::<libc::sockaddr_ll>() as u32) }).map(drop)
    }

    /// An interface ioctl on `fd`; the caller reads the union member the
    /// request fills.
    fn ifreq_ioctl(fd: RawFd, ifname: &str, request: libc::c_ulong) -> io::Result<libc::ifreq> {
        let mut ifr = named_ifreq(ifname);
        // SAFETY: `ifr` is a valid ifreq with a NUL-terminated name; the
        // kernel writes only within it.
        check(unsafe { libc::ioctl(fd, request as _, &mut ifr as *mut libc::ifreq) })?;
        Ok(ifr)
    }

    /// An ifreq naming `ifname` (NUL-terminated, cut to IFNAMSIZ - 1).
    fn named_ifreq(ifname: &str) -> libc::ifreq {
        let mut ifr: libc::ifreq = zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(ifname.bytes().take(libc::IFNAMSIZ - 1)) {
            *d = s as libc::c_char;
        }
        ifr
    }

    pub fn if_index(fd: RawFd, ifname: &str) -> io::Result<c_int> {
        let ifr = ifreq_ioctl(fd, ifname, libc::SIOCGIFINDEX)?;
        // SAFETY: SIOCGIFINDEX filled this integer member.
        Ok(unsafe { ifr.ifr_ifru.ifru_ifindex })
    }

    /// The interface's (first) IPv4 address; EADDRNOTAVAIL if it has none.
    pub fn if_ipv4(fd: RawFd, ifname: &str) -> io::Result<std::net::Ipv4Addr> {
        let ifr = ifreq_ioctl(fd, ifname, libc::SIOCGIFADDR)?;
        // SAFETY: SIOCGIFADDR filled this sockaddr member, an AF_INET
        // address (plain bytes: family, port, then the four octets).
        let sa = unsafe { ifr.ifr_ifru.ifru_addr };
        let d = sa.sa_data;
        Ok(std::net::Ipv4Addr::new(d[2] as u8, d[3] as u8, d[4] as u8, d[5] as u8))
    }

    pub fn if_mtu(fd: RawFd, ifname: &str) -> io::Result<usize> {
        let ifr = ifreq_ioctl(fd, ifname, libc::SIOCGIFMTU)?;
        // SAFETY: SIOCGIFMTU filled this integer member.
        let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
        Ok(mtu.max(0) as usize)
    }

    /// `struct ethtool_drvinfo` (linux/ethtool.h), as far as we read it.
    #[repr(C)]
    struct EthtoolDrvinfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        n_priv_flags: u32,
        n_stats: u32,
        testinfo_len: u32,
        eedump_len: u32,
        regdump_len: u32,
    }
    // SAFETY: a plain C struct of integers and byte arrays.
    unsafe impl Zeroable for EthtoolDrvinfo {}
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 0x3;

    /// The name of the interface's driver (`ethtool -i`), e.g. `veth`.
    pub fn if_driver(fd: RawFd, ifname: &str) -> io::Result<String> {
        let mut info: EthtoolDrvinfo = zeroed();
        info.cmd = ETHTOOL_GDRVINFO;
        let mut ifr = named_ifreq(ifname);
        ifr.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
        // SAFETY: `ifr` names the interface and points at `info`, a live
        // ethtool_drvinfo the kernel fills (and writes nothing beyond).
        check(unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut ifr as *mut libc::ifreq) })?;
        let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
        Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
    }

    /// The hardware type (ARPHRD_*) and address of the interface.
    pub fn if_hwaddr(fd: RawFd, ifname: &str) -> io::Result<(u16, MacAddr)> {
        let ifr = ifreq_ioctl(fd, ifname, libc::SIOCGIFHWADDR)?;
        // SAFETY: SIOCGIFHWADDR filled this sockaddr member (plain bytes).
        let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (d, s) in mac.iter_mut().zip(sa.sa_data) {
            *d = s as u8;
        }
        Ok((sa.sa_family, MacAddr(mac)))
    }

    pub fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    }

    pub fn mmap_ring(fd: RawFd, len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh shared mapping of the socket's ring; it aliases no
        // Rust object.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
    }

    pub fn munmap_ring(base: NonNull<u8>, len: usize) {
        // SAFETY: unmaps exactly the mapping `mmap_ring` made; its owner is
        // being dropped, so no borrow into it is alive.
        unsafe { libc::munmap(base.as_ptr().cast::<c_void>(), len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_geometry_fits_the_kernel_rules() {
        for page in [4096, 16384, 65536] {
            for mtu in [0, 576, 1500, 4000, 9000, 9216, 16000, 65535, 65536] {
                let g = RingGeometry::for_mtu(mtu, page, None);
                assert!(g.frame_size.is_power_of_two() && g.frame_size >= SLOT_NET_OFFSET + mtu + SLOT_SLACK, "{g:?}");
                assert_eq!(g.frame_size % 16, 0);
                assert_eq!(g.block_size % page, 0, "{g:?}");
                assert_eq!(g.block_size % g.frame_size, 0, "{g:?}");
                assert_eq!(g.frame_nr, g.block_nr * (g.block_size / g.frame_size), "{g:?}");
                assert!(g.frame_nr >= RING_MIN_FRAMES, "{g:?}");
                assert!(g.frame_nr <= RING_MAX_FRAMES.max(g.block_size / g.frame_size), "{g:?}");
            }
        }
        let std = RingGeometry::for_mtu(1500, 4096, None);
        assert_eq!((std.frame_size, std.frame_nr), (2048, 4096));
        let jumbo = RingGeometry::for_mtu(9000, 4096, None);
        assert_eq!((jumbo.frame_size, jumbo.frame_nr), (16384, 512));
        // Superframe slots (VIA in UDP) and a 64 KiB MTU: 8 MiB, 64 slots.
        let superframes = RingGeometry::for_mtu(MAX_MTU, 4096, None);
        assert_eq!((superframes.frame_size, superframes.frame_nr), (131072, 64));
        assert_eq!(SLOT_NET_OFFSET, 80);
        // A count asked for is taken, in whole blocks.
        let asked = RingGeometry::for_mtu(1500, 4096, Some(1023));
        assert_eq!((asked.frame_size, asked.frame_nr, asked.block_nr), (2048, 1024, 512));
        assert_eq!(RingGeometry::for_mtu(1500, 4096, Some(usize::MAX)).frame_nr, RING_LIMIT_FRAMES);
    }

    #[test]
    fn only_interfaces_in_memory_are_vouched_for() {
        assert!(memory_only(ARPHRD_LOOPBACK, None));
        assert!(memory_only(ARPHRD_ETHER, Some("veth")));
        for nic in [None, Some("e1000e"), Some("virtio_net"), Some("tun"), Some("bridge"), Some("8021q"), Some("")] {
            assert!(!memory_only(ARPHRD_ETHER, nic), "{nic:?}");
        }
    }

    #[test]
    fn bad_names_are_not_found() {
        for name in ["", "0123456789abcdef", "a/b", "a b"] {
            let e = PacketDevice::open(name).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{name:?}: {e}");
        }
    }
}
