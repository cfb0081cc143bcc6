//! User-level threads: non-preemptive, on guard-paged stacks (corosensei),
//! with one scheduler per process.
//!
//! A thread runs until it finishes, yields ([`yield_now`]) or blocks
//! ([`block`], woken by [`wake`]). The scheduler runs ready threads in FIFO
//! order; the runtime's loop (`runtime.rs`) polls the communication layer
//! when none is ready. A thread gets its stack when it first runs, not
//! when it is made, so a hundred thousand queued threads cost a closure
//! each; finished threads give their stack back to a pool, so many short
//! threads cost one `mmap` each only until the pool is warm.
//!
//! Everything here is per OS thread (thread-local): MTTL processes are
//! single-threaded underneath their user-level threads.

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::mem::ManuallyDrop;

/// Names a user-level thread of this process.
pub type ThreadId = usize;

type Co = Coroutine<(), (), (), DefaultStack>;

/// Stack size of a user-level thread (`MTTL_STACK_KB`, default 256 KiB).
fn stack_size() -> usize {
    std::env::var("MTTL_STACK_KB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(256) << 10
}

/// Most stacks kept for reuse.
const POOL_MAX: usize = 4096;

/// What the scheduler counts, for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadStats {
    /// Threads created.
    pub created: u64,
    /// Stacks allocated (the rest of `created` reused a pooled stack).
    pub stacks_allocated: u64,
    /// Switches into a thread.
    pub switches: u64,
    /// Threads alive now (ready, running or blocked).
    pub alive: usize,
    /// Stack size in bytes.
    pub stack_bytes: usize,
}

/// A thread that has not run yet, or one that has (its coroutine).
enum Slot {
    New(Box<dyn FnOnce()>),
    Started(Co),
}

struct Scheduler {
    threads: Vec<Option<Slot>>,
    free_ids: Vec<ThreadId>,
    ready: VecDeque<ThreadId>,
    pool: Vec<DefaultStack>,
    stack_bytes: usize,
    stats: ThreadStats,
}

thread_local! {
    // Never dropped: dropping a suspended coroutine unwinds its stack, and
    // at process exit (`std::process::exit` from inside a thread, say) that
    // would run user code against a runtime that is going away.
    static SCHED: ManuallyDrop<RefCell<Scheduler>> = ManuallyDrop::new(RefCell::new(Scheduler {
        threads: Vec::new(),
        free_ids: Vec::new(),
        ready: VecDeque::new(),
        pool: Vec::new(),
        stack_bytes: stack_size(),
        stats: ThreadStats::default(),
    }));
    /// The thread running now (None: the scheduler's own stack).
    static CURRENT: Cell<Option<ThreadId>> = const { Cell::new(None) };
    /// The running coroutine's yielder; each coroutine sets it again after
    /// every switch back into it.
    static YIELDER: Cell<*const Yielder<(), ()>> = const { Cell::new(std::ptr::null()) };
}

/// Creates a thread that runs `f`; it becomes ready at once.
pub fn spawn(f: impl FnOnce() + 'static) -> ThreadId {
    SCHED.with(|s| {
        let mut s = s.borrow_mut();
        let slot = Some(Slot::New(Box::new(f)));
        let id = match s.free_ids.pop() {
            Some(id) => {
                s.threads[id] = slot;
                id
            }
            None => {
                s.threads.push(slot);
                s.threads.len() - 1
            }
        };
        s.stats.created += 1;
        s.stats.alive += 1;
        s.ready.push_back(id);
        id
    })
}

/// Gives a new thread its stack (from the pool when there is one).
fn start(s: &mut Scheduler, f: Box<dyn FnOnce()>) -> Co {
    let stack = match s.pool.pop() {
        Some(st) => st,
        None => {
            s.stats.stacks_allocated += 1;
            DefaultStack::new(s.stack_bytes).unwrap_or_else(|e| panic!("allocating a {} KiB thread stack: {e} (MTTL_STACK_KB sets the size)", s.stack_bytes >> 10))
        }
    };
    Co::with_stack(stack, move |y: &Yielder<(), ()>, ()| {
        YIELDER.with(|c| c.set(y));
        f();
    })
}

