//! `PacketDevice` over a real veth pair between two network namespaces.
//! Needs root (to create namespaces, and CAP_NET_RAW for AF_PACKET) and the
//! `ip` tool; fails with a clear message otherwise.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use via_wire::{ANY_ENDPOINT, DST_EP_OFFSET, ETHERTYPE};
use via_device::{FrameDevice, MacAddr, RxFilter, TxFrame};
use via_softnic::{PacketDevice, PacketOptions};

const IFNAME: &str = "veth0";
const EP_A: u32 = 0x0a0a_0a0a;
const EP_B: u32 = 0x0b0b_0b0b;
const WAIT: Duration = Duration::from_secs(3);

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(euid == 0, "packet_veth tests need root (network namespaces, veth pairs and CAP_NET_RAW for AF_PACKET); run them as root");
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("running `ip {}`: {e} (is iproute2 installed?)", args.join(" ")));
    assert!(out.status.success(), "`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two namespaces joined by a veth pair (`veth0` in each); deleted on drop,
/// panic or not.
struct VethPair {
    ns: [String; 2],
}

impl VethPair {
    fn new(tag: &str, mtu: u32) -> VethPair {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let base = format!("via-softnic-{}-{}-{tag}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let pair = VethPair { ns: [format!("{base}-a"), format!("{base}-b")] };
        let [a, b] = &pair.ns;
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&["link", "add", IFNAME, "netns", a, "type", "veth", "peer", "name", IFNAME, "netns", b]);
        let mtu = mtu.to_string();
        for ns in &pair.ns {
            ip(&["-n", ns, "link", "set", IFNAME, "mtu", &mtu, "up"]);
        }
        // Set-up, not synchronisation between the devices: frames sent
        // before the link is operational may be dropped.
        let deadline = Instant::now() + WAIT;
        for ns in &pair.ns {
            loop {
                let out = Command::new("ip").args(["-n", ns, "-o", "link", "show", IFNAME]).output().unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                assert!(Instant::now() < deadline, "veth in {ns} did not come up");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        pair
    }

    /// Runs `f` on a thread that has entered namespace `i`.
    fn within<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.ns[i]);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
                // SAFETY: setns on a namespace fd we hold open; it changes
                // only this thread's network namespace.
                let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns({path}): {}", io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Opens `veth0` in each namespace, each from its own thread.
    fn open(&self) -> (PacketDevice, PacketDevice) {
        self.open_with(PacketOptions::default())
    }

    /// Gives the two ends 10.9.0.1/24 and 10.9.0.2/24 and opens them for
    /// VIA in UDP/IPv4 (segmentation offload on).
    fn open_udp(&self) -> (PacketDevice, PacketDevice) {
        self.open_udp_gso([true, true])
    }

    /// [`VethPair::open_udp`], each end with segmentation (and checksum)
    /// offload or without (`gso=off`).
    fn open_udp_gso(&self, gso: [bool; 2]) -> (PacketDevice, PacketDevice) {
        ip(&["-n", &self.ns[0], "addr", "add", "10.9.0.1/24", "dev", IFNAME]);
        ip(&["-n", &self.ns[1], "addr", "add", "10.9.0.2/24", "dev", IFNAME]);
        let port = via_softnic::VIA_UDP_PORT;
        std::thread::scope(|s| {
            let a = s.spawn(|| self.within(0, || PacketDevice::open_udp(IFNAME, port, gso[0]).unwrap()));
            let b = s.spawn(|| self.within(1, || PacketDevice::open_udp(IFNAME, port, gso[1]).unwrap()));
            (a.join().unwrap(), b.join().unwrap())
        })
    }

    fn open_with(&self, options: PacketOptions) -> (PacketDevice, PacketDevice) {
        std::thread::scope(|s| {
            let a = s.spawn(|| self.within(0, || PacketDevice::open_with(IFNAME, options).unwrap()));
            let b = s.spawn(|| self.within(1, || PacketDevice::open_with(IFNAME, options).unwrap()));
            (a.join().unwrap(), b.join().unwrap())
        })
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn filter(ethertype: u16, ep: u32) -> RxFilter {
    RxFilter { ethertype, offset: DST_EP_OFFSET, accept: [ep, ANY_ENDPOINT] }
}

/// An Ethernet + endpoint header of `len` bytes (≥ 22).
fn header(dst: MacAddr, src: MacAddr, ethertype: u16, ep: u32, len: usize) -> Vec<u8> {
    let mut h: Vec<u8> = (0..len).map(|i| i as u8).collect();
    h[..6].copy_from_slice(&dst.0);
    h[6..12].copy_from_slice(&src.0);
    h[12..14].copy_from_slice(&ethertype.to_be_bytes());
    h[DST_EP_OFFSET..DST_EP_OFFSET + 4].copy_from_slice(&ep.to_be_bytes());
    h
}

fn readable(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) == 1 }
}

/// Receives until `n` frames arrived (or the time is up).
fn recv_n(d: &mut PacketDevice, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if readable(d.wait_fd(), left) {
            d.receive(n - got.len(), &mut |f| got.push(f.to_vec())).unwrap();
        }
    }
    got
}

/// What is waiting right now, after a short grace for stragglers.
fn recv_pending(d: &mut PacketDevice) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    if readable(d.wait_fd(), Duration::from_millis(50)) {
        while d.receive(64, &mut |f| got.push(f.to_vec())).unwrap() > 0 {}
    }
    got
}

