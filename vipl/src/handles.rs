//! The opaque handles C programs hold (`VIP_NIC_HANDLE`, `VIP_VI_HANDLE`,
//! `VIP_CQ_HANDLE`, `VIP_PROTECTION_HANDLE`, `VIP_CONN_HANDLE`).
//!
//! A handle is never a pointer to our memory: it is the number of a slot
//! in one process-wide table with a generation count above it, so a NULL,
//! forged or stale handle (one whose object was destroyed) is found out by
//! a lookup and answered with VIP_INVALID_PARAMETER, never dereferenced.
//!
//! Looking a handle up takes no lock, copies nothing and makes no locked
//! read-modify-write: the caller pins the slot in its thread's record of
//! pins ([`crate::hazard`]: a plain store), checks the generation in the
//! slot's word, and borrows the object until it unpins (a plain store).
//! A thread holding more pins than its record has room for counts them in
//! the slot's word instead (an atomic add). Creating and destroying
//! objects take the table's mutex. A slot whose object is destroyed while
//! pinned (a thread waiting on the VI that another thread destroys) gets a
//! new generation at once, so no new lookup finds it, and is marked
//! destroyed; its object is dropped by whoever finds it unpinned last (the
//! destroyer, or the last to unpin).

use std::cell::UnsafeCell;
use std::ops::Deref;
use std::os::raw::c_void;
use std::ptr::null_mut;
use crate::hazard;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use via_user::{IncomingRequest, Nic, Ptag};

/// What a handle names.
#[derive(Clone)]
pub enum Object {
    Nic(NicObject),
    Vi { nic: Nic, nic_handle: *mut c_void, id: u16 },
    Cq { nic: Nic, nic_handle: *mut c_void, vis: ViHandles, id: u16 },
    Ptag { nic: Nic, tag: Ptag },
    Conn { nic: Nic, req: IncomingRequest },
    /// A shared receive queue (extension, `vipl_ext.h`).
    Srq { nic: Nic, nic_handle: *mut c_void, id: u16 },
}

// SAFETY: the raw handle values in objects are numbers (see the module
// comment), never dereferenced.
unsafe impl Send for Object {}

/// The handle of each VI of a NIC, by VI number (what CQDone returns):
/// one word per possible VI, read without a lock.
#[derive(Clone)]
pub struct ViHandles(Arc<[AtomicUsize]>);

impl ViHandles {
    /// Room for VIs numbered 1 to `max_vi`.
    pub fn new(max_vi: usize) -> Self {
        ViHandles((0..=max_vi).map(|_| AtomicUsize::new(0)).collect())
    }
}

/// An opened NIC and what `VipQueryNic` hands out pointers into.
#[derive(Clone)]
pub struct NicObject {
    pub nic: Nic,
    /// The MAC, kept where `LocalNicAddress` may point for the NIC's life.
    pub mac: std::sync::Arc<[u8; 6]>,
    pub vis: ViHandles,
}

/// Records `handle` as the handle of VI `id` in `vis`.
pub fn set_vi_handle(vis: &ViHandles, id: u16, handle: *mut c_void) {
    if let Some(w) = vis.0.get(id as usize) {
        w.store(handle as usize, Ordering::Release);
    }
}

/// The handle of VI `id` in `vis` (NULL if unknown).
pub fn vi_handle(vis: &ViHandles, id: u16) -> *mut c_void {
    vis.0.get(id as usize).map_or(0, |w| w.load(Ordering::Acquire)) as *mut c_void
}

/// Slot indices take the low 24 bits of a handle, generations the rest.
const INDEX_BITS: u32 = 24;
/// Slots are made a chunk at a time and never freed.
const CHUNK: usize = 1024;
const CHUNKS: usize = (1 << INDEX_BITS) / CHUNK;

/// A slot's word: generation in the high 32 bits, then the "destroyed
/// while pinned" mark, then the count of pins. The generation goes up by
/// one when an object is stored and again when it is destroyed: odd
/// generations name objects, even ones none.
const GENERATION: u64 = 1 << 32;
const DESTROYED: u64 = 1 << 31;
const PINS: u64 = DESTROYED - 1;

struct Slot {
    /// Its number in the table.
    index: u32,
    state: AtomicU64,
    /// Written only under the table's mutex, while no pin can read it (a
    /// free slot, or one whose generation no handle carries any more).
    object: UnsafeCell<Option<Object>>,
    /// Does a handle name the object? Read and written under the mutex
    /// only (the scans of `find` and `remove_unless_used`).
    live: UnsafeCell<bool>,
}

