//! [`CompositeDevice`]: one VIA device made of a NIC and a shared-memory
//! wire, as SCore's composite devices were: a frame for a process attached
//! to the wire on this host goes through shared memory, every other frame
//! through the NIC, and the engine above sees one device with the NIC's
//! MAC address.
//!
//! The routing table is the wire's port table: a process attaches with
//! its NIC's MAC as its identity and its receive filter, so a frame whose
//! destination and endpoint some attached process takes goes there
//! ([`ShmDevice::takes`]); the NIC carries the rest. Broadcasts take both:
//! a NIC does not hand a process what other processes send on it, so the
//! wire is how they reach this host's processes. Receiving
//! takes turns between the two, so neither starves the other, and the
//! wait descriptor is an epoll set of both.
//!
//! The MTU is the NIC's, except to a process on the wire
//! ([`FrameDevice::mtu_to`]): the engine sends it frames of up to 64 KiB
//! (whose payloads the wire lends rather than copies, if it was opened
//! with `,lend=<bytes>`). Should such a frame
//! find its process gone and be routed to the NIC, it is dropped and
//! counted (the engine's retransmission timer then gives up on the
//! connection): it cannot be cut to the NIC's MTU here.

use crate::shm::{ShmDevice, MTU as SHM_MTU};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use via_kernel_agent::wire::ETH_HEADER_LEN;
use via_kernel_agent::{Capabilities, FrameDevice, LentPayload, MacAddr, RxFilter, TxFrame};

/// A NIC and a shared-memory wire under one MAC address.
pub struct CompositeDevice {
    nic: Box<dyn FrameDevice>,
    shm: ShmDevice,
    epoll: OwnedFd,
    /// Which member receives first next time.
    shm_first: bool,
    /// Frames for the NIC longer than its MTU, dropped.
    nic_oversize: u64,
}

impl std::fmt::Debug for CompositeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompositeDevice").field("mac", &self.nic.mac()).field("shm", &self.shm).finish_non_exhaustive()
    }
}

/// Which member a frame takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    Nic,
    Shm,
    /// A broadcast: the NIC for other hosts, the wire for this one (a NIC
    /// does not hand a process the frames other processes send on it).
    Both,
    /// Longer than the NIC's MTU and for no process on the wire (sized
    /// for one that has gone): dropped and counted.
    Drop,
}

impl CompositeDevice {
    /// Joins `nic` to the shared-memory wire `wire` under the NIC's MAC.
    pub fn new(nic: Box<dyn FrameDevice>, wire: &str) -> io::Result<CompositeDevice> {
        let shm = ShmDevice::open(wire, Some(nic.mac()))?;
        let epoll = sys::epoll(&[nic.wait_fd(), shm.wait_fd()])?;
        Ok(CompositeDevice { nic, shm, epoll, shm_first: false, nic_oversize: 0 })
    }

    fn route(&mut self, f: &TxFrame<'_>) -> Route {
        // Destination, ethertype and endpoint lie in the first bytes.
        let mut head = [0u8; 64];
        let n = f.prefix(&mut head);
        if n >= 6 && MacAddr(head[..6].try_into().unwrap()).is_broadcast() {
            Route::Both
        } else if self.shm.takes(&head[..n]) {
            Route::Shm
        } else if f.len() > ETH_HEADER_LEN + self.nic.mtu() {
            Route::Drop
        } else {
            Route::Nic
        }
    }

    /// The members in the order they receive this time (they take turns).
    fn in_turn(&mut self) -> (&mut dyn FrameDevice, &mut dyn FrameDevice) {
        self.shm_first = !self.shm_first;
        if self.shm_first {
            (&mut self.shm, &mut *self.nic)
        } else {
            (&mut *self.nic, &mut self.shm)
        }
    }
}

impl FrameDevice for CompositeDevice {
    fn mac(&self) -> MacAddr {
        self.nic.mac()
    }

    fn mtu(&self) -> usize {
        self.nic.mtu().min(SHM_MTU)
    }

    fn capabilities(&self) -> Capabilities {
        self.nic.capabilities()
    }

