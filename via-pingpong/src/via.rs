//! The VIA transport of via-pingpong: a server that echoes and counts, and
//! a client that measures, both on the via-user Rust API.
//!
//! Protocol: every test starts with a 12-byte control message from the
//! client, `[op, size, count]` (little-endian u32; op 1 = latency, 2 =
//! bandwidth, 3 = end), answered by a 4-byte message from the server.
//! Latency: `count` ping-pongs of `size` bytes. Bandwidth: the client
//! streams `count` messages of `size` bytes under credit flow control (the
//! server grants `RECVS / 2` credits each time it reposted that many
//! receives, so a reliable VI never meets an empty receive queue), then the
//! server sends a 4-byte "done".
//!
//! RDMA modes (`--rdma write|read`, demo transports `via-write` and
//! `via-read`): at the start the two ends swap the address and handle of
//! their receive buffers (op 4). RDMA write latency (op 5) is the perftest
//! `ib_write_lat` pattern: each side writes `size` bytes into the other's
//! buffer and polls the last byte of its own for the iteration's tag (a
//! write needs no receive descriptor). RDMA read latency is the time of one
//! whole read (a round trip, as `ib_read_lat` reports). Both bandwidths
//! stream writes or reads into or out of the server's buffer while the
//! server waits for the closing message (op 6), serving them.

use crate::common::{max_size, sweep, Bench, Options, Row};
use std::io;
use std::time::{Duration, Instant};
use via_user::descriptor::control;
use via_user::{Cq, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, RemoteBuffer, Vi, ViAttributes};

/// Receives the server keeps posted (and the client's initial credit).
const RECVS: usize = 64;
/// Each receive's private first segment: small messages (control, credit)
/// land there whole, so a later message cannot overwrite one not yet read.
const SLOT: usize = 4096;
const OP_LAT: u32 = 1;
const OP_BW: u32 = 2;
const OP_END: u32 = 3;
const OP_XCHG: u32 = 4;
const OP_WLAT: u32 = 5;
const OP_WAIT: u32 = 6;
const OP_VERIFY: u32 = 7;
/// `OP_VERIFY` modes.
const CHECK_SEND: u32 = 0;
const CHECK_WRITE: u32 = 1;
const CHECK_READ: u32 = 2;

/// The contents of a verified message: a function of its size and a seed,
/// different for every size, seed and offset within 256 bytes.
fn pattern(seed: u32, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(7).wrapping_add(seed.wrapping_mul(13)).wrapping_add((i >> 8) as u32) as u8).collect()
}

/// Where the first difference between `got` and `want` is, as an error.
fn compare(what: &str, got: &[u8], want: &[u8]) -> io::Result<()> {
    if got.len() != want.len() {
        return Err(io::Error::other(format!("{what}: {} bytes, expected {}", got.len(), want.len())));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(io::Error::other(format!("{what}: byte {i} of {} is {:#04x}, expected {:#04x}", want.len(), got[i], want[i]))),
    }
}
/// RDMA operations kept in flight by the bandwidth tests.
const RDMA_WINDOW: usize = 32;
const T: Option<Duration> = Some(Duration::from_secs(30));

