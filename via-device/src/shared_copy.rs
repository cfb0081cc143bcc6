//! A lent payload copied by both of its ends at once ([`SharedCopy`]).
//!
//! A receiver alone reads a lent payload at what one core's copy does
//! (`process_vm_readv`, ~15 GB/s here), while the sender's core, whose
//! message it is, waits. Where the device shares a block of memory with
//! both ends beside the lent record (the shared-memory wire's slot), the
//! receiver posts the copy there as a job: where the bytes go (its pid
//! and an address of its own), cut into [`CHUNK`]-byte chunks, and tells
//! the sender where the block is (a word the sender watches,
//! [`SharedCopyRef::posted`]). It takes chunks from the front, and the
//! sender, when it looks (its device's `serve_peers`), takes them from
//! the back and writes them with `process_vm_writev`. One word holds the
//! job's record and its unclaimed chunks, so each chunk is claimed once,
//! by a compare-and-swap; the receiver then waits for the chunks the
//! sender claimed. A sender that does not look leaves every chunk to the
//! receiver; one that fails to write a chunk leaves the receiver to read
//! it all again; one that dies makes the read fail, as a lent read from a
//! dead process does.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::LentPayload;

/// Bytes of one chunk of a shared copy.
pub const CHUNK: usize = 128 << 10;

/// The `done` word's bit for a chunk the sender failed to write (its
/// count counts it too).
const FAILED: u32 = 1 << 31;

/// The block beside a lent record that both ends use. All zero: no job.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct SharedCopy {
    /// `record << 32 | front << 16 | back`: the record the block belongs
    /// to (its sender's, nonzero) and the chunks `[front, back)` of the
    /// open job not yet claimed.
    job: AtomicU64,
    /// Chunks of the open job the sender has finished, written or not
    /// (`FAILED` if one was not).
    done: AtomicU32,
    /// The receiver's pid, and the job: bytes `[from, from + len)` of the
    /// payload to address `dst` of the receiver.
    rpid: AtomicU32,
    dst: AtomicU64,
    from: AtomicU64,
    len: AtomicU64,
}

/// Where a lent payload's shared block is, and how its receiver tells
/// the sender that it posted a copy there: by storing `ticket` (which
/// names the block to the sender's device) in the word `posted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedCopyRef {
    pub block: NonNull<SharedCopy>,
    pub posted: NonNull<AtomicU64>,
    pub ticket: u64,
}

fn unpack(w: u64) -> (u32, u64, u64) {
    ((w >> 32) as u32, (w >> 16) & 0xffff, w & 0xffff)
}

impl SharedCopy {
    /// The sender, as it writes the record: the block belongs to `record`
    /// (nonzero, unique among the records in flight on the wire), with no
    /// job open.
    pub fn reset(&self, record: u32) {
        self.done.store(0, Ordering::Relaxed);
        self.job.store(u64::from(record) << 32, Ordering::Relaxed);
    }

    /// The record the block belongs to.
    pub fn record(&self) -> u32 {
        (self.job.load(Ordering::Acquire) >> 32) as u32
    }

    /// The record of the open job, if it has chunks left to claim: what
    /// the sender reads before it looks at the record (so that a block
    /// another record took over meanwhile fails its claims, `help`).
    pub fn open_record(&self) -> Option<u32> {
        let (owner, front, back) = unpack(self.job.load(Ordering::Acquire));
        (owner != 0 && front < back).then_some(owner)
    }

    /// The receiver: copies bytes `[from, from + len)` of `lent` to `dst`,
    /// sharing the chunks with a sender that looks meanwhile (told by
    /// `posted`: see [`SharedCopyRef`]). Returns once every chunk is in
    /// place (or one failed, or the sender died with a chunk claimed).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, by this process and
    /// by the sender, until this returns; `posted` must be mapped.
    pub unsafe fn pull(&self, posted: (&AtomicU64, u64), lent: &LentPayload, from: usize, dst: *mut u8, len: usize) -> io::Result<()> {
        match self.open(posted, from, dst, len) {
            // SAFETY: as the caller promised.
            Some(chunks) => unsafe { self.finish(chunks, lent, from, dst, len) },
            // SAFETY: as the caller promised.
            None => unsafe { lent.read(from, dst, len) },
        }
    }

