//! The VIA hosts A and B of a [`Segment`], opened in this process (each
//! device opened from inside its host's namespace, so that its frames
//! cross the hub), and the connection the attacks aim at: a reliable VI
//! from A to B with RDMA write and read enabled and registered memory on
//! both sides.
//!
//! [`HostOptions::key`] is where frame authentication comes in: a host
//! opened with a key has the cluster secret at that path (the engine reads
//! it from `VIA_SECRET` when the device opens); without one, it runs the
//! unauthenticated wire.

use super::segment::{Segment, Station};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use via_user::{Counters, Descriptor, MacAddr, MemAttributes, MemoryRegion, Nic, Op, Ptag, Reliability, Vi, ViAttributes, ViPhase};

/// Bytes of registered memory on each side.
pub const MEM: usize = 64 << 10;
/// How long any one step of a test may take before it fails.
pub const STEP: Duration = Duration::from_secs(10);
/// The server's discriminator.
pub const SERVICE: &[u8] = b"third-host";

/// How a host is set up.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostOptions<'a> {
    /// The cluster secret file (frame authentication), or none.
    pub key: Option<&'a Path>,
}

/// Opening engines reads the environment; one at a time, so that a key
/// meant for one host is never seen by another.
static OPENING: Mutex<()> = Mutex::new(());

/// One opened VIA NIC on a host of the segment.
pub struct Host {
    pub nic: Nic,
    pub ptag: Ptag,
    pub mac: MacAddr,
}

impl Host {
    /// Opens host `s`'s device (with the background progress thread).
    pub fn open(seg: &Segment, s: Station, opts: HostOptions) -> Host {
        let name = seg.device(s);
        let dev = seg.within(s, || via_user::open_device(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"));
        let nic = {
            let _one = OPENING.lock().unwrap_or_else(|p| p.into_inner());
            match opts.key {
                Some(k) => std::env::set_var(via_kernel_agent::auth::SECRET_ENV, k),
                None => std::env::remove_var(via_kernel_agent::auth::SECRET_ENV),
            }
            let nic = Nic::with_device(&name, dev, via_user::Config::default());
            std::env::remove_var(via_kernel_agent::auth::SECRET_ENV);
            nic.unwrap_or_else(|e| panic!("starting the engine on {name}: {e}"))
        };
        let ptag = nic.create_ptag().expect("creating a protection tag");
        let mac = nic.mac();
        Host { nic, ptag, mac }
    }

    /// The engine's counters now.
    pub fn counters(&self) -> Counters {
        self.nic.counters()
    }

    /// Memory of `MEM` bytes with both RDMA enable bits, filled with `fill`.
    pub fn memory(&self, fill: u8) -> MemoryRegion {
        let m = MemoryRegion::new(&self.nic, MEM, 4096, MemAttributes { ptag: self.ptag, enable_rdma_write: true, enable_rdma_read: true }).expect("registering memory");
        m.write(0, &vec![fill; MEM]).expect("filling memory");
        m
    }

    /// A reliable VI with RDMA write and read enabled.
    pub fn vi(&self) -> Vi {
        let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag: self.ptag, enable_rdma_write: true, enable_rdma_read: true };
        self.nic.create_vi(&attrs, None, None).expect("creating a VI")
    }

    /// A descriptor for `op` over `range` of `mem`.
    pub fn descriptor(&self, op: Op, mem: &MemoryRegion, range: std::ops::Range<usize>) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).expect("making a descriptor");
        d.set_op(op, &[(mem, range)], None, false).expect("filling in a descriptor");
        d
    }

    /// Drives the engine until `cond` holds of the counters; panics
    /// naming `what` after [`STEP`]. (A wait on a condition, no sleep.)
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut(&Counters) -> bool) -> Counters {
        let deadline = Instant::now() + STEP;
        loop {
            let c = self.counters();
            if cond(&c) {
                return c;
            }
            assert!(Instant::now() < deadline, "{what}: not within {STEP:?}; counters {:?}", c.pairs());
            self.nic.progress();
            std::thread::yield_now();
        }
    }

    /// The phase of VI `vi` of this host.
    pub fn phase(&self, vi: u16) -> ViPhase {
        self.nic.raw().vi_query(vi).expect("querying a VI").0
    }
}

/// A and B connected: A is the client, B the server.
pub struct Connected {
    pub a: Host,
    pub b: Host,
    pub vi_a: Vi,
    pub vi_b: Vi,
    pub mem_a: MemoryRegion,
    pub mem_b: MemoryRegion,
}

