//! The wake-up eventfd of each thread that sleeps in a wait: one per
//! thread, created on its first sleep and closed when the thread ends.
//! A thread asleep in a wait polls the device and its own eventfd; whoever
//! may have completed or ended what it waits for writes to every sleeper's
//! eventfd. Only the owner drains its eventfd, so no sleeper can take
//! another's wake-up (which one shared eventfd allowed).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

thread_local! {
    static WAKE_FD: std::cell::OnceCell<OwnedFd> = const { std::cell::OnceCell::new() };
}

/// This thread's wake-up eventfd (created on first use).
pub(crate) fn thread_fd() -> std::io::Result<RawFd> {
    WAKE_FD.with(|cell| {
        if let Some(fd) = cell.get() {
            return Ok(fd.as_raw_fd());
        }
        // SAFETY: plain eventfd creation; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(cell.get_or_init(|| owned).as_raw_fd())
    })
}

/// Wakes the sleeper whose eventfd is `fd`.
pub(crate) fn wake(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to an eventfd; `fd` belongs
    // to a thread registered as asleep, which unregisters it (under the
    // same lock the caller holds) before its thread can end.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Clears this thread's pending wake-up.
pub(crate) fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64 from our nonblocking eventfd.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}