    /// Posts the copy of `len` bytes to `dst` as a job, if it is worth
    /// sharing (two chunks or more): how many chunks.
    fn open(&self, posted: (&AtomicU64, u64), from: usize, dst: *mut u8, len: usize) -> Option<usize> {
        let chunks = len.div_ceil(CHUNK);
        let record = self.record();
        if !(2..=0xffff).contains(&chunks) || record == 0 {
            return None;
        }
        self.rpid.store(std::process::id(), Ordering::Relaxed);
        self.dst.store(dst as u64, Ordering::Relaxed);
        self.from.store(from as u64, Ordering::Relaxed);
        self.len.store(len as u64, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        // Open: the sender's claim (an acquire of this word) sees the job.
        self.job.store(u64::from(record) << 32 | chunks as u64, Ordering::Release);
        posted.0.store(posted.1, Ordering::Release);
        Some(chunks)
    }

    /// The receiver's part of the open job of `chunks` chunks: claims and
    /// reads chunks from the front while any is left, then waits for the
    /// ones the sender claimed.
    ///
    /// # Safety
    /// As for [`SharedCopy::pull`].
    unsafe fn finish(&self, chunks: usize, lent: &LentPayload, from: usize, dst: *mut u8, len: usize) -> io::Result<()> {
        let (mut mine, mut result) = (0, Ok(()));
        let mut w = self.job.load(Ordering::Acquire);
        loop {
            let (_, front, back) = unpack(w);
            if front >= back {
                break;
            }
            match self.job.compare_exchange_weak(w, w + (1 << 16), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let at = front as usize * CHUNK;
                    let n = CHUNK.min(len - at);
                    // SAFETY: chunk `front` lies inside `dst`'s `len` bytes.
                    let r = unsafe { lent.read(from + at, dst.add(at), n) };
                    if result.is_ok() {
                        result = r;
                    }
                    mine += 1;
                    w = self.job.load(Ordering::Acquire);
                }
                Err(now) => w = now,
            }
        }
        // The sender's chunks: claimed, so being written now.
        let theirs = (chunks - mine) as u32;
        let mut looks = 0u32;
        loop {
            let d = self.done.load(Ordering::Acquire);
            if d & !FAILED == theirs {
                if d & FAILED != 0 && result.is_ok() {
                    // The sender could not write a chunk (a kernel that
                    // refuses it `process_vm_writev`): all of it again,
                    // read here (the chunks it wrote get the same bytes).
                    // SAFETY: as the caller promised.
                    result = unsafe { lent.read(from, dst, len) };
                }
                break;
            }
            looks = looks.wrapping_add(1);
            // Now and then: is the sender still there to finish?
            if looks.is_multiple_of(1 << 16) && gone(lent.pid) {
                result = Err(io::Error::other(format!("the sender of a lent payload (process {}) died writing its share", lent.pid)));
                break;
            }
            std::hint::spin_loop();
        }
        result
    }