fn send_all(d: &mut PacketDevice, frames: &[TxFrame<'_>]) {
    let deadline = Instant::now() + WAIT;
    let mut done = 0;
    while done < frames.len() {
        done += d.transmit(&frames[done..]).unwrap();
        assert!(Instant::now() < deadline, "transmit stalled after {done} of {} frames", frames.len());
    }
}

fn stat(d: &PacketDevice, name: &str) -> u64 {
    d.stats().into_iter().find(|s| s.0 == name).unwrap_or_else(|| panic!("no stat {name}")).1
}

/// A full-MTU frame goes through intact; one byte more is refused.
fn check_mtu(a: &mut PacketDevice, b: &mut PacketDevice, mtu: usize) {
    assert_eq!(a.mtu(), mtu);
    assert_eq!(b.mtu(), mtu);
    let h = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 78);
    let rest = 14 + mtu - h.len();
    let payload: Vec<u8> = (0..rest).map(|i| (i * 7 + 3) as u8).collect();
    let (p1, p2) = payload.split_at(rest / 3);
    let mut t = TxFrame::new(&h);
    t.push(p1);
    t.push(p2);
    assert_eq!(t.len(), 14 + mtu);
    send_all(a, &[t]);
    let got = recv_n(b, 1);
    assert_eq!(got.len(), 1, "full-MTU frame did not arrive");
    assert_eq!(got[0].len(), 14 + mtu);
    assert!(got[0][..h.len()] == h[..] && got[0][h.len()..] == payload[..], "full-MTU frame arrived altered");

    let one_more = [0u8; 1];
    let mut big = t;
    big.push(&one_more);
    let before = stat(a, "tx_oversize");
    let e = a.transmit(&[TxFrame::new(&h), big]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains(&(15 + mtu).to_string()), "error names the size: {e}");
    assert_eq!(stat(a, "tx_oversize"), before + 1);
    assert!(recv_pending(b).is_empty(), "nothing of a refused batch goes out");
}

