//! Explaining a refused pin: a device that DMAs from memory (type-1 VFIO)
//! pins its pages and charges them to the process's locked memory, and
//! without `CAP_IPC_LOCK` the kernel refuses (ENOMEM) a pin that would take
//! it past `RLIMIT_MEMLOCK`. [`explain_pin_error`] turns that bare ENOMEM
//! into an error naming the limit, what is already locked and the remedies.
//! Devices that copy instead of DMA (AF_PACKET, shared memory) pin nothing
//! and never need this.

use std::io;

/// `CAP_IPC_LOCK` (linux/capability.h): pinning past the limit is allowed.
pub const CAP_IPC_LOCK: u32 = 14;

/// What `/proc/self/status` says about locked memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockedMemory {
    /// Bytes this process has locked (`VmLck`), pinned DMA pages included.
    pub locked: u64,
    /// Whether the effective capabilities (`CapEff`) hold `CAP_IPC_LOCK`.
    pub ipc_lock: bool,
}

impl LockedMemory {
    /// Reads the `VmLck` and `CapEff` lines of a `/proc/<pid>/status` text.
    pub fn parse(status: &str) -> Option<LockedMemory> {
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim);
        let kib: u64 = field("VmLck")?.strip_suffix("kB")?.trim().parse().ok()?;
        let cap_eff = u64::from_str_radix(field("CapEff")?, 16).ok()?;
        Some(LockedMemory { locked: kib * 1024, ipc_lock: cap_eff & (1 << CAP_IPC_LOCK) != 0 })
    }

    /// This process's locked memory now.
    pub fn current() -> Option<LockedMemory> {
        LockedMemory::parse(&std::fs::read_to_string("/proc/self/status").ok()?)
    }
}

/// The soft `RLIMIT_MEMLOCK` in bytes; `None` when unlimited.
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one `rlimit` into the local we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(r.rlim_cur)
}

/// `e`, from pinning `bytes` bytes for `what` (e.g. "the NIC"), explained
/// when it is the kernel refusing to go past `RLIMIT_MEMLOCK`: an ENOMEM
/// while the process lacks `CAP_IPC_LOCK` and the pin does not fit under
/// the limit. Any other error comes back unchanged. The kind stays
/// `OutOfMemory`.
pub fn explain_pin_error(e: io::Error, bytes: usize, what: &str) -> io::Error {
    match LockedMemory::current() {
        Some(now) => explain(e, bytes, what, memlock_limit(), now),
        None => e,
    }
}

/// [`explain_pin_error`] with the limit and the process's state given.
pub fn explain(e: io::Error, bytes: usize, what: &str, limit: Option<u64>, now: LockedMemory) -> io::Error {
    let Some(limit) = limit else { return e };
    if e.kind() != io::ErrorKind::OutOfMemory || now.ipc_lock || now.locked + bytes as u64 <= limit {
        return e;
    }
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!(
            "pinning {bytes} bytes for {what} failed ({e}): RLIMIT_MEMLOCK is {limit} bytes and {} are already locked by this process (raise it with `ulimit -l` or limits.conf, or give the process CAP_IPC_LOCK)",
            now.locked
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tvia\nVmPin:\t       0 kB\nVmLck:\t    2196 kB\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffbfff\n";

    fn enomem() -> io::Error {
        io::Error::from_raw_os_error(libc::ENOMEM)
    }

    #[test]
    fn parses_locked_bytes_and_the_capability() {
        assert_eq!(LockedMemory::parse(STATUS), Some(LockedMemory { locked: 2196 * 1024, ipc_lock: false }));
        let with_cap = STATUS.replace("000001ffffffbfff", "000001ffffffffff");
        assert_eq!(LockedMemory::parse(&with_cap).map(|m| m.ipc_lock), Some(true));
        assert_eq!(LockedMemory::parse("Name:\tvia\n"), None, "no VmLck line");
    }

    #[test]
    fn a_pin_past_the_limit_names_it() {
        let now = LockedMemory { locked: 262144, ipc_lock: false };
        let e = explain(enomem(), 8388608, "the NIC", Some(1048576), now);
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        let msg = e.to_string();
        for part in ["pinning 8388608 bytes for the NIC", "RLIMIT_MEMLOCK is 1048576 bytes", "262144 are already locked", "ulimit -l", "CAP_IPC_LOCK"] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
    }

    #[test]
    fn other_causes_stay_unexplained() {
        let now = LockedMemory { locked: 262144, ipc_lock: false };
        let same = |e: io::Error| e.to_string() == enomem().to_string();
        assert!(same(explain(enomem(), 8388608, "x", None, now)), "unlimited");
        assert!(same(explain(enomem(), 8388608, "x", Some(1048576), LockedMemory { ipc_lock: true, ..now })), "CAP_IPC_LOCK");
        assert!(same(explain(enomem(), 4096, "x", Some(1048576), now)), "fits under the limit");
        let busy = explain(io::Error::from_raw_os_error(libc::EBUSY), 8388608, "x", Some(1048576), now);
        assert_eq!(busy.raw_os_error(), Some(libc::EBUSY));
    }

    #[test]
    fn counts_a_page_this_process_locks() {
        let page = 4096;
        // SAFETY: a fresh private anonymous page; checked below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let before = LockedMemory::current().expect("/proc/self/status has VmLck and CapEff");
        // SAFETY: locks the page mapped above.
        let locked = unsafe { libc::mlock(p, page) };
        let why = io::Error::last_os_error();
        let during = LockedMemory::current();
        // SAFETY: unlocks and unmaps the page mapped above; nothing refers to it.
        unsafe {
            libc::munlock(p, page);
            libc::munmap(p, page);
        }
        assert_eq!(locked, 0, "mlock of one page: {why} (RLIMIT_MEMLOCK {:?})", memlock_limit());
        assert_eq!(during.map(|d| d.locked), Some(before.locked + page as u64));
    }
}
