//! RDMA through the engine over the in-process loopback device: writes
//! with and without immediate data, multi-frame reads, QFENCE, and a
//! protection violation. The two-namespace conformance suite in `tests/`
//! covers the same rules across real processes; this one is quick to debug.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, RemoteBuffer, Vi, ViAttributes, ViPhase};
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
    fn vi(&self, level: Reliability, rdma: bool) -> Vi {
        let a = ViAttributes { reliability: level, max_transfer_size: 1 << 20, ptag: self.ptag, enable_rdma_write: rdma, enable_rdma_read: rdma && level != Reliability::Unreliable };
        self.nic.create_vi(&a, None, None).unwrap()
    }
    fn region(&self, len: usize, rdma: bool) -> MemoryRegion {
        MemoryRegion::new(&self.nic, len, 4096, MemAttributes { ptag: self.ptag, enable_rdma_write: rdma, enable_rdma_read: rdma }).unwrap()
    }
    fn desc(&self, op: Op, r: &MemoryRegion, off: usize, len: usize, imm: Option<u32>, fence: bool) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set_op(op, &[(r, off..off + len)], imm, fence).unwrap();
        d
    }
}

fn data(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// A target exposing a 256 KiB region (filled with `data(7, ..)`, canary
/// pages of 0xAA around an RDMA-enabled middle) to a client; `body` runs
/// on the client with the connected VI and the remote buffer.
fn with_target(wire: &str, target_enabled: bool, body: impl FnOnce(&Host, &mut Vi, RemoteBuffer, &mpsc::Sender<()>)) -> (Vec<u8>, Vec<via_user::AsyncError>) {
    let server = Host::new(wire);
    let client = Host::new(wire);
    let smac = server.nic.mac();
    let (rb_tx, rb_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        let buf = server.region(256 << 10, target_enabled);
        buf.write(0, &data(7, 256 << 10)).unwrap();
        let mut vi = server.vi(Reliability::ReliableReception, true);
        let rbuf = server.region(4096, false);
        for _ in 0..4 {
            vi.post_recv(server.desc(Op::SendRecv, &rbuf, 0, 4096, None, false)).unwrap();
        }
        let req = server.nic.connect_wait(b"rdma", T).unwrap();
        server.nic.accept(&req, &vi).unwrap();
        rb_tx.send(buf.remote(0..256 << 10).unwrap()).unwrap();
        // Serve until the client is done (the progress thread answers reads).
        done_rx.recv().unwrap();
        let mut got = Vec::new();
        while let Ok(Some(d)) = vi.recv_done() {
            got.push((d.status(), d.immediate(), d.length()));
        }
        (buf.to_vec(0..256 << 10).unwrap(), server.nic.take_async_errors(), got)
    });
    let mut vi = client.vi(Reliability::ReliableReception, true);
    vi.connect_retrying(smac, b"rdma", T.unwrap()).unwrap();
    let rb = rb_rx.recv().unwrap();
    body(&client, &mut vi, rb, &done_tx);
    let _ = done_tx.send(());
    let (mem, errs, _) = t.join().unwrap();
    (mem, errs)
}

#[test]
fn rdma_write_lands_in_remote_memory() {
    let (mem, errs) = with_target("w", true, |c, vi, rb, _| {
        let src = c.region(100_000, false);
        src.write(0, &data(1, 100_000)).unwrap();
        vi.post_send(c.desc(Op::RdmaWrite(rb.offset(1000)), &src, 0, 100_000, None, false)).unwrap();
        let d = vi.send_wait(T).unwrap();
        d.check_ok().unwrap();
        assert_eq!(d.status() & status::OP_MASK, status::OP_RDMA_WRITE);
    });
    assert!(errs.is_empty());
    assert_eq!(&mem[1000..101_000], &data(1, 100_000)[..]);
    assert_eq!(&mem[..1000], &data(7, 256 << 10)[..1000]);
}

