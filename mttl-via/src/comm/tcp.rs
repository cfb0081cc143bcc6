//! The eight primitives over TCP: the baseline the VIA layer is measured
//! against, so it is the best simple use of TCP. One socket per pair of
//! processes (TCP_NODELAY, non-blocking), messages framed by a 4-byte
//! length.
//!
//! Sending: a small message is copied once into the peer's send queue,
//! and messages queued in a row leave in one write at the next call that
//! makes progress (as the VIA layer packs them into one frame); a message
//! of [`GATHER_MIN`] bytes or more (where the VIA layer gathers straight
//! into its send slots) goes at once in one `sendmsg` gathering the queue,
//! its header and its parts, and only what the kernel did not take is
//! copied. A send is done once the kernel took all its bytes.
//!
//! Receiving: each peer has one reusable receive buffer that the kernel
//! reads into (never cleared); whole messages in it are listed, in arrival
//! order over all peers, on the pending list ([`PendingList`]), and each
//! is copied once, from the buffer into the caller's vector, when it is
//! taken. The buffer is consumed by an offset and compacted only when its
//! tail has no room for the next read.
//!
//! Waiting: the VIA layer's rule (via-user's `Nic::wait`). A blocking wait
//! lasts until a whole message arrived; it polls the sockets without
//! sleeping for `VIA_SPIN_US` (200 µs by default; `MTTL_TCP_SPIN_US`
//! overrides it for this layer alone), then sleeps in `poll`; after bytes
//! arrived that did not complete a message it keeps polling
//! [`BURST_ROUNDS`] more rounds before it sleeps again, since the rest
//! comes right behind.

use super::pending::PendingList;
use super::{CommError, PlainHeap, Result, SendHandle, Transport};
use crate::boot::Boot;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A message this large or larger is sent at once in one gathered
/// `sendmsg` instead of being copied into the send queue: the VIA layer's
/// threshold for gathering into send slots (half a 32 KiB slot).
pub const GATHER_MIN: usize = 16 << 10;
/// Starting size of a peer's receive buffer; it grows to hold the largest
/// message met.
const RECV_BUF: usize = 64 << 10;
/// Free bytes a read wants at the buffer's tail (less only when the
/// message being read needs less).
const MIN_READ: usize = 16 << 10;
/// Rounds a wait keeps polling after bytes arrived that did not complete
/// a message (via-user's `BURST_ROUNDS`).
pub const BURST_ROUNDS: u32 = 64;
/// Largest message accepted: a length beyond it is a broken stream.
const MAX_MESSAGE: usize = 1 << 31;

/// Bytes read from one peer: `buf[head..parsed]` are whole messages
/// (`[len u32 LE][bytes]` each) not taken yet, `buf[parsed..tail]` the
/// start of the next one.
struct Inbox {
    buf: Vec<u8>,
    head: usize,
    parsed: usize,
    tail: usize,
}

impl Inbox {
    /// Bytes still missing from the message being read (its header first).
    fn missing(&self) -> usize {
        let have = self.tail - self.parsed;
        if have < 4 {
            return 4 - have;
        }
        let len = u32::from_le_bytes(self.buf[self.parsed..self.parsed + 4].try_into().unwrap()) as usize;
        (4 + len).saturating_sub(have)
    }