    fn wait_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        self.nic.set_filter(filter)?;
        self.shm.set_filter(filter)
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let (a, b) = self.in_turn();
        let n = a.receive(budget, sink)?;
        Ok(n + b.receive(budget - n, sink)?)
    }

    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], Option<&LentPayload>)) -> io::Result<usize> {
        let (a, b) = self.in_turn();
        let n = a.receive_lent(budget, sink)?;
        Ok(n + b.receive_lent(budget - n, sink)?)
    }

    fn mtu_to(&mut self, head: &[u8]) -> usize {
        if self.shm.takes(head) {
            self.shm.mtu()
        } else {
            self.mtu()
        }
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let mut done = 0;
        while done < frames.len() {
            // The longest run of frames taking the same member.
            let route = self.route(&frames[done]);
            let mut end = done + 1;
            while end < frames.len() && self.route(&frames[end]) == route {
                end += 1;
            }
            let run = &frames[done..end];
            let sent = match route {
                Route::Nic => self.nic.transmit(run)?,
                Route::Shm => self.shm.transmit(run)?,
                Route::Drop => {
                    self.nic_oversize += run.len() as u64;
                    run.len()
                }
                Route::Both => {
                    let sent = self.nic.transmit(run)?;
                    // Best effort on the wire, as broadcasts are.
                    self.shm.transmit(&run[..sent])?;
                    sent
                }
            };
            done += sent;
            if sent < run.len() {
                break;
            }
        }
        Ok(done)
    }

    fn map_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.nic.map_memory(addr, len)
    }

    fn unmap_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.nic.unmap_memory(addr, len)
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut s = self.nic.stats();
        s.extend(self.shm.stats());
        s.push(("composite_nic_oversize", self.nic_oversize));
        s
    }
}

/// The epoll calls, each confining its `unsafe`.
mod sys {
    use super::*;

    /// An epoll set, readable when any of `fds` is.
    pub fn epoll(fds: &[RawFd]) -> io::Result<OwnedFd> {
        // SAFETY: plain epoll creation.
        let e = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if e < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `e` was just created and is ours.
        let owned = unsafe { OwnedFd::from_raw_fd(e) };
        for &fd in fds {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
            // SAFETY: adds a live descriptor with a live event struct.
            if unsafe { libc::epoll_ctl(e, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoopbackDevice;

    fn frame(dst: MacAddr, fill: u8) -> Vec<u8> {
        let mut f = vec![fill; 80];
        f[..6].copy_from_slice(&dst.0);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f
    }

    fn recv_all(d: &mut dyn FrameDevice) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while d.receive(3, &mut |f| v.push(f.to_vec())).unwrap() > 0 {}
        v
    }

    /// Two composites share a wire; a third host is reachable only by the
    /// (loopback) NIC. Frames take the right member, in order, and the
    /// wait descriptor wakes for either.
    #[test]
    fn same_host_frames_take_the_wire_and_the_rest_the_nic() {
        let (lw, sw) = (format!("comp-{}", std::process::id()), format!("comp-{}", std::process::id()));
        let mut a = CompositeDevice::new(Box::new(LoopbackDevice::open(&lw).unwrap()), &sw).unwrap();
        let mut b = CompositeDevice::new(Box::new(LoopbackDevice::open(&lw).unwrap()), &sw).unwrap();
        let mut far = LoopbackDevice::open(&lw).unwrap();
        let (to_b, to_far) = (frame(b.mac(), 1), frame(far.mac(), 2));
        let batch: Vec<TxFrame> = [&to_b, &to_far, &to_b, &to_far].iter().map(|f| TxFrame::new(f)).collect();
        let mut pfd = libc::pollfd { fd: b.wait_fd(), events: libc::POLLIN, revents: 0 };
        assert_eq!(a.transmit(&batch).unwrap(), 4);
        // SAFETY: poll on one live pollfd, no wait.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 1, "b's epoll set is readable");
        assert_eq!(recv_all(&mut b), vec![to_b.clone(), to_b]);
        let stats = b.stats();
        assert!(stats.contains(&("shm_rx_frames", 2)) && stats.contains(&("rx_frames", 0)), "both came by shared memory: {stats:?}");
        assert_eq!(recv_all(&mut far), vec![to_far.clone(), to_far]);
        crate::shm::remove_wire(&sw);
    }
}