#[test]
fn veth_exchange_filters_and_batches() {
    require_root();
    let pair = VethPair::new("std", 1500);
    pair.within(0, || {
        let e = PacketDevice::open("nosuch0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("no such interface: nosuch0"), "{e}");
        let e = via_device::open_device("/dev/via_nosuch0", &[]).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(via_device::open_device("/dev/via_veth0", &[]).is_ok());
    });
    let (mut a, mut b) = pair.open();
    assert_ne!(a.mac(), b.mac());
    assert_ne!(a.mac(), MacAddr::ZERO);
    // A veth pair cannot corrupt a frame: the device vouches for its raw
    // frames, so the engine seals them with no CRC.
    assert!(a.capabilities().checksummed, "a veth pair's frames are vouched for");
    assert!(a.path_to(&header(b.mac(), a.mac(), ETHERTYPE, EP_B, 64)).checksummed);
    // A frame that reached B's ring before its filter went in is still
    // held back by it.
    let early = header(b.mac(), a.mac(), ETHERTYPE, 0x1234_5678, 64);
    send_all(&mut a, &[TxFrame::new(&early)]);
    assert!(readable(b.wait_fd(), WAIT), "the early frame did not arrive");
    a.set_filter(filter(ETHERTYPE, EP_A)).unwrap();
    b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
    assert_eq!(b.receive(64, &mut |f| panic!("filtered frame of {} bytes delivered", f.len())).unwrap(), 0);
    assert_eq!(stat(&b, "rx_filtered_in_software"), 1);

    // A non-matching endpoint is dropped; the matching frame behind it,
    // gathered from a header and two pieces, arrives intact.
    let wrong = header(b.mac(), a.mac(), ETHERTYPE, 0xdead_beef, 64);
    let h = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 78);
    let mut t = TxFrame::new(&h);
    t.push(b"hello, ");
    t.push(b"endpoint B");
    send_all(&mut a, &[TxFrame::new(&wrong), t]);
    let got = recv_n(&mut b, 1);
    assert_eq!(got, vec![[&h[..], b"hello, endpoint B"].concat()]);

    // Endpoint 0 (connection management) reaches everyone, broadcast too,
    // but not the sender itself.
    let any = header(MacAddr::BROADCAST, a.mac(), ETHERTYPE, ANY_ENDPOINT, 64);
    send_all(&mut a, &[TxFrame::new(&any)]);
    assert_eq!(recv_n(&mut b, 1), vec![any.clone()]);
    assert_eq!(a.receive(64, &mut |f| panic!("A saw a frame of {} bytes: its own?", f.len())).unwrap(), 0);

    // The other way round.
    let to_a = header(a.mac(), b.mac(), ETHERTYPE, EP_A, 100);
    send_all(&mut b, &[TxFrame::new(&to_a)]);
    assert_eq!(recv_n(&mut a, 1), vec![to_a]);

    check_mtu(&mut a, &mut b, 1500);

    // More than one sendmmsg's worth, in order.
    let hs: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let mut h = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 64);
            h[40..44].copy_from_slice(&i.to_be_bytes());
            h
        })
        .collect();
    let frames: Vec<_> = hs.iter().map(|h| TxFrame::new(h)).collect();
    send_all(&mut a, &frames);
    let got = recv_n(&mut b, hs.len());
    assert_eq!(got.len(), hs.len(), "batch of {} frames; stats {:?}", hs.len(), b.stats());
    assert!(got == hs, "batch arrived altered or out of order");

    // Another EtherType: the socket rebinds, and 0x88B5 no longer arrives.
    b.set_filter(filter(0x88b6, EP_B)).unwrap();
    let old = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 64);
    let new = header(b.mac(), a.mac(), 0x88b6, EP_B, 64);
    send_all(&mut a, &[TxFrame::new(&old), TxFrame::new(&new)]);
    assert_eq!(recv_n(&mut b, 1), vec![new]);

    assert!(recv_pending(&mut a).is_empty());
    assert!(recv_pending(&mut b).is_empty());
    assert_eq!(stat(&b, "rx_frames"), 204);
    assert_eq!(stat(&a, "rx_frames"), 1);
    assert_eq!(stat(&a, "tx_frames"), 207);
    for d in [&a, &b] {
        for s in ["rx_bad_slot", "rx_truncated", "kernel_rx_drops"] {
            assert_eq!(stat(d, s), 0, "{s}: {:?}", d.stats());
        }
    }
}

#[test]
fn veth_jumbo_frames() {
    require_root();
    let pair = VethPair::new("jumbo", 9000);
    let (mut a, mut b) = pair.open();
    a.set_filter(filter(ETHERTYPE, EP_A)).unwrap();
    b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
    check_mtu(&mut a, &mut b, 9000);
    // And a train of them.
    let h = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 78);
    let payload = vec![0x5au8; 9000 - 64];
    let frames: Vec<_> = (0..100)
        .map(|_| {
            let mut t = TxFrame::new(&h);
            t.push(&payload);
            t
        })
        .collect();
    send_all(&mut a, &frames);
    let got = recv_n(&mut b, frames.len());
    assert_eq!(got.len(), frames.len(), "stats {:?}", b.stats());
    assert!(got.iter().all(|f| f.len() == 9014 && f[78..] == payload[..]));
}

