//! What each thread has pinned (hazard pointers), so that pinning a
//! handle costs no locked instruction on the data path.
//!
//! Every thread that pins gets a [`Record`] of its own: a few words, each
//! naming a table slot it has pinned (slot number + 1; 0 is free). A pin is
//! a plain store into the thread's record followed by a look at the slot's
//! state; an unpin is a plain store of 0 followed by a look at the state.
//! A destroy (the rare side) changes the slot's state first, then makes
//! sure every thread's earlier stores are visible to it, then looks at the
//! records: of a pinner's store-then-load and the destroyer's
//! store-then-load, one sees the other's store (as with two full fences),
//! so either the pinner sees the object destroyed or the destroyer sees
//! the pin.
//!
//! The destroyer's side of that is `membarrier(2)` with
//! `MEMBARRIER_CMD_PRIVATE_EXPEDITED`: every running thread of the process
//! passes a full barrier before the call returns (a thread that is not
//! running passed one when it was switched out). The pinner's side is then
//! a compiler barrier only. Where the kernel does not offer it (it is
//! registered for once, before the first handle exists), both sides use
//! full fences, which is still without a locked read-modify-write.
//!
//! Records are never freed: a thread's record goes back to a list when the
//! thread ends, for the next thread to take.

use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

/// Pins one thread holds at once (a call pins one or two handles; a
/// thread that wants more pins count them in the slot instead).
const HELD: usize = 4;

/// One thread's pins.
pub struct Record {
    held: [AtomicUsize; HELD],
    /// Owned by a live thread.
    taken: AtomicBool,
    /// The next record of the list (set once, before the record is published).
    next: *mut Record,
}

/// Every record ever made, newest first.
static RECORDS: AtomicPtr<Record> = AtomicPtr::new(null_mut());

/// `membarrier` was registered for: pins need a compiler barrier only.
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Registers the process for expedited membarriers, once; to be called
/// before the first handle exists (so before any pin can matter). Every
/// caller returns only once the registration is done: a second thread
/// that returned while the first was still registering could pin and
/// destroy while `ASYMMETRIC` changes, and a pin that found it set (a
/// compiler barrier) would meet a destroy that found it clear (a fence
/// without the membarrier): neither would see the other.
pub fn enable() {
    static ONCE: Once = Once::new();
    enable_with(&ONCE, &ASYMMETRIC, || {
        // SAFETY: membarrier takes integer arguments only.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
    });
}

/// [`enable`] with its state given: `register` runs once, and every
/// caller returns after `asymmetric` holds its answer.
fn enable_with(once: &Once, asymmetric: &AtomicBool, register: impl FnOnce() -> bool) {
    once.call_once(|| asymmetric.store(register(), Ordering::Release));
}

/// The pinner's barrier, between publishing (or clearing) a pin and
/// looking at the slot's state.
#[inline(always)]
pub fn light_barrier() {
    if ASYMMETRIC.load(Ordering::Relaxed) {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The destroyer's barrier, between changing a slot's state and looking
/// at the records.
pub fn heavy_barrier() {
    if ASYMMETRIC.load(Ordering::Acquire) {
        let membarrier = |cmd: libc::c_int| {
            // SAFETY: membarrier takes integer arguments only.
            unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
        };
        // A child after fork(2) may have to register again (it has one
        // thread then, whose own pins need no barrier).
        if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) || (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
            return;
        }
        // Registered for, and refused: pins published with a compiler
        // barrier alone would not be covered by a fence here. Abort
        // rather than free an object in use.
        std::process::abort();
    }
    fence(Ordering::SeqCst);
}

/// A pin held in the calling thread's record; cleared when dropped.
pub struct Held(&'static AtomicUsize);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// Publishes a pin of slot `slot` in the calling thread's record; None
/// when the record is full (or the thread is ending).
#[inline(always)]
pub fn hold(slot: usize) -> Option<Held> {
    let rec = mine()?;
    let w = rec.held.iter().find(|w| w.load(Ordering::Relaxed) == 0)?;
    w.store(slot + 1, Ordering::Relaxed);
    Some(Held(w))
}

/// Does any thread hold a pin of slot `slot`? (Destroyers, after
/// [`heavy_barrier`].)
pub fn held_anywhere(slot: usize) -> bool {
    let mut r = RECORDS.load(Ordering::Acquire);
    while !r.is_null() {
        // SAFETY: records are leaked: never freed once published.
        let rec = unsafe { &*r };
        if rec.held.iter().any(|w| w.load(Ordering::Acquire) == slot + 1) {
            return true;
        }
        r = rec.next;
    }
    false
}

/// The calling thread's record, taken from the list or made on first use.
#[inline(always)]
fn mine() -> Option<&'static Record> {
    thread_local! {
        static MINE: Owner = const { Owner(Cell::new(None)) };
    }
    MINE.try_with(|o| match o.0.get() {
        Some(r) => r,
        None => {
            let r = take_record();
            o.0.set(Some(r));
            r
        }
    })
    .ok()
}

/// Gives the thread's record back when the thread ends.
struct Owner(Cell<Option<&'static Record>>);

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(r) = self.0.get() {
            r.taken.store(false, Ordering::Release);
        }
    }
}

/// A record no live thread owns: a free one from the list, or a new one.
fn take_record() -> &'static Record {
    let mut r = RECORDS.load(Ordering::Acquire);
    while !r.is_null() {
        // SAFETY: records are never freed once published.
        let rec = unsafe { &*r };
        if rec.taken.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return rec;
        }
        r = rec.next;
    }
    let new = Box::into_raw(Box::new(Record { held: Default::default(), taken: AtomicBool::new(true), next: null_mut() }));
    let mut head = RECORDS.load(Ordering::Acquire);
    loop {
        // SAFETY: `new` is ours until published by the exchange below.
        unsafe { (*new).next = head };
        match RECORDS.compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: leaked: lives for the rest of the process.
            Ok(_) => return unsafe { &*new },
            Err(h) => head = h,
        }
    }
}

// SAFETY: a record's fields are atomics, and `next`, written before the
// record is published and never after.
unsafe impl Sync for Record {}
unsafe impl Send for Record {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// Threads that ask for the registration at once all return after it
    /// is done: none finds the answer missing while the first registers.
    #[test]
    fn every_caller_returns_after_the_registration() {
        let once = Arc::new(Once::new());
        let asymmetric = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (once, asymmetric, start) = (Arc::clone(&once), Arc::clone(&asymmetric), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    enable_with(&once, &asymmetric, || {
                        // A registration that takes a while, as the system
                        // call may: the others arrive meanwhile.
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        true
                    });
                    asymmetric.load(Ordering::Acquire)
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().unwrap(), "a caller returned before the registration was done");
        }
    }
}
