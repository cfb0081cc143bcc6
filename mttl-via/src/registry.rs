//! Remote functions by name: every function declared with [`remote!`]
//! registers itself at link time (a `linkme` distributed slice) under its
//! module path and name. Messages carry a 64-bit hash of that name, never a
//! code address; start-up compares the digest of the whole table across
//! ranks, so a run whose processes are different programs is refused.
//!
//! [`remote!`]: crate::remote

use crate::wire::{self, Wire, WireError};
use std::collections::HashMap;
use std::sync::OnceLock;

/// A function other processes may invoke. Made by [`remote!`](crate::remote).
pub trait RemoteFunction: 'static {
    type Args: Wire + 'static;
    type Ret: Wire + 'static;
    /// `module::path::name`, the function's identity across processes.
    const NAME: &'static str;
    fn call(args: Self::Args) -> Self::Ret;
    /// The identity on the wire.
    fn id() -> u64 {
        fnv1a(Self::NAME.as_bytes())
    }
}

/// One registered function: its name and a type-erased caller.
pub struct Entry {
    pub name: &'static str,
    pub call: fn(&[u8]) -> Result<Vec<u8>, WireError>,
}

#[linkme::distributed_slice]
pub static REMOTE_FUNCTIONS: [Entry];

/// Decodes the arguments, calls `F`, encodes the result.
pub fn trampoline<F: RemoteFunction>(args: &[u8]) -> Result<Vec<u8>, WireError> {
    let a = wire::decode::<F::Args>(args)?;
    Ok(wire::encode(&F::call(a)))
}

/// FNV-1a, 64 bits.
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
}

struct Table {
    by_id: HashMap<u64, &'static Entry>,
    digest: u64,
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let mut names: Vec<&str> = REMOTE_FUNCTIONS.iter().map(|e| e.name).collect();
        names.sort_unstable();
        let mut by_id = HashMap::new();
        for e in REMOTE_FUNCTIONS.iter() {
            if let Some(old) = by_id.insert(fnv1a(e.name.as_bytes()), e) {
                // Two names with one hash (or one name twice): a build
                // problem to fix, found at start-up rather than mid-run.
                panic!("remote functions {:?} and {:?} have the same identity; rename one", old.name, e.name);
            }
        }
        let digest = fnv1a(names.join("\n").as_bytes());
        Table { by_id, digest }
    })
}

/// The function registered under `id`.
pub fn lookup(id: u64) -> Option<&'static Entry> {
    table().by_id.get(&id).copied()
}

/// The digest of every registered name (the same program gives the same).
pub fn digest() -> u64 {
    table().digest
}

/// How many functions are registered.
pub fn count() -> usize {
    table().by_id.len()
}

/// Declares functions that other processes may invoke:
///
/// ```ignore
/// mttl_via::remote! {
///     pub fn square(x: u64) -> u64 { x * x }
/// }
/// let y = mttl_via::invoke(1, square, (7,));
/// ```
///
/// Each becomes a unit struct of the same name implementing
/// [`RemoteFunction`], with the arguments as a tuple.
#[macro_export]
macro_rules! remote {
    ($($(#[$m:meta])* $vis:vis fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? $body:block)*) => {$(
        $(#[$m])*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        $vis struct $name;
        impl $crate::RemoteFunction for $name {
            type Args = ($($ty,)*);
            type Ret = $crate::remote!(@ret $($ret)?);
            const NAME: &'static str = concat!(module_path!(), "::", stringify!($name));
            #[allow(unused_parens)]
            fn call(args: Self::Args) -> Self::Ret {
                let ($($arg,)*) = args;
                $body
            }
        }
        const _: () = {
            #[$crate::linkme::distributed_slice($crate::registry::REMOTE_FUNCTIONS)]
            #[linkme(crate = $crate::linkme)]
            static ENTRY: $crate::registry::Entry = $crate::registry::Entry {
                name: <$name as $crate::RemoteFunction>::NAME,
                call: $crate::registry::trampoline::<$name>,
            };
        };
    )*};
    (@ret) => { () };
    (@ret $t:ty) => { $t };
}
