//! Start-up: who am I (rank and size), which transport, and the address
//! exchange at rank 0.
//!
//! Rank and size come from `mttl-run` (`MTTL_RANK`, `MTTL_SIZE`), Slurm
//! (`SLURM_PROCID`, `SLURM_NTASKS`), Open MPI (`OMPI_COMM_WORLD_RANK`,
//! `OMPI_COMM_WORLD_SIZE`) or PMI (`PMI_RANK`, `PMI_SIZE`); none of them
//! means a single process. With more than one, `MTTL_ROOT` (`host:port`)
//! names where rank 0 listens for the rendezvous: every rank connects, sends
//! its transport address and the digest of its remote-function table, and
//! gets back everybody's addresses. Rank 0 refuses a run whose ranks do not
//! run the same program (different digests).

use crate::error::{CommError, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long ranks wait for each other at start-up (`MTTL_BOOT_TIMEOUT_S`).
fn boot_timeout() -> Duration {
    Duration::from_secs(std::env::var("MTTL_BOOT_TIMEOUT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(60))
}

/// This process's place in the run.
#[derive(Debug)]
pub struct Boot {
    pub rank: usize,
    pub size: usize,
    /// `MTTL_TRANSPORT`: "via" (default) or "tcp".
    pub transport: String,
    root: Option<String>,
    /// Our address as rank 0 sees it (after `connect`).
    pub local_ip: Option<IpAddr>,
    stream: Option<TcpStream>,
    /// Rank 0: one stream per other rank, by rank.
    streams: Vec<Option<TcpStream>>,
}

fn env_pair(rank: &str, size: &str) -> Option<(String, String)> {
    Some((std::env::var(rank).ok()?, std::env::var(size).ok()?))
}

impl Boot {
    /// Reads rank, size, transport and root from the environment.
    pub fn from_env() -> Result<Boot> {
        let pairs = [("MTTL_RANK", "MTTL_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")];
        let (rank, size) = match pairs.iter().find_map(|(r, s)| env_pair(r, s).map(|v| (r, s, v))) {
            Some((rn, sn, (r, s))) => {
                let rank: usize = r.parse().map_err(|_| CommError(format!("{rn}={r:?} is not a rank")))?;
                let size: usize = s.parse().map_err(|_| CommError(format!("{sn}={s:?} is not a process count")))?;
                if size == 0 || rank >= size {
                    return Err(CommError(format!("{rn}={rank} is not below {sn}={size}")));
                }
                (rank, size)
            }
            None => (0, 1),
        };
        let transport = std::env::var("MTTL_TRANSPORT").unwrap_or_else(|_| "via".into());
        let root = std::env::var("MTTL_ROOT").ok();
        if size > 1 && root.is_none() {
            return Err(CommError(format!("rank {rank} of {size}: MTTL_ROOT is not set (host:port where rank 0 listens for the start-up exchange; mttl-run sets it)")));
        }
        Ok(Boot { rank, size, transport, root, local_ip: None, stream: None, streams: Vec::new() })
    }

    /// Joins the rendezvous: rank 0 accepts every other rank, the others
    /// connect to it (retrying until the boot timeout, since rank 0 may
    /// start last). Sets `local_ip`.
    pub fn connect(&mut self) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let root = self.root.clone().expect("checked in from_env");
        let addr: SocketAddr = root
            .to_socket_addrs()
            .map_err(|e| CommError(format!("MTTL_ROOT={root}: {e}")))?
            .next()
            .ok_or_else(|| CommError(format!("MTTL_ROOT={root} names no address")))?;
        let deadline = Instant::now() + boot_timeout();
        if self.rank == 0 {
            let l = TcpListener::bind(addr).map_err(|e| CommError(format!("rank 0: listening on MTTL_ROOT={root}: {e}")))?;
            l.set_nonblocking(true).map_err(|e| CommError(e.to_string()))?;
            self.streams = (0..self.size).map(|_| None).collect();
            let mut joined = 1;
            while joined < self.size {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).map_err(|e| CommError(e.to_string()))?;
                        s.set_read_timeout(Some(boot_timeout())).ok();
                        let r = read_u32(&mut s)? as usize;
                        if r == 0 || r >= self.size || self.streams[r].is_some() {
                            return Err(CommError(format!("rank 0: a process joined as rank {r}, which is out of range or taken (size {})", self.size)));
                        }
                        self.local_ip = s.local_addr().ok().map(|a| a.ip());
                        self.streams[r] = Some(s);
                        joined += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let missing: Vec<usize> = (1..self.size).filter(|&r| self.streams[r].is_none()).collect();
                            return Err(CommError(format!("rank 0: ranks {missing:?} did not join within {:?}", boot_timeout())));
                        }
                        wait_readable(&l, Duration::from_millis(100));
                    }
                    Err(e) => return Err(CommError(format!("rank 0: accepting: {e}"))),
                }
            }
        } else {
            let mut s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => return Err(CommError(format!("rank {}: rank 0 at {root} did not answer within {:?}: {e}", self.rank, boot_timeout()))),
                    // Rank 0 is not listening yet: back off before the next try.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            s.set_read_timeout(Some(boot_timeout())).ok();
            s.write_all(&(self.rank as u32).to_le_bytes()).map_err(|e| CommError(format!("rank {}: joining: {e}", self.rank)))?;
            self.local_ip = s.local_addr().ok().map(|a| a.ip());
            self.stream = Some(s);
        }
        Ok(())
    }

    /// Exchanges `blob` (this rank's transport address) and `digest` (its
    /// remote-function table) with every rank: returns every rank's blob.
    pub fn exchange(&mut self, blob: &[u8], digest: u64) -> Result<Vec<Vec<u8>>> {
        if self.size == 1 {
            return Ok(vec![blob.to_vec()]);
        }
        if self.rank == 0 {
            let mut blobs = vec![blob.to_vec()];
            let mut bad = None;
            for r in 1..self.size {
                let s = self.streams[r].as_mut().expect("joined");
                let d = read_u64(s)?;
                blobs.push(read_bytes(s)?);
                if d != digest && bad.is_none() {
                    bad = Some(format!("rank {r} runs a different program than rank 0 (remote-function table digest {d:016x}, rank 0 has {digest:016x}); every rank must run the same binary"));
                }
            }
            let mut reply = Vec::new();
            match &bad {
                Some(msg) => {
                    reply.push(1);
                    put_bytes(&mut reply, msg.as_bytes());
                }
                None => {
                    reply.push(0);
                    for b in &blobs {
                        put_bytes(&mut reply, b);
                    }
                }
            }
            for r in 1..self.size {
                let s = self.streams[r].as_mut().expect("joined");
                s.write_all(&reply).map_err(|e| CommError(format!("rank 0: answering rank {r}: {e}")))?;
            }
            match bad {
                Some(msg) => Err(CommError(msg)),
                None => Ok(blobs),
            }
        } else {
            let rank = self.rank;
            let s = self.stream.as_mut().expect("connected");
            let mut m = digest.to_le_bytes().to_vec();
            put_bytes(&mut m, blob);
            s.write_all(&m).map_err(|e| CommError(format!("rank {rank}: sending my address: {e}")))?;
            let mut status = [0u8];
            s.read_exact(&mut status).map_err(|e| CommError(format!("rank {rank}: waiting for everybody's addresses: {e}")))?;
            if status[0] != 0 {
                let msg = read_bytes(s)?;
                return Err(CommError(String::from_utf8_lossy(&msg).into_owned()));
            }
            (0..self.size).map(|_| read_bytes(s)).collect()
        }
    }

    /// Everybody has connected: waits until every rank says so, then
    /// closes the rendezvous.
    pub fn finish(&mut self) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        if self.rank == 0 {
            for r in 1..self.size {
                let s = self.streams[r].as_mut().expect("joined");
                read_u32(s).map_err(|e| CommError(format!("rank 0: rank {r} did not finish connecting: {e}")))?;
            }
            for r in 1..self.size {
                let s = self.streams[r].as_mut().expect("joined");
                let _ = s.write_all(&0u32.to_le_bytes());
            }
            self.streams.clear();
        } else {
            let s = self.stream.as_mut().expect("connected");
            s.write_all(&0u32.to_le_bytes()).map_err(|e| CommError(e.to_string()))?;
            read_u32(s)?;
            self.stream = None;
        }
        Ok(())
    }
}

fn wait_readable(l: &TcpListener, t: Duration) {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, t.as_millis() as i32) };
}

fn read_u32(s: &mut TcpStream) -> Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b).map_err(|e| CommError(format!("start-up exchange: {e}")))?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(s: &mut TcpStream) -> Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).map_err(|e| CommError(format!("start-up exchange: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

fn read_bytes(s: &mut TcpStream) -> Result<Vec<u8>> {
    let n = read_u32(s)? as usize;
    if n > 1 << 20 {
        return Err(CommError(format!("start-up exchange: a {n}-byte address")));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).map_err(|e| CommError(format!("start-up exchange: {e}")))?;
    Ok(b)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}