#[test]
fn rdma_read_fetches_remote_memory() {
    with_target("r", true, |c, vi, rb, _| {
        let dst = c.region(200_000, false);
        vi.post_send(c.desc(Op::RdmaRead(rb.offset(5)), &dst, 0, 200_000, None, false)).unwrap();
        let d = vi.send_wait(T).unwrap();
        d.check_ok().unwrap();
        assert_eq!(d.status() & status::OP_MASK, status::OP_RDMA_READ);
        assert_eq!(d.length(), 200_000);
        assert_eq!(dst.to_vec(0..200_000).unwrap(), data(7, 256 << 10)[5..200_005].to_vec());
    });
}

#[test]
fn fenced_send_waits_for_earlier_read() {
    with_target("f", true, |c, vi, rb, _| {
        let dst = c.region(65536, false);
        let src = c.region(64, false);
        vi.post_send(c.desc(Op::RdmaRead(rb), &dst, 0, 65536, None, false)).unwrap();
        vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0, 64, None, true)).unwrap();
        vi.send_wait(T).unwrap().check_ok().unwrap();
        vi.send_wait(T).unwrap().check_ok().unwrap();
        // The read saw the memory before the fenced write changed it.
        assert_eq!(dst.to_vec(0..64).unwrap(), data(7, 64));
    });
}

#[test]
fn rdma_write_outside_enabled_memory_is_refused() {
    let (mem, errs) = with_target("p", false, |c, vi, rb, _| {
        let src = c.region(4096, false);
        vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0, 4096, None, false)).unwrap();
        let d = vi.send_wait(T).unwrap();
        assert_ne!(d.errors() & status::RDMA_PROT_ERROR, 0, "status {:#x}", d.status());
        assert_eq!(vi.state(), ViPhase::Error);
    });
    assert_eq!(mem, data(7, 256 << 10), "the target's memory is untouched");
    assert!(errs.iter().any(|e| e.kind == via_user::AsyncErrorKind::RdmaWriteProt), "{errs:?}");
}

#[test]
fn many_rdma_writes_in_flight() {
    with_target("many", true, |c, vi, rb, _| {
        let src = c.region(4096, false);
        let mut spare: Vec<Descriptor> = Vec::new();
        let (mut posted, mut done) = (0, 0);
        while done < 2000 {
            while posted < 2000 && posted - done < 32 {
                let d = spare.pop().unwrap_or_else(|| c.desc(Op::RdmaWrite(rb), &src, 0, 4096, None, false));
                vi.post_send(d).unwrap();
                posted += 1;
            }
            let d = vi.send_wait(T).unwrap_or_else(|e| panic!("after {done} of {posted}: {e}; counters {:?}", c.nic.counters()));
            d.check_ok().unwrap();
            spare.push(d);
            done += 1;
        }
    });
}

/// A target's read responses carry its ACK of the requests, so serving
/// reads sends no ACK frames of its own (one was owed every 32 requests,
/// and went out beside the responses that had already carried it).
#[test]
fn read_responses_carry_the_ack_so_no_ack_frame_follows() {
    with_target("ackr", true, |c, vi, rb, _| {
        let dst = c.region(16 * 32, false);
        let before = c.nic.counters().rx_frames;
        for round in 0..4 {
            for i in 0..16 {
                vi.post_send(c.desc(Op::RdmaRead(rb.offset((round * 512 + i * 32) as u64)), &dst, i * 32, 32, None, false)).unwrap();
            }
            for _ in 0..16 {
                vi.send_wait(T).unwrap().check_ok().unwrap();
            }
            assert_eq!(dst.to_vec(0..512).unwrap(), data(7, 256 << 10)[round * 512..round * 512 + 512].to_vec());
        }
        let got = c.nic.counters().rx_frames - before;
        assert_eq!(got, 64, "64 reads, 64 frames back (their responses)");
    });
}
