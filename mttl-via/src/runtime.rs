//! The per-process runtime: the scheduler loop that runs user-level
//! threads and, when none is ready, waits on the communication layer; the
//! message kinds between processes; waiting for replies; start-up and the
//! shutdown handshake ([`run`], the `mpc_main` of this library).
//!
//! Every message starts with a kind byte. A process answers INVOKE by
//! running the function in a new thread and REPLYing with the token the
//! invoker waits on; READ and WRITE of heap memory are answered by the
//! loop itself, without a thread.

use crate::comm::{self, SendHandle, Transport, BULK_NOTICE};
use crate::heap::HeapAlloc;
use crate::step::Mail;
use crate::registry;
use crate::sync::SyncTable;
use crate::thread::{self, ThreadId};
use crate::wire::{take, WireError};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
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
    pub syncs: SyncTable,
    waiters: Vec<Waiter>,
    free_tokens: Vec<u32>,
    /// Collective steps that arrived before their receiver: (node, tag).
    mailbox: HashMap<(usize, u64), VecDeque<Mail>>,
    mail_waiters: HashMap<(usize, u64), ThreadId>,
    pub coll_seq: u64,
    /// Heap blocks to free once their bulk send completed.
    deferred: Vec<(SendHandle, u64)>,
    acks: usize,
    ack_waiter: Option<ThreadId>,
    done: bool,
}

