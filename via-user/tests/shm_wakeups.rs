//! Over the shared-memory wire nobody makes a system call to wake a peer
//! that spins: a ping-pong of 2,000 messages whose waits spin and that no
//! progress thread shares rings no doorbell at all (counted by the
//! device), where a sender that rang whenever the ring had been empty rang
//! once per message. (With progress threads, each sleep of one on the
//! device is rung, rightly; how often that happens depends on how the
//! machine schedules the threads, so it is not counted here.)

use std::time::Duration;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, Vi, ViAttributes};
// The software drivers (shared memory), registered by linking them.
use via_softnic as _;

mod common;
use common::Wire;

const T: Option<Duration> = Some(Duration::from_secs(10));
const MESSAGES: usize = 2000;

struct End {
    nic: Nic,
    vi: Vi,
    mem: MemoryRegion,
    ptag: via_user::Ptag,
}

impl End {
    fn new(wire: &str) -> End {
        let nic = Nic::open(&format!("shm:{wire}")).unwrap();
        let ptag = nic.create_ptag().unwrap();
        let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 4096, ptag, enable_rdma_write: false, enable_rdma_read: false };
        let vi = nic.create_vi(&attrs, None, None).unwrap();
        let mem = MemoryRegion::new(&nic, 8192, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
        End { nic, vi, mem, ptag }
    }

    fn desc(&self, range: std::ops::Range<usize>) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set(&[(&self.mem, range)], None).unwrap();
        d
    }

    fn rung(&self) -> u64 {
        self.nic.device_counters().into_iter().find(|(k, _)| *k == "shm_doorbells_rung").map(|(_, v)| v).expect("the shm device counts its doorbells")
    }

    /// `n` messages: send one, wait for one (or the other way round).
    fn ping_pong(&mut self, n: usize, first: bool) {
        for _ in 0..n {
            if first {
                self.vi.post_send(self.desc(0..64)).unwrap();
                let r = self.vi.recv_wait(T).unwrap();
                r.check_ok().unwrap();
                self.vi.post_recv(r).unwrap();
            } else {
                let r = self.vi.recv_wait(T).unwrap();
                r.check_ok().unwrap();
                self.vi.post_recv(r).unwrap();
                self.vi.post_send(self.desc(0..64)).unwrap();
            }
            while let Some(d) = self.vi.send_done().unwrap() {
                d.check_ok().unwrap();
            }
        }
    }
}

#[test]
fn a_spinning_ping_pong_rings_no_doorbell() {
    // Waits that spin throughout, however slow the machine, and no
    // progress thread: nobody ever sleeps on the devices, so a doorbell
    // rung is one rung for nothing. (This test binary has this one test.)
    std::env::set_var("VIA_SPIN_US", "30000000");
    std::env::set_var("VIA_PROGRESS_THREAD", "0");
    let wire = Wire::new("wakeups");
    let (mut a, mut b) = (End::new(&wire.0), End::new(&wire.0));
    for e in [&mut a, &mut b] {
        for k in 0..4 {
            let d = e.desc(4096 + k * 64..4096 + (k + 1) * 64);
            e.vi.post_recv(d).unwrap();
        }
    }
    let bmac = b.nic.mac();
    let server = std::thread::spawn(move || {
        let req = b.nic.connect_wait(b"wake", T).unwrap();
        b.nic.accept(&req, &b.vi).unwrap();
        b
    });
    a.vi.connect_retrying(bmac, b"wake", T.unwrap()).unwrap();
    let mut b = server.join().unwrap();
    let before = (a.rung(), b.rung());
    let server = std::thread::spawn(move || {
        b.ping_pong(MESSAGES, false);
        b
    });
    a.ping_pong(MESSAGES, true);
    let b = server.join().unwrap();
    let rung = (a.rung() - before.0, b.rung() - before.1);
    assert_eq!(rung, (0, 0), "{MESSAGES} spinning round trips rang doorbells (every message did under the first protocol)");
}