/// With the bypass, frames skip the queueing discipline; without it they
/// go through it, and a qdisc that refuses them makes transmit accept none
/// (ENOBUFS is back-pressure, not an error).
#[test]
fn qdisc_bypass_skips_the_queueing_discipline() {
    require_root();
    let pair = VethPair::new("qdisc", 1500);
    // A queue that holds nothing: every frame through it is dropped.
    pair.within(0, || {
        let out = Command::new("tc").args(["qdisc", "replace", "dev", IFNAME, "root", "pfifo", "limit", "0"]).output().expect("running tc");
        assert!(out.status.success(), "tc: {}", String::from_utf8_lossy(&out.stderr));
    });
    let (mut a, mut b) = pair.open_with(PacketOptions { qdisc_bypass: false, ..PacketOptions::default() });
    assert!(!a.qdisc_bypass());
    b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
    let h = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 64);
    assert_eq!(a.transmit(&[TxFrame::new(&h), TxFrame::new(&h)]).unwrap(), 0, "the qdisc drops, transmit accepts nothing");
    assert!(recv_pending(&mut b).is_empty());

    let (mut a, mut b) = pair.open();
    assert!(a.qdisc_bypass());
    b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
    send_all(&mut a, &[TxFrame::new(&h), TxFrame::new(&h)]);
    assert_eq!(recv_n(&mut b, 2).len(), 2);
}

/// Without CAP_NET_RAW, opening says what is missing. Capabilities are per
/// thread, so one thread drops its own.
#[test]
fn permission_denied_names_the_capability() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // As root, a ring for lo's 64 KiB MTU is fine.
        let lo = PacketDevice::open("lo").unwrap();
        assert_eq!(lo.mtu(), 65536);
    }
    let e = std::thread::spawn(|| {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let header = Header { version: 0x2008_0522, pid: 0 };
        let mut data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
        // SAFETY: capget/capset (version 3) read the header and read or
        // write two data entries; this affects only the calling thread.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()), 0);
            data[0].effective = 0;
            data[1].effective = 0;
            assert_eq!(libc::syscall(libc::SYS_capset, &header, data.as_ptr()), 0, "capset: {}", io::Error::last_os_error());
        }
        PacketDevice::open("lo").unwrap_err()
    })
    .join()
    .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("CAP_NET_RAW"), "{e}");
}

/// VIA in UDP/IPv4 between two addressed hosts of one subnet: identities
/// are IPv4 addresses, the MTU leaves room for the IPv4 and UDP headers,
/// the first frame waits for the next hop's resolution (a probe), frames
/// arrive with their identities, and frames that can go nowhere (no route,
/// no IPv4 identity) are dropped and counted, not retried forever.
#[test]
fn udp_frames_cross_between_ipv4_identities() {
    require_root();
    let pair = VethPair::new("udp", 1500);
    let port = via_softnic::VIA_UDP_PORT;
    pair.within(0, || {
        let e = PacketDevice::open_udp(IFNAME, port, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable, "{e}");
        assert!(e.to_string().contains("no IPv4 address"), "{e}");
    });
    let (mut a, mut b) = pair.open_udp();
    assert_eq!(a.mac(), "10.9.0.1".parse().unwrap());
    assert_eq!(b.mac().to_string(), "10.9.0.2");
    a.set_filter(filter(ETHERTYPE, EP_A)).unwrap();
    b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
    assert_eq!(b.set_filter(filter(0x88b6, EP_B)).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    // The first frame waits for ARP; then a full-MTU frame arrives whole.
    check_mtu(&mut a, &mut b, 1500 - 28);
    assert!(stat(&a, "tx_probes") >= 1, "a's first frame needed its next hop resolved");
    assert_eq!(stat(&a, "udp_port_held"), 1);
    // Another endpoint's frames stay out; ours come in with identities.
    let other = header(b.mac(), a.mac(), ETHERTYPE, EP_A, 64);
    let ours = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 64);
    send_all(&mut a, &[TxFrame::new(&other), TxFrame::new(&ours)]);
    let got = recv_n(&mut b, 1);
    assert_eq!(got, vec![ours.clone()]);
    assert!(recv_pending(&mut b).is_empty());
    // And back.
    let back = header(a.mac(), b.mac(), ETHERTYPE, EP_A, 100);
    send_all(&mut b, &[TxFrame::new(&back)]);
    assert_eq!(recv_n(&mut a, 1), vec![back]);
    // Nowhere to go: no route to 192.0.2.1, and a MAC is no IPv4 identity.
    // Each is dropped and counted, and the batch goes on past it.
    let lost = header("192.0.2.1".parse().unwrap(), a.mac(), ETHERTYPE, EP_B, 64);
    let not_ip = header(MacAddr([2, 0, 0, 0, 0, 9]), a.mac(), ETHERTYPE, EP_B, 64);
    assert_eq!(a.transmit(&[TxFrame::new(&lost), TxFrame::new(&not_ip), TxFrame::new(&ours)]).unwrap(), 3);
    assert_eq!(stat(&a, "tx_unreachable"), 2);
    assert_eq!(recv_n(&mut b, 1), vec![ours]);
}

