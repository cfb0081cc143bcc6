//! The runtime's core: the per-process state every feature reaches
//! ([`with`]: rank, size, the communication layer, the heap, the tokens
//! replies are waited on), the message kinds and reply statuses, waiting
//! for a reply, running a call in a new thread, and stopping the process.
//! It knows no feature: the scheduler loop and the dispatch of message
//! kinds to the features that own them are `scheduler`'s.

use crate::comm::{SendHandle, Transport};
use crate::heap::HeapAlloc;
use crate::thread::{self, ThreadId};
use crate::wire::{take, WireError};
use std::cell::{Cell, RefCell};
use std::fmt::Display;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Message kinds (the first byte). `BULK_NOTICE` (0xB0) comes from the
/// transport.
pub(crate) mod kind {
    /// [id u64][token u32][args]: run function `id`, reply to `token` (0: none).
    pub const INVOKE: u8 = 1;
    /// [token u32][status u8][payload]: the answer to a request.
    pub const REPLY: u8 = 2;
    /// [token u32][off u64][len u32]: reply with heap bytes.
    pub const READ: u8 = 3;
    /// [token u32][off u64][len u32][dst u64]: put heap bytes into the
    /// requester's heap at `dst`, notice `token`.
    pub const READ_BULK: u8 = 4;
    /// [token u32][off u64][data]: store into the heap, reply (token != 0).
    pub const WRITE: u8 = 5;
    /// [id u64][value]: append to a Sync.
    pub const SYNC_WRITE: u8 = 6;
    /// [token u32][id u64][op u8]: read, peek or length of a Sync.
    pub const SYNC_OP: u8 = 7;
    /// [0; 7][tag u64][payload]: a collective's step (the payload 16
    /// bytes in, so that it stays aligned for reading in place).
    pub const COLL: u8 = 8;
    /// Rank 0's program finished: acknowledge; peers may close from now on.
    pub const SHUTDOWN: u8 = 9;
    pub const SHUTDOWN_ACK: u8 = 10;
    /// Every rank acknowledged: stop.
    pub const FINISH: u8 = 12;
    /// [text]: rank 0 failed; stop with this message.
    pub const ABORT: u8 = 11;
    /// [payload]: answered at once by the loop with ECHO_BACK and 8 bytes
    /// (the size of a small result): `beneath::round_trip`.
    pub const ECHO: u8 = 13;
    pub const ECHO_BACK: u8 = 14;
    /// [payload]: answered at once by the loop with ECHO_BACK and the
    /// payload itself: `beneath::round_trip_whole`.
    pub const ECHO_WHOLE: u8 = 16;
    /// [token u32][off u64][op u8][a u64][b u64]: run an atomic on the
    /// heap word at `off` (op 0: add `a`; 1: compare `a`, swap `b`), reply
    /// with the value before (8 bytes LE). Where the transport has no
    /// remote atomics.
    pub const ATOMIC: u8 = 15;
}

/// Reply status.
pub(crate) mod status {
    pub const OK: u8 = 0;
    /// The remote thread panicked; the payload is the message.
    pub const PANIC: u8 = 1;
    /// The request was refused (bad address, unknown function, ...).
    pub const ERROR: u8 = 2;
}

/// Bulk notices with this bit answer a bulk write (acknowledge it); without
/// it they complete a bulk read.
pub(crate) const WRITE_FLAG: u32 = 1 << 31;

#[derive(Default)]
struct Waiter {
    thread: Option<ThreadId>,
    reply: Option<(u8, Vec<u8>)>,
    /// Nobody will collect the reply (a dropped `Pending`).
    discard: bool,
    used: bool,
}

pub(crate) struct Runtime {
    pub rank: usize,
    pub size: usize,
    pub comm: Box<dyn Transport>,
    pub heap: HeapAlloc,
    waiters: Vec<Waiter>,
    free_tokens: Vec<u32>,
    pub coll_seq: u64,
    /// Heap blocks to free once their bulk send completed.
    pub(crate) deferred: Vec<(SendHandle, u64)>,
    pub(crate) acks: usize,
    pub(crate) ack_waiter: Option<ThreadId>,
    pub(crate) done: bool,
    /// Threads blocked on a direct read (`GlobalPtr::nread` over RDMA
    /// read) while others ran: woken by the scheduler once it is done.
    pub(crate) reads: Vec<(SendHandle, ThreadId)>,
}

thread_local! {
    // Never dropped at thread exit (see `exit_now`); `run` takes it out.
    static RT: ManuallyDrop<RefCell<Option<Runtime>>> = const { ManuallyDrop::new(RefCell::new(None)) };
    static RANK: Cell<usize> = const { Cell::new(0) };
}

/// Installs `rt` as this process's runtime (rank `rt.rank`).
pub(crate) fn install(rt: Runtime) {
    RANK.with(|r| r.set(rt.rank));
    RT.with(|r| *r.borrow_mut() = Some(rt));
}

/// Takes the runtime out again, at the end of the run.
pub(crate) fn uninstall() -> Runtime {
    RT.with(|r| r.borrow_mut().take()).expect("the runtime was installed")
}

