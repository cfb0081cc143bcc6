//! The `udp` and `tcp` baselines: the same messages over the kernel's IP
//! stack between the same two hosts, each the best simple use of its
//! socket (held to the C probe `probe/sockprobe.c` in the demo):
//! non-blocking sockets, one system call per message each way where the
//! message fits (a header and the payload gathered by one `sendmsg`,
//! scattered by one `recvmsg`), no allocation or staging copy per message,
//! and the same wait as VIA ([`spin_then_poll`]).
//!
//! UDP: a message goes as datagrams that fit the MTU (as raw and VIA frame
//! at the MTU; IP never fragments), received straight into the caller's
//! buffer; a message that fits one datagram is exactly its bytes (one
//! `send`, one `recv`), a longer one's first datagram carries a 4-byte
//! trailer with its length (see [`UdpLink::send`]).
//! TCP: a 4-byte length and the message in one system call (TCP_NODELAY;
//! up to 1 KiB copied beside the length and sent as one buffer, larger
//! messages gathered by `sendmsg`);
//! the receiver reads what is there into a reusable buffer and copies
//! each message out once, large messages' tails straight into place.

use crate::common::{spin_then_poll, Link, Step};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
/// IPv4 and UDP headers, taken off the MTU for a datagram's payload.
const IP_UDP: usize = 28;
/// The baselines' message header: the message length.
const HDR: usize = 4;

/// Sets a socket buffer size as root may (beyond the sysctl limit) and
/// returns the size the kernel then accounts (it doubles the request).
fn set_buffer(fd: i32, force: libc::c_int, plain: libc::c_int, bytes: usize) -> usize {
    let v = bytes as libc::c_int;
    for opt in [force, plain] {
        // SAFETY: setsockopt with a valid int option value.
        if unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, opt, (&v as *const libc::c_int).cast(), 4) } == 0 {
            break;
        }
    }
    let mut got: libc::c_int = 0;
    let mut len: libc::socklen_t = 4;
    // SAFETY: getsockopt into a valid int with its length.
    unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, plain, (&mut got as *mut libc::c_int).cast(), &mut len) };
    got.max(0) as usize
}

fn would_block(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOBUFS))
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

pub struct UdpLink {
    sock: UdpSocket,
    /// Set once the socket is connected to its peer (the server connects
    /// to the sender of the first datagram).
    connected: bool,
    /// Message bytes per datagram.
    chunk: usize,
    rcvbuf: usize,
}

impl UdpLink {
    /// Receive buffer: the bandwidth window of 64 messages of 1 MiB, with
    /// the kernel's per-datagram overhead.
    const RCVBUF: usize = 64 << 20;

    fn new(sock: UdpSocket, mtu: usize) -> io::Result<UdpLink> {
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        let rcvbuf = set_buffer(fd, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, Self::RCVBUF);
        set_buffer(fd, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, 8 << 20);
        let chunk = mtu.saturating_sub(IP_UDP + HDR).max(64);
        Ok(UdpLink { sock, connected: false, chunk, rcvbuf })
    }

    pub fn server(bind: &str, port: u16, mtu: usize) -> io::Result<UdpLink> {
        Self::new(UdpSocket::bind((bind, port))?, mtu)
    }

    pub fn client(peer: &str, port: u16, mtu: usize) -> io::Result<UdpLink> {
        let addr: SocketAddr = format!("{peer}:{port}").parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{peer}: {e}")))?;
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        sock.connect(addr)?;
        let mut l = Self::new(sock, mtu)?;
        l.connected = true;
        Ok(l)
    }
}

impl UdpLink {
    /// Sends one datagram of `parts` (gathered), waiting while the socket is full.
    fn send_datagram(&self, parts: &[&[u8]]) -> io::Result<()> {
        let fd = self.sock.as_raw_fd();
        spin_then_poll(fd, libc::POLLOUT, T, || {
            let r = match parts {
                // SAFETY: sends from a valid slice of its length.
                [one] => unsafe { libc::send(fd, one.as_ptr().cast(), one.len(), libc::MSG_DONTWAIT) },
                [a, b] => {
                    let iov = [libc::iovec { iov_base: a.as_ptr() as *mut _, iov_len: a.len() }, libc::iovec { iov_base: b.as_ptr() as *mut _, iov_len: b.len() }];
                    // SAFETY: a zeroed msghdr pointing at two valid iovecs.
                    unsafe {
                        let mut m: libc::msghdr = std::mem::zeroed();
                        m.msg_iov = iov.as_ptr() as *mut _;
                        m.msg_iovlen = 2;
                        libc::sendmsg(fd, &m, libc::MSG_DONTWAIT)
                    }
                }
                _ => unreachable!("one or two parts"),
            };
            if r >= 0 {
                return Ok(Step::Done(()));
            }
            let e = last_error();
            if would_block(&e) { Ok(Step::Empty) } else { Err(e) }
        })
    }
}