    /// The sender of `record`, whose payload is `lent` (pieces in this
    /// process): writes chunks of the open job from the back until none
    /// is left; returns how many it wrote.
    pub fn help(&self, record: u32, lent: &LentPayload) -> usize {
        let mut wrote = 0;
        let mut w = self.job.load(Ordering::Acquire);
        loop {
            let (owner, front, back) = unpack(w);
            if owner != record || front >= back {
                return wrote;
            }
            if let Err(now) = self.job.compare_exchange_weak(w, w - 1, Ordering::AcqRel, Ordering::Acquire) {
                w = now;
                continue;
            }
            // Chunk `back - 1` is ours: the job's fields are the ones the
            // receiver wrote before opening it (the acquire above), and
            // stay until we say it is done.
            let k = back as usize - 1;
            let (rpid, dst, from, len) = (self.rpid.load(Ordering::Relaxed), self.dst.load(Ordering::Relaxed), self.from.load(Ordering::Relaxed) as usize, self.len.load(Ordering::Relaxed) as usize);
            let at = k * CHUNK;
            let n = CHUNK.min(len.saturating_sub(at));
            let ok = n > 0 && lent.write_to(rpid, from + at, dst + at as u64, n).is_ok();
            if !ok {
                self.done.fetch_or(FAILED, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
            wrote += 1;
            w = self.job.load(Ordering::Acquire);
        }
    }
}

/// Has process `pid` exited (or does it no longer exist)? A zombie's
/// threads are gone too: it writes nothing more.
fn gone(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
        return true;
    }
    // `/proc/<pid>/stat`: "pid (comm) S ...", the state after the last ')'.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), None | Some('Z' | 'X'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A payload of `n` bytes lent by this process, in two pieces.
    fn lent_of(src: &[u8]) -> LentPayload {
        let cut = src.len() / 3;
        let mut l = LentPayload { pid: std::process::id(), n: 2, ..LentPayload::default() };
        l.pieces[0] = (src.as_ptr() as u64, cut as u32);
        l.pieces[1] = (src[cut..].as_ptr() as u64, (src.len() - cut) as u32);
        l
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4093) as u8).collect()
    }

    #[test]
    fn the_receiver_alone_copies_every_chunk() {
        let src = pattern(5 * CHUNK + 123);
        let lent = lent_of(&src);
        let block = SharedCopy::default();
        block.reset(7);
        let posted = AtomicU64::new(0);
        let mut dst = vec![0u8; src.len() - 100];
        // SAFETY: dst holds the bytes asked for.
        unsafe { block.pull((&posted, 99), &lent, 100, dst.as_mut_ptr(), dst.len()) }.unwrap();
        assert!(dst[..] == src[100..]);
        assert_eq!(posted.load(Ordering::Relaxed), 99, "the sender was told");
        assert_eq!(block.open_record(), None, "no chunk left");
        assert_eq!(block.help(7, &lent), 0, "nothing for a late sender");
    }

    #[test]
    fn chunks_shared_with_a_sender_that_looks_meanwhile_all_arrive() {
        let src = Arc::new(pattern(64 * CHUNK + 5));
        let block = Arc::new(SharedCopy::default());
        block.reset(0x0100_0001);
        let stop = Arc::new(AtomicBool::new(false));
        // The sender: helps with whatever is open, as its device would.
        let helper = {
            let (src, block, stop) = (Arc::clone(&src), Arc::clone(&block), Arc::clone(&stop));
            std::thread::spawn(move || {
                let lent = lent_of(&src);
                let mut wrote = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Another record's job is not ours to help with.
                    assert_eq!(block.help(0x0100_0002, &lent), 0);
                    wrote += block.help(0x0100_0001, &lent);
                }
                wrote
            })
        };
        let lent = lent_of(&src);
        let posted = AtomicU64::new(0);
        let mut dst = vec![0u8; src.len()];
        for _ in 0..20 {
            dst.fill(0);
            // SAFETY: dst holds the bytes asked for.
            unsafe { block.pull((&posted, 1), &lent, 0, dst.as_mut_ptr(), dst.len()) }.unwrap();
            assert!(dst[..] == src[..], "every chunk in place, whoever wrote it");
        }
        stop.store(true, Ordering::Relaxed);
        // How many chunks the sender took depends on when it ran (the
        // test before this one makes it take them all).
        helper.join().unwrap();
    }

    #[test]
    fn chunks_the_sender_claims_before_the_receiver_are_its_own() {
        let src = pattern(6 * CHUNK + 1);
        let lent = lent_of(&src);
        let block = SharedCopy::default();
        block.reset(3);
        let posted = AtomicU64::new(0);
        let mut dst = vec![0u8; src.len()];
        let chunks = block.open((&posted, 1), 0, dst.as_mut_ptr(), dst.len()).expect("worth sharing");
        assert_eq!(block.open_record(), Some(3));
        // A sender that looks first takes every chunk, from the back.
        assert_eq!(block.help(3, &lent), chunks);
        // SAFETY: dst holds the bytes.
        unsafe { block.finish(chunks, &lent, 0, dst.as_mut_ptr(), dst.len()) }.unwrap();
        assert!(dst == src);
    }

    #[test]
    fn chunks_the_sender_fails_to_write_are_read_by_the_receiver() {
        let src = pattern(4 * CHUNK);
        let lent = lent_of(&src);
        let block = SharedCopy::default();
        block.reset(5);
        // A sender whose writes fail (here: its pieces point at nothing,
        // as a kernel refusing `process_vm_writev` would fail them).
        let mut gone = lent;
        gone.pieces[1].0 = 8;
        let posted = AtomicU64::new(0);
        let mut dst = vec![0u8; src.len()];
        let chunks = block.open((&posted, 1), 0, dst.as_mut_ptr(), dst.len()).expect("worth sharing");
        assert_eq!(block.help(5, &gone), chunks);
        // SAFETY: dst holds the bytes.
        unsafe { block.finish(chunks, &lent, 0, dst.as_mut_ptr(), dst.len()) }.unwrap();
        assert!(dst == src, "read again, whole");
        // A receiver that cannot read the payload either fails.
        let mut dst = vec![0u8; src.len()];
        let chunks = block.open((&posted, 1), 0, dst.as_mut_ptr(), dst.len()).unwrap();
        assert_eq!(block.help(5, &gone), chunks);
        // SAFETY: dst holds the bytes.
        assert!(unsafe { block.finish(chunks, &gone, 0, dst.as_mut_ptr(), dst.len()) }.is_err());
    }
}