/// The thread running now, if any.
pub fn current() -> Option<ThreadId> {
    CURRENT.with(|c| c.get())
}

/// Switches back to the scheduler; returns when this thread is resumed.
fn suspend() {
    let y = YIELDER.with(|c| c.get());
    assert!(!y.is_null() && current().is_some(), "blocking outside a user-level thread");
    // SAFETY: `y` was set by the coroutine running now (it sets it on start
    // and after every switch back), and a coroutine's yielder lives as long
    // as the coroutine.
    unsafe { (*y).suspend(()) };
    YIELDER.with(|c| c.set(y));
}

/// Blocks the running thread until somebody calls [`wake`] with its id.
/// The caller must have recorded the id where the waker will find it.
pub fn block() {
    suspend();
}

/// Makes thread `id` ready again.
pub fn wake(id: ThreadId) {
    SCHED.with(|s| s.borrow_mut().ready.push_back(id));
}

/// Lets the other ready threads run; this one runs again after them.
/// Outside a thread it does nothing.
pub fn yield_now() {
    if let Some(id) = current() {
        wake(id);
        suspend();
    }
}

/// Is any thread ready to run?
pub fn any_ready() -> bool {
    SCHED.with(|s| !s.borrow().ready.is_empty())
}

/// How many threads are ready to run (a thread woken twice counts twice).
pub fn ready_count() -> usize {
    SCHED.with(|s| s.borrow().ready.len())
}

/// Runs the next ready thread until it yields, blocks or finishes.
/// Returns false when no thread was ready.
pub fn run_one() -> bool {
    let next = SCHED.with(|s| {
        let mut s = s.borrow_mut();
        let id = s.ready.pop_front()?;
        let co = match s.threads[id].take() {
            Some(Slot::New(f)) => Some(start(&mut s, f)),
            Some(Slot::Started(co)) => Some(co),
            None => None,
        };
        s.stats.switches += 1;
        Some((id, co))
    });
    let Some((id, co)) = next else { return false };
    // A thread woken twice is queued twice; the second entry finds it gone
    // (running or finished) and is skipped.
    let Some(mut co) = co else { return true };
    CURRENT.with(|c| c.set(Some(id)));
    let r = co.resume(());
    CURRENT.with(|c| c.set(None));
    SCHED.with(|s| {
        let mut s = s.borrow_mut();
        match r {
            CoroutineResult::Yield(()) => s.threads[id] = Some(Slot::Started(co)),
            CoroutineResult::Return(()) => {
                if s.pool.len() < POOL_MAX {
                    s.pool.push(co.into_stack());
                }
                s.free_ids.push(id);
                s.stats.alive -= 1;
            }
        }
    });
    true
}

/// The scheduler's counters.
pub fn stats() -> ThreadStats {
    SCHED.with(|s| {
        let s = s.borrow();
        ThreadStats { stack_bytes: s.stack_bytes, ..s.stats }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn run_all() {
        while run_one() {}
    }

    #[test]
    fn threads_interleave_at_yields_and_stacks_are_reused() {
        let log = Rc::new(RefCell::new(Vec::new()));
        for t in 0..3 {
            let log = log.clone();
            spawn(move || {
                for k in 0..2 {
                    log.borrow_mut().push((t, k));
                    yield_now();
                }
            });
        }
        run_all();
        assert_eq!(*log.borrow(), vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]);
        let before = stats();
        for _ in 0..100 {
            spawn(|| {});
            run_all();
        }
        let after = stats();
        assert_eq!(after.stacks_allocated, before.stacks_allocated, "finished threads' stacks are reused");
        assert_eq!(after.alive, 0);
    }

    #[test]
    fn blocked_threads_run_again_only_when_woken() {
        let waiter: Rc<Cell<Option<ThreadId>>> = Rc::new(Cell::new(None));
        let done = Rc::new(Cell::new(false));
        let (w, d) = (waiter.clone(), done.clone());
        spawn(move || {
            w.set(current());
            block();
            d.set(true);
        });
        run_all();
        assert!(!done.get(), "a blocked thread does not run");
        wake(waiter.get().unwrap());
        run_all();
        assert!(done.get());
    }
}
