//! A descriptor posted again unchanged is not checked against the
//! registration table again: the engine keeps what its last post found
//! (`engine::post::Kept`) and takes it when the descriptor still says the
//! same. These tests pin when that may happen and when it must not (its
//! contents changed, through its methods or behind them as a C program
//! changes them; memory was deregistered; it goes to another VI), over the
//! in-process loopback device. No root needed.

use std::time::Duration;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, Vi, ViAttributes};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

struct Host {
    nic: Nic,
    ptag: via_user::Ptag,
}

impl Host {
    fn new(wire: &str) -> Host {
        let nic = Nic::open(&format!("loop:{wire}")).unwrap();
        let ptag = nic.create_ptag().unwrap();
        Host { nic, ptag }
    }
    fn vi(&self) -> Vi {
        let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 16, ptag: self.ptag, enable_rdma_write: false, enable_rdma_read: false };
        self.nic.create_vi(&a, None, None).unwrap()
    }
    fn region(&self, len: usize) -> MemoryRegion {
        MemoryRegion::new(&self.nic, len, 4096, MemAttributes { ptag: self.ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap()
    }
    fn desc(&self, r: &MemoryRegion, off: usize, len: usize) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set(&[(r, off..off + len)], None).unwrap();
        d
    }
    fn kept(&self) -> u64 {
        self.nic.counters().posts_kept
    }
}

/// A connected pair of VIs, `a` on `ha` and `b` on `hb`, on one wire.
fn pair(wire: &str, disc: &[u8]) -> (Host, Vi, Host, Vi) {
    let (ha, hb) = (Host::new(wire), Host::new(wire));
    let (a, b) = connect(&ha, &hb, disc);
    (ha, a, hb, b)
}

/// A new VI on each host, connected.
fn connect(ha: &Host, hb: &Host, disc: &[u8]) -> (Vi, Vi) {
    let (mut a, b) = (ha.vi(), hb.vi());
    let (nic, mac, disc2) = (hb.nic.clone(), hb.nic.mac(), disc.to_vec());
    let server = std::thread::spawn(move || {
        let req = nic.connect_wait(&disc2, T).unwrap();
        nic.accept(&req, &b).unwrap();
        b
    });
    a.connect_retrying(mac, disc, T.unwrap()).expect("connect");
    (a, server.join().unwrap())
}

/// Sends with `d` from `a` into the receive `r` posted on `b`; returns the
/// bytes that arrived and both descriptors.
fn send(a: &mut Vi, d: Descriptor, b: &mut Vi, r: Descriptor, rbuf: &MemoryRegion) -> (Vec<u8>, Descriptor, Descriptor) {
    b.post_recv(r).unwrap();
    a.post_send(d).unwrap();
    let r = b.recv_wait(T).unwrap();
    r.check_ok().unwrap();
    let got = rbuf.to_vec(0..r.length() as usize).unwrap();
    let d = a.send_wait(T).unwrap();
    d.check_ok().unwrap();
    (got, d, r)
}

#[test]
fn an_unchanged_descriptor_posted_again_is_not_checked_again_and_a_changed_one_is() {
    let (ha, mut a, hb, mut b) = pair("kept-1", b"k1");
    let (sbuf, other, rbuf) = (ha.region(4096), ha.region(4096), hb.region(4096));
    sbuf.write(0, &[1u8; 100]).unwrap();
    other.write(200, &[2u8; 50]).unwrap();
    let (d, r) = (ha.desc(&sbuf, 0, 100), hb.desc(&rbuf, 0, 4096));
    let (k0a, k0b) = (ha.kept(), hb.kept());
    let (got, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![1u8; 100]);
    assert_eq!((ha.kept(), hb.kept()), (k0a, k0b), "first posts are checked");

    // Unchanged (new bytes in the same segment are the payload's business,
    // read at transmit): both posts take what the first found.
    sbuf.write(0, &[3u8; 100]).unwrap();
    let (got, mut d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![3u8; 100]);
    assert_eq!((ha.kept(), hb.kept()), (k0a + 1, k0b + 1), "unchanged descriptors are not checked again");

    // Changed: another region, another length. What arrives is what the
    // descriptor says now, and it was checked again.
    d.set(&[(&other, 200..250)], None).unwrap();
    let (got, d, _r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![2u8; 50], "the changed descriptor's segment is what goes");
    assert_eq!(d.length(), 50);
    assert_eq!(ha.kept(), k0a + 1, "a changed descriptor is checked again");
}

#[test]
fn a_deregistration_between_posts_has_the_descriptor_checked_again() {
    let (ha, mut a, hb, mut b) = pair("kept-2", b"k2");
    let (sbuf, rbuf) = (ha.region(4096), hb.region(4096));
    sbuf.write(0, &[7u8; 64]).unwrap();
    let (d, r) = (ha.desc(&sbuf, 0, 64), hb.desc(&rbuf, 0, 4096));
    let (_, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    let k = ha.kept();
    // Any deregistration may have been of the descriptor's memory: what
    // was found before no longer stands.
    drop(ha.region(4096));
    let (got, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![7u8; 64]);
    assert_eq!(ha.kept(), k, "checked again after a deregistration");
    let (_, _d, _r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(ha.kept(), k + 1, "and kept again after that check");
}

#[test]
fn a_descriptor_posted_on_another_vi_is_checked_there() {
    let (ha, mut a, hb, mut b) = pair("kept-3", b"k3");
    let (sbuf, rbuf) = (ha.region(4096), hb.region(4096));
    sbuf.write(0, &[9u8; 32]).unwrap();
    let (d, r) = (ha.desc(&sbuf, 0, 32), hb.desc(&rbuf, 0, 4096));
    let (_, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    // A second connection on the same NICs: the descriptor moves to it.
    let (mut a2, mut b2) = connect(&ha, &hb, b"k3b");
    let k = (ha.kept(), hb.kept());
    let (got, _d, _r) = send(&mut a2, d, &mut b2, r, &rbuf);
    assert_eq!(got, vec![9u8; 32]);
    assert_eq!((ha.kept(), hb.kept()), k, "another VI checks it anew");
}

#[test]
fn a_descriptor_rewritten_behind_its_methods_is_read_as_it_is_now() {
    let (ha, mut a, hb, mut b) = pair("kept-4", b"k4");
    let (sbuf, rbuf) = (ha.region(4096), hb.region(4096));
    sbuf.write(0, &[5u8; 100]).unwrap();
    sbuf.write(1000, &[6u8; 100]).unwrap();
    let (d, r) = (ha.desc(&sbuf, 0, 100), hb.desc(&rbuf, 0, 4096));
    let (_, d, r) = send(&mut a, d, &mut b, r, &rbuf);
    let k = ha.kept();
    // As a C program would: the first data segment's address (its first 8
    // bytes, after the 32-byte control segment) moved 1000 bytes on, in
    // the descriptor's memory directly; nothing else changes.
    // SAFETY: the descriptor is ours and not posted; its first data
    // segment lies 32 bytes in.
    unsafe {
        let at = (d.addr() + 32) as *mut u64;
        at.write_volatile(at.read_volatile() + 1000);
    }
    let (got, _d, _r) = send(&mut a, d, &mut b, r, &rbuf);
    assert_eq!(got, vec![6u8; 100], "the segment's new address is what goes");
    assert_eq!(ha.kept(), k, "a rewritten descriptor is checked again");
}
