//! The extensions of `include/vipl_ext.h` that need calls: shared receive
//! queues. (Remote atomics need none: they are descriptors posted with
//! `VipPostSend`.) A pool's receives are posted with `VipExtPostSrq`; a VI
//! that uses a pool hands the pool's descriptors back from its own
//! `VipRecvDone`/`VipRecvWait`, as the descriptors posted on it.

use crate::api::{guard, invalid, nic_of, out, ptag_of, vi_of};
use crate::handles::{self, Object};
use crate::types::{VipHandle, VipMemHandle, VipReturnCode};
use std::os::raw::{c_ulong, c_void};
use via_user::{Nic, ViaError};

fn srq_of(h: VipHandle) -> Result<(Nic, u16), ViaError> {
    match handles::get(h) {
        Some(Object::Srq { nic, id, .. }) => Ok((nic, id)),
        _ => Err(invalid("not a shared receive queue handle (NULL, destroyed or another kind)")),
    }
}

/// `VipExtCreateSrq`: a pool of up to `depth` receives under `ptag`.
///
/// # Safety
/// `srq` is NULL (refused) or valid for writing a handle.
#[no_mangle]
pub unsafe extern "C" fn VipExtCreateSrq(nic: VipHandle, ptag: VipHandle, depth: c_ulong, srq: *mut VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let tag = ptag_of(ptag)?;
        if srq.is_null() {
            return Err(invalid("NULL shared receive queue handle pointer"));
        }
        let id = n.nic.raw().srq_create(tag, depth as usize)?;
        // SAFETY: checked non-NULL; the caller's room for a handle.
        unsafe { out(srq, handles::insert(Object::Srq { nic: n.nic, nic_handle: nic, id })) }
    })
}

/// `VipExtDestroySrq`: refused (VIP_INVALID_STATE) while a VI uses it.
///
/// # Safety
/// None beyond the handle (checked).
#[no_mangle]
pub unsafe extern "C" fn VipExtDestroySrq(srq: VipHandle) -> VipReturnCode {
    guard(|| {
        let (nic, id) = srq_of(srq)?;
        nic.raw().srq_destroy(id)?;
        handles::remove(srq);
        Ok(())
    })
}

/// `VipExtPostSrq`: posts the receive descriptor `desc` (in memory `mem`)
/// to the pool; one that is no valid receive is refused with
/// VIP_DESCRIPTOR_ERROR.
///
/// # Safety
/// `desc` is a descriptor in registered memory, as for `VipPostRecv`
/// (checked against the registration table).
#[no_mangle]
pub unsafe extern "C" fn VipExtPostSrq(srq: VipHandle, desc: *mut c_void, mem: VipMemHandle) -> VipReturnCode {
    guard(|| {
        let (nic, id) = srq_of(srq)?;
        nic.raw().srq_post(id, desc as usize, mem)
    })
}

/// `VipExtViUseSrq`: the idle VI `vi`, with no receive posted, takes its
/// receives from the pool from now on (its own `VipPostRecv` is refused).
///
/// # Safety
/// None beyond the handles (checked).
#[no_mangle]
pub unsafe extern "C" fn VipExtViUseSrq(vi: VipHandle, srq: VipHandle) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, vid) = pinned.parts();
        let (snic, sid) = srq_of(srq)?;
        if !snic.same(nic) {
            return Err(invalid("the shared receive queue belongs to another NIC"));
        }
        nic.raw().vi_use_srq(vid, sid)
    })
}
