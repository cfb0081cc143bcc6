//! `GlobalPtr<T>`: a pointer into any process's global heap. Reads and
//! writes of one value or of ranges go as messages answered by the
//! owner's scheduler loop; over VIA, a read below the transport's bulk
//! threshold is one RDMA read that the reader waits for in place, and
//! ranges from the threshold up go by RDMA write into the other side's
//! registered heap (a read asks the owner to write into a landing block
//! of ours; a write stages the data in our heap and writes it into the
//! owner's), with the immediate data naming the waiting thread.

use crate::registry::RemoteFunction;
use crate::runtime::{self, kind, status, with, WRITE_FLAG};
use crate::thread;
use crate::wire::{pod_bytes, pod_bytes_mut, Pod, Wire, WireError};
use std::marker::PhantomData;

/// A pointer to `T`s in the global heap of process `pe`.
pub struct GlobalPtr<T: Pod> {
    pe: u32,
    off: u64,
    _t: PhantomData<*mut T>,
}

impl<T: Pod> Clone for GlobalPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Pod> Copy for GlobalPtr<T> {}
impl<T: Pod> PartialEq for GlobalPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.pe == o.pe && self.off == o.off
    }
}
impl<T: Pod> Eq for GlobalPtr<T> {}

impl<T: Pod> std::fmt::Debug for GlobalPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlobalPtr(pe {}, offset {:#x})", self.pe, self.off)
    }
}

impl<T: Pod> Wire for GlobalPtr<T> {
    fn put(&self, out: &mut Vec<u8>) {
        self.pe.put(out);
        self.off.put(out);
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        Ok(GlobalPtr { pe: u32::get(inp)?, off: u64::get(inp)?, _t: PhantomData })
    }
}

crate::remote! {
    fn __mttl_gmalloc(bytes: u64) -> u64 {
        with(|rt| rt.heap.alloc(bytes as usize)).unwrap_or_else(|| panic!("the global heap of rank {} is full ({bytes} bytes asked; MTTL_HEAP_MB raises it)", runtime::my_pe()))
    }
    fn __mttl_gfree(off: u64) -> bool {
        with(|rt| rt.heap.free(off))
    }
}

impl<T: Pod> GlobalPtr<T> {
    /// `n` zeroed `T`s in this process's heap.
    pub fn alloc(n: usize) -> GlobalPtr<T> {
        Self::alloc_on(runtime::my_pe(), n)
    }