// SAFETY: `object` and `live` follow the protocol of the module comment:
// written under the table mutex when no pin can borrow the object, read
// under a pin whose generation matches (or under the mutex).
unsafe impl Sync for Slot {}

type Chunk = [Slot; CHUNK];

static TABLE: [AtomicPtr<Chunk>; CHUNKS] = [const { AtomicPtr::new(null_mut()) }; CHUNKS];

/// What the mutex guards: slots free for new objects, and how many slots
/// exist.
struct Writers {
    free: Vec<u32>,
    made: u32,
}

static WRITERS: Mutex<Writers> = Mutex::new(Writers { free: Vec::new(), made: 0 });

fn writers() -> MutexGuard<'static, Writers> {
    WRITERS.lock().unwrap_or_else(|p| p.into_inner())
}

#[inline(always)]
fn slot(i: usize) -> Option<&'static Slot> {
    let c = TABLE.get(i / CHUNK)?.load(Ordering::Acquire);
    // SAFETY: chunks are leaked boxes, never freed once published.
    (!c.is_null()).then(|| unsafe { &(*c)[i % CHUNK] })
}

fn handle_of(i: usize, generation: u32) -> *mut c_void {
    (((generation as usize) << INDEX_BITS) | (i + 1)) as *mut c_void
}

#[inline(always)]
fn slot_of(h: *mut c_void) -> Option<(usize, u32)> {
    let v = h as usize;
    let i = (v & ((1 << INDEX_BITS) - 1)).checked_sub(1)?;
    Some((i, (v >> INDEX_BITS) as u32))
}

/// Stores `object` and returns its handle (never NULL).
pub fn insert(object: Object) -> *mut c_void {
    hazard::enable(); // before the first handle exists
    let mut w = writers();
    let i = match w.free.pop() {
        Some(i) => i as usize,
        None => {
            let i = w.made as usize;
            if i.is_multiple_of(CHUNK) {
                let chunk: Box<Chunk> = Box::new(std::array::from_fn(|k| Slot { index: (i + k) as u32, state: AtomicU64::new(0), object: UnsafeCell::new(None), live: UnsafeCell::new(false) }));
                TABLE[i / CHUNK].store(Box::into_raw(chunk), Ordering::Release);
            }
            w.made += 1;
            i
        }
    };
    let s = slot(i).expect("a slot just made or freed exists");
    // SAFETY: a free slot: no handle carries its generation, so no pin
    // borrows the object; the mutex is held.
    unsafe {
        *s.object.get() = Some(object);
        *s.live.get() = true;
    }
    let state = s.state.fetch_add(GENERATION, Ordering::Release) + GENERATION;
    handle_of(i, (state >> 32) as u32)
}

/// A live object borrowed through its handle; unpins when dropped.
pub struct Pinned {
    slot: &'static Slot,
    /// The pin in the thread's record; None: counted in the slot's word.
    held: Option<hazard::Held>,
}

impl Deref for Pinned {
    type Target = Object;
    fn deref(&self) -> &Object {
        // SAFETY: pinned with a matching generation: the object stays until
        // the last pin goes (see the module comment).
        unsafe { (*self.slot.object.get()).as_ref().expect("a pinned slot holds its object") }
    }
}

impl Drop for Pinned {
    #[inline(always)]
    fn drop(&mut self) {
        let s = self.slot;
        match self.held.take() {
            Some(held) => {
                drop(held);
                hazard::light_barrier();
                if s.state.load(Ordering::Acquire) & DESTROYED != 0 {
                    free_destroyed(s);
                }
            }
            None => {
                let before = s.state.fetch_sub(1, Ordering::AcqRel);
                if before & DESTROYED != 0 && before & PINS == 1 {
                    free_destroyed(s);
                }
            }
        }
    }
}

/// [`try_free`] from a pin's end: rare (the object was destroyed while
/// pinned), so out of the entry points' way.
#[cold]
#[inline(never)]
fn free_destroyed(s: &'static Slot) {
    try_free(writers(), s);
}

/// Drops the object of slot `s` and frees the slot if it is destroyed and
/// nobody pins it any more (neither in a record nor counted); `w` is the
/// mutex held. Whoever finds that first does it, once.
fn try_free(w: MutexGuard<'static, Writers>, s: &'static Slot) {
    // Every pin published before is visible to the look at the records.
    hazard::heavy_barrier();
    let st = s.state.load(Ordering::Acquire);
    if st & DESTROYED == 0 || st & PINS != 0 || hazard::held_anywhere(s.index as usize) {
        return;
    }
    s.state.fetch_and(!DESTROYED, Ordering::AcqRel);
    free(w, s);
}