thread_local! {
    // Never dropped at thread exit (see `exit_now`); `run` takes it out.
    static RT: ManuallyDrop<RefCell<Option<Runtime>>> = const { ManuallyDrop::new(RefCell::new(None)) };
    static RANK: Cell<usize> = const { Cell::new(0) };
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
fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; buffers were flushed above.
    unsafe { libc::_exit(code) }
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

    fn free_deferred(&mut self) {
        let mut i = 0;
        while i < self.deferred.len() {
            let (h, off) = self.deferred[i];
            match self.comm.senddone(h) {
                Ok(true) => {
                    self.heap.free(off);
                    self.deferred.swap_remove(i);
                }
                Ok(false) => i += 1,
                Err(e) => fatal(e),
            }
        }
    }

    /// The oldest collective step from `node` under `tag`.
    pub(crate) fn take_mail(&mut self, node: usize, tag: u64) -> Option<Mail> {
        let q = self.mailbox.get_mut(&(node, tag))?;
        let m = q.pop_front();
        if q.is_empty() {
            self.mailbox.remove(&(node, tag));
        }
        m
    }

    /// Thread `t` waits for a step from `node` under `tag`.
    pub(crate) fn wait_mail(&mut self, node: usize, tag: u64, t: ThreadId) {
        self.mail_waiters.insert((node, tag), t);
    }

    /// Delivers a collective step to its receiver.
    pub(crate) fn mail(&mut self, node: usize, tag: u64, payload: Mail) {
        self.mailbox.entry((node, tag)).or_default().push_back(payload);
        if let Some(t) = self.mail_waiters.remove(&(node, tag)) {
            thread::wake(t);
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

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
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

/// Handles one message from `node`. Runs on the scheduler's stack: it may
/// start and wake threads but never blocks.
fn dispatch(rt: &mut Runtime, node: usize, msg: &mut Vec<u8>) -> Result<(), String> {
    let bad = |e: WireError| format!("from rank {node}: {e}");
    let (&k, mut b) = msg.split_first().ok_or_else(|| format!("an empty message from rank {node}"))?;
    match k {
        kind::INVOKE => {
            let id = u64_at(&mut b).map_err(bad)?;
            let token = u32_at(&mut b).map_err(bad)?;
            let args = b.to_vec();
            match registry::lookup(id) {
                Some(e) => spawn_call(node, token, format!("{} invoked by rank {node}", e.name), move || (e.call)(&args).map_err(|w| w.to_string())),
                None => {
                    let why = format!("rank {} has no remote function with identity {id:#x}", rt.rank);
                    if token == 0 {
                        return Err(why);
                    }
                    rt.send_reply(node, token, status::ERROR, why.as_bytes());
                }
            }
        }
        kind::REPLY => {
            let token = u32_at(&mut b).map_err(bad)?;
            let st = *take(&mut b, 1).map_err(bad)?.first().unwrap();
            rt.complete(token, st, b.to_vec()).map_err(|e| format!("from rank {node}: {e}"))?;
        }
        kind::READ | kind::READ_BULK => {
            let token = u32_at(&mut b).map_err(bad)?;
            let off = u64_at(&mut b).map_err(bad)?;
            let len = u32_at(&mut b).map_err(bad)? as usize;
            let Some(src) = rt.heap.slice(off, len) else {
                let why = format!("rank {}: a read of {len} bytes at heap offset {off:#x} is outside the heap", rt.rank);
                rt.send_reply(node, token, status::ERROR, why.as_bytes());
                return Ok(());
            };
            if k == kind::READ {
                let mut m = Vec::with_capacity(6 + len);
                m.extend_from_slice(&[kind::REPLY]);
                m.extend_from_slice(&token.to_le_bytes());
                m.push(status::OK);
                // SAFETY: `src` is a checked range of our heap.
                m.extend_from_slice(unsafe { std::slice::from_raw_parts(src, len) });
                rt.send(node, &m);
            } else {
                let dst = u64_at(&mut b).map_err(bad)?;
                let bulk = rt.comm.bulk().ok_or_else(|| format!("rank {node} asked for a bulk read, but this transport has none"))?;
                let _ = bulk.put(node, off as usize, dst as usize, len, token).map_err(|e| e.to_string())?;
            }
        }
        kind::WRITE => {
            let token = u32_at(&mut b).map_err(bad)?;
            let off = u64_at(&mut b).map_err(bad)?;
            match rt.heap.slice(off, b.len()) {
                Some(dst) => {
                    // SAFETY: `dst` is a checked range of our heap.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
                    if token != 0 {
                        rt.send_reply(node, token, status::OK, &[]);
                    }
                }
                None => {
                    let why = format!("rank {}: a write of {} bytes at heap offset {off:#x} is outside the heap", rt.rank, b.len());
                    if token == 0 {
                        return Err(why);
                    }
                    rt.send_reply(node, token, status::ERROR, why.as_bytes());
                }
            }
        }
        BULK_NOTICE => {
            let imm = u32_at(&mut b).map_err(bad)?;
            if imm & WRITE_FLAG != 0 {
                rt.send_reply(node, imm & !WRITE_FLAG, status::OK, &[]);
            } else {
                rt.complete(imm, status::OK, Vec::new()).map_err(|e| format!("from rank {node}: {e}"))?;
            }
        }
        kind::SYNC_WRITE => {
            let id = u64_at(&mut b).map_err(bad)?;
            rt.syncs.write(id, b.to_vec()).map_err(|e| format!("from rank {node}: {e}"))?;
        }
        kind::SYNC_OP => {
            let token = u32_at(&mut b).map_err(bad)?;
            let id = u64_at(&mut b).map_err(bad)?;
            let op = *take(&mut b, 1).map_err(bad)?.first().unwrap();
            spawn_call(node, token, "a Sync operation".into(), move || crate::sync::local_op(id, op));
        }
        kind::COLL => {
            take(&mut b, 7).map_err(bad)?;
            let tag = u64_at(&mut b).map_err(bad)?;
            // The message itself goes to the mailbox, its header skipped
            // rather than cut off (no copy of a bulky payload).
            let at = msg.len() - b.len();
            rt.mail(node, tag, Mail { bytes: std::mem::take(msg), at });
        }
        kind::SHUTDOWN => {
            rt.comm.closing();
            rt.send(node, &[kind::SHUTDOWN_ACK]);
        }
        kind::FINISH => rt.done = true,
        kind::SHUTDOWN_ACK => {
            rt.acks += 1;
            if rt.acks == rt.size - 1 {
                if let Some(t) = rt.ack_waiter.take() {
                    thread::wake(t);
                }
            }
        }
        kind::ABORT => {
            fatal(format!("stopping: rank {node} failed: {}", String::from_utf8_lossy(b)));
        }
        other => return Err(format!("a message of unknown kind {other:#x} from rank {node}")),
    }
    Ok(())
}

/// The scheduler loop: runs ready threads; between them takes what
/// arrived; when nothing is ready, sleeps in `brecany` until a message
/// comes. Returns when the shutdown handshake is over.
fn serve() {
    let mut buf = Vec::new();
    loop {
        while thread::run_one() {}
        let finished = with(|rt| {
            let mut got = 0;
            while got < 64 {
                match rt.comm.prob() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => fatal(e),
                }
                let node = rt.comm.brecany(&mut buf).unwrap_or_else(|e| fatal(e));
                if let Err(e) = dispatch(rt, node, &mut buf) {
                    fatal(e)
                }
                got += 1;
            }
            if !rt.deferred.is_empty() {
                rt.free_deferred();
            }
            if rt.done {
                return true;
            }
            if got == 0 && !thread::any_ready() {
                let node = rt.comm.brecany(&mut buf).unwrap_or_else(|e| fatal(e));
                if let Err(e) = dispatch(rt, node, &mut buf) {
                    fatal(e)
                }
            }
            false
        });
        if finished {
            break;
        }
    }
}

/// Messages come and go as heap buffers of up to tens of kilobytes; by
/// default glibc hands such memory back to the kernel when freed and takes
/// it again (zeroed, a page fault per page) for the next message. As MPI
/// libraries do, keep freed memory in the process instead.
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread of ours runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// The entry point, like MPC++'s `mpc_main`: connects this process to the
/// others (rank and size from `mttl-run`, Slurm, `mpirun` or PMI; one
/// process alone otherwise); process 0 runs `main` in a user-level thread
/// while every process serves remote requests; when `main` returns, all
/// processes stop and exit with status 0 (`run` does not return). A panic
/// in `main` stops every process and this one exits with status 1.
pub fn run(main: impl FnOnce() + 'static) -> ! {
    keep_freed_memory();
    let mut boot = crate::boot::Boot::from_env().unwrap_or_else(|e| {
        eprintln!("mttl: {e}");
        exit_now(2)
    });
    RANK.with(|r| r.set(boot.rank));
    let heap_mb: usize = std::env::var("MTTL_HEAP_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let mut comm = comm::cominit(&mut boot, heap_mb << 20).unwrap_or_else(|e| fatal(e));
    let (base, len) = comm.heap();
    let rt = Runtime {
        rank: boot.rank,
        size: boot.size,
        comm,
        heap: HeapAlloc::new(base, len),
        syncs: SyncTable::default(),
        waiters: Vec::new(),
        free_tokens: Vec::new(),
        mailbox: HashMap::new(),
        mail_waiters: HashMap::new(),
        coll_seq: 0,
        deferred: Vec::new(),
        acks: 0,
        ack_waiter: None,
        done: false,
    };
    RT.with(|r| *r.borrow_mut() = Some(rt));
    if boot.rank == 0 {
        thread::spawn(move || {
            if let Err(p) = catch_unwind(AssertUnwindSafe(main)) {
                let why = panic_text(&*p);
                with(|rt| {
                    let mut m = vec![kind::ABORT];
                    m.extend_from_slice(why.as_bytes());
                    for j in 1..rt.size {
                        let _ = rt.comm.asend(j, &m);
                    }
                    let _ = rt.comm.comfinish();
                });
                fatal(format!("the program failed: {why}"));
            }
            let others = with(|rt| {
                for j in 1..rt.size {
                    rt.send(j, &[kind::SHUTDOWN]);
                }
                rt.size - 1
            });
            while with(|rt| {
                if rt.acks < others {
                    rt.ack_waiter = thread::current();
                    true
                } else {
                    false
                }
            }) {
                thread::block();
            }
            with(|rt| {
                rt.comm.closing();
                for j in 1..rt.size {
                    rt.send(j, &[kind::FINISH]);
                }
                rt.done = true;
            });
        });
    }
    serve();
    let rt = RT.with(|r| r.borrow_mut().take()).expect("runtime");
    let Runtime { mut comm, .. } = rt;
    if let Err(e) = comm.comfinish() {
        fatal(e)
    }
    drop(comm);
    exit_now(0)
}