impl Connected {
    /// Opens A and B on the segment and connects them.
    pub fn new(seg: &Segment, opts: HostOptions) -> Connected {
        let (a, b) = (Host::open(seg, Station::A, opts), Host::open(seg, Station::B, opts));
        let (mem_a, mem_b) = (a.memory(0xAA), b.memory(0xBB));
        let (mut vi_a, vi_b) = (a.vi(), b.vi());
        let server = &b;
        let vi_b = std::thread::scope(|s| {
            let accepted = s.spawn(move || {
                let req = server.nic.connect_wait(SERVICE, Some(STEP)).expect("B waiting for A's request");
                server.nic.accept(&req, &vi_b).expect("B accepting");
                vi_b
            });
            vi_a.connect(b.mac, SERVICE, Some(STEP)).expect("A connecting to B");
            accepted.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        Connected { a, b, vi_a, vi_b, mem_a, mem_b }
    }

    /// A writes `data` (through its memory at offset 0) into B's memory
    /// at `at` by RDMA, and sees it complete.
    pub fn rdma_write(&mut self, data: &[u8], at: usize) {
        self.mem_a.write(0, data).unwrap();
        let remote = self.mem_b.remote(at..at + data.len()).unwrap();
        let d = self.a.descriptor(Op::RdmaWrite(remote), &self.mem_a, 0..data.len());
        self.vi_a.post_send(d).unwrap();
        self.vi_a.send_wait(Some(STEP)).expect("A's RDMA write").check_ok().expect("A's RDMA write");
    }

    /// A reads `len` bytes of B's memory from `at` into its own at
    /// offset 0 by RDMA, and sees it complete.
    pub fn rdma_read(&mut self, at: usize, len: usize) {
        let remote = self.mem_b.remote(at..at + len).unwrap();
        let d = self.a.descriptor(Op::RdmaRead(remote), &self.mem_a, 0..len);
        self.vi_a.post_send(d).unwrap();
        self.vi_a.send_wait(Some(STEP)).expect("A's RDMA read").check_ok().expect("A's RDMA read");
    }

    /// A reads `len` bytes of B's memory from `at`, `n` times, as fast as
    /// its send queue lets it.
    pub fn rdma_reads(&mut self, at: usize, len: usize, n: usize) {
        const BURST: usize = 64;
        let remote = self.mem_b.remote(at..at + len).unwrap();
        let mut left = n;
        while left > 0 {
            let k = left.min(BURST);
            for _ in 0..k {
                let d = self.a.descriptor(Op::RdmaRead(remote), &self.mem_a, 0..len);
                self.vi_a.post_send(d).unwrap();
            }
            for _ in 0..k {
                self.vi_a.send_wait(Some(STEP)).expect("A's RDMA read").check_ok().expect("A's RDMA read");
            }
            left -= k;
        }
    }

    /// B posts a receive into its memory `range`.
    pub fn post_recv_b(&mut self, range: std::ops::Range<usize>) {
        let d = self.b.descriptor(Op::SendRecv, &self.mem_b, range);
        self.vi_b.post_recv(d).unwrap();
    }

    /// A sends `data` (through its memory at offset 0); returns when A's
    /// send completed (successfully).
    pub fn send(&mut self, data: &[u8]) {
        self.mem_a.write(0, data).unwrap();
        let d = self.a.descriptor(Op::SendRecv, &self.mem_a, 0..data.len());
        self.vi_a.post_send(d).unwrap();
        self.vi_a.send_wait(Some(STEP)).expect("A's send").check_ok().expect("A's send");
    }

    /// B's next completed receive: (length, bytes of B's memory `range`).
    pub fn recv_b(&mut self, range: std::ops::Range<usize>) -> (u32, Vec<u8>) {
        let d = self.vi_b.recv_wait(Some(STEP)).expect("B's receive");
        d.check_ok().expect("B's receive");
        (d.length(), self.mem_b.to_vec(range).unwrap())
    }
}

/// A cluster secret file for A and B (mode 0600, in a private directory),
/// removed on drop.
pub struct SecretFile {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl SecretFile {
    /// A fresh random secret; `name` keeps concurrent tests apart.
    pub fn new(name: &str) -> SecretFile {
        let dir = std::env::temp_dir().join(format!("via-third-host-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let path = dir.join("secret");
        via_kernel_agent::auth::create_secret_file(&path).unwrap_or_else(|e| panic!("creating the secret {}: {e}", path.display()));
        SecretFile { dir, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