/// Drops the object of slot `s`, destroyed (no handle carries its
/// generation) and unpinned, and frees the slot; `w` is the mutex held.
fn free(mut w: MutexGuard<'static, Writers>, s: &'static Slot) {
    // SAFETY: as the caller says: nobody can borrow the object any more,
    // and the mutex is held.
    let object = unsafe { (*s.object.get()).take() };
    w.free.push(s.index);
    drop(w);
    drop(object); // a NIC's last handle closes it: not under the mutex
}

/// Pins the live object `h` names, if any.
#[inline(always)]
pub fn pin(h: *mut c_void) -> Option<Pinned> {
    let (i, g) = slot_of(h)?;
    let s = slot(i)?;
    let (pinned, state) = match hazard::hold(i) {
        Some(held) => {
            hazard::light_barrier();
            (Pinned { slot: s, held: Some(held) }, s.state.load(Ordering::Acquire))
        }
        None => {
            let before = s.state.fetch_add(1, Ordering::Acquire);
            (Pinned { slot: s, held: None }, before)
        }
    };
    // A stale or forged handle: unpinned again when `pinned` drops.
    ((state >> 32) as u32 == g && g % 2 == 1 && state & DESTROYED == 0).then_some(pinned)
}

/// The object a handle names, if it is live (a copy).
pub fn get(h: *mut c_void) -> Option<Object> {
    pin(h).map(|p| (*p).clone())
}

/// Destroys the object a handle names (the handle goes stale at once);
/// returns a copy of it. Threads that have it pinned keep their borrow;
/// the last of them drops it.
pub fn remove(h: *mut c_void) -> Option<Object> {
    let w = writers();
    remove_locked(w, h)
}

fn remove_locked(w: MutexGuard<'static, Writers>, h: *mut c_void) -> Option<Object> {
    let (i, g) = slot_of(h)?;
    let s = slot(i)?;
    let mut cur = s.state.load(Ordering::Relaxed);
    if (cur >> 32) as u32 != g || g % 2 == 0 || cur & DESTROYED != 0 {
        return None;
    }
    // SAFETY: a live object with a matching generation; the mutex is held,
    // so nobody else writes it.
    let copy = unsafe { (*s.object.get()).clone() };
    // SAFETY: the mutex is held.
    unsafe { *s.live.get() = false };
    // No handle carries the new generation; the object goes now if
    // nobody pins it, else with the last pin.
    loop {
        match s.state.compare_exchange_weak(cur, (cur + GENERATION) | DESTROYED, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => break,
            Err(now) => cur = now,
        }
    }
    try_free(w, s);
    copy
}

/// Every live object, under the mutex.
fn live_objects<'a>(w: &'a MutexGuard<'static, Writers>) -> impl Iterator<Item = (usize, &'static Slot)> + 'a {
    (0..w.made as usize).filter_map(|i| slot(i).map(|s| (i, s))).filter(|(_, s)| {
        // SAFETY: `live` is read under the mutex.
        unsafe { *s.live.get() }
    })
}

fn object_of(s: &'static Slot) -> &'static Object {
    // SAFETY: called on live slots under the mutex: the object is there and
    // only the mutex holder could take it.
    unsafe { (*s.object.get()).as_ref().expect("a live slot holds its object") }
}

impl Object {
    /// What the object is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Nic(_) => "NIC",
            Object::Vi { .. } => "VI",
            Object::Cq { .. } => "CQ",
            Object::Ptag { .. } => "protection tag",
            Object::Conn { .. } => "connection request (not accepted or rejected)",
            Object::Srq { .. } => "shared receive queue",
        }
    }
}

