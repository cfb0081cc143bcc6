//! The `udp` and `tcp` baselines: the same messages over the kernel's IP
//! stack between the same two hosts. Sockets are non-blocking and waits use
//! the same spin-then-poll as VIA, so no transport is favoured by its wait.
//! UDP messages longer than one datagram go as several datagrams of at most
//! [`DGRAM`] bytes; TCP frames each message with a 4-byte length.

use crate::common::{spin_then_poll, Link};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Largest UDP payload per datagram (with a 4-byte length header).
pub const DGRAM: usize = 60_000;
const T: Duration = Duration::from_secs(30);

/// Socket buffers big enough for the protocol's window (best effort;
/// root may exceed the sysctl limits).
fn big_buffers(fd: i32) {
    let v: libc::c_int = 8 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE, libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: setsockopt with a valid int option value.
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, opt, (&v as *const libc::c_int).cast(), 4) };
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

pub struct UdpLink {
    sock: UdpSocket,
    peer: Option<SocketAddr>,
    dgram: Vec<u8>,
}

impl UdpLink {
    pub fn server(bind: &str, port: u16) -> io::Result<UdpLink> {
        let sock = UdpSocket::bind((bind, port))?;
        sock.set_nonblocking(true)?;
        big_buffers(sock.as_raw_fd());
        Ok(UdpLink { sock, peer: None, dgram: vec![0u8; DGRAM + 4] })
    }

    pub fn client(peer: &str, port: u16) -> io::Result<UdpLink> {
        let addr: SocketAddr = format!("{peer}:{port}").parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{peer}: {e}")))?;
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        sock.set_nonblocking(true)?;
        big_buffers(sock.as_raw_fd());
        Ok(UdpLink { sock, peer: Some(addr), dgram: vec![0u8; DGRAM + 4] })
    }
}

impl Link for UdpLink {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let peer = self.peer.ok_or_else(|| io::Error::other("no peer yet"))?;
        let chunks: Vec<&[u8]> = if msg.is_empty() { vec![&[][..]] } else { msg.chunks(DGRAM).collect() };
        for c in chunks {
            self.dgram[..4].copy_from_slice(&(msg.len() as u32).to_be_bytes());
            self.dgram[4..4 + c.len()].copy_from_slice(c);
            let d = &self.dgram[..4 + c.len()];
            let fd = self.sock.as_raw_fd();
            let sock = &self.sock;
            spin_then_poll(fd, libc::POLLOUT, T, || match sock.send_to(d, peer) {
                Ok(_) => Ok(Some(())),
                Err(e) if would_block(&e) || e.raw_os_error() == Some(libc::ENOBUFS) => Ok(None),
                Err(e) => Err(e),
            })?;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut total = None;
        let mut got = 0;
        loop {
            let fd = self.sock.as_raw_fd();
            let (sock, dgram) = (&self.sock, &mut self.dgram);
            let (n, from) = spin_then_poll(fd, libc::POLLIN, T, || match sock.recv_from(dgram) {
                Ok(x) => Ok(Some(x)),
                Err(e) if would_block(&e) => Ok(None),
                Err(e) => Err(e),
            })?;
            self.peer.get_or_insert(from);
            if n < 4 {
                continue;
            }
            let t = *total.get_or_insert(u32::from_be_bytes(self.dgram[..4].try_into().unwrap()) as usize);
            let p = &self.dgram[4..n];
            let end = (got + p.len()).min(buf.len());
            buf[got..end].copy_from_slice(&p[..end - got]);
            got += p.len();
            if got >= t {
                return Ok(t);
            }
        }
    }
}

pub struct TcpLink {
    s: TcpStream,
}

impl TcpLink {
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
        Ok(TcpLink { s })
    }

    fn write_all(&mut self, mut b: &[u8]) -> io::Result<()> {
        let fd = self.s.as_raw_fd();
        while !b.is_empty() {
            let s = &mut self.s;
            let n = spin_then_poll(fd, libc::POLLOUT, T, || match s.write(b) {
                Ok(n) => Ok(Some(n)),
                Err(e) if would_block(&e) => Ok(None),
                Err(e) => Err(e),
            })?;
            b = &b[n..];
        }
        Ok(())
    }

    fn read_exact(&mut self, mut b: &mut [u8]) -> io::Result<()> {
        let fd = self.s.as_raw_fd();
        while !b.is_empty() {
            let s = &mut self.s;
            let n = spin_then_poll(fd, libc::POLLIN, T, || match s.read(b) {
                Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed")),
                Ok(n) => Ok(Some(n)),
                Err(e) if would_block(&e) => Ok(None),
                Err(e) => Err(e),
            })?;
            b = &mut b[n..];
        }
        Ok(())
    }
}

impl Link for TcpLink {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.write_all(&(msg.len() as u32).to_be_bytes())?;
        self.write_all(msg)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut l = [0u8; 4];
        self.read_exact(&mut l)?;
        let n = u32::from_be_bytes(l) as usize;
        if n > buf.len() {
            return Err(io::Error::other(format!("message of {n} bytes exceeds the buffer")));
        }
        self.read_exact(&mut buf[..n])?;
        Ok(n)
    }
}
