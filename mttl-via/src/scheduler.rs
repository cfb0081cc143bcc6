//! The scheduler: the loop that runs user-level threads and, when none is
//! ready, waits on the communication layer; the dispatch of each message
//! kind to the feature that owns it (invoke, heap reads and writes, Syncs,
//! collective steps, the shutdown handshake); start-up and the end of the
//! run ([`run`], the `mpc_main` of this library).
//!
//! Every message starts with a kind byte. A process answers INVOKE by
//! running the function in a new thread and REPLYing with the token the
//! invoker waits on; READ and WRITE of heap memory are answered by the
//! loop itself, without a thread.

use crate::comm::{self, BULK_NOTICE};
use crate::heap::HeapAlloc;
use crate::registry;
use crate::runtime::{self, exit_now, fatal, kind, panic_text, spawn_call, status, u32_at, u64_at, with, Runtime, WRITE_FLAG};
use crate::step::{self, Mail};
use crate::sync;
use crate::thread;
use crate::wire::{take, WireError};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Handles one message from `node`. Runs on the scheduler's stack: it may
/// start and wake threads but never blocks.
pub(crate) fn dispatch(rt: &mut Runtime, node: usize, msg: &mut Vec<u8>) -> Result<(), String> {
    let bad = |e: WireError| format!("from rank {node}: {e}");
    let (&k, mut b) = msg.split_first().ok_or_else(|| format!("an empty message from rank {node}"))?;
    match k {
        kind::INVOKE => {
            let id = u64_at(&mut b).map_err(bad)?;
            let token = u32_at(&mut b).map_err(bad)?;
            match registry::lookup(id) {
                Some(e) => {
                    // The thread takes the message whole and decodes its
                    // arguments where they lie: no copy of them (the
                    // loop's buffer grows again for the next message).
                    let at = msg.len() - b.len();
                    let whole = std::mem::take(msg);
                    spawn_call(node, token, format!("{} invoked by rank {node}", e.name), move || (e.call)(&whole[at..]).map_err(|w| w.to_string()))
                }
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
        kind::ATOMIC => {
            let token = u32_at(&mut b).map_err(bad)?;
            match crate::atomic::serve(rt.rank, &rt.heap, b) {
                Ok(v) => rt.send_reply(node, token, status::OK, &v),
                Err(why) => rt.send_reply(node, token, status::ERROR, why.as_bytes()),
            }
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
            sync::write_local(id, b.to_vec()).map_err(|e| format!("from rank {node}: {e}"))?;
        }
        kind::SYNC_OP => {
            let token = u32_at(&mut b).map_err(bad)?;
            let id = u64_at(&mut b).map_err(bad)?;
            let op = *take(&mut b, 1).map_err(bad)?.first().unwrap();
            spawn_call(node, token, "a Sync operation".into(), move || sync::local_op(id, op));
        }
        kind::COLL => {
            take(&mut b, 7).map_err(bad)?;
            let tag = u64_at(&mut b).map_err(bad)?;
            // The message itself goes to the mailbox, its header skipped
            // rather than cut off (no copy of a bulky payload).
            let at = msg.len() - b.len();
            step::deliver(node, tag, Mail { bytes: std::mem::take(msg), at });
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
        kind::ECHO => rt.send(node, &[kind::ECHO_BACK, 0, 0, 0, 0, 0, 0, 0, 0]),
        kind::ECHO_WHOLE => {
            let mut m = Vec::with_capacity(1 + b.len());
            m.push(kind::ECHO_BACK);
            m.extend_from_slice(b);
            rt.send(node, &m);
        }
        kind::ECHO_BACK => return Err(format!("an echo answer from rank {node} that nobody waits for")),
        kind::ABORT => {
            fatal(format!("stopping: rank {node} failed: {}", String::from_utf8_lossy(b)));
        }
        other => return Err(format!("a message of unknown kind {other:#x} from rank {node}")),
    }
    Ok(())
}

/// The scheduler loop: runs the threads ready at the start of a pass
/// (those they wake run in the next), then takes what arrived; when
/// nothing is ready, sleeps in `brecany` until a message comes. A thread
/// that yields in a loop waiting for another process (spinning on a
/// remote lock) thus never keeps this process from answering that
/// process's messages. Returns when the shutdown handshake is over.
fn serve() {
    let mut buf = Vec::new();
    loop {
        for _ in 0..thread::ready_count() {
            if !thread::run_one() {
                break;
            }
        }
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
            if !rt.reads.is_empty() {
                rt.wake_finished_reads();
            }
            if rt.done {
                return true;
            }
            // A direct read's completion is no message: with reads
            // outstanding the loop polls instead of blocking in brecany.
            if got == 0 && !thread::any_ready() && rt.reads.is_empty() {
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
    runtime::set_rank(boot.rank);
    let heap_mb: usize = std::env::var("MTTL_HEAP_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let mut comm = comm::cominit(&mut boot, heap_mb << 20).unwrap_or_else(|e| fatal(e));
    let (base, len) = comm.heap();
    let rt = Runtime::new(boot.rank, boot.size, comm, HeapAlloc::new(base, len));
    runtime::install(rt);
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
    let rt = runtime::uninstall();
    let Runtime { mut comm, .. } = rt;
    if let Err(e) = comm.comfinish() {
        fatal(e)
    }
    drop(comm);
    exit_now(0)
}
