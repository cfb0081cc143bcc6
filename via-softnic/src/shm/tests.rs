//! The shm device's unit tests: routing, full rings, filters and
//! doorbells, lending, which lent records and doorbells are refused, and
//! how large payloads are copied into the ring.

use super::*;
use payload_copy::Way;

fn frame(dst: MacAddr, len: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![fill; len];
    f[..6].copy_from_slice(&dst.0);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

fn wire(name: &str) -> String {
    format!("test-{name}-{}", std::process::id())
}

fn recv_all(d: &mut ShmDevice) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    while d.receive(5, &mut |f| v.push(f.to_vec())).unwrap() > 0 {}
    v
}

#[test]
fn frames_reach_the_port_of_their_destination_only() {
    let w = wire("route");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let mut c = ShmDevice::open(&w, None).unwrap();
    let f = frame(b.mac(), 100, 7);
    assert_eq!(a.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
    assert_eq!(recv_all(&mut b), vec![f]);
    assert!(recv_all(&mut c).is_empty());
    // Broadcast: everyone but the sender.
    let g = frame(MacAddr::BROADCAST, 60, 1);
    assert_eq!(a.transmit(&[TxFrame::new(&g)]).unwrap(), 1);
    assert_eq!(recv_all(&mut b).len(), 1);
    assert_eq!(recv_all(&mut c).len(), 1);
    assert!(recv_all(&mut a).is_empty());
    // Nobody there: counted, not an error.
    let h = frame(MacAddr([2, 9, 9, 9, 9, 9]), 60, 1);
    assert_eq!(a.transmit(&[TxFrame::new(&h)]).unwrap(), 1);
    assert!(a.stats().contains(&("shm_tx_no_port", 1)));
    remove_wire(&w);
}

#[test]
fn a_frame_longer_than_a_slot_is_refused_and_counted_and_the_batch_before_it_goes() {
    let w = wire("oversize");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let (ok, long) = (frame(b.mac(), 100, 7), frame(b.mac(), ETH_HEADER_LEN + MTU + 1, 8));
    assert!(a.transmit(&[TxFrame::new(&long)]).is_err(), "a frame no slot takes is an error");
    // After a frame that went: the prefix that went, as the trait says.
    assert_eq!(a.transmit(&[TxFrame::new(&ok), TxFrame::new(&long)]).unwrap(), 1);
    assert!(a.stats().contains(&("shm_tx_oversize", 2)));
    assert_eq!(recv_all(&mut b), vec![ok]);
    remove_wire(&w);
}

#[test]
fn a_port_taken_again_delivers_nothing_its_last_owner_left_unread() {
    let w = wire("stale");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let b = ShmDevice::open(&w, None).unwrap();
    let (port, mac) = (b.port, b.mac());
    let frames: Vec<Vec<u8>> = (0..5).map(|i| frame(mac, 80, i)).collect();
    let tx: Vec<TxFrame> = frames.iter().map(|f| TxFrame::new(f)).collect();
    assert_eq!(a.transmit(&tx).unwrap(), 5);
    drop(b); // gone with five frames unread, their slots published
    let mut c = ShmDevice::open(&w, None).unwrap();
    assert_eq!(c.port, port, "the freed port is the first free one");
    assert!(recv_all(&mut c).is_empty(), "the new owner starts past what the old one left");
    // And the ring works from there: the next frame, and only it.
    let f = frame(c.mac(), 90, 42);
    assert_eq!(a.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
    assert_eq!(recv_all(&mut c), vec![f]);
    remove_wire(&w);
}

#[test]
fn a_full_ring_refuses_frames_and_loses_none() {
    let w = wire("full");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let frames: Vec<Vec<u8>> = (0..SLOTS as usize + 10).map(|i| frame(b.mac(), 64 + i, i as u8)).collect();
    let tx: Vec<TxFrame> = frames.iter().map(|f| TxFrame::new(f)).collect();
    let sent = a.transmit(&tx).unwrap();
    assert_eq!(sent, SLOTS as usize, "the ring takes SLOTS frames");
    let mut pfd = libc::pollfd { fd: a.wait_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one live pollfd, no wait.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0, "the refused sender has nothing to wake for yet");
    let mut got = recv_all(&mut b);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 1, "making room woke the refused sender");
    assert_eq!(a.transmit(&tx[sent..]).unwrap(), 10);
    got.extend(recv_all(&mut b));
    assert_eq!(got, frames, "every frame once, in order");
    remove_wire(&w);
}

#[test]
fn the_filter_and_the_doorbell() {
    let w = wire("filter");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    b.set_filter(RxFilter { ethertype: 0x88b5, offset: 18, accept: [5, 0] }).unwrap();
    let mut ok = frame(b.mac(), 40, 0);
    ok[18..22].copy_from_slice(&5u32.to_be_bytes());
    let other = frame(b.mac(), 40, 0xee);
    assert!(a.takes(&ok) && !a.takes(&other));
    let mut pfd = libc::pollfd { fd: b.wait_fd(), events: libc::POLLIN, revents: 0 };
    let mut readable = || {
        // SAFETY: poll on one live pollfd, no wait.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    };
    assert!(!readable(), "nothing yet");
    // Nobody sleeps: frames come without a system call to wake anyone.
    assert_eq!(a.transmit(&[TxFrame::new(&other), TxFrame::new(&ok)]).unwrap(), 2);
    assert!(!readable(), "a spinning owner is not rung");
    assert!(b.prepare_sleep().is_none(), "a frame waits: do not sleep");
    assert_eq!(recv_all(&mut b), vec![ok.clone()], "the filter let one through");
    // A thread about to sleep is counted, and the next frame rings once.
    let sleep = b.prepare_sleep().expect("nothing waits: sleep");
    assert_eq!(a.transmit(&[TxFrame::new(&ok)]).unwrap(), 1);
    assert!(readable(), "the doorbell rang for the sleeper");
    assert_eq!(a.transmit(&[TxFrame::new(&ok)]).unwrap(), 1);
    drop(sleep);
    assert_eq!(recv_all(&mut b).len(), 2);
    assert!(!readable(), "emptied when the ring was found empty");
    drop(b.prepare_sleep().expect("nothing waits"));
    assert_eq!(a.transmit(&[TxFrame::new(&ok)]).unwrap(), 1);
    assert!(!readable(), "the sleeper woke and said so: not rung");
    assert_eq!(b.receive(1, &mut |_| {}).unwrap(), 1);
    assert!(!readable(), "none wait");
    remove_wire(&w);
}

#[test]
fn long_lendable_payloads_are_lent_and_read_once() {
    const LEND_MIN: usize = 16384;
    let w = wire("lend");
    let mut a = ShmDevice::open(&format!("{w},lend={LEND_MIN}"), None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let head = frame(b.mac(), 60, 0);
    let p1: Vec<u8> = (0..LEND_MIN).map(|i| (i * 7) as u8).collect();
    let p2: Vec<u8> = (0..5000).map(|i| (i * 3) as u8).collect();
    let mut whole = head.clone();
    whole.extend_from_slice(&p1);
    whole.extend_from_slice(&p2);
    let mut lent = TxFrame::new(&head);
    lent.push(&p1);
    lent.push(&p2);
    lent.lendable = true;
    let mut short = TxFrame::new(&head);
    short.push(&p2);
    short.lendable = true;
    let mut kept = lent;
    kept.lendable = false;
    assert_eq!(a.transmit(&[lent, short, kept]).unwrap(), 3);
    assert!(a.stats().contains(&("shm_tx_lent", 1)), "only the long lendable frame is lent: {:?}", a.stats());
    let mut got = Vec::new();
    b.receive_lent(8, &mut |f, m| {
        assert!(m.vouched, "memory vouches for every frame");
        let mut bytes = f.to_vec();
        if let Some(l) = m.lent {
            assert_eq!(f, &head[..], "a lent frame holds the headers alone");
            assert_eq!(l.pid, std::process::id());
            let at = bytes.len();
            bytes.resize(at + l.len(), 0);
            // Read it in two parts, across the pieces' boundary.
            let cut = LEND_MIN - 10;
            // SAFETY: `bytes` holds l.len() bytes past `at`.
            unsafe {
                l.read(0, bytes.as_mut_ptr().add(at), cut).unwrap();
                l.read(cut, bytes.as_mut_ptr().add(at + cut), l.len() - cut).unwrap();
                assert!(l.read(1, bytes.as_mut_ptr(), l.len()).is_err(), "past the payload's end");
            }
        }
        got.push((bytes, m.lent.is_some()));
    })
    .unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], (whole.clone(), true));
    assert!(!got[1].1 && !got[2].1);
    assert_eq!(got[2].0, whole);
    // Plain receive reads a lent payload in itself.
    assert_eq!(a.transmit(&[lent]).unwrap(), 1);
    assert_eq!(recv_all(&mut b), vec![whole]);
    remove_wire(&w);
}

#[test]
fn a_lent_payload_may_be_longer_than_a_frame() {
    let w = wire("lendwhole");
    let mut a = ShmDevice::open(&format!("{w},lend=4096"), None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let head = frame(b.mac(), 60, 0);
    let p: Vec<u8> = (0..3 * MTU).map(|i| (i * 13 + i / 251) as u8).collect();
    let mut big = TxFrame::new(&head);
    big.push(&p[..MTU]);
    big.push(&p[MTU..]);
    big.lendable = true;
    // Lent: only its headers and record go into the ring.
    assert_eq!(a.transmit(&[big]).unwrap(), 1);
    assert!(a.stats().contains(&("shm_tx_lent", 1)), "{:?}", a.stats());
    let mut got = Vec::new();
    assert_eq!(b.receive_lent(8, &mut |f, m| {
        assert_eq!(f, &head[..]);
        let l = m.lent.expect("lent");
        let mut bytes = vec![0u8; l.len()];
        // SAFETY: `bytes` holds l.len() bytes.
        unsafe { l.read(0, bytes.as_mut_ptr(), l.len()) }.unwrap();
        got = bytes;
    }).unwrap(), 1);
    assert!(got == p, "the whole payload, read at once");
    // A caller that takes no lent payloads takes frames up to the MTU:
    // this one is dropped and counted.
    assert_eq!(a.transmit(&[big]).unwrap(), 1);
    assert!(recv_all(&mut b).is_empty());
    assert!(b.stats().contains(&("shm_rx_bad_length", 1)), "{:?}", b.stats());
    // Copied, it would not fit a slot: refused, as is a lendable one on
    // a wire that does not lend.
    let mut kept = big;
    kept.lendable = false;
    let e = a.transmit(&[kept]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    let mut c = ShmDevice::open(&format!("{w},lend=off"), None).unwrap();
    assert_eq!(c.transmit(&[big]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    assert!(a.stats().contains(&("shm_tx_oversize", 1)) && c.stats().contains(&("shm_tx_oversize", 1)));
    remove_wire(&w);
}

#[test]
fn the_lending_threshold_is_set_by_name() {
    let w = wire("lendopt");
    let mut a = ShmDevice::open(&format!("{w},lend=off"), None).unwrap();
    let mut b = ShmDevice::open(&format!("{w},lend=100"), None).unwrap();
    let c = ShmDevice::open(&w, None).unwrap();
    assert_eq!(a.wire_name(), w);
    let default = if lending_possible() { LEND_MIN_DEFAULT } else { usize::MAX };
    assert_eq!((a.lend_min, b.lend_min, c.lend_min), (usize::MAX, 100, default), "from 64 KiB by default, where the kernel allows");
    assert_eq!((a.path_to(&[]).lends_from, b.path_to(&[]).lends_from), (None, Some(100)), "the path says what it lends");
    let head = frame(b.mac(), 60, 0);
    let p = vec![9u8; 40000];
    let mut f = TxFrame::new(&head);
    f.push(&p);
    f.lendable = true;
    assert_eq!(a.transmit(&[f]).unwrap(), 1);
    assert!(a.stats().contains(&("shm_tx_lent", 0)));
    for bad in [format!("{w},lend=x"), format!("{w},speed=1"), format!("{w},copy=fast"), ",lend=off".into(), "a/b".into()] {
        let e = ShmDevice::open(&bad, None).err();
        assert!(e.is_some_and(|e| e.kind() == io::ErrorKind::InvalidInput), "{bad:?}");
    }
    remove_wire(&w);
}

#[test]
fn a_damaged_lent_record_is_dropped() {
    let w = wire("badlent");
    let mut a = ShmDevice::open(&format!("{w},lend=1"), None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let head = frame(b.mac(), 60, 0);
    let p = vec![1u8; 20000];
    let mut f = TxFrame::new(&head);
    f.push(&p);
    f.lendable = true;
    assert_eq!(a.transmit(&[f, f]).unwrap(), 2);
    // Spoil the first frame's piece count, and the second's address.
    let s0 = a.seg.slot(b.port, 0);
    let s1 = a.seg.slot(b.port, 1);
    // SAFETY: both slots were published and b has not taken them.
    unsafe {
        *s0.add(SLOT_PREFIX + 64 + 4) = 99;
        std::ptr::write_unaligned(s1.add(SLOT_PREFIX + 64 + 8).cast::<u64>(), 8);
    }
    assert!(recv_all(&mut b).is_empty());
    assert!(b.stats().contains(&("shm_rx_bad_length", 1)), "{:?}", b.stats());
    assert!(b.stats().contains(&("shm_rx_lent_failed", 1)), "{:?}", b.stats());
    remove_wire(&w);
}

#[test]
fn a_dead_owners_port_is_taken_again() {
    let w = wire("reuse");
    let ports: Vec<usize> = (0..3).map(|_| ShmDevice::open(&w, None).unwrap().port).collect();
    assert!(ports.iter().all(|&p| p == ports[0]), "a closed port is free again: {ports:?}");
    // A port whose owner pid no longer exists.
    let seg = Segment::open(&segment_path(&w)).unwrap();
    let c = seg.control(5);
    c.state.store(LIVE, Ordering::Release);
    c.pid.store(0x7fff_fff0, Ordering::Release);
    c.lock.store(0x7fff_fff0, Ordering::Release);
    let held: Vec<ShmDevice> = (0..6).map(|_| ShmDevice::open(&w, None).unwrap()).collect();
    assert!(held.iter().any(|d| d.port == 5), "the dead owner's port (and lock) were taken over");
    remove_wire(&w);
}

/// A process of another user (nobody, through util-linux's `setpriv`),
/// alive until dropped.
struct Stranger(std::process::Child);

impl Stranger {
    fn spawn() -> Stranger {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root (to run a process as another user with setpriv)");
        let mut child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", "echo ready; exec cat"])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("running setpriv (util-linux)");
        // It prints once it runs as nobody.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Stranger(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sets the pid of the lent record in slot `i` of port `p`'s ring (a
/// lent frame with a 60-byte header, published and not yet taken).
fn forge_lender(seg: &Segment, p: usize, i: u64, pid: u32) {
    // SAFETY: the slot was published and its owner has not taken it; the
    // record starts at SLOT_PREFIX + 64.
    unsafe { std::ptr::write_unaligned(seg.slot(p, i).add(SLOT_PREFIX + 64).cast::<u32>(), pid) };
}

#[test]
fn lent_records_of_non_members_and_other_users_are_refused_unread() {
    let w = wire("foreignlent");
    let mut a = ShmDevice::open(&format!("{w},lend=1"), None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let stranger = Stranger::spawn();
    // A port claimed in the stranger's name, as a writer of the segment
    // could make one: a member, but not of our uid.
    let seg = Segment::open(&segment_path(&w)).unwrap();
    let forged = seg.control(PORTS - 1);
    forged.pid.store(stranger.pid(), Ordering::Release);
    forged.state.store(LIVE, Ordering::Release);
    // A process of our uid that is no member.
    let mut outsider = std::process::Command::new("cat").stdin(std::process::Stdio::piped()).spawn().unwrap();
    let head = frame(b.mac(), 60, 0);
    let p = vec![5u8; 20000];
    let mut f = TxFrame::new(&head);
    f.push(&p);
    f.lendable = true;
    assert_eq!(a.transmit(&[f, f, f, f]).unwrap(), 4);
    forge_lender(&seg, b.port, 0, stranger.pid());
    forge_lender(&seg, b.port, 1, outsider.id());
    forge_lender(&seg, b.port, 3, stranger.pid());
    let mut lenders = Vec::new();
    assert_eq!(b.receive_lent(8, &mut |_, m| lenders.push(m.lent.unwrap().pid)).unwrap(), 1, "slots 0, 1 and 3 refused");
    assert_eq!(lenders, [std::process::id()], "slot 2, a's own record, is handed out");
    assert!(b.stats().contains(&("shm_rx_lent_refused", 3)), "{:?}", b.stats());
    // The plain receive path reads lent payloads in itself: refused too.
    assert_eq!(a.transmit(&[f, f]).unwrap(), 2);
    forge_lender(&seg, b.port, 4, stranger.pid());
    let got = recv_all(&mut b);
    assert_eq!(got.len(), 1, "slot 5, a's own record, is read");
    assert_eq!(got[0].len(), 60 + p.len());
    assert!(b.stats().contains(&("shm_rx_lent_refused", 4)), "{:?}", b.stats());
    assert!(b.stats().contains(&("shm_rx_lent_failed", 0)), "refused records are never read: {:?}", b.stats());
    forged.state.store(FREE, Ordering::Release);
    let _ = outsider.kill();
    let _ = outsider.wait();
    remove_wire(&w);
}

#[test]
fn a_doorbell_that_is_not_an_eventfd_is_not_written() {
    let w = wire("notabell");
    let mut a = ShmDevice::open(&w, None).unwrap();
    // A port of ours (our pid: a member of our uid) whose doorbell names a
    // file of ours: ringing it would write 8 bytes there.
    let path = format!("/tmp/via-shm-notabell-{}", std::process::id());
    let file = std::fs::File::create(&path).unwrap();
    let seg = Segment::open(&segment_path(&w)).unwrap();
    let forged = seg.control(PORTS - 1);
    let target = MacAddr([2, 0, 0, 0, 0, 0x42]);
    forged.mac.store(mac_word(target), Ordering::Release);
    forged.pid.store(std::process::id(), Ordering::Release);
    forged.wake_fd.store(file.as_raw_fd() as u32, Ordering::Release);
    forged.sleepers.store(1, Ordering::Release); // asleep (one sleeper): a frame rings it
    forged.state.store(LIVE, Ordering::Release);
    seg.header().epoch.fetch_add(1, Ordering::AcqRel);
    let f = frame(target, 60, 1);
    assert_eq!(a.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "nothing written to the file");
    assert!(a.stats().contains(&("shm_doorbell_failed", 1)), "{:?}", a.stats());
    forged.state.store(FREE, Ordering::Release);
    let _ = std::fs::remove_file(&path);
    remove_wire(&w);
}

#[test]
fn a_frame_copied_in_two_ranges_is_the_frame_copied_whole() {
    // The append writes what lies past the slot's first line first, then
    // the rest: every split point, inside the header or a piece or between
    // them, must give the same bytes as one copy.
    let header: Vec<u8> = (0..78).collect();
    let (a, b): (Vec<u8>, Vec<u8>) = ((100..137).collect(), (200..227).collect());
    let mut f = TxFrame::new(&header);
    assert!(f.push(&a) && f.push(&b));
    let mut whole = vec![0u8; f.len()];
    // SAFETY: `whole` holds f.len() bytes and is the frame's own buffer.
    unsafe { f.copy_to(whole.as_mut_ptr()) };
    for split in 0..=f.len() + 1 {
        let mut two = vec![0u8; f.len()];
        // SAFETY: as above.
        unsafe {
            copy_frame_range(&f, split, usize::MAX, two.as_mut_ptr());
            copy_frame_range(&f, 0, split, two.as_mut_ptr());
        }
        assert_eq!(two, whole, "split at {split}");
    }
}

#[test]
fn a_frame_written_to_a_slot_reads_back_whole() {
    // The slot writer has a way of its own for headers that fill the
    // first line's share (every frame the engine builds) and the general
    // one for shorter ones: both, with no, one and several pieces, give
    // the frame's bytes and its length after the length word.
    // Short pieces, and pieces long enough to be copied the chosen way,
    // each way.
    let short: Vec<Vec<u8>> = vec![(100..137).collect(), (200..201).collect(), (50..90).collect()];
    let long: Vec<Vec<u8>> = vec![(0..payload_copy::STREAM_MIN + 5).map(|i| (i % 251) as u8).collect(), (0..3).collect(), (0..payload_copy::STREAM_MIN).map(|i| (i % 13) as u8).collect()];
    let ways = [Policy::Timed, Policy::Always(payload_copy::Way::Cached), Policy::Always(payload_copy::Way::Streaming)];
    for (header_len, pieces, policy) in [14, 47, 48, 78].into_iter().flat_map(|h| [(&short, Policy::Timed)].into_iter().chain(ways.iter().map(|&w| (&long, w))).map(move |(p, w)| (h, p, w))) {
        let mut copy = PayloadCopy::new(policy);
        let header: Vec<u8> = (0..header_len as u8).collect();
        for n in 0..=pieces.len() {
            let mut f = TxFrame::new(&header);
            for p in &pieces[..n] {
                assert!(f.push(p));
            }
            let mut whole = vec![0u8; f.len()];
            // SAFETY: `whole` holds f.len() bytes and is the frame's own buffer.
            unsafe { f.copy_to(whole.as_mut_ptr()) };
            let mut slot = vec![0xeeu8; 8 + f.len() + 8];
            // SAFETY: the slot holds the length word, the frame and spare bytes.
            let streamed_before = copy.streamed;
            unsafe { write_frame(&f, slot.as_mut_ptr(), &mut copy, &payload_copy::ReadCosts::default()) };
            let word = u64::from_le_bytes(slot[..8].try_into().unwrap());
            assert_eq!(word & !STREAMED, f.len() as u64, "header {header_len}, {n} pieces");
            assert_eq!(word & STREAMED != 0, copy.streamed > streamed_before, "the length word says it was streamed");
            assert_eq!(&slot[8..8 + f.len()], &whole[..], "header {header_len}, {n} pieces");
            assert!(slot[8 + f.len()..].iter().all(|&b| b == 0xee), "nothing past the frame");
        }
        // (A header shorter than the slot's first line, which no frame
        // of the engine's has, takes the plain path of `copy_frame_range`.)
        if policy == Policy::Always(payload_copy::Way::Streaming) && cfg!(target_arch = "x86_64") && header_len >= 64 - SLOT_PREFIX {
            assert!(copy.streamed > 0, "the long pieces went streaming (header {header_len})");
        }
    }
}

#[test]
fn frames_to_one_identity_go_by_their_endpoint_whatever_came_before() {
    // Two processes of one host share its identity and are told apart by
    // the endpoint their filters accept. The route of the last frame is
    // reused only for a frame that agrees on what decides it: frames that
    // differ in the endpoint alone, or in other bytes alone, alternate.
    let w = wire("endpoints");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let host = MacAddr([2, 7, 7, 7, 7, 7]);
    let mut p = ShmDevice::open(&w, Some(host)).unwrap();
    let mut q = ShmDevice::open(&w, Some(host)).unwrap();
    p.set_filter(RxFilter { ethertype: 0x88b5, offset: 18, accept: [5, 0] }).unwrap();
    q.set_filter(RxFilter { ethertype: 0x88b5, offset: 18, accept: [6, 0] }).unwrap();
    let to = |ep: u32, fill: u8| {
        let mut f = frame(host, 80, fill);
        f[18..22].copy_from_slice(&ep.to_be_bytes());
        f
    };
    let (p1, q1, p2, p3, nobody) = (to(5, 1), to(6, 1), to(5, 2), to(5, 3), to(7, 1));
    for f in [&p1, &q1, &p2, &nobody, &p3] {
        assert_eq!(a.transmit(&[TxFrame::new(f)]).unwrap(), 1);
    }
    assert_eq!(recv_all(&mut p), vec![p1, p2, p3]);
    assert_eq!(recv_all(&mut q), vec![q1]);
    assert!(a.stats().contains(&("shm_tx_no_port", 1)), "the endpoint nobody accepts");
    remove_wire(&w);
}

#[test]
fn a_boxed_message_reaches_its_port_with_the_senders_placed_word() {
    use via_device::BoxRepr;
    let w = wire("boxed");
    let mut a = ShmDevice::open(&w, None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let route = a.box_route(&frame(b.mac(), 64, 0), 5).expect("one port takes b's frames");
    assert!(a.box_route(&frame(MacAddr::BROADCAST, 64, 0), 5).is_none(), "broadcast: no box");
    assert!(a.box_route(&frame(MacAddr([2, 9, 9, 9, 9, 9]), 64, 0), 5).is_none(), "nobody there: no box");
    let mut h = [0u8; BOX_HEADER_LEN];
    BoxRepr { src_vi: 5, len: 3, ..BoxRepr::default() }.emit(&mut h);
    assert!(a.transmit_boxed(&route, &h, b"abc").unwrap());
    let mut got = Vec::new();
    b.receive_lent(5, &mut |f, meta| got.push((f.to_vec(), meta.boxed))).unwrap();
    assert_eq!(got.len(), 1);
    let (bytes, placed) = &got[0];
    let (repr, payload) = BoxRepr::parse(bytes).unwrap();
    assert_eq!((repr.src_vi, repr.src_port as usize, payload), (5, a.port, &b"abc"[..]));
    // The receiver's store is what the sender's route reads.
    placed.expect("a boxed message comes with its placed word").set(9, 1);
    assert_eq!(route.placed.placed(9), Some(1));
    // Plain receive is for frames: a boxed message is not one.
    assert!(a.transmit_boxed(&route, &h, b"abc").unwrap());
    assert!(recv_all(&mut b).is_empty());
    // A large payload goes the way the copy's choice says, streamed here,
    // whole, and its receiver times it.
    let mut s = ShmDevice::open(&format!("{w},copy=streaming"), None).unwrap();
    let sroute = s.box_route(&frame(b.mac(), 64, 0), 6).unwrap();
    let large: Vec<u8> = (0..payload_copy::STREAM_MIN + 9).map(|i| (i % 241) as u8).collect();
    let mut lh = [0u8; BOX_HEADER_LEN];
    BoxRepr { src_vi: 6, len: large.len() as u32, ..BoxRepr::default() }.emit(&mut lh);
    for _ in 0..16 {
        assert!(s.transmit_boxed(&sroute, &lh, &large).unwrap());
        let mut got = Vec::new();
        b.receive_lent(5, &mut |f, _| got.push(f.to_vec())).unwrap();
        assert_eq!(got.len(), 1);
        assert!(BoxRepr::parse(&got[0]).unwrap().1 == &large[..], "the streamed boxed payload arrived changed");
    }
    if cfg!(target_arch = "x86_64") {
        assert!(s.stats().contains(&("shm_tx_streamed", 16)));
        assert!(b.seg.control(b.port).read_costs.load().get(Way::Streaming) > 0);
    }
    // Longer than a slot holds: refused, nothing written.
    let big = vec![0u8; MTU + ETH_HEADER_LEN];
    assert_eq!(a.transmit_boxed(&route, &h, &big).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    assert!(a.stats().contains(&("shm_tx_boxed", 2)));
    remove_wire(&w);
}

#[test]
fn large_payloads_streamed_into_the_ring_arrive_whole_and_their_receiver_times_them() {
    let w = wire("stream");
    let mut a = ShmDevice::open(&format!("{w},copy=streaming"), None).unwrap();
    let mut b = ShmDevice::open(&w, None).unwrap();
    let header = frame(b.mac(), 64, 0);
    let payloads: Vec<Vec<u8>> = (0..20u8).map(|k| (0..payload_copy::STREAM_MIN + 3 + usize::from(k)).map(|i| i as u8 ^ k).collect()).collect();
    for p in &payloads {
        let mut f = TxFrame::new(&header);
        assert!(f.push(p));
        assert_eq!(a.transmit(&[f]).unwrap(), 1);
        let got = recv_all(&mut b);
        assert_eq!(got.len(), 1);
        assert_eq!(&got[0][..64], &header[..]);
        assert!(got[0][64..] == p[..], "a streamed payload of {} bytes arrived changed", p.len());
    }
    if cfg!(target_arch = "x86_64") {
        assert!(a.stats().contains(&("shm_tx_streamed", 20)));
        // What b says to its senders: streamed frames timed; none came
        // through the cache.
        let costs = b.seg.control(b.port).read_costs.load();
        assert!(costs.get(Way::Streaming) > 0 && costs.get(Way::Cached) == 0, "{costs:?}");
    }
    remove_wire(&w);
}

#[test]
fn small_frames_cross_whole_with_the_cache_line_hints_on_or_off() {
    let w = wire("hints");
    let mut on = ShmDevice::open(&w, None).unwrap();
    let mut off = ShmDevice::open(&format!("{w},hints=off"), None).unwrap();
    assert!(!off.hints.any() && !LineHints::detect(false).any(), "hints=off turns both off");
    // Every size around the hinted lines' edges (a slot's prefix is 16
    // bytes: one, two and three lines end at frames of 48, 112 and 176),
    // over more than a ring's slots, so that hinted slots are used again.
    let mut sent = 0;
    for round in 0..3u8 {
        for len in [ETH_HEADER_LEN, 48, 49, 112, 113, 176, 177, 300] {
            let f = frame(off.mac(), len, round.wrapping_add(len as u8));
            let g = frame(on.mac(), len, round ^ len as u8);
            for _ in 0..SLOTS / 16 {
                assert_eq!(on.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
                assert_eq!(off.transmit(&[TxFrame::new(&g)]).unwrap(), 1);
                assert_eq!(recv_all(&mut off), vec![f.clone()], "{len} bytes, hinted");
                assert_eq!(recv_all(&mut on), vec![g.clone()], "{len} bytes, not hinted");
                sent += 1;
            }
        }
    }
    assert!(sent > SLOTS, "each ring went round ({sent} frames, {SLOTS} slots)");
    let e = ShmDevice::open(&format!("{w},hints=maybe"), None).expect_err("a bad value is refused");
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("hints=maybe"), "{e}");
    remove_wire(&w);
}
