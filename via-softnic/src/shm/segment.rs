//! The shared-memory segment of a wire: its layout (header, ports, rings),
//! the mapping, the ports' locks, and how the file `/dev/shm/via-shm-<wire>`
//! is made or joined.
//!
//! Only the caller's user may be behind a segment: whoever can write it
//! can make a member read another process's memory (lent records name a
//! pid and addresses) or ring another process's descriptors. So a segment
//! is created with `O_EXCL` and mode 0600 (set again with `fchmod`, whatever
//! the umask), and one that exists already is opened without `O_CREAT`
//! and without following a symbolic link, and used only if it is a regular
//! file with one link, owned by our effective uid, with no group or other
//! permission bits. Anything else is refused with an error naming the
//! file, its owner and its mode; nothing is written to it.
//!
//! Two members may create at once: one `O_EXCL` wins, the other opens the
//! file the winner made and checks it. The winner may not have grown it
//! yet: every member grows a short file to the segment's size itself
//! (growing to the same size is idempotent, and never shrinks), and an
//! all-zero header is a valid empty segment (every port free, epoch 0)
//! whose magic the first member to look sets with a compare-and-swap. So
//! there is no half-initialised state to wait for.

use super::payload_copy::ReadCosts;
use super::{ETH_HEADER_LEN, MTU, PORTS, SLOTS};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes at the start of a slot before the frame: its sequence word (the
/// ring index it was published at, plus one: what tells its owner the
/// slot is full) and its length word.
pub(super) const SLOT_PREFIX: usize = 16;
/// Bytes of a slot: the prefix and the largest frame, rounded.
pub(super) const SLOT_BYTES: usize = (SLOT_PREFIX + ETH_HEADER_LEN + MTU).next_multiple_of(64);
/// Bytes of a port's control block (its fields on separate cache lines).
const CONTROL_BYTES: usize = 256;
const PORT_BYTES: usize = CONTROL_BYTES + SLOTS as usize * SLOT_BYTES;
const HEADER_BYTES: usize = 4096;
/// VIs per port whose boxed messages have a placed word (by VI handle).
pub(super) const BOX_VIS: usize = 2048;
/// Each port's placed words ([`Segment::placed`]), after the ports.
const PLACED_BYTES: usize = PORTS * BOX_VIS * 8;
const SEGMENT_BYTES: usize = HEADER_BYTES + PORTS * PORT_BYTES + PLACED_BYTES;
const MAGIC: u64 = u64::from_le_bytes(*b"VIASHM07");

/// Port states.
pub(super) const FREE: u32 = 0;
pub(super) const CLAIMED: u32 = 1;
pub(super) const LIVE: u32 = 2;

/// The segment header.
#[repr(C)]
pub(super) struct Header {
    magic: AtomicU64,
    /// Bumped whenever a port's identity or filter changes, so senders
    /// know to look at the port table again.
    pub epoch: AtomicU64,
}

/// A port's control block, in shared memory, on three cache lines by who
/// writes them, so that a frame moves no line but its slot's: the
/// identity (written when the port changes hands, or its owner sleeps or
/// is rung: read by senders), the senders' line, the owner's line.
#[repr(C)]
pub(super) struct Control {
    pub state: AtomicU32,
    pub pid: AtomicU32,
    pub generation: AtomicU32,
    /// The owner's eventfd (a descriptor number in the owner's process).
    pub wake_fd: AtomicU32,
    /// The identity MAC in the low 48 bits.
    pub mac: AtomicU64,
    /// The receive filter: ethertype << 32 | offset, and the two accepted
    /// words; ethertype 0 means none (accept everything).
    pub filter: [AtomicU64; 2],
    /// Ports whose owners found this ring full (bit p for port p): rung
    /// when the owner makes room.
    pub blocked: AtomicU64,
    /// The eventfd was rung and not emptied since: no need to ring again.
    pub rung: AtomicU32,
    _pad0: u32,
    /// Threads of the owner asleep on its eventfd, or about to be, in the
    /// low 32 bits (a sender rings only while they are not 0), under the
    /// port's generation in the high 32 (so that a sleep of a port's
    /// previous owner, ending late, does not count down the next one's).
    pub sleepers: AtomicU64,
    /// The senders' lock: 0, or the pid of the process holding it.
    pub lock: AtomicU32,
    _pad1: u32,
    /// Frames appended (written by senders under the lock).
    pub tail: AtomicU64,
    /// The owner's `head` as senders last read it (under the lock): they
    /// read the owner's line only when this says the ring is full.
    pub head_seen: AtomicU64,
    _pad2: [u8; 40],
    /// Frames taken out (written by the owner alone, once per batch).
    pub head: AtomicU64,
    /// Where a receiver of the owner's lent payloads last posted a copy
    /// for the owner to share (`shared_copies`): 0, or `(port + 1) << 48`
    /// with the ring index of the slot that holds the record.
    pub copy_posted: AtomicU64,
    _pad3: [u8; 48],
    /// What taking a large frame costs the owner, by how it was written
    /// (`payload_copy`: written now and then, read by senders as often).
    pub read_costs: ReadCosts,
}

// The identity, the senders' and the owner's words on lines of their own,
// and the owner's copy costs on a fourth.
const _: () = assert!(std::mem::offset_of!(Control, lock) == 64 && std::mem::offset_of!(Control, head) == 128 && std::mem::offset_of!(Control, read_costs) == 192);
const _: () = assert!(std::mem::size_of::<Control>() <= CONTROL_BYTES);

/// Does process `pid` exist?
pub(super) fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    pid != 0 && (unsafe { libc::kill(pid as i32, 0) } == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// The mapped segment.
pub(super) struct Segment {
    base: *mut u8,
}

// SAFETY: the mapping is shared memory accessed through atomics and
// through slots owned by one side at a time (see the shm module comment).
unsafe impl Send for Segment {}
// SAFETY: as above; what a shared reference reaches (the control blocks)
// is atomics only.
unsafe impl Sync for Segment {}

impl Segment {
    /// Maps the segment at `path`, made owner-only or checked to be (module
    /// comment).
    pub fn open(path: &str) -> io::Result<Segment> {
        let c = CString::new(path).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the wire name"))?;
        let fd = open_private(&c, path)?;
        grow(&fd)?;
        // SAFETY: maps the whole file, shared; checked for failure.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), SEGMENT_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let seg = Segment { base: base.cast() };
        match seg.header().magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) | Err(MAGIC) => Ok(seg),
            Err(other) => Err(io::Error::new(io::ErrorKind::InvalidData, format!("{path} is not a via shm segment of this version (magic {other:#x})"))),
        }
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header sits at the start of the mapping, which is
        // page-aligned and outlives `self`; its fields are atomics.
        unsafe { &*self.base.cast::<Header>() }
    }

    pub fn control(&self, p: usize) -> &Control {
        debug_assert!(p < PORTS);
        // SAFETY: port `p`'s control block lies inside the mapping at a
        // 64-byte aligned offset; its fields are atomics.
        unsafe { &*self.base.add(HEADER_BYTES + p * PORT_BYTES).cast::<Control>() }
    }

    /// Slot `i` of port `p`'s ring.
    pub fn slot(&self, p: usize, i: u64) -> *mut u8 {
        // SAFETY: the offset stays inside port `p`'s ring.
        unsafe { self.base.add(HEADER_BYTES + p * PORT_BYTES + CONTROL_BYTES + (i % SLOTS) as usize * SLOT_BYTES) }
    }

    /// The sequence word of slot `i` of port `p`: `i + 1` once the frame
    /// appended at ring index `i` is published there.
    pub fn slot_seq(&self, p: usize, i: u64) -> &AtomicU64 {
        // SAFETY: a slot starts 64-byte aligned inside the mapping, which
        // outlives `self`; its first word is only accessed atomically.
        unsafe { &*self.slot(p, i).cast::<AtomicU64>() }
    }

    /// The word in which the receiver of the boxed messages of VI `vi`
    /// of port `p`'s owner says how many it placed (`vi < BOX_VIS`).
    pub fn placed(&self, p: usize, vi: usize) -> &AtomicU64 {
        assert!(p < PORTS && vi < BOX_VIS);
        // SAFETY: the placed words lie after the ports, inside the
        // mapping, 8-byte aligned; they are only accessed atomically.
        unsafe { &*self.base.add(HEADER_BYTES + PORTS * PORT_BYTES + (p * BOX_VIS + vi) * 8).cast::<AtomicU64>() }
    }

    /// Is `pid` the owner of a live port?
    pub fn has_member(&self, pid: u32) -> bool {
        self.port_of(pid).is_some()
    }

    /// The live port process `pid` owns, if any.
    pub fn port_of(&self, pid: u32) -> Option<usize> {
        (0..PORTS).find(|&p| {
            let c = self.control(p);
            c.state.load(Ordering::Acquire) == LIVE && c.pid.load(Ordering::Acquire) == pid
        })
    }

    /// Takes port `p`'s lock, overruling a holder that died.
    pub fn lock(&self, p: usize, me: u32) {
        let c = self.control(p);
        let mut spins = 0u32;
        loop {
            match c.lock.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(holder) => {
                    spins += 1;
                    if spins.is_multiple_of(256) {
                        if holder != 0 && !alive(holder) && c.lock.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                            return;
                        }
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }

    pub fn unlock(&self, p: usize) {
        self.control(p).lock.store(0, Ordering::Release);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `open` mapped.
        unsafe { libc::munmap(self.base.cast(), SEGMENT_BYTES) };
    }
}

/// `open(2)`, its descriptor owned.
fn open_fd(path: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: plain open of a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: fstat into a zeroed struct on a descriptor we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// How many times a member looks again at a segment file that another
/// member is creating or removing under its feet.
const ATTEMPTS: usize = 1000;

/// Creates the segment file owner-only, or opens the existing one and
/// checks that it is (module comment).
fn open_private(c: &CStr, path: &str) -> io::Result<OwnedFd> {
    for _ in 0..ATTEMPTS {
        match open_fd(c, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600) {
            Ok(fd) => {
                // The umask may have taken owner bits away: set the mode
                // we mean, for the members that open it after us.
                // SAFETY: fchmod on a descriptor we own.
                if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                check_private(&fstat(&fd)?, path)?;
                return Ok(fd);
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        match open_fd(c, libc::O_RDWR, 0) {
            Ok(fd) => {
                check_private(&fstat(&fd)?, path)?;
                return Ok(fd);
            }
            // Removed since: make it afresh.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            // Between another member's creation and its fchmod (a umask
            // without owner bits): look again.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) && ours_being_made(path) => std::thread::yield_now(),
            Err(e) => return Err(refusal(path, e)),
        }
    }
    Err(io::Error::new(io::ErrorKind::WouldBlock, format!("{path}: not opened in {ATTEMPTS} attempts (other members kept removing it or setting it up)")))
}

/// Is the file at `path` ours and without the owner's read and write
/// bits, as a member's segment is between its creation and its `fchmod`?
fn ours_being_made(path: &str) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file() && m.uid() == euid() && m.mode() & 0o600 != 0o600)
}

/// The error for a segment file we could not open: a symbolic link (or
/// anything else `O_NOFOLLOW` refuses) is described as such.
fn refusal(path: &str, e: io::Error) -> io::Error {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            let to = std::fs::read_link(path).map_or_else(|_| "?".into(), |t| t.display().to_string());
            io::Error::new(io::ErrorKind::PermissionDenied, format!("{path} is a symbolic link to {to} (owner uid {}): refusing it; {}", m.uid(), the_rule()))
        }
        _ => e,
    }
}

fn the_rule() -> String {
    format!("a via shm segment must be a regular file of uid {} (ours) with mode 0600; remove it if it is stale", euid())
}

/// Refuses a segment file that is not a regular file with one link, owned
/// by our effective uid, without group or other permissions.
fn check_private(st: &libc::stat, path: &str) -> io::Result<()> {
    let kind = st.st_mode & libc::S_IFMT;
    let mode = st.st_mode & 0o7777;
    let what = if kind != libc::S_IFREG {
        "is not a regular file"
    } else if st.st_uid != euid() {
        "belongs to another user"
    } else if mode & 0o077 != 0 {
        "is open to other users"
    } else if st.st_nlink != 1 {
        "has other names (hard links)"
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{path} {what} (owner uid {}, mode {mode:04o}, {} links): refusing it; {}", st.st_uid, st.st_nlink, the_rule()),
    ))
}

/// Grows the file to the segment's size (another member may be doing the
/// same: both grow it to one size). The pages stay unallocated until
/// touched.
fn grow(fd: &OwnedFd) -> io::Result<()> {
    if (fstat(fd)?.st_size as usize) < SEGMENT_BYTES {
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SEGMENT_BYTES as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
