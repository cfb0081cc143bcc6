//! `invoke` and `ainvoke`: running a [`RemoteFunction`] on any process,
//! waiting for its result or not.

use crate::registry::RemoteFunction;
use crate::runtime::{self, kind, status, with};
use crate::wire;
use std::marker::PhantomData;

fn check_pe(pe: usize, name: &str) {
    let n = runtime::pe_num();
    if pe >= n {
        panic!("{name} invoked on PE {pe}, but the run has {n} processes");
    }
}

/// Runs `f(args)` on process `pe` and returns its result; the calling
/// thread blocks meanwhile (other threads run). On this process it is a
/// plain call. A panic of the remote function panics here, naming it.
pub fn invoke<F: RemoteFunction>(pe: usize, f: F, args: F::Args) -> F::Ret {
    if pe == runtime::my_pe() {
        return F::call(args);
    }
    ainvoke(pe, f, args).wait()
}

/// Starts `f(args)` on process `pe` (on this one: in a new thread) and
/// returns at once; [`Pending::wait`] gives the result.
pub fn ainvoke<F: RemoteFunction>(pe: usize, _f: F, args: F::Args) -> Pending<F::Ret> {
    check_pe(pe, F::NAME);
    let me = runtime::my_pe();
    let token = with(|rt| rt.new_token());
    if pe == me {
        runtime::spawn_call(me, token, F::NAME.into(), move || Ok(wire::encode(&F::call(args))));
    } else {
        send_invoke::<F>(pe, token, &args);
    }
    Pending { token, pe, name: F::NAME, _r: PhantomData }
}

/// Starts `f(args)` on process `pe` with nobody waiting for it. If it
/// panics, its process stops (and with it the run).
pub fn ainvoke_detached<F: RemoteFunction>(pe: usize, _f: F, args: F::Args) {
    check_pe(pe, F::NAME);
    let me = runtime::my_pe();
    if pe == me {
        runtime::spawn_call(me, 0, F::NAME.into(), move || Ok(wire::encode(&F::call(args))));
    } else {
        send_invoke::<F>(pe, 0, &args);
    }
}

fn send_invoke<F: RemoteFunction>(pe: usize, token: u32, args: &F::Args) {
    let mut m = Vec::with_capacity(64);
    m.push(kind::INVOKE);
    m.extend_from_slice(&F::id().to_le_bytes());
    m.extend_from_slice(&token.to_le_bytes());
    wire::Wire::put(args, &mut m);
    with(|rt| rt.send(pe, &m));
}

/// Runs `f(args)` on every process at once (this one included) and
/// returns the results by rank: the way to start an SPMD phase, in which
/// every process may call the collectives.
pub fn on_all<F: RemoteFunction + Copy>(f: F, args: F::Args) -> Vec<F::Ret>
where
    F::Args: Clone,
{
    let n = runtime::pe_num();
    let pending: Vec<_> = (0..n).map(|pe| ainvoke(pe, f, args.clone())).collect();
    pending.into_iter().map(|p| p.wait()).collect()
}

/// The result of an [`ainvoke`], to come.
#[must_use = "an ainvoke's result is lost unless waited for (use ainvoke_detached)"]
pub struct Pending<R: wire::Wire> {
    token: u32,
    pe: usize,
    name: &'static str,
    _r: PhantomData<fn() -> R>,
}

impl<R: wire::Wire> Pending<R> {
    /// Has the result arrived?
    pub fn is_ready(&self) -> bool {
        with(|rt| rt.is_complete(self.token))
    }

    /// Waits for the result. Panics, naming the function and process, if
    /// the function panicked there.
    pub fn wait(self) -> R {
        let token = self.token;
        let (pe, name) = (self.pe, self.name);
        std::mem::forget(self);
        match runtime::wait_reply(token) {
            (status::OK, v) => wire::decode(&v).unwrap_or_else(|e| panic!("{name} on rank {pe}: bad result: {e}")),
            (status::PANIC, why) => panic!("{name} panicked on rank {pe}: {}", String::from_utf8_lossy(&why)),
            (_, why) => panic!("{name} failed on rank {pe}: {}", String::from_utf8_lossy(&why)),
        }
    }
}

impl<R: wire::Wire> Drop for Pending<R> {
    fn drop(&mut self) {
        let t = self.token;
        with(|rt| rt.forget(t));
    }
}
