//! The eight primitives over TCP: the baseline the VIA layer is measured
//! against. One socket per pair of processes (TCP_NODELAY, non-blocking),
//! messages framed by a 4-byte length; a send is done once the kernel took
//! all its bytes. Sends queue until the next call that makes progress, so
//! that messages queued in a row leave in one write (as the VIA layer
//! packs them into one frame). Received messages wait in one queue in arrival order,
//! which is the pending list of this transport.

use super::{CommError, PlainHeap, Result, SendHandle, Transport};
use crate::boot::Boot;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

struct Peer {
    stream: TcpStream,
    /// Bytes read but not yet a whole message.
    inbuf: Vec<u8>,
    /// Bytes still to write, from `out_at`.
    out: Vec<u8>,
    out_at: usize,
    /// Messages queued in all, and the count whose last byte the kernel took.
    queued: u64,
    written: u64,
    /// End offsets in `out` of queued messages not yet written.
    ends: VecDeque<usize>,
    closed: bool,
    /// Closed before `closing` was called: the peer stopped.
    early: bool,
}

/// MTTL's communication layer over TCP sockets.
pub struct TcpTransport {
    rank: usize,
    closing: bool,
    peers: Vec<Option<Peer>>,
    ready: VecDeque<(usize, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
    heap: PlainHeap,
}

/// How long a blocking wait polls before it sleeps: `MTTL_TCP_SPIN_US`, by
/// default `VIA_SPIN_US`, the VIA layer's budget (200 µs), so that the
/// baseline is measured on equal terms (0: sleep at once).
fn spin() -> Duration {
    let us = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    Duration::from_micros(us("MTTL_TCP_SPIN_US").or_else(|| us("VIA_SPIN_US")).unwrap_or(200))
}

fn err(what: impl std::fmt::Display) -> CommError {
    CommError(format!("tcp: {what}"))
}

impl TcpTransport {
    /// `_pmttl_cominit`: a listener, the address exchange, then a socket
    /// to every other rank (lower ranks are dialled, higher ones accepted).
    pub fn cominit(boot: &mut Boot, heap_bytes: usize) -> Result<TcpTransport> {
        boot.connect()?;
        let ip = boot.local_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| err(format!("listening on {ip}: {e}")))?;
        let me = l.local_addr().map_err(err)?;
        let blobs = boot.exchange(me.to_string().as_bytes(), crate::registry::digest())?;
        let addrs: Vec<SocketAddr> = blobs
            .iter()
            .enumerate()
            .map(|(r, b)| String::from_utf8_lossy(b).parse().map_err(|_| err(format!("rank {r} gave the address {:?}", String::from_utf8_lossy(b)))))
            .collect::<Result<_>>()?;
        let (rank, size) = (boot.rank, boot.size);
        let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        for (j, addr) in addrs.iter().enumerate().take(rank) {
            let mut s = TcpStream::connect(addr).map_err(|e| err(format!("rank {rank}: connecting to rank {j} at {addr}: {e}")))?;
            s.write_all(&(rank as u32).to_le_bytes()).map_err(err)?;
            streams[j] = Some(s);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        l.set_nonblocking(true).map_err(err)?;
        while streams.iter().enumerate().any(|(j, s)| j > rank && s.is_none()) {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(err)?;
                    let mut b = [0u8; 4];
                    s.read_exact(&mut b).map_err(err)?;
                    let j = u32::from_le_bytes(b) as usize;
                    if j <= rank || j >= size || streams[j].is_some() {
                        return Err(err(format!("rank {rank}: a connection claims to be rank {j}")));
                    }
                    streams[j] = Some(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(err(format!("rank {rank}: higher ranks did not connect within 60 s")));
                    }
                    let mut p = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut p, 1, 100) };
                }
                Err(e) => return Err(err(e)),
            }
        }
        let mut peers = Vec::with_capacity(size);
        for s in streams {
            peers.push(match s {
                None => None,
                Some(s) => {
                    s.set_nodelay(true).map_err(err)?;
                    s.set_nonblocking(true).map_err(err)?;
                    Some(Peer { stream: s, inbuf: Vec::new(), out: Vec::new(), out_at: 0, queued: 0, written: 0, ends: VecDeque::new(), closed: false, early: false })
                }
            });
        }
        boot.finish()?;
        Ok(TcpTransport { rank, closing: false, peers, ready: VecDeque::new(), spare: Vec::new(), heap: PlainHeap::new(heap_bytes)? })
    }

    fn peer(&mut self, node: usize) -> Result<&mut Peer> {
        let rank = self.rank;
        self.peers.get_mut(node).and_then(|p| p.as_mut()).ok_or_else(|| err(format!("rank {rank}: no connection to node {node}")))
    }

    /// Reads and writes what the sockets allow; waits (without limit) for
    /// one of them when `block` and nothing happened.
    fn progress(&mut self, block: bool) -> Result<()> {
        // Queued sends first: messages queued in a row leave in one write.
        for j in 0..self.peers.len() {
            if self.peers[j].as_ref().is_some_and(|p| p.out_at < p.out.len()) {
                self.write_to(j)?;
            }
        }
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(self.peers.len());
        let mut who = Vec::with_capacity(self.peers.len());
        for (j, p) in self.peers.iter().enumerate() {
            if let Some(p) = p {
                if p.closed && p.out_at == p.out.len() {
                    continue;
                }
                let mut ev = if p.closed { 0 } else { libc::POLLIN };
                if p.out_at < p.out.len() {
                    ev |= libc::POLLOUT;
                }
                pfds.push(libc::pollfd { fd: p.stream.as_raw_fd(), events: ev, revents: 0 });
                who.push(j);
            }
        }
        if pfds.is_empty() {
            return if block { Err(err(format!("rank {}: waiting for a message, but every peer has closed", self.rank))) } else { Ok(()) };
        }
        // Blocking waits spin (polling without sleeping) for up to
        // VIA_SPIN_US, as the VIA layer's waits do, then sleep in poll.
        let spin_until = block.then(|| Instant::now() + spin());
        let n = loop {
            let sleep = spin_until.is_some_and(|t| Instant::now() >= t);
            // SAFETY: `pfds` is a valid array of its length.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, if sleep { -1 } else { 0 }) };
            if n != 0 || spin_until.is_none() || sleep {
                break n;
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == ErrorKind::Interrupted { Ok(()) } else { Err(err(e)) };
        }
        for (pfd, &j) in pfds.iter().zip(&who) {
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                self.read_from(j)?;
            }
            if pfd.revents & libc::POLLOUT != 0 {
                self.write_to(j)?;
            }
        }
        Ok(())
    }

    fn read_from(&mut self, j: usize) -> Result<()> {
        let rank = self.rank;
        let p = self.peers[j].as_mut().expect("polled");
        let mut buf = [0u8; 65536];
        loop {
            match p.stream.read(&mut buf) {
                Ok(0) => {
                    p.closed = true;
                    // Messages before the close are still delivered; the
                    // error comes when nothing else is left (see `check_closed`).
                    p.early = !self.closing;
                    break;
                }
                Ok(n) => p.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(err(format!("rank {rank}: reading from rank {j}: the connection was lost ({e}); did rank {j} stop?"))),
            }
        }
        // Cut whole messages off the front.
        let mut at = 0;
        while p.inbuf.len() - at >= 4 {
            let n = u32::from_le_bytes(p.inbuf[at..at + 4].try_into().unwrap()) as usize;
            if p.inbuf.len() - at - 4 < n {
                break;
            }
            let mut m = self.spare.pop().unwrap_or_default();
            m.clear();
            m.extend_from_slice(&p.inbuf[at + 4..at + 4 + n]);
            self.ready.push_back((j, m));
            at += 4 + n;
        }
        p.inbuf.drain(..at);
        if p.closed && !p.inbuf.is_empty() {
            return Err(err(format!("rank {rank}: rank {j} closed in the middle of a message")));
        }
        Ok(())
    }

    fn write_to(&mut self, j: usize) -> Result<()> {
        let rank = self.rank;
        let p = self.peers[j].as_mut().expect("connected");
        while p.out_at < p.out.len() {
            match p.stream.write(&p.out[p.out_at..]) {
                Ok(n) => p.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(err(format!("rank {rank}: writing to rank {j}: the connection was lost ({e}); did rank {j} stop?"))),
            }
        }
        while p.ends.front().is_some_and(|&e| e <= p.out_at) {
            p.ends.pop_front();
            p.written += 1;
        }
        if p.out_at == p.out.len() {
            p.out.clear();
            p.out_at = 0;
            p.ends.clear();
        }
        Ok(())
    }

    /// A peer that stopped before the end is an error once every message
    /// it sent was taken.
    fn check_closed(&self) -> Result<()> {
        if let Some(j) = self.peers.iter().position(|p| p.as_ref().is_some_and(|p| p.early)) {
            if !self.ready.iter().any(|(n, _)| *n == j) {
                return Err(err(format!("rank {}: rank {j} closed its connection before the end of the run; did rank {j} stop?", self.rank)));
            }
        }
        Ok(())
    }

    fn take(&mut self, i: usize, out: &mut Vec<u8>) -> usize {
        let (j, m) = self.ready.remove(i).expect("index checked");
        out.clear();
        out.extend_from_slice(&m);
        self.spare.push(m);
        j
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn closing(&mut self) {
        self.closing = true;
        for p in self.peers.iter_mut().flatten() {
            p.early = false;
        }
    }

    fn comfinish(&mut self) -> Result<()> {
        self.closing = true;
        while self.peers.iter().flatten().any(|p| p.out_at < p.out.len()) {
            self.progress(true)?;
        }
        for p in self.peers.iter_mut().flatten() {
            let _ = p.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    fn prob(&mut self) -> Result<Option<usize>> {
        if self.ready.is_empty() {
            self.progress(false)?;
            self.check_closed()?;
        }
        Ok(self.ready.front().map(|(j, _)| *j))
    }

    fn nsendv(&mut self, node: usize, parts: &[&[u8]]) -> Result<SendHandle> {
        let p = self.peer(node)?;
        let len: usize = parts.iter().map(|m| m.len()).sum();
        p.out.extend_from_slice(&(len as u32).to_le_bytes());
        parts.iter().for_each(|m| p.out.extend_from_slice(m));
        p.ends.push_back(p.out.len());
        p.queued += 1;
        let seq = p.queued;
        Ok(SendHandle { node, seq })
    }

    fn senddone(&mut self, h: SendHandle) -> Result<bool> {
        let p = self.peer(h.node)?;
        if p.written >= h.seq {
            return Ok(true);
        }
        self.write_to(h.node)?;
        Ok(self.peer(h.node)?.written >= h.seq)
    }

    fn brecnode(&mut self, node: usize, out: &mut Vec<u8>) -> Result<()> {
        self.peer(node)?;
        loop {
            if let Some(i) = self.ready.iter().position(|(j, _)| *j == node) {
                self.take(i, out);
                return Ok(());
            }
            if self.peer(node)?.closed {
                return Err(err(format!("rank {}: waiting for rank {node}, whose connection is closed", self.rank)));
            }
            self.check_closed()?;
            self.progress(true)?;
        }
    }

    fn brecany(&mut self, out: &mut Vec<u8>) -> Result<usize> {
        loop {
            if !self.ready.is_empty() {
                return Ok(self.take(0, out));
            }
            self.check_closed()?;
            self.progress(true)?;
        }
    }

    fn heap(&mut self) -> (*mut u8, usize) {
        self.heap.get()
    }
}