impl Link for UdpLink {
    /// A message of at most `chunk` bytes is one datagram of exactly its
    /// bytes (one `send`, as the C probe does). A longer one starts with a
    /// datagram of `chunk` bytes plus a 4-byte trailer holding the message
    /// length — a size no single-datagram message has — followed by
    /// datagrams of its remaining bytes.
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        if !self.connected {
            return Err(io::Error::other("udp: no peer yet"));
        }
        if msg.len() <= self.chunk {
            return self.send_datagram(&[msg]);
        }
        let total = (msg.len() as u32).to_be_bytes();
        self.send_datagram(&[&msg[..self.chunk], &total])?;
        for piece in msg[self.chunk..].chunks(self.chunk) {
            self.send_datagram(&[piece])?;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = self.sock.as_raw_fd();
        let chunk = self.chunk;
        let mut total: Option<usize> = None;
        let mut got = 0usize;
        // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
        let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut peer_len: libc::socklen_t = 0;
        let connected = self.connected;
        let t = spin_then_poll(fd, libc::POLLIN, T, || {
            let mut arrived = false;
            loop {
                // Straight into the caller's buffer; a first datagram's
                // trailer lands in `tail` when the buffer ends first.
                let mut tail = [0u8; HDR];
                let room = buf.len().saturating_sub(got);
                let r = if connected && room >= chunk + HDR {
                    // SAFETY: receives into a valid, writable slice of its length.
                    unsafe { libc::recv(fd, buf[got..].as_mut_ptr().cast(), room, libc::MSG_DONTWAIT) }
                } else {
                    let iov = [libc::iovec { iov_base: buf[got..].as_mut_ptr().cast(), iov_len: room }, libc::iovec { iov_base: tail.as_mut_ptr().cast(), iov_len: HDR }];
                    // SAFETY: a zeroed msghdr pointing at two valid iovecs and,
                    // before the peer is known, at a sockaddr_storage.
                    unsafe {
                        let mut m: libc::msghdr = std::mem::zeroed();
                        m.msg_iov = iov.as_ptr() as *mut _;
                        m.msg_iovlen = 2;
                        if !connected {
                            m.msg_name = (&mut peer as *mut libc::sockaddr_storage).cast();
                            m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
                        }
                        let r = libc::recvmsg(fd, &mut m, libc::MSG_DONTWAIT);
                        peer_len = m.msg_namelen;
                        r
                    }
                };
                if r < 0 {
                    let e = last_error();
                    if !would_block(&e) {
                        return Err(e);
                    }
                    return Ok(if arrived { Step::Partial } else { Step::Empty });
                }
                let n = r as usize;
                arrived = true;
                match total {
                    None if n == chunk + HDR => {
                        // The first datagram of a longer message: its trailer.
                        let mut t = [0u8; HDR];
                        for (i, b) in t.iter_mut().enumerate() {
                            let at = chunk + i;
                            *b = if at < room { buf[got + at] } else { tail[at - room] };
                        }
                        let t = u32::from_be_bytes(t) as usize;
                        if t > buf.len() {
                            return Err(io::Error::other(format!("udp: message of {t} bytes exceeds the buffer of {}", buf.len())));
                        }
                        total = Some(t);
                        got = chunk;
                    }
                    None => return Ok(Step::Done(n.min(room))), // a whole message
                    Some(_) => got += n.min(room),
                }
                if total.is_some_and(|t| got >= t) {
                    return Ok(Step::Done(total.unwrap()));
                }
            }
        })?;
        if !self.connected && peer_len > 0 {
            // SAFETY: connect to the address recvmsg filled in.
            if unsafe { libc::connect(fd, (&peer as *const libc::sockaddr_storage).cast(), peer_len) } != 0 {
                return Err(last_error());
            }
            self.connected = true;
        }
        Ok(t)
    }

    fn lossless_bytes(&self) -> Option<usize> {
        // The kernel accounts about twice a datagram's payload.
        Some(self.rcvbuf / 2)
    }
}

pub struct TcpLink {
    s: TcpStream,
    /// Bytes read but not yet handed out: `rx[head..tail]`.
    rx: Vec<u8>,
    head: usize,
    tail: usize,
    /// A small message and its length, sent as one buffer.
    tx: Vec<u8>,
}

impl TcpLink {
    /// The receive buffer: many small messages per read, the head of a large one.
    const RX: usize = 256 << 10;
    /// Messages up to this size are sent from one buffer with their length.
    const SMALL: usize = 1024;

    pub fn server(bind: &str, port: u16, ready: impl FnOnce()) -> io::Result<TcpLink> {
        let l = TcpListener::bind((bind, port))?;
        ready();
        let (s, _) = l.accept()?;
        Self::setup(s)
    }

    pub fn client(peer: &str, port: u16) -> io::Result<TcpLink> {
        let mut last = None;
        for _ in 0..200 {
            match TcpStream::connect((peer, port)) {
                Ok(s) => return Self::setup(s),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(10)); // server not listening yet: retry
        }
        Err(last.unwrap())
    }