    /// `n` zeroed `T`s in the heap of process `pe`.
    pub fn alloc_on(pe: usize, n: usize) -> GlobalPtr<T> {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).expect("allocation size overflows") as u64;
        let off = crate::invoke(pe, __mttl_gmalloc, (bytes,));
        GlobalPtr { pe: pe as u32, off, _t: PhantomData }
    }

    /// Gives the block back (it must come from `alloc`/`alloc_on`).
    pub fn free(self) {
        if !crate::invoke(self.pe as usize, __mttl_gfree, (self.off,)) {
            panic!("{self:?} is not the start of a block in use (freed twice?)");
        }
    }

    /// The process that holds the memory.
    pub fn pe(&self) -> usize {
        self.pe as usize
    }

    /// The byte offset in its process's heap.
    pub fn heap_offset(&self) -> u64 {
        self.off
    }

    pub fn is_local(&self) -> bool {
        self.pe as usize == runtime::my_pe()
    }

    /// The pointer `i` elements further on (`p + i`), as `pointer::add`.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, i: usize) -> GlobalPtr<T> {
        let off = self.off + (i * std::mem::size_of::<T>()) as u64;
        GlobalPtr { pe: self.pe, off, _t: PhantomData }
    }

    /// `p[i]`, read.
    pub fn get(self, i: usize) -> T {
        self.add(i).read()
    }

    /// `p[i] = v`.
    pub fn set(self, i: usize, v: T) {
        self.add(i).write(v)
    }

    pub fn read(self) -> T {
        let mut v = [unsafe_zeroed::<T>()];
        self.nread(&mut v);
        v[0]
    }

    pub fn write(self, v: T) {
        self.nwrite(&[v])
    }

    /// The local memory of a pointer into this process's heap, `n` long.
    ///
    /// # Safety
    /// No other reference to that memory may be alive (remote writes land
    /// in it only when this process's loop runs, i.e. when the calling
    /// thread blocks or yields).
    pub unsafe fn local_slice<'a>(self, n: usize) -> &'a mut [T] {
        assert!(self.is_local(), "{self:?} is not in this process's heap");
        let p = self.local_bytes(n * std::mem::size_of::<T>(), "using");
        // SAFETY: a checked range of the heap; exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(p.cast::<T>(), n) }
    }

    /// The address of `len` bytes here in this process's heap; panics,
    /// saying what was being done (`what`), when they run past it.
    fn local_bytes(self, len: usize, what: &str) -> *mut u8 {
        with(|rt| rt.heap.slice(self.off, len)).unwrap_or_else(|| panic!("{self:?}: {what} {len} bytes runs past the heap"))
    }

    /// Reads `out.len()` elements starting here.
    pub fn nread(self, out: &mut [T]) {
        let bytes = pod_bytes_mut(out);
        let len = bytes.len();
        if len == 0 {
            return;
        }
        if self.is_local() {
            let src = self.local_bytes(len, "reading");
            // SAFETY: a checked heap range; `bytes` is a distinct user buffer.
            unsafe { std::ptr::copy_nonoverlapping(src, bytes.as_mut_ptr(), len) };
            return;
        }
        let pe = self.pe as usize;
        if self.read_direct(pe, bytes) {
            return;
        }
        let landing = with(|rt| {
            let bulk = rt.comm.bulk().map(|b| b.threshold()).is_some_and(|t| len >= t);
            if bulk { rt.heap.alloc_landing(len) } else { None }
        });
        let token = with(|rt| {
            let t = rt.new_token();
            let mut m = Vec::with_capacity(25);
            m.push(if landing.is_some() { kind::READ_BULK } else { kind::READ });
            m.extend_from_slice(&t.to_le_bytes());
            m.extend_from_slice(&self.off.to_le_bytes());
            m.extend_from_slice(&(u32::try_from(len).expect("reads up to 4 GiB")).to_le_bytes());
            if let Some(l) = landing {
                m.extend_from_slice(&l.to_le_bytes());
            }
            rt.send(pe, &m);
            t
        });
        let (st, data) = runtime::wait_reply(token);
        if st != status::OK {
            if let Some(l) = landing {
                with(|rt| rt.heap.free_landing(l, len));
            }
            panic!("reading {len} bytes at {self:?}: {}", String::from_utf8_lossy(&data));
        }
        match landing {
            Some(l) => take_landing(l, bytes), // filled by the owner's RDMA write
            None if data.len() == len => bytes.copy_from_slice(&data),
            None => panic!("reading {len} bytes at {self:?}: {} came back", data.len()),
        }
    }

    /// A read below the transport's bulk threshold where the transport
    /// reads peers' heaps itself (VIA: one RDMA read into a landing block
    /// of our heap): no message to the owner, no work for its scheduler.
    /// The reader waits in place, polling the transport, while no other
    /// thread is ready and no other reader waits (a lone reader never
    /// switches); otherwise it blocks and the scheduler wakes it when the
    /// read is done, so the reads of many threads overlap. False (nothing done) when the transport
    /// has no such reads (TCP), the read is large (the owner writes it
    /// into a landing block: `READ_BULK`) or our heap has no room: the
    /// message path takes it.
    ///
    /// The owner's provider reads the memory when the owner's engine runs,
    /// which, without the engine's progress thread (MTTL's default), is
    /// when the owner's scheduler polls between its threads' steps: as
    /// atomic for the owner's threads as a message-served read.
    fn read_direct(self, pe: usize, out: &mut [u8]) -> bool {
        let len = out.len();
        let started = with(|rt| {
            if rt.comm.bulk().is_none_or(|b| len >= b.threshold()) {
                return None;
            }
            rt.start_read(pe, self.off, len)
        });
        let (h, landing) = match started {
            None => return false,
            Some(Ok(x)) => x,
            Some(Err(e)) => panic!("reading {len} bytes at {self:?}: {e}"),
        };
        await_direct(h);
        take_landing(landing, out); // filled by the completed RDMA read
        true
    }

    /// Writes `vals` starting here; returns when they are in place.
    pub fn nwrite(self, vals: &[T]) {
        let bytes = pod_bytes(vals);
        let len = bytes.len();
        if len == 0 {
            return;
        }
        if self.is_local() {
            let dst = self.local_bytes(len, "writing");
            // SAFETY: a checked heap range; `bytes` is a distinct user buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, len) };
            return;
        }
        let pe = self.pe as usize;
        let token = with(|rt| {
            let t = rt.new_token();
            let bulk = rt.comm.bulk().map(|b| b.threshold()).is_some_and(|th| len >= th);
            let staged = if bulk { rt.heap.alloc(len) } else { None };
            match staged {
                Some(s) => {
                    let dst = rt.heap.slice(s, len).expect("staging block");
                    // SAFETY: our staging block, just allocated.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, len) };
                    let h = rt.comm.bulk().expect("bulk").put(pe, s as usize, self.off as usize, len, t | WRITE_FLAG).unwrap_or_else(|e| runtime::fatal(e));
                    rt.free_after(h, s);
                }
                None => {
                    let mut m = Vec::with_capacity(13 + len);
                    m.push(kind::WRITE);
                    m.extend_from_slice(&t.to_le_bytes());
                    m.extend_from_slice(&self.off.to_le_bytes());
                    m.extend_from_slice(bytes);
                    rt.send(pe, &m);
                }
            }
            t
        });
        let (st, why) = runtime::wait_reply(token);
        if st != status::OK {
            panic!("writing {len} bytes at {self:?}: {}", String::from_utf8_lossy(&why));
        }
    }

    /// Runs `f(self, a)` on the process holding the memory: invoking a
    /// method of a remote object.
    pub fn invoke<F, A>(self, f: F, a: A) -> F::Ret
    where
        F: RemoteFunction<Args = (GlobalPtr<T>, A)>,
    {
        crate::invoke(self.pe as usize, f, (self, a))
    }
}

