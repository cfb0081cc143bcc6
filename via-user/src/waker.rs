//! The wake-up eventfd of each thread that sleeps in a wait: one per
//! thread, created on its first sleep and closed when the thread ends.
//! A thread asleep in a wait polls the device and its own eventfd; whoever
//! may have completed or ended what it waits for writes to every sleeper's
//! eventfd. Only the owner drains its eventfd, so no sleeper can take
//! another's wake-up (which one shared eventfd allowed).

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;
use via_device::EventFd;

thread_local! {
    static WAKE_FD: std::cell::OnceCell<EventFd> = const { std::cell::OnceCell::new() };
}

/// This thread's wake-up eventfd (created on first use).
pub(crate) fn thread_fd() -> std::io::Result<RawFd> {
    WAKE_FD.with(|cell| {
        if let Some(fd) = cell.get() {
            return Ok(fd.as_raw_fd());
        }
        let fd = EventFd::new()?;
        Ok(cell.get_or_init(|| fd).as_raw_fd())
    })
}

/// Wakes the sleeper whose eventfd is `fd`.
pub(crate) fn wake(fd: RawFd) {
    // SAFETY: `fd` belongs to a thread registered as asleep, which
    // unregisters it (under the same lock the caller holds) before its
    // thread can end and close it: it is open for this borrow.
    via_device::eventfd::signal(unsafe { BorrowedFd::borrow_raw(fd) });
}

/// Clears this thread's pending wake-up.
pub(crate) fn drain() {
    WAKE_FD.with(|cell| {
        if let Some(fd) = cell.get() {
            fd.drain();
        }
    });
}

/// Sleeps until one of `fds` is readable or `timeout` passes (None: no limit).
pub(crate) fn sleep_on(fds: &[RawFd], timeout: Option<Duration>) {
    let mut pfd = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; 2];
    for (p, &fd) in pfd.iter_mut().zip(fds) {
        p.fd = fd;
    }
    let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: valid pollfds (fd -1 entries are ignored), a valid or null
    // timespec, no signal mask.
    unsafe { libc::ppoll(pfd.as_mut_ptr(), fds.len().min(2) as libc::nfds_t, tsp, std::ptr::null()) };
}
