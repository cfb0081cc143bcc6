//! Which processes of a wire a member trusts: those whose lent payloads it
//! reads with `process_vm_readv` and whose doorbell descriptors it copies
//! and writes to.
//!
//! A lent record and a port's pid are words in the segment, written by
//! whoever can write it. A segment is owner-only (see `segment`), so every
//! member has our uid already; we still check at use, from the kernel,
//! never from what the segment says: the pid must own a live port of the
//! wire, and `/proc/<pid>/status` must give it our effective uid as its
//! real, effective and saved uid. The answer is kept with a pidfd of the
//! process, so that it is asked once per process, and asked again if the
//! process exits (its pid may then name another). What a process of our
//! uid can still do: name another member's pid, making us read that
//! member's memory — memory it could read itself with `process_vm_readv`,
//! our uid being its uid.

use super::segment::Segment;
use super::PORTS;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The members checked so far.
pub(super) struct Members {
    /// Our effective uid.
    uid: u32,
    /// A pidfd of each process found to be a member of our uid.
    trusted: HashMap<u32, OwnedFd>,
}

impl Members {
    pub fn new() -> Members {
        // SAFETY: geteuid has no preconditions.
        Members { uid: unsafe { libc::geteuid() }, trusted: HashMap::new() }
    }

    /// Does process `pid` own a live port of `seg`, with our uid?
    pub fn trusts(&mut self, seg: &Segment, pid: u32) -> bool {
        if !seg.has_member(pid) {
            return false;
        }
        if let Some(pidfd) = self.trusted.get(&pid) {
            if running(pidfd) {
                return true;
            }
            self.trusted.remove(&pid);
        }
        let Some(pidfd) = same_user(pid, self.uid) else {
            return false;
        };
        if self.trusted.len() >= 2 * PORTS {
            self.trusted.retain(|_, fd| running(fd));
        }
        self.trusted.insert(pid, pidfd);
        true
    }
}

/// A pidfd of process `pid` if its real, effective and saved uids are
/// `uid`, as the kernel tells.
fn same_user(pid: u32, uid: u32) -> Option<OwnedFd> {
    let pidfd = pidfd_open(pid).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uids: Vec<u32> = status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().filter_map(|u| u.parse().ok()).collect();
    let ours = uids.len() >= 3 && uids[..3].iter().all(|&u| u == uid);
    // The status was our pidfd's process's if that process still runs: a
    // pid names another process only once its own has exited.
    (ours && running(&pidfd)).then_some(pidfd)
}

/// A pidfd of process `pid`.
pub(super) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel gave us this descriptor (close-on-exec).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Has the pidfd's process not exited? (A pidfd becomes readable when it
/// does.)
fn running(pidfd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one live pollfd, no wait.
    unsafe { libc::poll(&mut pfd, 1, 0) == 0 }
}

/// Is `fd` (ours) an eventfd? A doorbell must be one: a port's `wake_fd`
/// could name any descriptor of its owner.
pub(super) fn is_eventfd(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|t| t.as_os_str() == "anon_inode:[eventfd]")
}
