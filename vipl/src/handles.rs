//! The opaque handles C programs hold (`VIP_NIC_HANDLE`, `VIP_VI_HANDLE`,
//! `VIP_CQ_HANDLE`, `VIP_PROTECTION_HANDLE`, `VIP_CONN_HANDLE`).
//!
//! A handle is never a pointer to our memory: it is the number of a slot
//! in one process-wide table with a generation count above it, so a NULL,
//! forged or stale handle (one whose object was destroyed) is found out by
//! a lookup and answered with VIP_INVALID_PARAMETER, never dereferenced.

use std::os::raw::c_void;
use std::sync::{Mutex, MutexGuard};
use via_user::{IncomingRequest, Nic, Ptag};

/// What a handle names.
#[derive(Clone)]
pub enum Object {
    Nic(NicObject),
    Vi { nic: Nic, nic_handle: *mut c_void, id: u16 },
    Cq { nic: Nic, nic_handle: *mut c_void, vis: ViHandles, id: u16 },
    Ptag { nic: Nic, tag: Ptag },
    Conn { nic: Nic, req: IncomingRequest },
}

// SAFETY: the raw handle values in objects are numbers (see the module
// comment), never dereferenced.
unsafe impl Send for Object {}

/// The handle of each VI of a NIC, by VI number (what CQDone returns).
pub type ViHandles = std::sync::Arc<Mutex<Vec<usize>>>;

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
    let mut v = vis.lock().unwrap_or_else(|p| p.into_inner());
    if v.len() <= id as usize {
        v.resize(id as usize + 1, 0);
    }
    v[id as usize] = handle as usize;
}

/// The handle of VI `id` in `vis` (NULL if unknown).
pub fn vi_handle(vis: &ViHandles, id: u16) -> *mut c_void {
    let v = vis.lock().unwrap_or_else(|p| p.into_inner());
    v.get(id as usize).copied().unwrap_or(0) as *mut c_void
}

struct Slot {
    generation: u32,
    object: Option<Object>,
}

/// Slot indices take the low 24 bits of a handle, generations the rest.
const INDEX_BITS: u32 = 24;

static TABLE: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

fn table() -> MutexGuard<'static, Vec<Slot>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stores `object` and returns its handle (never NULL).
pub fn insert(object: Object) -> *mut c_void {
    let mut t = table();
    let i = match t.iter().position(|s| s.object.is_none()) {
        Some(i) => i,
        None => {
            t.push(Slot { generation: 0, object: None });
            t.len() - 1
        }
    };
    let s = &mut t[i];
    s.generation = s.generation.wrapping_add(1);
    s.object = Some(object);
    (((s.generation as usize) << INDEX_BITS) | (i + 1)) as *mut c_void
}

fn slot_of(h: *mut c_void) -> Option<(usize, u32)> {
    let v = h as usize;
    let i = (v & ((1 << INDEX_BITS) - 1)).checked_sub(1)?;
    Some((i, (v >> INDEX_BITS) as u32))
}

/// The object a handle names, if it is live.
pub fn get(h: *mut c_void) -> Option<Object> {
    let (i, g) = slot_of(h)?;
    let t = table();
    let s = t.get(i)?;
    if s.generation != g {
        return None;
    }
    s.object.clone()
}

/// Removes the object a handle names (the handle goes stale).
pub fn remove(h: *mut c_void) -> Option<Object> {
    let (i, g) = slot_of(h)?;
    let mut t = table();
    let s = t.get_mut(i)?;
    if s.generation != g {
        return None;
    }
    s.object.take()
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
        }
    }
}

/// Removes the object `h` names unless live objects that `depends`
/// accepts remain; then returns how many of each kind remain, in one
/// look at the table (no object can appear between the count and the
/// removal).
pub fn remove_unless_used(h: *mut c_void, depends: impl Fn(&Object) -> bool) -> Result<Option<Object>, Vec<(&'static str, usize)>> {
    let (i, g) = slot_of(h).ok_or_else(Vec::new)?;
    let mut t = table();
    let mut used: Vec<(&'static str, usize)> = Vec::new();
    for o in t.iter().filter_map(|s| s.object.as_ref()).filter(|o| depends(o)) {
        match used.iter_mut().find(|(k, _)| *k == o.kind()) {
            Some((_, n)) => *n += 1,
            None => used.push((o.kind(), 1)),
        }
    }
    if !used.is_empty() {
        return Err(used);
    }
    Ok(t.get_mut(i).filter(|s| s.generation == g).and_then(|s| s.object.take()))
}

/// The handle of the first live object `pred` accepts (NULL if none).
pub fn find(pred: impl Fn(&Object) -> bool) -> *mut c_void {
    let t = table();
    for (i, s) in t.iter().enumerate() {
        if s.object.as_ref().is_some_and(&pred) {
            return (((s.generation as usize) << INDEX_BITS) | (i + 1)) as *mut c_void;
        }
    }
    std::ptr::null_mut()
}