    /// Makes room at the tail for the next read: the rest of the message
    /// being read once its length is known (a message is never split
    /// across the buffer's end), [`MIN_READ`] bytes otherwise. Moves the
    /// unread bytes to the front when something was taken, grows the
    /// buffer otherwise.
    fn make_room(&mut self) {
        let want = if self.tail - self.parsed >= 4 { self.missing().max(1) } else { MIN_READ };
        if self.buf.len() - self.tail >= want {
            return;
        }
        if self.head > 0 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.parsed -= self.head;
            self.tail -= self.head;
            self.head = 0;
        }
        if self.buf.len() - self.tail < want {
            // Zeroes the new part, once: the buffer is kept.
            self.buf.resize((self.tail + want).max(2 * self.buf.len()), 0);
        }
    }

    /// Lists the whole messages that the last read completed; returns how
    /// many (or the length of an impossible message).
    fn parse(&mut self) -> std::result::Result<usize, usize> {
        let mut n = 0;
        while self.tail - self.parsed >= 4 {
            let len = u32::from_le_bytes(self.buf[self.parsed..self.parsed + 4].try_into().unwrap()) as usize;
            if len > MAX_MESSAGE {
                return Err(len);
            }
            if self.tail - self.parsed - 4 < len {
                break;
            }
            self.parsed += 4 + len;
            n += 1;
        }
        Ok(n)
    }

    /// Copies the oldest whole message into `out` and consumes it.
    fn take(&mut self, out: &mut Vec<u8>) {
        debug_assert!(self.head < self.parsed);
        let len = u32::from_le_bytes(self.buf[self.head..self.head + 4].try_into().unwrap()) as usize;
        out.clear();
        out.extend_from_slice(&self.buf[self.head + 4..self.head + 4 + len]);
        self.head += 4 + len;
        if self.head == self.tail {
            // Everything read was taken: start over at the front for free.
            self.head = 0;
            self.parsed = 0;
            self.tail = 0;
        }
    }
}

struct Peer {
    stream: TcpStream,
    inbox: Inbox,
    /// Bytes queued for the kernel, from `out_at`.
    out: Vec<u8>,
    out_at: usize,
    /// Bytes of the stream the kernel took, and the end (in the same
    /// count) of every queued message not yet wholly taken, oldest first.
    sent: u64,
    stream_end: u64,
    ends: VecDeque<u64>,
    /// Messages queued in all; the ones wholly sent are `queued - ends.len()`.
    queued: u64,
    closed: bool,
    /// Closed before `closing` was called: the peer stopped.
    early: bool,
}

impl Peer {
    fn new(stream: TcpStream) -> Peer {
        Peer {
            stream,
            inbox: Inbox { buf: vec![0; RECV_BUF], head: 0, parsed: 0, tail: 0 },
            out: Vec::new(),
            out_at: 0,
            sent: 0,
            stream_end: 0,
            ends: VecDeque::new(),
            queued: 0,
            closed: false,
            early: false,
        }
    }

    fn written(&self) -> u64 {
        self.queued - self.ends.len() as u64
    }

    /// Notes that the kernel took `n` more bytes of the stream.
    fn took(&mut self, n: usize) {
        self.sent += n as u64;
        while self.ends.front().is_some_and(|&e| e <= self.sent) {
            self.ends.pop_front();
        }
    }
}

/// MTTL's communication layer over TCP sockets.
pub struct TcpTransport {
    rank: usize,
    closing: bool,
    peers: Vec<Option<Peer>>,
    /// One entry per whole message received and not taken, oldest first.
    pending: PendingList,
    spin: Duration,
    heap: PlainHeap,
}

/// How long a blocking wait polls before it sleeps: `MTTL_TCP_SPIN_US`, by
/// default `VIA_SPIN_US`, as the VIA layer reads it (200 µs by default;
/// 0: sleep at once).
fn spin() -> Duration {
    let us = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse().ok());
    Duration::from_micros(us("MTTL_TCP_SPIN_US").or_else(|| us("VIA_SPIN_US")).unwrap_or(200))
}

fn err(what: impl std::fmt::Display) -> CommError {
    CommError(format!("tcp: {what}"))
}