/// With segmentation offload (UDP mode's default), a message's fragments
/// to one endpoint go as one superframe, which veth carries whole; the
/// receiver cuts it into the same frames, in order and intact (the last,
/// short one too). Frames to another endpoint of the same host in the
/// same batch are not folded in (the receiver's filter sees only a
/// superframe's first endpoint).
#[test]
fn udp_superframes_arrive_as_the_frames_they_carry() {
    require_root();
    let pair = VethPair::new("gso", 1500);
    let (mut a, mut b) = pair.open_udp();
    b.set_filter(RxFilter { ethertype: ETHERTYPE, offset: DST_EP_OFFSET, accept: [EP_B, EP_A] }).unwrap();
    let mtu = a.mtu();
    let full = |i: usize, ep: u32| {
        let mut h = header(b.mac(), a.mac(), ETHERTYPE, ep, 14 + mtu);
        h[40] = i as u8; // tells the frames apart
        h
    };
    let mut frames: Vec<Vec<u8>> = (0..20).map(|i| full(i, EP_B)).collect();
    frames.push(header(b.mac(), a.mac(), ETHERTYPE, EP_B, 300));
    frames.push(full(21, EP_A));
    frames.push(full(22, EP_A));
    let tx: Vec<TxFrame<'_>> = frames.iter().map(|f| TxFrame::new(f)).collect();
    send_all(&mut a, &tx);
    let got = recv_n(&mut b, frames.len());
    assert_eq!(got.len(), frames.len(), "every frame arrived");
    for (i, (g, f)) in got.iter().zip(&frames).enumerate() {
        assert!(g == f, "frame {i} arrived altered or out of order ({} bytes, sent {})", g.len(), f.len());
    }
    assert_eq!(stat(&a, "tx_superframes"), 2, "the run to EP_B and the pair to EP_A");
    assert_eq!(stat(&b, "rx_superframes"), 2, "veth carried them whole");
}

/// With offload, every datagram (a lone frame or a superframe's) asks for
/// its UDP checksum, and the receiver hands its frames on vouched for: the
/// path needs no CRC of the engine's. Without offload (`gso=off`) the
/// datagram has no checksum: the path is not checksummed (the engine
/// adds its CRC) and the frames come unvouched for.
#[test]
fn udp_checksums_vouch_for_frames_where_offloaded() {
    require_root();
    for gso in [true, false] {
        let pair = VethPair::new(if gso { "csum" } else { "nocsum" }, 1500);
        let (mut a, mut b) = pair.open_udp_gso([gso, true]);
        b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
        let mtu = a.mtu();
        let lone = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 200);
        assert_eq!(a.path_to(&lone).checksummed, gso, "gso={gso}: the path says whether frames need a CRC");
        let run: Vec<Vec<u8>> = (0..6).map(|i| header(b.mac(), a.mac(), ETHERTYPE, EP_B, if i < 5 { 14 + mtu } else { 99 })).collect();
        send_all(&mut a, &[TxFrame::new(&lone)]);
        send_all(&mut a, &run.iter().map(|f| TxFrame::new(f)).collect::<Vec<_>>());
        let deadline = Instant::now() + WAIT;
        let mut got = Vec::new();
        while got.len() < 7 && Instant::now() < deadline {
            if readable(b.wait_fd(), WAIT) {
                b.receive_lent(7, &mut |f, meta| got.push((f.to_vec(), meta.vouched))).unwrap();
            }
        }
        assert_eq!(got.len(), 7, "gso={gso}: every frame arrived");
        assert_eq!(got[0].0, lone);
        for (i, (f, vouched)) in got.iter().enumerate() {
            assert_eq!(*vouched, gso, "gso={gso}: frame {i} vouched for by its UDP checksum");
            assert_eq!(f.len(), if i == 0 { 200 } else { run[i - 1].len() });
        }
        assert_eq!(stat(&a, "tx_superframes"), u64::from(gso));
        assert_eq!(stat(&b, "rx_bad_udp_checksum"), 0);
    }
}