fn err(e: via_user::ViaError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Both ends' resources: NIC, VI, CQ, buffers, descriptor pools.
struct End {
    nic: Nic,
    ptag: via_user::Ptag,
    vi: Vi,
    /// RECVS private slots, then the shared bulk buffer.
    slots: MemoryRegion,
    rbuf: MemoryRegion,
    sbuf: MemoryRegion,
    /// Descriptor address of each slot.
    slot_of: Vec<usize>,
    /// Send descriptors not posted, for reuse.
    spare: Vec<Descriptor>,
    /// The peer's receive buffer (after the RDMA exchange).
    peer_buf: Option<RemoteBuffer>,
    /// Receives complete through this CQ (`--recv-cq`): each is taken
    /// from it, then from the VI, as a CQ-driven program does.
    recv_cq: Option<Cq>,
}

impl End {
    fn new(device: &str, level: Reliability, max: usize, recv_cq: bool) -> io::Result<End> {
        let nic = Nic::open(device).map_err(err)?;
        let ptag = nic.create_ptag().map_err(err)?;
        // Both ends open their receive buffer to RDMA (reads need a
        // reliable level), so every VIA mode connects the same VIs.
        let read = level.is_reliable();
        let attrs = ViAttributes { reliability: level, max_transfer_size: (max.max(16) + SLOT) as u32, ptag, enable_rdma_write: true, enable_rdma_read: read };
        let recv_cq = if recv_cq { Some(nic.create_cq(RECVS).map_err(err)?) } else { None };
        let vi = nic.create_vi(&attrs, None, recv_cq.as_ref()).map_err(err)?;
        let mem = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
        let slots = MemoryRegion::new(&nic, RECVS * SLOT, 4096, mem).map_err(err)?;
        let rbuf = MemoryRegion::new(&nic, max.max(16), 4096, MemAttributes { ptag, enable_rdma_write: true, enable_rdma_read: read }).map_err(err)?;
        let sbuf = MemoryRegion::new(&nic, max.max(16), 4096, mem).map_err(err)?;
        let mut end = End { nic, ptag, vi, slots, rbuf, sbuf, slot_of: Vec::new(), spare: Vec::new(), peer_buf: None, recv_cq };
        for k in 0..RECVS {
            let mut d = Descriptor::new(&end.nic, end.ptag, 2).map_err(err)?;
            d.set(&[(&end.slots, k * SLOT..(k + 1) * SLOT), (&end.rbuf, 0..end.rbuf.len())], None).map_err(err)?;
            end.slot_of.push(d.addr());
            end.vi.post_recv(d).map_err(err)?;
        }
        // Send descriptors ready in advance: taking one is never a call.
        for _ in 0..8 {
            let d = Descriptor::new(&end.nic, end.ptag, 1).map_err(err)?;
            end.spare.push(d);
        }
        Ok(end)
    }

    /// Waits for the next completed receive: `RecvWait`, or with a CQ
    /// `CQWait` and then `RecvDone`.
    fn next_receive(&mut self) -> io::Result<Descriptor> {
        match &self.recv_cq {
            None => self.vi.recv_wait(T).map_err(err),
            Some(cq) => {
                cq.wait(T).map_err(err)?;
                self.vi.recv_done().map_err(err)?.ok_or_else(|| io::Error::other("the CQ named a receive RecvDone does not have"))
            }
        }
    }

    /// The next completed receive if there is one: `RecvDone`, or with a
    /// CQ `CQDone` and then `RecvDone`.
    fn poll_receive(&mut self) -> io::Result<Option<Descriptor>> {
        match &self.recv_cq {
            None => self.vi.recv_done().map_err(err),
            Some(cq) => match cq.done().map_err(err)? {
                None => Ok(None),
                Some(_) => self.vi.recv_done().map_err(err)?.map(Some).ok_or_else(|| io::Error::other("the CQ named a receive RecvDone does not have")),
            },
        }
    }

    /// A send descriptor for `len` bytes of the send buffer.
    fn send(&mut self, len: usize) -> io::Result<()> {
        let mut d = match self.spare.pop() {
            Some(d) => d,
            None => match self.vi.send_done().map_err(err)? {
                Some(d) => d,
                None => Descriptor::new(&self.nic, self.ptag, 1).map_err(err)?,
            },
        };
        if d.length() as usize != len || d.control() != control::OP_SENDRECV {
            d.set(&[(&self.sbuf, 0..len)], None).map_err(err)?;
        }
        self.vi.post_send(d).map_err(err)
    }

    /// Posts a fetch-and-add of 1 on the first word of the peer's buffer,
    /// the value before landing in `rbuf[..8]` (the `vipl_ext.h` atomic).
    fn post_atomic(&mut self) -> io::Result<()> {
        let peer = self.peer_buf.ok_or_else(|| io::Error::other("an atomic before the buffer exchange"))?;
        let mut d = match self.spare.pop() {
            Some(d) => d,
            None => Descriptor::new(&self.nic, self.ptag, 1).map_err(err)?,
        };
        if d.control() != control::OP_ATOMIC | control::ATOMIC_FETCH_ADD {
            d.set_op(Op::FetchAdd { remote: peer, add: 1 }, &[(&self.rbuf, 0..8)], None, false).map_err(err)?;
        }
        self.vi.post_send(d).map_err(err)
    }

    /// Posts an RDMA write of `sbuf[..len]` into the peer's buffer, or an
    /// RDMA read of the peer's buffer into `rbuf[..len]`.
    fn post_rdma(&mut self, write: bool, len: usize) -> io::Result<()> {
        let peer = self.peer_buf.ok_or_else(|| io::Error::other("RDMA before the buffer exchange"))?;
        // Completions are the caller's to collect (they count them), so a
        // fresh descriptor is made when the pool is empty.
        let mut d = match self.spare.pop() {
            Some(d) => d,
            None => Descriptor::new(&self.nic, self.ptag, 1).map_err(err)?,
        };
        let op = if write { control::OP_RDMAWRITE } else { control::OP_RDMAREAD };
        if d.length() as usize != len || d.control() != op {
            let (op, local) = if write { (Op::RdmaWrite(peer), &self.sbuf) } else { (Op::RdmaRead(peer), &self.rbuf) };
            d.set_op(op, &[(local, 0..len)], None, false).map_err(err)?;
        }
        self.vi.post_send(d).map_err(err)
    }

    /// Waits for every posted send and returns them to the pool.
    fn drain_sends(&mut self) -> io::Result<()> {
        while self.vi.posted().0 > 0 {
            let d = self.vi.send_wait(T).map_err(err)?;
            d.check_ok().map_err(err)?;
            self.spare.push(d);
        }
        Ok(())
    }

    /// RDMA write latency: writes `size` bytes whose last byte is `tag`.
    fn write_pong(&mut self, size: usize, tag: u8) -> io::Result<()> {
        self.sbuf.write(size - 1, &[tag]).unwrap();
        self.post_rdma(true, size)?;
        self.reap()
    }

    /// Waits until the last byte of `rbuf[..size]` says `tag`.
    fn await_tag(&self, size: usize, tag: u8) -> io::Result<()> {
        let (nic, rbuf) = (&self.nic, &self.rbuf);
        nic.wait_until(T, || {
            let mut b = [0u8];
            rbuf.read(size - 1, &mut b).unwrap();
            b[0] == tag
        })
        .map_err(err)
    }

    /// Collects completed sends into the spare pool, checking them.
    fn reap(&mut self) -> io::Result<()> {
        while let Some(d) = self.vi.send_done().map_err(err)? {
            d.check_ok().map_err(err)?;
            self.spare.push(d);
        }
        Ok(())
    }

    /// Waits for the next receive; returns its length and the first
    /// `N` words of a small message, and reposts it.
    fn recv<const N: usize>(&mut self) -> io::Result<(usize, [u32; N])> {
        let d = self.next_receive()?;
        self.consume(d)
    }

    /// Reads a completed receive and reposts it.
    fn consume<const N: usize>(&mut self, d: Descriptor) -> io::Result<(usize, [u32; N])> {
        d.check_ok().map_err(err)?;
        let n = d.length() as usize;
        let mut w = [0u32; N];
        if N > 0 && n <= SLOT {
            let k = self.slot_of.iter().position(|&a| a == d.addr()).expect("one of our receives");
            for (i, x) in w.iter_mut().enumerate().take(n / 4) {
                let mut b = [0u8; 4];
                self.slots.read(k * SLOT + 4 * i, &mut b).unwrap();
                *x = u32::from_le_bytes(b);
            }
        }
        self.vi.post_recv(d).map_err(err)?;
        Ok((n, w))
    }

    /// Waits for the next receive and returns a copy of the whole message
    /// (its first SLOT bytes are in the slot, the rest in `rbuf`), reposting it.
    fn recv_bytes(&mut self) -> io::Result<Vec<u8>> {
        let d = self.next_receive()?;
        d.check_ok().map_err(err)?;
        let n = d.length() as usize;
        let k = self.slot_of.iter().position(|&a| a == d.addr()).expect("one of our receives");
        let mut v = self.slots.to_vec(k * SLOT..k * SLOT + n.min(SLOT)).map_err(err)?;
        if n > SLOT {
            v.extend(self.rbuf.to_vec(0..n - SLOT).map_err(err)?);
        }
        self.vi.post_recv(d).map_err(err)?;
        Ok(v)
    }

    /// Sends `data` (copied into the send buffer).
    fn send_bytes(&mut self, data: &[u8]) -> io::Result<()> {
        // The send buffer is the provider's until every send from it has
        // completed: a send still unacknowledged may go again (a lost
        // frame), and would carry what is written now.
        self.drain_sends()?;
        self.sbuf.write(0, data).map_err(err)?;
        self.send(data.len())
    }

    /// The server's half of one `OP_VERIFY` (see [`Client::verify`]):
    /// returns whether what it checked held.
    fn serve_verify(&mut self, size: usize, mode: u32, seed: u32) -> io::Result<bool> {
        let ok = match mode {
            CHECK_SEND => {
                let got = self.recv_bytes()?;
                let ok = compare("message from the client", &got, &pattern(seed, size));
                self.reap()?;
                self.send_bytes(&pattern(seed + 1, size))?;
                ok
            }
            CHECK_WRITE => {
                let ok = compare("RDMA write from the client", &self.rbuf.to_vec(0..size).map_err(err)?, &pattern(seed, size));
                self.sbuf.write(0, &pattern(seed + 1, size)).map_err(err)?;
                self.post_rdma(true, size)?;
                self.drain_sends()?;
                ok
            }
            _ => {
                self.rbuf.write(0, &pattern(seed + 1, size)).map_err(err)?;
                Ok(())
            }
        };
        if let Err(e) = &ok {
            eprintln!("via-pingpong server: verification failed: {e}");
        }
        Ok(ok.is_ok())
    }

    fn send_words(&mut self, w: &[u32]) -> io::Result<()> {
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.send_bytes(&bytes)
    }
}

/// Runs the server for one client; returns when the client says end.
pub fn serve(device: &str, level: Reliability, discriminator: &[u8], max: usize, recv_cq: bool, ready: impl FnOnce(&Nic)) -> io::Result<()> {
    let mut s = End::new(device, level, max, recv_cq)?;
    ready(&s.nic);
    let req = s.nic.connect_wait(discriminator, None).map_err(err)?;
    s.nic.accept(&req, &s.vi).map_err(err)?;
    let r = serve_connected(&mut s);
    // VIA_PINGPONG_STATS: the server's counters (it has no --stats of
    // its own) when it ends, as the client's --stats prints them.
    if std::env::var_os("VIA_PINGPONG_STATS").is_some() {
        print_stats(&s.nic);
    }
    r
}

/// The server's loop over the client's control messages.
fn serve_connected(s: &mut End) -> io::Result<()> {
    loop {
        let (n, [op, size, count, a0, a1, h, l0, l1]) = s.recv::<8>()?;
        if n != 12 && !(op == OP_XCHG && n == 32) {
            return Err(io::Error::other(format!("expected a 12-byte control message, got {n} bytes")));
        }
        let (size, count) = (size as usize, count as usize);
        s.reap()?;
        if op == OP_XCHG {
            s.peer_buf = Some(words_to_buffer([a0, a1, h, l0, l1]));
            let mine = s.rbuf.remote(0..s.rbuf.len()).map_err(err)?;
            let mut w = vec![op];
            w.extend(buffer_to_words(&mine));
            s.send_words(&w)?;
            continue;
        }
        if op == OP_VERIFY {
            // [op, size, mode | seed << 8]
            let ok = s.serve_verify(size, count as u32 & 0xff, count as u32 >> 8)?;
            s.reap()?;
            s.send_words(&[op, ok as u32])?;
            continue;
        }
        if op == OP_WLAT {
            let zero = vec![0u8; size.max(1)];
            s.rbuf.write(0, &zero).unwrap();
        }
        s.send_words(&[op])?;
        match op {
            OP_WLAT => {
                for i in 0..count {
                    let tag = (i % 255) as u8 + 1;
                    s.await_tag(size, tag)?;
                    s.write_pong(size, tag)?;
                }
            }
            OP_WAIT => {
                // RDMA traffic of the client: serve it until its closing
                // message, spinning like a NIC's own processor would (a
                // wait would sleep after VIA_SPIN_US and add a wake-up to
                // every read).
                loop {
                    if let Some(d) = s.poll_receive()? {
                        s.consume::<0>(d)?;
                        break;
                    }
                }
            }
            OP_LAT => {
                for _ in 0..count {
                    // Echo first, repost the receive after: the critical
                    // path is ping in, pong out.
                    let d = s.next_receive()?;
                    let n = d.length() as usize;
                    if n != size || d.errors() != 0 {
                        return Err(io::Error::other(format!("ping of {n} bytes (status {:#x}), expected {size}", d.status())));
                    }
                    s.send(size)?;
                    s.consume::<0>(d)?;
                    s.reap()?;
                }
            }
            OP_BW => {
                let mut since_credit = 0;
                for _ in 0..count {
                    s.recv::<0>()?;
                    since_credit += 1;
                    if since_credit == RECVS / 2 {
                        since_credit = 0;
                        s.reap()?;
                        s.send_words(&[(RECVS / 2) as u32])?;
                    }
                }
                s.reap()?;
                s.send_words(&[0])?;
            }
            OP_END => {
                // Let the answer reach the client before the VI goes away.
                let _ = s.vi.send_wait(Some(Duration::from_secs(2)));
                return Ok(());
            }
            _ => return Err(io::Error::other(format!("unknown control op {op}"))),
        }
    }
}

/// A connected client.
pub struct Client {
    end: End,
}

impl Client {
    /// Connects to the server at `peer` (MAC or host name), retrying while
    /// the server is not waiting yet.
    pub fn connect(device: &str, peer: &str, level: Reliability, discriminator: &[u8], max: usize, recv_cq: bool) -> io::Result<Client> {
        let mut end = End::new(device, level, max, recv_cq)?;
        let mac = end.nic.lookup_host(peer).map_err(err)?;
        end.vi.connect_retrying(mac, discriminator, Duration::from_secs(30)).map_err(err)?;
        Ok(Client { end })
    }

    /// Swaps receive-buffer addresses with the server (RDMA modes).
    fn exchange(&mut self) -> io::Result<()> {
        let e = &mut self.end;
        e.reap()?;
        let mine = e.rbuf.remote(0..e.rbuf.len()).map_err(err)?;
        let mut w = vec![OP_XCHG, 0, 0];
        w.extend(buffer_to_words(&mine));
        e.send_words(&w)?;
        let (n, [op, a0, a1, h, l0, l1]) = e.recv::<6>()?;
        if n != 24 || op != OP_XCHG {
            return Err(io::Error::other("bad buffer exchange answer"));
        }
        e.peer_buf = Some(words_to_buffer([a0, a1, h, l0, l1]));
        Ok(())
    }

    fn control(&mut self, op: u32, size: usize, count: usize) -> io::Result<()> {
        let e = &mut self.end;
        e.reap()?;
        e.send_words(&[op, size as u32, count as u32])?;
        let (n, [answer]) = e.recv::<1>()?;
        if n != 4 || answer != op {
            return Err(io::Error::other(format!("bad control answer: asked {op} ({size} B x {count}), got {n} bytes starting {answer}")));
        }
        Ok(())
    }

    /// `iters` ping-pongs of `size` bytes (after `warmup` more); returns the
    /// one-way latency of each in microseconds. The receive a pong took is
    /// posted again while the next ping is on its way (as the server posts
    /// its own again after answering, and as MPI_Recv posts before it
    /// waits): inside the time taken, but not between the pong's arrival
    /// and the next ping. (Completed sends are collected after the time
    /// is taken, as before.)
    pub fn latency(&mut self, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<f64>> {
        self.control(OP_LAT, size, iters + warmup)?;
        let e = &mut self.end;
        let mut out = Vec::with_capacity(iters);
        let mut taken: Option<Descriptor> = None;
        for i in 0..iters + warmup {
            let t0 = Instant::now();
            e.send(size)?;
            if let Some(d) = taken.take() {
                e.vi.post_recv(d).map_err(err)?;
            }
            let d = e.next_receive()?;
            let dt = t0.elapsed();
            d.check_ok().map_err(err)?;
            let n = d.length() as usize;
            taken = Some(d);
            if n != size {
                return Err(io::Error::other(format!("pong of {n} bytes, expected {size}")));
            }
            e.reap()?;
            if i >= warmup {
                out.push(dt.as_secs_f64() * 1e6 / 2.0);
            }
        }
        if let Some(d) = taken {
            e.vi.post_recv(d).map_err(err)?;
        }
        Ok(out)
    }

    /// Streams `count` messages of `size` bytes; returns the elapsed time
    /// until the server confirmed it received them all.
    pub fn bandwidth(&mut self, size: usize, count: usize) -> io::Result<Duration> {
        self.control(OP_BW, size, count)?;
        let e = &mut self.end;
        let mut credits = RECVS;
        let mut sent = 0;
        let t0 = Instant::now();
        loop {
            while credits > 0 && sent < count {
                e.send(size)?;
                credits -= 1;
                sent += 1;
            }
            // Block for a grant only when nothing more can be sent.
            let got = if credits == 0 || sent == count { Some(e.next_receive()?) } else { e.poll_receive()? };
            if let Some(d) = got {
                let (_, [grant]) = e.consume::<1>(d)?;
                let grant = grant as usize;
                if grant == 0 {
                    break; // the server has everything
                }
                credits += grant;
            }
            e.reap()?;
        }
        let dt = t0.elapsed();
        e.reap()?;
        Ok(dt)
    }

    /// Checks contents both ways at `size` with the server: the client's
    /// bytes as the server received them, and the server's as the client
    /// received them. `mode` picks the path: send/receive, RDMA write (each
    /// side writes into the other's buffer) or RDMA read (the client reads
    /// the server's buffer).
    pub fn verify(&mut self, size: usize, mode: u32, seed: u32) -> io::Result<()> {
        let e = &mut self.end;
        e.drain_sends()?;
        let mine = pattern(seed, size);
        if mode == CHECK_WRITE {
            e.rbuf.write(0, &vec![0u8; size]).map_err(err)?;
            e.sbuf.write(0, &mine).map_err(err)?;
            e.post_rdma(true, size)?;
            e.drain_sends()?;
        }
        e.send_words(&[OP_VERIFY, size as u32, mode | seed << 8])?;
        if mode == CHECK_SEND {
            e.drain_sends()?;
            e.send_bytes(&mine)?;
        }
        let answer = |e: &mut End| -> io::Result<()> {
            let (n, [op, ok]) = e.recv::<2>()?;
            if n != 8 || op != OP_VERIFY {
                return Err(io::Error::other("bad verify answer"));
            }
            if ok != 1 {
                return Err(io::Error::other(format!("the server found the client's {size}-byte message corrupted (see its output)")));
            }
            Ok(())
        };
        let theirs = pattern(seed + 1, size);
        match mode {
            CHECK_SEND => {
                let got = e.recv_bytes()?;
                answer(e)?;
                compare("message from the server", &got, &theirs)
            }
            CHECK_WRITE => {
                answer(e)?;
                compare("RDMA write from the server", &e.rbuf.to_vec(0..size).map_err(err)?, &theirs)
            }
            _ => {
                answer(e)?;
                e.rbuf.write(0, &vec![0u8; size]).map_err(err)?;
                e.post_rdma(false, size)?;
                e.drain_sends()?;
                compare("RDMA read of the server's buffer", &e.rbuf.to_vec(0..size).map_err(err)?, &theirs)
            }
        }
    }

    /// [`Client::verify`] at every latency size of `o`.
    fn verify_all(&mut self, o: &Options, mode: u32) -> io::Result<()> {
        for (k, &size) in o.sizes.iter().enumerate() {
            for round in 0..2u32 {
                self.verify(size, mode, (k as u32) * 2 + round + 1)?;
            }
        }
        eprintln!("via-pingpong: verified {} sizes ({}), both directions", o.sizes.len(), ["send/receive", "RDMA write", "RDMA read"][mode as usize]);
        Ok(())
    }

    /// Tells the server to stop.
    pub fn finish(mut self) -> io::Result<()> {
        self.control(OP_END, 0, 0)
    }

}

/// The RDMA modes of the client (see the module comment).
pub struct RdmaClient {
    c: Client,
    write: bool,
    /// `--rdma atomic`: each operation a fetch-and-add of one 8-byte word
    /// (whatever the size), timed as a read is.
    atomic: bool,
}

impl Bench for RdmaClient {
    fn latency(&mut self, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<f64>> {
        let size = size.max(1); // the tag needs a byte
        let mut out = Vec::with_capacity(iters);
        if self.write {
            let zero = vec![0u8; size];
            self.c.end.rbuf.write(0, &zero).unwrap();
            self.c.control(OP_WLAT, size, iters + warmup)?;
            let e = &mut self.c.end;
            for i in 0..iters + warmup {
                let tag = (i % 255) as u8 + 1;
                let t0 = Instant::now();
                e.write_pong(size, tag)?;
                e.await_tag(size, tag)?;
                let dt = t0.elapsed();
                if i >= warmup {
                    out.push(dt.as_secs_f64() * 1e6 / 2.0);
                }
            }
        } else {
            self.c.control(OP_WAIT, 0, 0)?;
            let e = &mut self.c.end;
            e.drain_sends()?;
            for i in 0..iters + warmup {
                let t0 = Instant::now();
                if self.atomic {
                    e.post_atomic()?;
                } else {
                    e.post_rdma(false, size)?;
                }
                let d = e.vi.send_wait(T).map_err(err)?;
                let dt = t0.elapsed();
                d.check_ok().map_err(err)?;
                e.spare.push(d);
                if i >= warmup {
                    out.push(dt.as_secs_f64() * 1e6);
                }
            }
            e.send_words(&[0])?;
        }
        self.c.end.reap()?;
        Ok(out)
    }

    fn bandwidth(&mut self, size: usize, count: usize) -> io::Result<Duration> {
        self.c.control(OP_WAIT, 0, 0)?;
        let e = &mut self.c.end;
        e.drain_sends()?; // only the RDMA operations are counted below
        let t0 = Instant::now();
        let (mut posted, mut done) = (0, 0);
        while done < count {
            while posted < count && posted - done < RDMA_WINDOW {
                e.post_rdma(self.write, size)?;
                posted += 1;
            }
            let d = e.vi.send_wait(T).map_err(err)?;
            d.check_ok().map_err(err)?;
            e.spare.push(d);
            done += 1;
        }
        let dt = t0.elapsed();
        e.send_words(&[0])?;
        e.reap()?;
        Ok(dt)
    }
}

fn buffer_to_words(b: &RemoteBuffer) -> [u32; 5] {
    [b.addr as u32, (b.addr >> 32) as u32, b.handle, b.len as u32, (b.len >> 32) as u32]
}

fn words_to_buffer(w: [u32; 5]) -> RemoteBuffer {
    RemoteBuffer { addr: w[0] as u64 | (w[1] as u64) << 32, handle: w[2], len: w[3] as u64 | (w[4] as u64) << 32 }
}

impl Bench for Client {
    fn latency(&mut self, size: usize, iters: usize, warmup: usize) -> io::Result<Vec<f64>> {
        Client::latency(self, size, iters, warmup)
    }
    fn bandwidth(&mut self, size: usize, count: usize) -> io::Result<Duration> {
        Client::bandwidth(self, size, count)
    }
}

/// The transport's name in tables: `via` (reliable delivery), `via-unrel`,
/// the RDMA modes `via-write` and `via-read`, or `via-shm` (reliable
/// delivery through a composite device, `<nic>+shm:<wire>`; `via-shm-lent`
/// with lending on), or `via-udp` (reliable delivery in UDP/IPv4
/// datagrams, `udp:<ifname>`).
pub fn name(o: &Options) -> &'static str {
    match (o.rdma.as_deref(), o.reliability.is_reliable()) {
        (Some("write"), _) => "via-write",
        (Some("atomic"), _) => "via-atomic",
        (Some(_), _) => "via-read",
        (None, true) if o.device.contains("+shm:") && o.device.contains(",lend=") => "via-shm-lent",
        (None, true) if o.device.contains("+shm:") => "via-shm",
        (None, true) if o.device.starts_with("udp:") => "via-udp",
        (None, true) => "via",
        (None, false) => "via-unrel",
    }
}

/// `via-pingpong server --transport via`: serves one client.
pub fn server(o: &Options, ready: impl FnOnce(String)) -> io::Result<()> {
    serve(&o.device, o.reliability, o.discriminator.as_bytes(), max_size(o), o.recv_cq, |nic| ready(nic.mac().to_string()))
}

/// `via-pingpong client --transport via`: the sweep. Bandwidth only on a
/// reliable VI (an unreliable stream may lose messages by design).
pub fn client(o: &Options) -> io::Result<Vec<Row>> {
    let mut c = Client::connect(&o.device, &o.peer, o.reliability, o.discriminator.as_bytes(), max_size(o), o.recv_cq)?;
    if let Some(mode) = &o.rdma {
        c.exchange()?;
        let mut r = RdmaClient { c, write: mode == "write", atomic: mode == "atomic" };
        // An atomic moves 8 bytes whatever the size: no bandwidth sweep.
        let bw = !r.atomic;
        let rows = sweep(o, name(o), &mut r, bw)?;
        if o.verify && !r.atomic {
            r.c.verify_all(o, if r.write { CHECK_WRITE } else { CHECK_READ })?;
        }
        if o.stats {
            print_stats(&r.c.end.nic);
        }
        return r.c.finish().map(|()| rows);
    }
    let rows = match sweep(o, name(o), &mut c, o.reliability.is_reliable()) {
        Ok(rows) => rows,
        Err(e) => {
            if o.stats {
                print_stats(&c.end.nic);
            }
            return Err(e);
        }
    };
    if o.verify {
        c.verify_all(o, CHECK_SEND)?;
    }
    if o.stats {
        print_stats(&c.end.nic);
    }
    c.finish()?;
    Ok(rows)
}

/// `--stats`: the engine's counters, then the device's, one per line.
fn print_stats(nic: &Nic) {
    eprintln!("counters of {} (engine):", nic.name());
    for (k, v) in nic.counters().pairs() {
        eprintln!("  {k:<24} {v}");
    }
    eprintln!("counters of {} (device):", nic.name());
    for (k, v) in nic.device_counters() {
        eprintln!("  {k:<24} {v}");
    }
}