/// Removes the object `h` names unless live objects that `depends`
/// accepts remain; then returns how many of each kind remain, in one
/// look at the table (no object can appear between the count and the
/// removal).
pub fn remove_unless_used(h: *mut c_void, depends: impl Fn(&Object) -> bool) -> Result<Option<Object>, Vec<(&'static str, usize)>> {
    let w = writers();
    let mut used: Vec<(&'static str, usize)> = Vec::new();
    for (_, s) in live_objects(&w) {
        let o = object_of(s);
        if !depends(o) {
            continue;
        }
        match used.iter_mut().find(|(k, _)| *k == o.kind()) {
            Some((_, n)) => *n += 1,
            None => used.push((o.kind(), 1)),
        }
    }
    if !used.is_empty() {
        return Err(used);
    }
    Ok(remove_locked(w, h))
}

/// The handle of the first live object `pred` accepts (NULL if none).
pub fn find(pred: impl Fn(&Object) -> bool) -> *mut c_void {
    let w = writers();
    for (i, s) in live_objects(&w) {
        if pred(object_of(s)) {
            return handle_of(i, (s.state.load(Ordering::Relaxed) >> 32) as u32);
        }
    }
    null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CQ object whose `vis` counts who holds the object.
    fn cq_object(nic: &Nic) -> (Object, ViHandles) {
        let vis = ViHandles::new(4);
        (Object::Cq { nic: nic.clone(), nic_handle: null_mut(), vis: vis.clone(), id: 1 }, vis)
    }

    fn holders(vis: &ViHandles) -> usize {
        Arc::strong_count(&vis.0) - 1 // less the test's own
    }

    #[test]
    fn a_destroyed_object_stays_for_its_pins_and_goes_with_the_last() {
        let nic = Nic::open("/dev/via_lo").unwrap();
        let (o, vis) = cq_object(&nic);
        let h = insert(o);
        let p1 = pin(h).expect("live");
        let p2 = pin(h).expect("live");
        assert!(matches!(remove(h), Some(Object::Cq { id: 1, .. })), "remove hands back a copy");
        assert!(pin(h).is_none() && get(h).is_none() && remove(h).is_none(), "the handle is stale at once");
        assert!(matches!(*p1, Object::Cq { id: 1, .. }), "a pin taken before still borrows it");
        assert_eq!(holders(&vis), 1, "kept for the pins");
        drop(p1);
        assert_eq!(holders(&vis), 1);
        drop(p2);
        assert_eq!(holders(&vis), 0, "dropped with the last pin");
        let (o, vis2) = cq_object(&nic);
        let h2 = insert(o);
        assert_ne!(h2, h, "a reused slot has a new generation");
        assert!(pin(h).is_none());
        assert!(remove(h2).is_some());
        assert_eq!(holders(&vis2), 0, "unpinned: dropped by remove");
    }

    #[test]
    fn pins_past_a_threads_record_are_counted_and_kept_alike() {
        let nic = Nic::open("/dev/via_lo").unwrap();
        let (o, vis) = cq_object(&nic);
        let h = insert(o);
        // More than a record holds: the last ones are counted in the slot.
        let mut pins: Vec<Pinned> = (0..7).map(|_| pin(h).expect("live")).collect();
        assert!(pins.iter().any(|p| p.held.is_none()) && pins.iter().any(|p| p.held.is_some()));
        assert!(remove(h).is_some());
        assert!(pin(h).is_none(), "stale at once");
        // Dropped in any order, the object goes with the last.
        while pins.len() > 1 {
            pins.remove(pins.len() / 2);
            assert_eq!(holders(&vis), 1, "kept while {} pins remain", pins.len());
        }
        pins.clear();
        assert_eq!(holders(&vis), 0, "dropped with the last pin");
    }

    #[test]
    fn forged_handles_find_nothing() {
        let nic = Nic::open("/dev/via_lo").unwrap();
        let (o, _vis) = cq_object(&nic);
        let h = insert(o);
        let (i, g) = slot_of(h).unwrap();
        for forged in [null_mut(), handle_of(i, g + 1), handle_of(i, g.wrapping_sub(1)), handle_of(i, 0), handle_of(i + 5000, g), handle_of((1 << INDEX_BITS) - 2, 1), usize::MAX as *mut c_void] {
            assert!(pin(forged).is_none(), "{forged:?}");
            assert!(remove(forged).is_none(), "{forged:?}");
        }
        assert!(pin(h).is_some(), "the real one still works");
        remove(h);
    }

    #[test]
    fn pins_racing_a_destroy_drop_the_object_once() {
        let nic = Nic::open("/dev/via_lo").unwrap();
        for _ in 0..50 {
            let (o, vis) = cq_object(&nic);
            let h = insert(o) as usize;
            let stop = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        while !stop.load(Ordering::Relaxed) {
                            if let Some(p) = pin(h as *mut c_void) {
                                assert!(matches!(*p, Object::Cq { id: 1, .. }));
                            }
                        }
                    });
                }
                std::thread::yield_now();
                assert!(remove(h as *mut c_void).is_some());
                stop.store(true, Ordering::Relaxed);
            });
            assert_eq!(holders(&vis), 0, "dropped exactly once, after the last pin");
        }
    }
}