/// The MAC address of `veth0` in namespace `i` (a UDP-mode device names
/// itself by its IPv4 identity instead).
fn link_mac(pair: &VethPair, i: usize) -> MacAddr {
    let out = Command::new("ip").args(["-n", &pair.ns[i], "-o", "link", "show", IFNAME]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let word = text.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap_or_else(|| panic!("no MAC in {text}"));
    word.parse().unwrap_or_else(|e| panic!("{word}: {e:?}"))
}

/// A UDP datagram 10.9.0.1 -> 10.9.0.2 in an Ethernet frame of
/// `ethertype`, to `port` both ways, carrying `via` (a raw VIA frame)
/// without its Ethernet header, as the UDP device sends one (no checksum).
fn datagram(dst: MacAddr, src: MacAddr, ethertype: u16, port: u16, via: &[u8]) -> Vec<u8> {
    let payload = &via[14..];
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 9, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 9, 0, 2]);
    let mut sum: u32 = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// In UDP mode the socket is bound to every EtherType (so that it sees a
/// datagram before the kernel's IP layer does), and its kernel filter is
/// all that keeps other traffic out: the same datagram under another
/// EtherType or to another port stays out, and so do our own
/// transmissions; the datagram itself, sent as raw bytes from another
/// socket, comes in.
#[test]
fn udp_mode_takes_only_our_datagrams_of_all_it_is_bound_to() {
    require_root();
    let pair = VethPair::new("udpall", 1500);
    let (mut a, mut b) = pair.open_udp();
    b.set_filter(filter(ETHERTYPE, EP_B)).unwrap();
    let mut raw = pair.within(0, || PacketDevice::open(IFNAME).unwrap());
    let (mac_a, mac_b) = (link_mac(&pair, 0), link_mac(&pair, 1));
    let via = header(b.mac(), a.mac(), ETHERTYPE, EP_B, 96);
    let port = via_softnic::VIA_UDP_PORT;
    let strangers = [
        datagram(mac_b, mac_a, ETHERTYPE, port, &via), // our datagram's bytes as a raw VIA frame
        datagram(mac_b, mac_a, 0x86dd, port, &via),    // under IPv6's EtherType
        datagram(mac_b, mac_a, 0x0800, port + 1, &via), // to another port
    ];
    let ours = datagram(mac_b, mac_a, 0x0800, port, &via);
    let mut tx: Vec<TxFrame<'_>> = strangers.iter().map(|f| TxFrame::new(f)).collect();
    tx.push(TxFrame::new(&ours));
    send_all(&mut raw, &tx);
    assert_eq!(recv_n(&mut b, 1), vec![via.clone()], "the datagram arrives as the VIA frame it carries");
    assert!(recv_pending(&mut b).is_empty(), "nothing but the datagram came in");
    // b's own datagram to a does not come back to b.
    a.set_filter(filter(ETHERTYPE, EP_A)).unwrap();
    let back = header(a.mac(), b.mac(), ETHERTYPE, EP_A, 80);
    send_all(&mut b, &[TxFrame::new(&back)]);
    assert_eq!(recv_n(&mut a, 1), vec![back]);
    assert!(recv_pending(&mut b).is_empty(), "b saw its own transmission");
}