/// Notes this process's rank (before the runtime exists, for messages).
pub(crate) fn set_rank(rank: usize) {
    RANK.with(|r| r.set(rank));
}

/// Runs `f` on the runtime. Panics outside [`run`].
pub(crate) fn with<R>(f: impl FnOnce(&mut Runtime) -> R) -> R {
    RT.with(|rt| f(rt.borrow_mut().as_mut().expect("mttl_via used outside mttl_via::run")))
}

/// Stops the process: the communication layer failed or a rule of the
/// run was broken. Exits with status 1 after saying why.
pub(crate) fn fatal(msg: impl Display) -> ! {
    // One write: mttl-run may kill this process any moment now (a peer
    // stopped), and eprintln! writes a formatted line in pieces.
    let line = format!("mttl: rank {}: {msg}\n", RANK.with(|r| r.get()));
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
        eprintln!("{}", std::backtrace::Backtrace::force_capture());
    }
    exit_now(1)
}

/// Ends the process without running thread-local destructors: those would
/// unwind the stacks of threads still blocked (server threads waiting on a
/// Sync, say) into a runtime that is gone.
pub(crate) fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; buffers were flushed above.
    unsafe { libc::_exit(code) }
}

/// Peers this process holds connections to (VIA connects on demand);
/// None where every pair is connected at start-up (TCP).
pub fn connections() -> Option<usize> {
    with(|rt| rt.comm.connections())
}

/// The counters of this process's communication device (for VIA: the
/// frame device's, e.g. frames through the NIC and through shared memory).
pub fn device_counters() -> Vec<(&'static str, u64)> {
    with(|rt| rt.comm.device_counters())
}

/// This process's number, 0..[`pe_num`].
pub fn my_pe() -> usize {
    RANK.with(|r| r.get())
}

/// How many processes run the program.
pub fn pe_num() -> usize {
    with(|rt| rt.size)
}

pub(crate) fn u32_at(b: &mut &[u8]) -> Result<u32, WireError> {
    Ok(u32::from_le_bytes(take(b, 4)?.try_into().unwrap()))
}

pub(crate) fn u64_at(b: &mut &[u8]) -> Result<u64, WireError> {
    Ok(u64::from_le_bytes(take(b, 8)?.try_into().unwrap()))
}

impl Runtime {
    /// The runtime of process `rank` of `size`, over `comm`, with its
    /// global heap at `heap`.
    pub(crate) fn new(rank: usize, size: usize, comm: Box<dyn Transport>, heap: HeapAlloc) -> Runtime {
        Runtime { rank, size, comm, heap, waiters: Vec::new(), free_tokens: Vec::new(), coll_seq: 0, deferred: Vec::new(), acks: 0, ack_waiter: None, done: false, reads: Vec::new() }
    }

    /// Sends, or stops the process if the transport cannot.
    pub fn send(&mut self, node: usize, msg: &[u8]) {
        if let Err(e) = self.comm.asend(node, msg) {
            fatal(e)
        }
    }

    pub fn send_reply(&mut self, node: usize, token: u32, st: u8, payload: &[u8]) {
        let mut m = Vec::with_capacity(6 + payload.len());
        m.push(kind::REPLY);
        m.extend_from_slice(&token.to_le_bytes());
        m.push(st);
        m.extend_from_slice(payload);
        self.send(node, &m);
    }

    /// A token for a reply the current thread will wait for.
    pub fn new_token(&mut self) -> u32 {
        let t = match self.free_tokens.pop() {
            Some(t) => t,
            None => {
                self.waiters.push(Waiter::default());
                let t = self.waiters.len() as u32;
                if t >= WRITE_FLAG {
                    fatal("more than 2^31 replies outstanding");
                }
                t
            }
        };
        self.waiters[t as usize - 1] = Waiter { used: true, ..Waiter::default() };
        t
    }

    fn waiter(&mut self, token: u32) -> Option<&mut Waiter> {
        self.waiters.get_mut((token as usize).wrapping_sub(1)).filter(|w| w.used)
    }

    fn release(&mut self, token: u32) {
        self.waiters[token as usize - 1] = Waiter::default();
        self.free_tokens.push(token);
    }

    /// A reply for `token` arrived (or a local thread finished).
    pub fn complete(&mut self, token: u32, st: u8, payload: Vec<u8>) -> Result<(), String> {
        let Some(w) = self.waiter(token) else { return Err(format!("a reply for token {token}, which nobody waits for")) };
        if w.reply.is_some() {
            return Err(format!("a second reply for token {token}"));
        }
        if w.discard {
            self.release(token);
            return Ok(());
        }
        w.reply = Some((st, payload));
        if let Some(t) = w.thread.take() {
            thread::wake(t);
        }
        Ok(())
    }

    /// Nobody will wait for `token` any more.
    pub fn forget(&mut self, token: u32) {
        match self.waiter(token) {
            Some(w) if w.reply.is_some() => self.release(token),
            Some(w) => w.discard = true,
            None => {}
        }
    }

