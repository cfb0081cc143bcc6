//! The Rust API's shared receive queue (an extension: `engine::srq`): a
//! pool of receive descriptors that VIs of one NIC draw from as messages
//! arrive. A descriptor posted to the pool is handed back by `RecvDone`
//! or `RecvWait` of whichever VI it was taken for.

use crate::error::{Result, ViaError};
use crate::nic::Nic;
use crate::raw::RawNic;
use crate::region::Descriptor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use via_kernel_agent::memory::Ptag;

/// Descriptors posted to a pool and not yet handed back, by address:
/// shared with the VIs that draw from it, which take theirs out when
/// the engine completes them.
#[derive(Clone, Default)]
pub(crate) struct PoolDescriptors(Arc<Mutex<HashMap<usize, Descriptor>>>);

impl PoolDescriptors {
    fn put(&self, d: Descriptor) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(d.addr(), d);
    }

    /// The descriptor at `addr`, completed on a VI that uses the pool.
    pub(crate) fn take(&self, addr: usize) -> Descriptor {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr).expect("the engine completed a descriptor of the pool")
    }
}

/// A shared receive queue.
pub struct Srq {
    nic: Nic,
    id: u16,
    posted: PoolDescriptors,
}

impl Srq {
    pub(crate) fn create(nic: &Nic, ptag: Ptag, depth: usize) -> Result<Srq> {
        let id = nic.raw().srq_create(ptag, depth)?;
        Ok(Srq { nic: nic.clone(), id, posted: PoolDescriptors::default() })
    }

    fn raw(&self) -> &RawNic {
        self.nic.raw()
    }

    pub(crate) fn id(&self) -> u16 {
        self.id
    }

    pub(crate) fn nic(&self) -> &Nic {
        &self.nic
    }

    pub(crate) fn descriptors(&self) -> PoolDescriptors {
        self.posted.clone()
    }

    /// Posts a receive descriptor to the pool; one that is not a valid
    /// receive under the pool's tag is refused (DESCRIPTOR_ERROR) and
    /// handed back with the error.
    pub fn post_recv(&self, d: Descriptor) -> std::result::Result<(), (Descriptor, ViaError)> {
        if let Err(e) = self.raw().srq_post(self.id, d.addr(), d.handle()) {
            return Err((d, e));
        }
        self.posted.put(d);
        Ok(())
    }

    /// Receives posted and not yet taken by a VI.
    pub fn len(&self) -> Result<usize> {
        self.raw().srq_len(self.id)
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // Refused only while a VI uses it; such VIs hold the descriptors
        // they were given, and the pool's rest are dropped with it.
        let _ = self.raw().srq_destroy(self.id);
    }
}
