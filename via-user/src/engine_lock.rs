//! The lock around an opened NIC's engine: a futex mutex without
//! poisoning. Every API call takes it, several times per message, so its
//! uncontended path is one compare-and-swap in and one swap out.
//!
//! `std::sync::Mutex` does the same atomics, and on top asks at both ends
//! whether this thread is panicking (poisoning), which the engine never
//! uses: a panic under the engine lock is a bug that ends the process's
//! use of the NIC either way, and every caller recovered the guard from a
//! poisoned lock anyway. Those two questions were ~18 instructions per call
//! (callgrind, `engine_cost`).
//!
//! The states and transitions are the classic three-state futex mutex
//! (Drepper, "Futexes Are Tricky", mutex 3): 0 free, 1 held, 2 held with
//! possible sleepers; the holder wakes one sleeper when it leaves state 2.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

const FREE: u32 = 0;
const HELD: u32 = 1;
/// Held, and a thread may sleep on the futex: unlocking wakes one.
const CONTENDED: u32 = 2;
/// Looks at the word before sleeping on it: the engine is held for short
/// stretches, and a wake-up costs far more than a short spin.
const SPINS: u32 = 100;

pub(crate) struct EngineLock<T> {
    state: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out at most one guard at a time (the state word's
// transitions), so `T` is reached by one thread at a time, as for `Mutex`.
unsafe impl<T: Send> Send for EngineLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for EngineLock<T> {}

/// Access to the locked value; unlocks when dropped. Neither sent nor
/// shared across threads by itself (the marker), as `MutexGuard`: shared,
/// it would hand `&T` to two threads, which only `T: Sync` allows (below).
pub(crate) struct EngineGuard<'a, T> {
    lock: &'a EngineLock<T>,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: `&EngineGuard` gives `&T` only; sharing that is what `T: Sync` allows.
unsafe impl<T: Sync> Sync for EngineGuard<'_, T> {}

impl<T> EngineLock<T> {
    pub(crate) fn new(value: T) -> Self {
        EngineLock { state: AtomicU32::new(FREE), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub(crate) fn lock(&self) -> EngineGuard<'_, T> {
        if self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        EngineGuard { lock: self, _not_send: PhantomData }
    }

    /// The lock if it is free now; None if another thread holds it.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<EngineGuard<'_, T>> {
        self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).ok().map(|_| EngineGuard { lock: self, _not_send: PhantomData })
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        for _ in 0..SPINS {
            if self.state.load(Ordering::Relaxed) == FREE && self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
            std::hint::spin_loop();
        }
        // From here on the word says CONTENDED while we may sleep, so the
        // holder wakes us; taking it as CONTENDED (not HELD) is safe, as it
        // costs at most one spare wake-up.
        while self.state.swap(CONTENDED, Ordering::Acquire) != FREE {
            futex_wait(&self.state, CONTENDED);
        }
    }

    #[inline]
    fn unlock(&self) {
        if self.state.swap(FREE, Ordering::Release) == CONTENDED {
            futex_wake_one(&self.state);
        }
    }
}

impl<T> Deref for EngineGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for EngineGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for EngineGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.unlock();
    }
}

/// Sleeps while `word` says `expected` (or until a wake-up or a signal;
/// the caller looks again either way).
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT reads the u32 at a valid, aligned address and
    // takes no other pointer (no timeout).
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, std::ptr::null::<libc::timespec>());
    }
}

fn futex_wake_one(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_held_lock_is_not_taken_again_until_it_is_dropped() {
        let l = EngineLock::new(5u32);
        let g = l.lock();
        assert!(l.try_lock().is_none());
        drop(g);
        assert_eq!(*l.try_lock().expect("free after the guard dropped"), 5);
    }

    /// Four threads add to an unsynchronised counter under the lock, many
    /// times each, with the lock contended (some sleep on the futex): the
    /// sum is exact only if no two ever held it at once.
    #[test]
    fn contended_increments_are_never_lost() {
        let l = Arc::new(EngineLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = Arc::clone(&l);
                std::thread::spawn(move || {
                    for i in 0..50_000u64 {
                        let mut g = l.lock();
                        let v = *g;
                        if i % 1000 == 0 {
                            std::thread::yield_now(); // hold it across a switch: others sleep
                        }
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 200_000);
        assert_eq!(l.state.load(Ordering::Relaxed), FREE);
    }
}
