//! `Sync<T>`: MTTL's synchronising queue. `write` appends a value and
//! wakes readers; `read` blocks until a value is there and takes it;
//! `peek` blocks the same way but leaves it; `queue_length` counts.
//!
//! A [`Sync`] lives in the process that made it and is removed when
//! dropped; its [`GlobalSync`] handle may be sent to other processes, which
//! write to it (asynchronously, in order per sender) and read from it (a
//! request served by a thread at the owner) as if it were local.

use crate::runtime::{self, kind, status, with};
use crate::thread::{self, ThreadId};
use crate::wire::{self, Wire, WireError};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;

pub(crate) const OP_READ: u8 = 0;
pub(crate) const OP_PEEK: u8 = 1;
pub(crate) const OP_LEN: u8 = 2;

#[derive(Default)]
struct Cell {
    values: VecDeque<Vec<u8>>,
    waiters: Vec<ThreadId>,
}

/// Every Sync of this process, by id; values kept encoded.
#[derive(Default)]
struct SyncTable {
    cells: HashMap<u64, Cell>,
    next: u64,
}

thread_local! {
    // The runtime's thread (every user-level thread runs on it).
    static SYNCS: RefCell<SyncTable> = RefCell::new(SyncTable::default());
}

/// Runs `f` on this process's Syncs.
fn with_syncs<R>(f: impl FnOnce(&mut SyncTable) -> R) -> R {
    SYNCS.with(|s| f(&mut s.borrow_mut()))
}

/// A write to local Sync `id` (from the message of another process).
pub(crate) fn write_local(id: u64, v: Vec<u8>) -> Result<(), String> {
    with_syncs(|t| t.write(id, v))
}

impl SyncTable {
    fn create(&mut self) -> u64 {
        self.next += 1;
        self.cells.insert(self.next, Cell::default());
        self.next
    }

    fn write(&mut self, id: u64, v: Vec<u8>) -> Result<(), String> {
        let c = self.cells.get_mut(&id).ok_or_else(|| format!("a write to Sync {id}, which does not exist (dropped?)"))?;
        c.values.push_back(v);
        for t in c.waiters.drain(..) {
            thread::wake(t);
        }
        Ok(())
    }
}

/// Runs a read/peek/length on local Sync `id`, blocking the calling
/// thread as needed; the answer encoded.
pub(crate) fn local_op(id: u64, op: u8) -> Result<Vec<u8>, String> {
    loop {
        let r = with_syncs(|t| {
            let c = t.cells.get_mut(&id).ok_or_else(|| format!("Sync {id} does not exist on rank {} (dropped?)", runtime::my_pe()))?;
            let got = match op {
                OP_LEN => Some(wire::encode(&(c.values.len() as u64))),
                OP_READ => c.values.pop_front(),
                OP_PEEK => c.values.front().cloned(),
                _ => return Err(format!("unknown Sync operation {op}")),
            };
            if got.is_none() {
                c.waiters.push(thread::current().expect("a Sync read outside a user-level thread"));
            }
            Ok(got)
        })?;
        match r {
            Some(v) => return Ok(v),
            None => thread::block(),
        }
    }
}

/// A synchronising queue owned by this process.
pub struct Sync<T: Wire> {
    id: u64,
    _t: PhantomData<T>,
}

/// A handle to a [`Sync`] anywhere in the run; cheap to copy and send.
pub struct GlobalSync<T: Wire> {
    pe: usize,
    id: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T: Wire> Clone for GlobalSync<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Wire> Copy for GlobalSync<T> {}

impl<T: Wire> std::fmt::Debug for GlobalSync<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlobalSync(pe {}, id {})", self.pe, self.id)
    }
}

impl<T: Wire> Wire for GlobalSync<T> {
    fn put(&self, out: &mut Vec<u8>) {
        (self.pe as u32).put(out);
        self.id.put(out);
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        Ok(GlobalSync { pe: u32::get(inp)? as usize, id: u64::get(inp)?, _t: PhantomData })
    }
}

impl<T: Wire> Default for Sync<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Wire> Sync<T> {
    pub fn new() -> Sync<T> {
        Sync { id: with_syncs(|t| t.create()), _t: PhantomData }
    }

    /// The handle other processes use.
    pub fn global(&self) -> GlobalSync<T> {
        GlobalSync { pe: runtime::my_pe(), id: self.id, _t: PhantomData }
    }

    pub fn write(&self, v: T) {
        self.global().write(v)
    }
    pub fn read(&self) -> T {
        self.global().read()
    }
    pub fn peek(&self) -> T {
        self.global().peek()
    }
    pub fn queue_length(&self) -> usize {
        self.global().queue_length()
    }
}

impl<T: Wire> Drop for Sync<T> {
    fn drop(&mut self) {
        let id = self.id;
        if let Some(c) = with_syncs(|t| t.cells.remove(&id)) {
            for t in c.waiters {
                // A waiter finds the Sync gone and fails with a clear message.
                thread::wake(t);
            }
        }
    }
}

impl<T: Wire> GlobalSync<T> {
    /// The process that owns the queue.
    pub fn pe(&self) -> usize {
        self.pe
    }

    /// Appends `v`; returns at once (remote writes are delivered in the
    /// order this process made them).
    pub fn write(&self, v: T) {
        let bytes = wire::encode(&v);
        if self.pe == runtime::my_pe() {
            write_local(self.id, bytes).unwrap_or_else(|e| panic!("{e}"));
        } else {
            let mut m = Vec::with_capacity(9 + bytes.len());
            m.push(kind::SYNC_WRITE);
            m.extend_from_slice(&self.id.to_le_bytes());
            m.extend_from_slice(&bytes);
            with(|rt| rt.send(self.pe, &m));
        }
    }

    fn op(&self, op: u8) -> Vec<u8> {
        if self.pe == runtime::my_pe() {
            return local_op(self.id, op).unwrap_or_else(|e| panic!("{e}"));
        }
        let token = with(|rt| {
            let t = rt.new_token();
            let mut m = Vec::with_capacity(14);
            m.push(kind::SYNC_OP);
            m.extend_from_slice(&t.to_le_bytes());
            m.extend_from_slice(&self.id.to_le_bytes());
            m.push(op);
            rt.send(self.pe, &m);
            t
        });
        match runtime::wait_reply(token) {
            (status::OK, v) => v,
            (_, why) => panic!("Sync on rank {}: {}", self.pe, String::from_utf8_lossy(&why)),
        }
    }

    fn decoded<V: Wire>(&self, op: u8) -> V {
        wire::decode(&self.op(op)).unwrap_or_else(|e| panic!("Sync on rank {}: {e}", self.pe))
    }

    /// Takes the oldest value, waiting for one.
    pub fn read(&self) -> T {
        self.decoded(OP_READ)
    }
    /// The oldest value, left in place; waits for one.
    pub fn peek(&self) -> T {
        self.decoded(OP_PEEK)
    }
    /// Values waiting now.
    pub fn queue_length(&self) -> usize {
        self.decoded::<u64>(OP_LEN) as usize
    }
}