    pub fn is_complete(&mut self, token: u32) -> bool {
        self.waiter(token).is_some_and(|w| w.reply.is_some())
    }

    /// Frees heap block `off` once `h` is done.
    pub fn free_after(&mut self, h: SendHandle, off: u64) {
        self.deferred.push((h, off));
    }

    /// Starts an RDMA read of `len` bytes at offset `off` of `pe`'s heap
    /// into a landing block allocated in ours: the read's handle and the
    /// block's offset. None where the transport has no RDMA reads or our
    /// heap has no room; the transport's error (the block freed again) if
    /// it refused the range.
    pub(crate) fn start_read(&mut self, pe: usize, off: u64, len: usize) -> Option<crate::comm::Result<(SendHandle, u64)>> {
        self.start_direct(len, |bulk, landing| bulk.get(pe, off as usize, landing as usize, len))
    }

    /// Starts a remote atomic `op` on the word at offset `off` of `pe`'s
    /// heap, its value before landing in a block allocated in ours: the
    /// atomic's handle and the block's offset. None where the transport
    /// has no remote atomics or our heap has no room.
    pub(crate) fn start_atomic(&mut self, pe: usize, off: u64, op: crate::comm::AtomicOp) -> Option<crate::comm::Result<(SendHandle, u64)>> {
        self.start_direct(8, |bulk, landing| bulk.atomic(pe, off as usize, op, landing as usize))
    }

    /// Starts `transfer` into a landing block of `len` bytes allocated in
    /// our heap: its handle and the block's offset. None where the
    /// transport has no direct transfers or our heap has no room; the
    /// transport's error (the block freed again) if it refused.
    fn start_direct(&mut self, len: usize, transfer: impl FnOnce(&mut dyn crate::comm::Bulk, u64) -> crate::comm::Result<SendHandle>) -> Option<crate::comm::Result<(SendHandle, u64)>> {
        self.comm.bulk()?;
        let landing = self.heap.alloc_landing(len)?;
        let bulk = self.comm.bulk().expect("checked above");
        Some(match transfer(bulk, landing) {
            Ok(h) => Ok((h, landing)),
            Err(e) => {
                self.heap.free_landing(landing, len);
                Err(e)
            }
        })
    }

    /// Wakes the threads whose direct reads are done (one poll of the
    /// transport for all of them).
    pub(crate) fn wake_finished_reads(&mut self) {
        let Some(&(first, _)) = self.reads.first() else { return };
        self.make_progress(first);
        let comm = &self.comm;
        self.reads.retain(|&(h, t)| {
            let done = comm.delivered(h);
            if done {
                thread::wake(t);
            }
            !done
        });
    }

    /// Frees the heap blocks whose transfers are done (one poll of the
    /// transport for all of them).
    pub(crate) fn free_deferred(&mut self) {
        let Some(&(first, _)) = self.deferred.first() else { return };
        self.make_progress(first);
        let (comm, heap) = (&self.comm, &mut self.heap);
        self.deferred.retain(|&(h, off)| {
            let done = comm.delivered(h);
            if done {
                heap.free(off);
            }
            !done
        });
    }

    /// One call into the transport that makes progress (through `h`'s
    /// `senddone`), after which [`Transport::delivered`] answers for every
    /// handle.
    fn make_progress(&mut self, h: SendHandle) {
        if let Err(e) = self.comm.senddone(h) {
            fatal(e)
        }
    }
}

/// Blocks the current thread until the reply to `token` is in; returns
/// (status, payload).
pub(crate) fn wait_reply(token: u32) -> (u8, Vec<u8>) {
    loop {
        let got = with(|rt| {
            let w = rt.waiter(token).expect("waiting for a token that was never issued");
            match w.reply.take() {
                Some(r) => {
                    rt.release(token);
                    Some(r)
                }
                None => {
                    w.thread = Some(thread::current().expect("waiting outside a user-level thread"));
                    None
                }
            }
        });
        match got {
            Some(r) => return r,
            None => thread::block(),
        }
    }
}

pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".into()
    }
}

/// Runs `body` in a new thread; its outcome goes to `token` at `node`
/// (the local waiter table when `node` is us). Token 0: nobody waits, so
/// a failure stops the process.
pub(crate) fn spawn_call(node: usize, token: u32, what: String, body: impl FnOnce() -> Result<Vec<u8>, String> + 'static) {
    thread::spawn(move || {
        let (st, payload) = match catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(v)) => (status::OK, v),
            Ok(Err(e)) => (status::ERROR, e.into_bytes()),
            Err(p) => (status::PANIC, panic_text(&*p).into_bytes()),
        };
        if token == 0 {
            if st != status::OK {
                fatal(format!("{what} failed and nobody waits for it: {}", String::from_utf8_lossy(&payload)));
            }
            return;
        }
        with(|rt| {
            if node == rt.rank {
                if let Err(e) = rt.complete(token, st, payload) {
                    fatal(e)
                }
            } else {
                rt.send_reply(node, token, st, &payload)
            }
        });
    });
}
