//! The eventfd (eventfd(2)): how a device says "frames wait" and how a
//! thread is woken from a sleep in poll(2). One type for every user: the
//! drivers' receive and interrupt descriptors, the shared-memory wire's
//! doorbells, the engine's per-thread wake-ups.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A nonblocking, close-on-exec eventfd, owned.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd with a zero count.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd(2) with constant flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nobody else owns it.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable (adds one to its count).
    pub fn signal(&self) {
        signal(self.0.as_fd());
    }

    /// Makes the eventfd unreadable again; returns the count it had (0
    /// when it was not readable).
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from our own
        // nonblocking eventfd (EAGAIN, and v stays 0, when the count is 0).
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            v
        } else {
            0
        }
    }
}

impl From<OwnedFd> for EventFd {
    /// Takes `fd` as an eventfd: the caller has checked that it is one
    /// (a descriptor of another kind would take the writes as data).
    fn from(fd: OwnedFd) -> EventFd {
        EventFd(fd)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Makes the eventfd `fd` readable: for a descriptor someone else owns
/// (another thread's wake-up eventfd, borrowed while it is registered).
pub fn signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to a descriptor that is
    // alive for the borrow. It cannot fail short of 2^64 - 1 pending
    // signals, or if `fd` is not an eventfd (then nothing is woken).
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: &EventFd) -> bool {
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn signalled_it_is_readable_until_drained() {
        let e = EventFd::new().unwrap();
        assert!(!readable(&e));
        assert_eq!(e.drain(), 0, "draining an unsignalled eventfd takes nothing and does not block");
        e.signal();
        signal(e.as_fd());
        assert!(readable(&e));
        assert_eq!(e.drain(), 2, "both signals counted");
        assert!(!readable(&e));
    }
}
