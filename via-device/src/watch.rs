//! Words a waiting thread can spin on between rounds of progress: the
//! place in a device's receive ring that its next frame changes (a shared-
//! memory slot's sequence word, a TPACKET slot's status word).
//!
//! A wait that spins runs a whole round of progress per look (the engine's
//! lock, the clock, every member of a composite, the timers): a frame that
//! lands just after a look waits for the rest of that round and the next
//! one before anybody sees it. Between rounds the wait can instead watch
//! these words, one load each, and run the next round as soon as one of
//! them changes (or after a bounded number of looks, so that timers and
//! other threads' work are still seen). A watch never takes a frame: it
//! only says whether a proper look would find one (a poll that finds
//! nothing complete skips its round when it would not).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Most watched words one device reports (a composite: all its members).
pub const MAX_WATCHES: usize = 4;

#[derive(Clone, Copy)]
enum Word {
    U32(NonNull<AtomicU32>, u32),
    U64(NonNull<AtomicU64>, u64),
}

/// One watched word: it has changed once `word & mask` differs from the
/// value it had when the device found its ring empty.
#[derive(Clone, Copy)]
pub struct RxWatch {
    word: Word,
    idle: u64,
}

impl RxWatch {
    /// Watches the bits `mask` of `word`, idle while they equal `idle`.
    ///
    /// # Safety
    /// `word` must stay mapped for as long as the device that reports it
    /// lives (a waiting thread reads it without the device's lock, while
    /// it holds the NIC open).
    pub unsafe fn u32(word: &AtomicU32, mask: u32, idle: u32) -> RxWatch {
        RxWatch { word: Word::U32(NonNull::from(word), mask), idle: u64::from(idle & mask) }
    }

    /// Watches all of `word`, idle while it equals `idle`.
    ///
    /// # Safety
    /// As for [`RxWatch::u32`].
    pub unsafe fn u64(word: &AtomicU64, idle: u64) -> RxWatch {
        RxWatch { word: Word::U64(NonNull::from(word), u64::MAX), idle }
    }

    /// Has the word left its idle value?
    #[inline]
    pub fn changed(&self) -> bool {
        // SAFETY: the device that made the watch promised the word stays
        // mapped while it lives (`RxWatch::u32`), and the caller holds
        // the NIC, so the device lives.
        match self.word {
            Word::U32(w, mask) => u64::from(unsafe { w.as_ref() }.load(Ordering::Relaxed) & mask) != self.idle,
            Word::U64(w, mask) => unsafe { w.as_ref() }.load(Ordering::Relaxed) & mask != self.idle,
        }
    }
}

// SAFETY: a watch is a pointer to an atomic word and a value; the word
// may be read from any thread, and it lives as long as the device that
// made it (`RxWatch::u32`), wherever that device is moved. A composite
// device keeps its members' watches with them.
unsafe impl Send for RxWatch {}

/// The watches of one device, collected while the caller has the device
/// to itself: watchable only if every part of the device that can
/// receive reported its word.
#[derive(Default)]
pub struct RxWatches {
    words: [Option<RxWatch>; MAX_WATCHES],
    n: usize,
    /// A part of the device could not say where its next frame shows.
    blind: bool,
    /// A part of the device has a frame waiting already.
    ready: bool,
}

impl RxWatches {
    /// Forgets what was collected, for the next round (the words past `n`
    /// are never read: no need to zero them).
    #[inline]
    pub fn clear(&mut self) {
        self.n = 0;
        self.blind = false;
        self.ready = false;
    }

    /// Adds a watched word.
    pub fn push(&mut self, w: RxWatch) {
        match self.words.get_mut(self.n) {
            Some(slot) => {
                *slot = Some(w);
                self.n += 1;
            }
            None => self.blind = true,
        }
    }

    /// The one word collected, if exactly one was and no frame is waiting
    /// (what a composite keeps of a member that found nothing).
    pub fn single(&self) -> Option<RxWatch> {
        match (self.n, self.blind || self.ready) {
            (1, false) => self.words[0],
            _ => None,
        }
    }

    /// A part of the device cannot be watched: the wait looks in rounds.
    pub fn blind(&mut self) {
        self.blind = true;
    }

    /// A part of the device has a frame already: no point in watching.
    pub fn ready(&mut self) {
        self.ready = true;
    }

    /// Can a wait rely on these words to tell it when frames come?
    pub fn usable(&self) -> bool {
        self.n > 0 && !self.blind
    }

    /// Has a frame come (or is one there already)? For usable watches.
    #[inline]
    pub fn changed(&self) -> bool {
        self.ready || self.words[..self.n].iter().flatten().any(RxWatch::changed)
    }

    /// Spins until a word changes or `looks` looks have found nothing;
    /// true when a word changed.
    #[inline]
    pub fn spin(&self, looks: u32) -> bool {
        for _ in 0..looks {
            if self.changed() {
                crate::probe::seen();
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_watched_until_it_leaves_its_idle_value() {
        let a = AtomicU32::new(0);
        let b = AtomicU64::new(7);
        let mut w = RxWatches::default();
        assert!(!w.usable(), "nothing reported: not usable");
        // SAFETY: both words outlive the watches.
        unsafe {
            w.push(RxWatch::u32(&a, 1, 0));
            w.push(RxWatch::u64(&b, 7));
        }
        assert!(w.usable());
        assert!(!w.changed());
        assert!(!w.spin(3));
        a.store(2, Ordering::Relaxed); // outside the mask
        assert!(!w.changed());
        a.store(3, Ordering::Relaxed);
        assert!(w.changed());
        a.store(0, Ordering::Relaxed);
        b.store(8, Ordering::Relaxed);
        assert!(w.spin(3));
    }

    #[test]
    fn a_blind_part_or_too_many_words_make_the_watches_unusable() {
        let a = AtomicU32::new(0);
        let mut w = RxWatches::default();
        // SAFETY: the word outlives the watches.
        unsafe { w.push(RxWatch::u32(&a, 1, 0)) };
        w.blind();
        assert!(!w.usable());
        w.clear();
        for _ in 0..=MAX_WATCHES {
            // SAFETY: as above.
            unsafe { w.push(RxWatch::u32(&a, 1, 0)) };
        }
        assert!(!w.usable());
        w.clear();
        // SAFETY: as above.
        unsafe { w.push(RxWatch::u32(&a, 1, 0)) };
        w.ready();
        assert!(w.usable() && w.changed(), "a frame already there ends the spin at once");
    }
}
