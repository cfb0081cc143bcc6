//! The VIPL management, error-callback and name-service functions
//! (`VipQuerySystemManagementInfo`, `VipErrorCallback`, `VipNS*`), built
//! like those of [`crate::api`], whose checks they share.

use crate::api::{guard, invalid, mac_of, net_address, nic_of, out, write_host, Context};
use crate::handles;
use crate::types::*;
use std::os::raw::{c_char, c_ulong};
use via_user::{ViaError, VipReturn};

// ---- management and errors ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipQuerySystemManagementInfo(nic: VipHandle, info_type: c_ulong, info: VipPvoid) -> VipReturnCode {
    guard(|| {
        nic_of(nic)?;
        if info_type != VIP_SMI_AUTODISCOVERY {
            return Err(invalid(format!("system management info type {info_type} is not supported (only VIP_SMI_AUTODISCOVERY)")));
        }
        // No discovery of other hosts is kept: an empty list, one hop.
        out(info.cast::<VipAutodiscoveryList>(), VipAutodiscoveryList { number_of_hops: 1, ad_addr_array: std::ptr::null_mut(), num_ad_addrs: 0 })
    })
}

type ErrorCallback = extern "C" fn(VipPvoid, *mut VipErrorDescriptor);

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipErrorCallback(nic: VipHandle, ctx: VipPvoid, f: Option<ErrorCallback>) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let Some(f) = f else {
            n.nic.set_error_callback(None);
            return Ok(());
        };
        let (ctx, nh, vis) = (Context(ctx), Context(nic), n.vis.clone());
        n.nic.set_error_callback(Some(Box::new(move |e| {
            let (ctx, nh) = (ctx, nh);
            let (error_code, resource, cq_handle) = match e.kind {
                via_user::AsyncErrorKind::ConnLost => (error_code::CONN_LOST, resource_code::VI, std::ptr::null_mut()),
                via_user::AsyncErrorKind::RecvQueueEmpty => (error_code::RECVQ_EMPTY, resource_code::VI, std::ptr::null_mut()),
                via_user::AsyncErrorKind::RdmaWriteProt => (error_code::RDMAW_PROT, resource_code::VI, std::ptr::null_mut()),
                via_user::AsyncErrorKind::RdmaReadProt => (error_code::RDMAR_PROT, resource_code::VI, std::ptr::null_mut()),
                via_user::AsyncErrorKind::CqOverflow { cq, .. } => {
                    let h = handles::find(|o| matches!(o, handles::Object::Cq { nic_handle, id, .. } if *nic_handle == nh.0 && *id == cq));
                    (error_code::CATASTROPHIC, resource_code::CQ, h)
                }
            };
            let mut d = VipErrorDescriptor {
                nic_handle: nh.0,
                vi_handle: handles::vi_handle(&vis, e.vi),
                cq_handle,
                descriptor_ptr: std::ptr::null_mut(),
                op_code: 0,
                resource_code: resource,
                error_code,
            };
            f(ctx.0, &mut d);
        })));
        Ok(())
    })
}

// ---- name service ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipNSInit(nic: VipHandle, _init_info: VipPvoid) -> VipReturnCode {
    guard(|| nic_of(nic)?.nic.ns_init(None))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipNSGetHostByName(nic: VipHandle, name: *const c_char, address: *mut VipNetAddress, name_index: c_ulong) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        if name.is_null() {
            return Err(invalid("NULL host name"));
        }
        if name_index != 0 {
            return Err(ViaError::new(VipReturn::ErrorNameService, "each name has one address here: NameIndex must be 0"));
        }
        // SAFETY: non-NULL, NUL-terminated by the VIPL contract.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_str().map_err(|_| invalid("host name is not UTF-8"))?;
        let mac = n.nic.lookup_host(name)?;
        write_host(address, mac, None)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipNSGetHostByAddr(nic: VipHandle, address: *const VipNetAddress, name: *mut c_char, name_len: *mut c_ulong) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let (host, _) = net_address(address)?;
        if name.is_null() || name_len.is_null() {
            return Err(invalid("NULL name buffer or length"));
        }
        let found = n.nic.lookup_name(mac_of(host)?)?;
        // SAFETY: non-NULL; the caller says how much room `name` has.
        unsafe {
            let room = *name_len as usize;
            *name_len = (found.len() + 1) as c_ulong;
            if found.len() + 1 > room {
                return Err(ViaError::resource(format!("the name needs {} bytes with its NUL, the buffer has {room}", found.len() + 1)));
            }
            std::ptr::copy_nonoverlapping(found.as_ptr().cast::<c_char>(), name, found.len());
            *name.add(found.len()) = 0;
        }
        Ok(())
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipNSShutdown(nic: VipHandle) -> VipReturnCode {
    guard(|| {
        nic_of(nic)?.nic.ns_shutdown();
        Ok(())
    })
}