fn unsafe_zeroed<T: Pod>() -> T {
    // SAFETY: every bit pattern, zero included, is a valid Pod value.
    unsafe { std::mem::zeroed() }
}

/// Copies the landing block `landing` of our heap, which a completed
/// transfer filled, into `out` (its length), and frees it.
pub(crate) fn take_landing(landing: u64, out: &mut [u8]) {
    with(|rt| {
        let src = rt.heap.slice(landing, out.len()).expect("landing block");
        // SAFETY: our landing block, `out.len()` bytes, written by the
        // transfer that completed; `out` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        rt.heap.free_landing(landing, out.len());
    });
}

/// Waits for the direct transfer `h` (an RDMA read or atomic the calling
/// thread started). Alone, the thread spins here. With other threads
/// ready, or other direct transfers parked (whom a spinner would keep
/// from being woken), it parks too, and the scheduler wakes it once the
/// transfer is done: one poll for all parked transfers, which overlap.
/// A parked transfer is not polled for (which would post it) until the
/// scheduler has run every ready thread: the transfers they start go out
/// together, one doorbell for all.
pub(crate) fn await_direct(h: crate::comm::SendHandle) {
    loop {
        let parked = with(|rt| {
            if thread::any_ready() || !rt.reads.is_empty() {
                rt.reads.push((h, thread::current().expect("a remote access outside a user-level thread")));
                return Some(true);
            }
            match rt.comm.senddone(h) {
                Ok(true) => Some(false),
                Ok(false) => None,
                Err(e) => runtime::fatal(e),
            }
        });
        match parked {
            None => continue,
            Some(false) => return,
            Some(true) => {
                thread::block();
                return; // woken: done
            }
        }
    }
}