    fn setup(s: TcpStream) -> io::Result<TcpLink> {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        Ok(TcpLink { s, rx: vec![0u8; Self::RX], head: 0, tail: 0, tx: vec![0u8; HDR + Self::SMALL] })
    }

    /// One non-blocking read into `to`: Some(n) (n > 0), None if nothing is there.
    fn read_some(fd: i32, to: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: reads into a valid, writable slice of its length.
        let r = unsafe { libc::recv(fd, to.as_mut_ptr().cast(), to.len(), libc::MSG_DONTWAIT) };
        match r {
            0 => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "tcp: peer closed")),
            r if r > 0 => Ok(Some(r as usize)),
            _ => {
                let e = last_error();
                if would_block(&e) { Ok(None) } else { Err(e) }
            }
        }
    }

    /// Waits until the buffer holds at least `want` bytes (want <= RX).
    fn fill(&mut self, want: usize) -> io::Result<()> {
        if self.tail - self.head >= want {
            return Ok(());
        }
        if self.head + want > self.rx.len() {
            self.rx.copy_within(self.head..self.tail, 0); // rare: a header split at the end
            self.tail -= self.head;
            self.head = 0;
        }
        let fd = self.s.as_raw_fd();
        let (rx, head, tail) = (&mut self.rx, self.head, &mut self.tail);
        spin_then_poll(fd, libc::POLLIN, T, || match Self::read_some(fd, &mut rx[*tail..])? {
            None => Ok(Step::Empty),
            Some(n) => {
                *tail += n;
                Ok(if *tail - head >= want { Step::Done(()) } else { Step::Partial })
            }
        })
    }
}

impl Link for TcpLink {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let fd = self.s.as_raw_fd();
        let hdr = (msg.len() as u32).to_be_bytes();
        if msg.len() <= Self::SMALL {
            // A small message goes with its length as one `send` of one
            // buffer, as the C probe sends (no iovec to import).
            let n = HDR + msg.len();
            self.tx[..HDR].copy_from_slice(&hdr);
            self.tx[HDR..n].copy_from_slice(msg);
            let mut off = 0;
            while off < n {
                let b = &self.tx[off..n];
                off += spin_then_poll(fd, libc::POLLOUT, T, || {
                    // SAFETY: sends from a valid slice of its length.
                    let r = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
                    if r >= 0 {
                        return Ok(Step::Done(r as usize));
                    }
                    let e = last_error();
                    if would_block(&e) { Ok(Step::Empty) } else { Err(e) }
                })?;
            }
            return Ok(());
        }
        let mut off = 0usize; // bytes of header + message written
        let total = HDR + msg.len();
        while off < total {
            let iov_h = &hdr[off.min(HDR)..];
            let iov_m = &msg[off.saturating_sub(HDR)..];
            let iov = [
                libc::iovec { iov_base: iov_h.as_ptr() as *mut _, iov_len: iov_h.len() },
                libc::iovec { iov_base: iov_m.as_ptr() as *mut _, iov_len: iov_m.len() },
            ];
            let (iov, cnt) = if iov_h.is_empty() { (&iov[1..], 1) } else { (&iov[..], 2) };
            off += spin_then_poll(fd, libc::POLLOUT, T, || {
                // SAFETY: a zeroed msghdr pointing at valid iovecs.
                let r = unsafe {
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = iov.as_ptr() as *mut _;
                    m.msg_iovlen = cnt;
                    libc::sendmsg(fd, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                };
                if r >= 0 {
                    return Ok(Step::Done(r as usize));
                }
                let e = last_error();
                if would_block(&e) { Ok(Step::Empty) } else { Err(e) }
            })?;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.fill(HDR)?;
        let n = u32::from_be_bytes(self.rx[self.head..self.head + HDR].try_into().unwrap()) as usize;
        self.head += HDR;
        if n > buf.len() {
            return Err(io::Error::other(format!("tcp: message of {n} bytes exceeds the buffer of {}", buf.len())));
        }
        // What is buffered already, copied once.
        let have = (self.tail - self.head).min(n);
        buf[..have].copy_from_slice(&self.rx[self.head..self.head + have]);
        self.head += have;
        if self.head == self.tail {
            (self.head, self.tail) = (0, 0);
        }
        // The rest straight into place, never past this message.
        let fd = self.s.as_raw_fd();
        let mut got = have;
        if got < n {
            spin_then_poll(fd, libc::POLLIN, T, || {
                let mut arrived = false;
                while got < n {
                    match Self::read_some(fd, &mut buf[got..n])? {
                        Some(k) => {
                            got += k;
                            arrived = true;
                        }
                        None => return Ok(if arrived { Step::Partial } else { Step::Empty }),
                    }
                }
                Ok(Step::Done(()))
            })?;
        }
        Ok(n)
    }

    fn lossless_bytes(&self) -> Option<usize> {
        None // TCP's own flow control holds the sender back
    }
}