/// One non-blocking `sendmsg` of `parts` in order; the bytes the kernel
/// took (0 when the socket is full).
fn send_gathered(fd: i32, parts: &[&[u8]]) -> std::io::Result<usize> {
    let mut iov: Vec<libc::iovec> = parts.iter().filter(|p| !p.is_empty()).map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }).collect();
    if iov.is_empty() {
        return Ok(0);
    }
    iov.truncate(libc::UIO_MAXIOV as usize);
    loop {
        // SAFETY: a zeroed msghdr is valid; it points at `iov`, whose
        // entries point into `parts`, all alive during the call.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::Interrupted => continue,
            ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
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
                    Some(Peer::new(s))
                }
            });
        }
        boot.finish()?;
        TcpTransport::over(rank, peers, heap_bytes)
    }

    /// The layer over connected, non-blocking sockets (`peers[rank]` is None).
    fn over(rank: usize, peers: Vec<Option<Peer>>, heap_bytes: usize) -> Result<TcpTransport> {
        Ok(TcpTransport { rank, closing: false, peers, pending: PendingList::default(), spin: spin(), heap: PlainHeap::new(heap_bytes)? })
    }

    fn peer(&mut self, node: usize) -> Result<&mut Peer> {
        let rank = self.rank;
        self.peers.get_mut(node).and_then(|p| p.as_mut()).ok_or_else(|| err(format!("rank {rank}: no connection to node {node}")))
    }

    /// Hands the kernel what the send queues hold (one write per peer).
    fn flush_all(&mut self) -> Result<()> {
        for j in 0..self.peers.len() {
            if self.peers[j].as_ref().is_some_and(|p| p.out_at < p.out.len()) {
                self.write_to(j)?;
            }
        }
        Ok(())
    }

    /// One round: writes the send queues, then polls every socket (for
    /// `timeout_ms`: 0 looks, -1 sleeps until one is ready) and reads and
    /// writes what it allows. Returns (whole messages that arrived,
    /// whether any bytes arrived).
    fn round(&mut self, timeout_ms: i32) -> Result<(usize, bool)> {
        self.flush_all()?;
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(self.peers.len());
        let mut who = Vec::with_capacity(self.peers.len());
        for (j, p) in self.peers.iter().enumerate() {
            if let Some(p) = p {
                let writing = p.out_at < p.out.len();
                if p.closed && !writing {
                    continue;
                }
                let mut ev = if p.closed { 0 } else { libc::POLLIN };
                if writing {
                    ev |= libc::POLLOUT;
                }
                pfds.push(libc::pollfd { fd: p.stream.as_raw_fd(), events: ev, revents: 0 });
                who.push(j);
            }
        }
        if pfds.is_empty() {
            return if timeout_ms != 0 { Err(err(format!("rank {}: waiting for a message, but every peer has closed", self.rank))) } else { Ok((0, false)) };
        }
        // SAFETY: `pfds` is a valid array of its length.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == ErrorKind::Interrupted { Ok((0, false)) } else { Err(err(e)) };
        }
        let (mut msgs, mut bytes) = (0, false);
        if n > 0 {
            for (pfd, &j) in pfds.iter().zip(&who) {
                if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && !self.peers[j].as_ref().expect("polled").closed {
                    let (m, b) = self.read_from(j)?;
                    msgs += m;
                    bytes |= b;
                }
                if pfd.revents & (libc::POLLOUT | libc::POLLERR) != 0 && self.peers[j].as_ref().expect("polled").out_at < self.peers[j].as_ref().expect("polled").out.len() {
                    self.write_to(j)?;
                }
            }
        }
        Ok((msgs, bytes))
    }

    /// Blocks until a whole message arrived, by the VIA layer's rule: polls
    /// without sleeping for the spin budget, and for [`BURST_ROUNDS`] more
    /// rounds after bytes arrived that completed no message; sleeps in
    /// `poll` otherwise.
    fn wait_message(&mut self) -> Result<()> {
        let start = Instant::now();
        let mut burst = 0;
        loop {
            let sleep = burst == 0 && start.elapsed() >= self.spin;
            let (msgs, bytes) = self.round(if sleep { -1 } else { 0 })?;
            if msgs > 0 {
                return Ok(());
            }
            self.check_closed()?;
            if bytes {
                burst = BURST_ROUNDS;
            } else if !sleep {
                burst = burst.saturating_sub(1);
                std::hint::spin_loop();
            }
        }
    }

    /// Reads what `j`'s socket holds into its inbox and lists the whole
    /// messages; returns (how many, whether any bytes came).
    fn read_from(&mut self, j: usize) -> Result<(usize, bool)> {
        let rank = self.rank;
        let closing = self.closing;
        let p = self.peers[j].as_mut().expect("polled");
        let (mut msgs, mut bytes) = (0, false);
        loop {
            p.inbox.make_room();
            let free = p.inbox.buf.len() - p.inbox.tail;
            let at = p.inbox.tail;
            match p.stream.read(&mut p.inbox.buf[at..]) {
                Ok(0) => {
                    p.closed = true;
                    // Messages before the close are still delivered; the
                    // error comes when nothing else is left (see `check_closed`).
                    p.early = !closing;
                    break;
                }
                Ok(n) => {
                    p.inbox.tail += n;
                    bytes = true;
                    let got = p.inbox.parse().map_err(|len| err(format!("rank {rank}: rank {j} sent a message of {len} bytes; the stream is broken")))?;
                    for _ in 0..got {
                        self.pending.push_back(j);
                    }
                    msgs += got;
                    if n < free {
                        // The socket is most likely drained; poll tells.
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(err(format!("rank {rank}: reading from rank {j}: the connection was lost ({e}); did rank {j} stop?"))),
            }
        }
        if p.closed && p.inbox.parsed < p.inbox.tail {
            return Err(err(format!("rank {rank}: rank {j} closed in the middle of a message")));
        }
        Ok((msgs, bytes))
    }

    /// Hands the kernel as much of `j`'s send queue as it takes.
    fn write_to(&mut self, j: usize) -> Result<()> {
        let rank = self.rank;
        let p = self.peers[j].as_mut().expect("connected");
        while p.out_at < p.out.len() {
            let n = send_gathered(p.stream.as_raw_fd(), &[&p.out[p.out_at..]]).map_err(|e| err(format!("rank {rank}: writing to rank {j}: the connection was lost ({e}); did rank {j} stop?")))?;
            if n == 0 {
                break;
            }
            p.out_at += n;
            p.took(n);
        }
        if p.out_at == p.out.len() {
            p.out.clear();
            p.out_at = 0;
        }
        Ok(())
    }

    /// A peer that stopped before the end is an error once every message
    /// it sent was taken.
    fn check_closed(&self) -> Result<()> {
        if let Some(j) = self.peers.iter().position(|p| p.as_ref().is_some_and(|p| p.early && p.inbox.head == p.inbox.parsed)) {
            return Err(err(format!("rank {}: rank {j} closed its connection before the end of the run; did rank {j} stop?", self.rank)));
        }
        Ok(())
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
            // Sleeps until a socket may take more (or brings bytes, which
            // only wait on the pending list: the run is over).
            self.round(-1)?;
        }
        for p in self.peers.iter_mut().flatten() {
            let _ = p.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let mut s = format!("tcp rank {}: pending {}; ", self.rank, self.pending.len());
        for (j, p) in self.peers.iter().enumerate() {
            if let Some(p) = p {
                let i = &p.inbox;
                s += &format!(
                    "[{j}: inbox {} bytes (whole {}, partial {}), send queue {} bytes, queued {}, written {}, closed {}] ",
                    i.buf.len(),
                    i.parsed - i.head,
                    i.tail - i.parsed,
                    p.out.len() - p.out_at,
                    p.queued,
                    p.written(),
                    p.closed
                );
            }
        }
        s
    }

    fn prob(&mut self) -> Result<Option<usize>> {
        if self.pending.is_empty() {
            self.round(0)?;
            self.check_closed()?;
        }
        Ok(self.pending.front())
    }

    fn nsendv(&mut self, node: usize, parts: &[&[u8]]) -> Result<SendHandle> {
        let rank = self.rank;
        let p = self.peer(node)?;
        let len: usize = parts.iter().map(|m| m.len()).sum();
        if len > MAX_MESSAGE {
            return Err(err(format!("rank {rank}: a message of {len} bytes to rank {node} is larger than {MAX_MESSAGE}")));
        }
        let header = (len as u32).to_le_bytes();
        p.queued += 1;
        p.stream_end += 4 + len as u64;
        p.ends.push_back(p.stream_end);
        let seq = p.queued;
        if len < GATHER_MIN {
            // Copied once into the queue; leaves with the messages queued
            // beside it at the next call that makes progress.
            p.out.extend_from_slice(&header);
            parts.iter().for_each(|m| p.out.extend_from_slice(m));
            return Ok(SendHandle { node, seq });
        }
        // The queue, the header and the parts in one gathered write.
        let queued = p.out.len() - p.out_at;
        let n = {
            let mut iov: Vec<&[u8]> = Vec::with_capacity(parts.len() + 2);
            iov.push(&p.out[p.out_at..]);
            iov.push(&header);
            iov.extend_from_slice(parts);
            send_gathered(p.stream.as_raw_fd(), &iov)
        }
        .map_err(|e| err(format!("rank {rank}: writing to rank {node}: the connection was lost ({e}); did rank {node} stop?")))?;
        p.took(n);
        if n >= queued {
            p.out.clear();
            p.out_at = 0;
        } else {
            p.out_at += n;
        }
        // What the kernel did not take of this message waits in the queue.
        let mut skip = n.saturating_sub(queued);
        for part in std::iter::once(&header[..]).chain(parts.iter().copied()) {
            let k = skip.min(part.len());
            skip -= k;
            p.out.extend_from_slice(&part[k..]);
        }
        Ok(SendHandle { node, seq })
    }

    fn senddone(&mut self, h: SendHandle) -> Result<bool> {
        self.peer(h.node)?;
        if self.delivered(h) {
            return Ok(true);
        }
        self.write_to(h.node)?;
        Ok(self.delivered(h))
    }

    fn delivered(&self, h: SendHandle) -> bool {
        self.peers.get(h.node).and_then(Option::as_ref).is_some_and(|p| p.written() >= h.seq)
    }

    fn brecnode(&mut self, node: usize, out: &mut Vec<u8>) -> Result<()> {
        self.peer(node)?;
        loop {
            if self.pending.take(node) {
                self.peer(node)?.inbox.take(out);
                return Ok(());
            }
            if self.peer(node)?.closed {
                return Err(err(format!("rank {}: waiting for rank {node}, whose connection is closed", self.rank)));
            }
            self.check_closed()?;
            self.wait_message()?;
        }
    }

    fn brecany(&mut self, out: &mut Vec<u8>) -> Result<usize> {
        loop {
            if let Some(j) = self.pending.pop_front() {
                self.peer(j)?.inbox.take(out);
                return Ok(j);
            }
            self.check_closed()?;
            self.wait_message()?;
        }
    }

    fn heap(&mut self) -> (*mut u8, usize) {
        self.heap.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Rank `rank` of a 2-rank layer over `stream`, a real loopback connection.
    fn side(rank: usize, stream: TcpStream) -> TcpTransport {
        stream.set_nodelay(true).unwrap();
        stream.set_nonblocking(true).unwrap();
        let mut peers = vec![None, None];
        peers[1 - rank] = Some(Peer::new(stream));
        TcpTransport::over(rank, peers, 4096).unwrap()
    }

    fn connected() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Shrinks the kernel's send or receive buffer of `s` (`opt`:
    /// SO_SNDBUF, SO_RCVBUF) to about `bytes`, so that sends are taken and
    /// messages read in pieces.
    fn small_buffer(s: &TcpStream, opt: i32, bytes: libc::c_int) {
        // SAFETY: setsockopt with a valid fd and a c_int of its size.
        let r = unsafe { libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, opt, (&bytes as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
        assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
    }

    /// Runs `f` on its own thread; fails (instead of hanging the test
    /// run) if it has not finished after 120 s.
    fn guarded(f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
        let (tx, rx) = mpsc::channel();
        let h = std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        std::thread::spawn(move || {
            if rx.recv_timeout(Duration::from_secs(120)) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!("a transport side did not finish within 120 s");
                std::process::exit(1);
            }
        });
        h
    }

    /// Sizes around the edges of this layer: the header, the gather
    /// threshold, the receive buffer's starting size, and messages many
    /// times larger than a socket buffer.
    const SIZES: [usize; 16] = [0, 1, 3, 4, 5, 100, GATHER_MIN - 1, GATHER_MIN, GATHER_MIN + 1, RECV_BUF - 5, RECV_BUF - 4, RECV_BUF - 3, RECV_BUF + 1, 56_000, 300_000, 3 << 20];

    fn msg(k: usize) -> Vec<u8> {
        (0..SIZES[k % SIZES.len()]).map(|i| (i * 31 + k * 7 + i / 251) as u8).collect()
    }

    /// Three rounds of every size, sent from three parts each, all queued
    /// at once over sockets with small kernel buffers (so that sends are
    /// taken in part, behind queued ones, and the rest queued): every
    /// message arrives whole and in order, and every send is reported done.
    #[test]
    fn messages_of_every_size_arrive_whole_in_order_and_are_done() {
        let count = 3 * SIZES.len();
        let (a, b) = connected();
        small_buffer(&a, libc::SO_SNDBUF, 16 << 10);
        small_buffer(&b, libc::SO_RCVBUF, 16 << 10);
        let receiver = guarded(move || {
            let mut t = side(1, b);
            let mut buf = Vec::new();
            for k in 0..count {
                // brecnode and brecany alike take the oldest message.
                if k % 2 == 0 {
                    t.brecnode(0, &mut buf).unwrap();
                } else {
                    assert_eq!(t.brecany(&mut buf).unwrap(), 0);
                }
                assert!(buf == msg(k), "message {k} ({} bytes) arrived as {} bytes, or changed", msg(k).len(), buf.len());
            }
            t.asend(0, b"all here").unwrap();
            t.comfinish().unwrap();
        });
        let sender = guarded(move || {
            let mut t = side(0, a);
            let mut handles = Vec::new();
            for k in 0..count {
                let m = msg(k);
                let (x, rest) = m.split_at(m.len() / 3);
                let (y, z) = rest.split_at(rest.len() / 2);
                handles.push(t.nsendv(1, &[x, y, z]).unwrap());
            }
            let mut buf = Vec::new();
            assert_eq!(t.brecany(&mut buf).unwrap(), 1);
            assert_eq!(buf, b"all here");
            for h in handles {
                assert!(t.senddone(h).unwrap(), "send {h:?} done once the receiver had every message");
            }
            t.comfinish().unwrap();
        });
        sender.join().unwrap();
        receiver.join().unwrap();
    }

    /// Messages taken as they come are read into the same buffer, which
    /// never grows: 200 round trips of 56 KB each way (a CG exchange) and
    /// of 100 bytes leave both buffers at their starting size.
    #[test]
    fn a_buffer_taken_promptly_is_reused_without_growing() {
        let (a, b) = connected();
        let echo = guarded(move || {
            let mut t = side(1, b);
            let mut buf = Vec::new();
            for _ in 0..400 {
                t.brecany(&mut buf).unwrap();
                t.asend(0, &buf).unwrap();
            }
            t.comfinish().unwrap();
            assert_eq!(t.peers[0].as_ref().unwrap().inbox.buf.len(), RECV_BUF, "the echo side's buffer grew");
        });
        let mut t = side(0, a);
        let mut buf = Vec::new();
        for k in 0..400 {
            let m = vec![k as u8; if k % 2 == 0 { 56_000 } else { 100 }];
            t.asend(1, &m).unwrap();
            t.brecnode(1, &mut buf).unwrap();
            assert_eq!(buf, m);
        }
        t.comfinish().unwrap();
        echo.join().unwrap();
        assert_eq!(t.peers[1].as_ref().unwrap().inbox.buf.len(), RECV_BUF, "the buffer grew");
    }

    /// The receive buffer alone, fed a stream of messages in pieces of 1
    /// to 9000 bytes while messages are taken now and then: each comes out
    /// whole and in order through compactions and growth.
    #[test]
    fn the_receive_buffer_keeps_messages_whole_through_compaction_and_growth() {
        let sizes = [0usize, 7, 16_000, 1, 70_000, 3, 40_000, 65_532, 9, 200_000];
        let msgs: Vec<Vec<u8>> = (0..60).map(|k| (0..sizes[k % sizes.len()]).map(|i| (i * 13 + k) as u8).collect()).collect();
        let stream: Vec<u8> = msgs.iter().flat_map(|m| (m.len() as u32).to_le_bytes().into_iter().chain(m.iter().copied())).collect();
        let mut inbox = Inbox { buf: vec![0; RECV_BUF], head: 0, parsed: 0, tail: 0 };
        let (mut fed, mut whole, mut taken, mut out) = (0, 0, 0, Vec::new());
        let mut piece = 1;
        while taken < msgs.len() {
            if fed < stream.len() {
                inbox.make_room();
                piece = (piece * 7 + 3) % 9000 + 1;
                let n = piece.min(inbox.buf.len() - inbox.tail).min(stream.len() - fed);
                assert!(n > 0, "make_room left no room");
                inbox.buf[inbox.tail..inbox.tail + n].copy_from_slice(&stream[fed..fed + n]);
                inbox.tail += n;
                fed += n;
                whole += inbox.parse().unwrap();
            }
            // Take every third chance, and everything once the stream is in.
            while taken < whole && (piece % 3 == 0 || fed == stream.len()) {
                inbox.take(&mut out);
                assert!(out == msgs[taken], "message {taken} ({} bytes) came out as {} bytes, or changed", msgs[taken].len(), out.len());
                taken += 1;
                if fed < stream.len() {
                    break;
                }
            }
        }
        assert_eq!((inbox.head, inbox.parsed, inbox.tail), (0, 0, 0), "all taken: the buffer starts over");
    }

    /// The same buffer alone, each 56 KB message read in pieces of 4000
    /// bytes and taken as soon as it is whole: the buffer is reused as it
    /// is, never grown (a message that fits is read in place).
    #[test]
    fn a_message_read_in_pieces_is_read_in_place() {
        let mut inbox = Inbox { buf: vec![0; RECV_BUF], head: 0, parsed: 0, tail: 0 };
        let mut out = Vec::new();
        for k in 0..50u8 {
            let m: Vec<u8> = (0..56_000).map(|i| (i as u8).wrapping_add(k)).collect();
            let stream: Vec<u8> = (m.len() as u32).to_le_bytes().into_iter().chain(m.iter().copied()).collect();
            let mut fed = 0;
            while fed < stream.len() {
                inbox.make_room();
                let n = 4000.min(stream.len() - fed).min(inbox.buf.len() - inbox.tail);
                inbox.buf[inbox.tail..inbox.tail + n].copy_from_slice(&stream[fed..fed + n]);
                inbox.tail += n;
                fed += n;
                let whole = inbox.parse().unwrap();
                assert_eq!(whole, usize::from(fed == stream.len()));
            }
            inbox.take(&mut out);
            assert!(out == m, "message {k} changed");
            assert_eq!(inbox.buf.len(), RECV_BUF, "the buffer grew for message {k}");
        }
    }

    /// A length beyond [`MAX_MESSAGE`] is a broken stream, said so.
    #[test]
    fn an_impossible_length_is_an_error() {
        let (mut a, b) = connected();
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        guarded(move || {
            let mut t = side(1, b);
            let e = t.brecany(&mut Vec::new()).unwrap_err();
            assert!(e.0.contains("the stream is broken"), "{e}");
        })
        .join()
        .unwrap();
    }
}
