//! The 41 VIPL functions, `unsafe extern "C"`, each a thin, checked call
//! into the via-user id-level API ([`via_user::raw`]). They are unsafe
//! for one reason, the VIPL contract: a pointer argument is NULL (refused
//! with VIP_INVALID_PARAMETER) or points to the object VIPL gives that
//! argument (a `VIP_VI_ATTRIBUTES`, a NUL-terminated name, room for the
//! handle or the descriptor written back), alive for the call; a
//! `VIP_NET_ADDRESS` is followed by its `HostAddressLen +
//! DiscriminatorLen` bytes. Handles need no promise: any value is looked
//! up and a stale or forged one refused. Every entry point:
//! - checks its handles against the handle table and its pointers for NULL
//!   (VIP_INVALID_PARAMETER);
//! - runs inside `catch_unwind`, so no Rust panic crosses into C (a panic
//!   becomes VIP_ERROR_RESOURCE);
//! - is thread-safe: the engine is behind one lock per NIC.
//!
//! The management, error-callback and name-service functions are in
//! [`crate::manage`].

use crate::handles::{self, NicObject, Object};
use crate::types::*;
use std::os::raw::{c_char, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use via_user::{MacAddr, MemAttributes, Nic, Notice, NotifyTarget, Ptag, Reliability, ViAttributes, ViPhase, ViaError, VipReturn};

pub(crate) type R = Result<(), ViaError>;

fn code(r: R) -> VipReturnCode {
    match r {
        Ok(()) => VipReturn::Success as VipReturnCode,
        Err(e) => e.code as VipReturnCode,
    }
}

/// Runs an entry point's body: errors become their codes, panics
/// VIP_ERROR_RESOURCE. With `VIPL_VERBOSE=1` in the environment, each
/// error (other than NOT_DONE and TIMEOUT) is also written to stderr with
/// its cause.
#[inline(always)]
pub(crate) fn guard(f: impl FnOnce() -> R) -> VipReturnCode {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => {
            match &r {
                Err(e) if !matches!(e.code, VipReturn::NotDone | VipReturn::Timeout) => log_error(e),
                _ => {}
            }
            code(r)
        }
        Err(_) => VipReturn::ErrorResource as VipReturnCode,
    }
}

/// Writes a failed call's error to stderr if `VIPL_VERBOSE` asks (NOT_DONE
/// and TIMEOUT, the answers of polls and timed waits, are not written).
#[cold]
#[inline(never)]
fn log_error(e: &ViaError) {
    static VERBOSE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *VERBOSE.get_or_init(|| std::env::var("VIPL_VERBOSE").is_ok_and(|v| v != "0")) {
        eprintln!("vipl: {e}");
    }
}

pub(crate) fn invalid(what: impl Into<std::borrow::Cow<'static, str>>) -> ViaError {
    ViaError::invalid(what)
}

pub(crate) fn nic_of(h: VipHandle) -> Result<NicObject, ViaError> {
    match handles::get(h) {
        Some(Object::Nic(n)) => Ok(n),
        _ => Err(invalid("not a NIC handle (NULL, closed or another kind)")),
    }
}

/// A VI handle's object, pinned for the call (no lock, no copy).
pub(crate) struct ViRef(handles::Pinned);

impl ViRef {
    /// Its NIC, the NIC's handle, and its number there.
    pub(crate) fn parts(&self) -> (&Nic, VipHandle, u16) {
        match &*self.0 {
            Object::Vi { nic, nic_handle, id } => (nic, *nic_handle, *id),
            _ => unreachable!("vi_of pins VIs only"),
        }
    }
}

#[inline(always)]
pub(crate) fn vi_of(h: VipHandle) -> Result<ViRef, ViaError> {
    match handles::pin(h) {
        Some(p) if matches!(*p, Object::Vi { .. }) => Ok(ViRef(p)),
        _ => Err(invalid("not a VI handle (NULL, destroyed or another kind)")),
    }
}

/// A CQ handle's object, pinned for the call.
struct CqRef(handles::Pinned);

impl CqRef {
    /// Its NIC, the NIC's handle, the NIC's VI handles, and its number.
    fn parts(&self) -> (&Nic, VipHandle, &handles::ViHandles, u16) {
        match &*self.0 {
            Object::Cq { nic, nic_handle, vis, id } => (nic, *nic_handle, vis, *id),
            _ => unreachable!("cq_of pins CQs only"),
        }
    }
}

#[inline(always)]
fn cq_of(h: VipHandle) -> Result<CqRef, ViaError> {
    match handles::pin(h) {
        Some(p) if matches!(*p, Object::Cq { .. }) => Ok(CqRef(p)),
        _ => Err(invalid("not a CQ handle (NULL, destroyed or another kind)")),
    }
}

pub(crate) fn ptag_of(h: VipHandle) -> Result<Ptag, ViaError> {
    match handles::get(h) {
        Some(Object::Ptag { tag, .. }) => Ok(tag),
        _ => Err(ViaError::new(VipReturn::InvalidPtag, "not a protection tag handle")),
    }
}

// (c_ulong is u64 here but 32 bits where `long` is: the cast stays.)
#[allow(clippy::unnecessary_cast)]
fn timeout(ms: c_ulong) -> Option<Duration> {
    (ms != VIP_INFINITE).then(|| Duration::from_millis(ms as u64))
}

/// Writes `v` through the output pointer `p`.
///
/// # Safety
/// `p` is NULL (refused) or valid for writing a `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(invalid("NULL output pointer"));
    }
    // SAFETY: non-NULL; the caller provides room for a T (the VIPL contract).
    unsafe { p.write(v) };
    Ok(())
}

fn reliability(bits: u16) -> Result<Reliability, ViaError> {
    Reliability::from_bits(bits).ok_or_else(|| ViaError::new(VipReturn::InvalidReliabilityLevel, format!("reliability level {bits:#x} is not one of 0x1, 0x2, 0x4")))
}

/// Reads a `VIP_VI_ATTRIBUTES`.
///
/// # Safety
/// `p` is NULL (refused) or points to a `VIP_VI_ATTRIBUTES`.
unsafe fn vi_attrs(p: *const VipViAttributes) -> Result<ViAttributes, ViaError> {
    if p.is_null() {
        return Err(invalid("NULL VI attributes"));
    }
    // SAFETY: non-NULL, a VIP_VI_ATTRIBUTES by the VIPL contract.
    let a = unsafe { *p };
    if !a.qos.is_null() {
        return Err(ViaError::new(VipReturn::InvalidQos, "QoS is not supported: pass NULL"));
    }
    Ok(ViAttributes {
        reliability: reliability(a.reliability_level)?,
        max_transfer_size: u32::try_from(a.max_transfer_size).map_err(|_| ViaError::new(VipReturn::InvalidMtu, "MaxTransferSize over 4 GiB"))?,
        ptag: ptag_of(a.ptag)?,
        enable_rdma_write: a.enable_rdma_write != 0,
        enable_rdma_read: a.enable_rdma_read != 0,
    })
}

fn c_vi_attrs(a: &ViAttributes, ptag: VipHandle) -> VipViAttributes {
    VipViAttributes {
        reliability_level: a.reliability.bits(),
        max_transfer_size: a.max_transfer_size as c_ulong,
        qos: std::ptr::null_mut(),
        ptag,
        enable_rdma_write: a.enable_rdma_write as VipBoolean,
        enable_rdma_read: a.enable_rdma_read as VipBoolean,
    }
}

/// (host address bytes, discriminator bytes) of a `VIP_NET_ADDRESS`.
///
/// # Safety
/// `p` is NULL (refused) or points to a `VIP_NET_ADDRESS` followed by its
/// address and discriminator bytes, alive for `'a`.
pub(crate) unsafe fn net_address<'a>(p: *const VipNetAddress) -> Result<(&'a [u8], &'a [u8]), ViaError> {
    if p.is_null() {
        return Err(invalid("NULL VIP_NET_ADDRESS"));
    }
    // SAFETY: non-NULL; by the VIPL contract the structure is followed by
    // HostAddressLen + DiscriminatorLen bytes.
    unsafe {
        let (h, d) = ((*p).host_address_len as usize, (*p).discriminator_len as usize);
        let base = std::ptr::addr_of!((*p).host_address).cast::<u8>();
        Ok((std::slice::from_raw_parts(base, h), std::slice::from_raw_parts(base.add(h), d)))
    }
}

pub(crate) fn mac_of(host: &[u8]) -> Result<MacAddr, ViaError> {
    <[u8; 6]>::try_from(host).map(MacAddr).map_err(|_| invalid("a host address is a 6-byte MAC"))
}

/// Writes `mac` as the host address of the caller's `VIP_NET_ADDRESS`
/// (HostAddressLen 6), leaving its discriminator alone.
///
/// # Safety
/// `p` is NULL (refused) or points to a `VIP_NET_ADDRESS` with room for a
/// 6-byte address (and the discriminator, when one is written).
pub(crate) unsafe fn write_host(p: *mut VipNetAddress, mac: MacAddr, discriminator: Option<&[u8]>) -> R {
    if p.is_null() {
        return Err(invalid("NULL VIP_NET_ADDRESS"));
    }
    // SAFETY: non-NULL; the caller allocated room for a 6-byte address
    // (and the discriminator we write, when we write one).
    unsafe {
        (*p).host_address_len = 6;
        let base = std::ptr::addr_of_mut!((*p).host_address).cast::<u8>();
        std::ptr::copy_nonoverlapping(mac.0.as_ptr(), base, 6);
        if let Some(d) = discriminator {
            (*p).discriminator_len = d.len() as u16;
            std::ptr::copy_nonoverlapping(d.as_ptr(), base.add(6), d.len());
        }
    }
    Ok(())
}

// ---- NIC ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipOpenNic(name: *const c_char, nic: *mut VipHandle) -> VipReturnCode {
    guard(|| {
        if name.is_null() || nic.is_null() {
            return Err(invalid("NULL device name or NIC handle pointer"));
        }
        // SAFETY: non-NULL, a NUL-terminated string by the VIPL contract.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_str().map_err(|_| invalid("device name is not UTF-8"))?;
        crate::drivers::keep_linked();
        let n = Nic::open(name)?;
        let mac = std::sync::Arc::new(n.mac().0);
        out(nic, handles::insert(Object::Nic(NicObject { vis: handles::ViHandles::new(n.attributes().max_vi), nic: n, mac })))
    })
}

/// `VipCloseNic`: refused with VIP_INVALID_STATE while VIs, CQs,
/// protection tags (and so registered memory, which needs one) or pending
/// connection requests of the NIC exist, naming them (see `VIPL_VERBOSE`);
/// otherwise the NIC closes for real before this returns: its device and
/// file descriptors are closed and its progress thread has ended.
///
/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCloseNic(nic: VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let of_this_nic = |o: &Object| match o {
            Object::Vi { nic_handle, .. } | Object::Cq { nic_handle, .. } | Object::Srq { nic_handle, .. } => *nic_handle == nic,
            Object::Ptag { nic, .. } | Object::Conn { nic, .. } => nic.same(&n.nic),
            Object::Nic(_) => false,
        };
        match handles::remove_unless_used(nic, of_this_nic) {
            Ok(_) => Ok(()), // with `n`, the last handle of the NIC: it closes on return
            Err(used) => {
                let list: Vec<String> = used.iter().map(|(k, n)| format!("{n} {k}")).collect();
                Err(ViaError::state(format!("VipCloseNic: the NIC still has {}: destroy them first", list.join(", "))))
            }
        }
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipQueryNic(nic: VipHandle, attrs: *mut VipNicAttributes) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let a = n.nic.attributes();
        let mut name = [0 as c_char; 64];
        for (d, s) in name.iter_mut().zip(a.name.bytes().take(63)) {
            *d = s as c_char;
        }
        out(
            attrs,
            VipNicAttributes {
                name,
                hardware_version: a.hardware_version as c_ulong,
                provider_version: a.provider_version as c_ulong,
                nic_address_len: 6,
                local_nic_address: n.mac.as_ptr(),
                thread_safe: a.thread_safe as VipBoolean,
                max_discriminator_len: a.max_discriminator_len as u16,
                max_register_bytes: a.max_register_bytes as c_ulong,
                max_register_regions: a.max_register_regions as c_ulong,
                max_register_block_bytes: a.max_register_block_bytes as c_ulong,
                max_vi: a.max_vi as c_ulong,
                max_descriptors_per_queue: a.max_descriptors_per_queue as c_ulong,
                max_segments_per_desc: a.max_segments_per_desc as c_ulong,
                max_cq: a.max_cq as c_ulong,
                max_cq_entries: a.max_cq_entries as c_ulong,
                max_transfer_size: a.max_transfer_size as c_ulong,
                native_mtu: a.native_mtu as c_ulong,
                max_ptags: a.max_ptags as c_ulong,
                reliability_level_support: a.reliability_level_support,
                rdma_read_support: a.rdma_read_support,
            },
        )
    })
}

// ---- protection and memory ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCreatePtag(nic: VipHandle, ptag: *mut VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        if ptag.is_null() {
            return Err(invalid("NULL ptag pointer"));
        }
        let tag = n.nic.create_ptag()?;
        out(ptag, handles::insert(Object::Ptag { nic: n.nic, tag }))
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipDestroyPtag(nic: VipHandle, ptag: VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let tag = ptag_of(ptag)?;
        n.nic.destroy_ptag(tag)?;
        handles::remove(ptag);
        Ok(())
    })
}

/// Reads a `VIP_MEM_ATTRIBUTES`.
///
/// # Safety
/// `p` is NULL (refused) or points to a `VIP_MEM_ATTRIBUTES`.
unsafe fn mem_attrs(p: *const VipMemAttributes) -> Result<MemAttributes, ViaError> {
    if p.is_null() {
        return Err(invalid("NULL memory attributes"));
    }
    // SAFETY: non-NULL, a VIP_MEM_ATTRIBUTES by the VIPL contract.
    let a = unsafe { *p };
    Ok(MemAttributes { ptag: ptag_of(a.ptag)?, enable_rdma_write: a.enable_rdma_write != 0, enable_rdma_read: a.enable_rdma_read != 0 })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipRegisterMem(nic: VipHandle, addr: VipPvoid, len: c_ulong, attrs: *const VipMemAttributes, handle: *mut VipMemHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let a = mem_attrs(attrs)?;
        if handle.is_null() {
            return Err(invalid("NULL memory handle pointer"));
        }
        // SAFETY: the C program promises, as VIA requires, that the memory
        // stays valid while registered.
        let h = unsafe { n.nic.raw().register(addr as usize, len as usize, a)? };
        out(handle, h)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipDeregisterMem(nic: VipHandle, addr: VipPvoid, handle: VipMemHandle) -> VipReturnCode {
    guard(|| nic_of(nic)?.nic.raw().deregister(addr as usize, handle))
}

/// The protection handle of `tag` on `nic` (found in the handle table).
fn ptag_handle(n: &NicObject, tag: Ptag) -> VipHandle {
    crate::handles::find(|o| matches!(o, Object::Ptag { nic, tag: t } if *t == tag && nic.same(&n.nic)))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipQueryMem(nic: VipHandle, addr: VipPvoid, handle: VipMemHandle, attrs: *mut VipMemAttributes) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let a = n.nic.raw().query_mem(addr as usize, handle)?;
        out(attrs, VipMemAttributes { ptag: ptag_handle(&n, a.ptag), enable_rdma_write: a.enable_rdma_write as VipBoolean, enable_rdma_read: a.enable_rdma_read as VipBoolean })
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipSetMemAttributes(nic: VipHandle, addr: VipPvoid, handle: VipMemHandle, attrs: *const VipMemAttributes) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        n.nic.raw().set_mem_attributes(addr as usize, handle, mem_attrs(attrs)?)
    })
}

// ---- VIs ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCreateVi(nic: VipHandle, attrs: *const VipViAttributes, send_cq: VipHandle, recv_cq: VipHandle, vi: *mut VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let a = vi_attrs(attrs)?;
        if vi.is_null() {
            return Err(invalid("NULL VI handle pointer"));
        }
        let cq = |h: VipHandle| -> Result<Option<u16>, ViaError> {
            if h.is_null() {
                return Ok(None);
            }
            let pinned = cq_of(h)?;
            let (cq_nic, _, _, id) = pinned.parts();
            if !cq_nic.same(&n.nic) {
                return Err(invalid("VipCreateVi: the CQ belongs to another NIC"));
            }
            Ok(Some(id))
        };
        let id = n.nic.raw().vi_create(&a, cq(send_cq)?, cq(recv_cq)?)?;
        let h = handles::insert(Object::Vi { nic: n.nic.clone(), nic_handle: nic, id });
        handles::set_vi_handle(&n.vis, id, h);
        out(vi, h)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipDestroyVi(vi: VipHandle) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        nic.raw().vi_destroy(id)?;
        handles::remove(vi);
        Ok(())
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipQueryVi(vi: VipHandle, state: *mut i32, attrs: *mut VipViAttributes, send_empty: *mut VipBoolean, recv_empty: *mut VipBoolean) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, nic_handle, id) = pinned.parts();
        let (phase, a, se, re) = nic.raw().vi_query(id)?;
        let st = match phase {
            ViPhase::Idle => vi_state::IDLE,
            ViPhase::Connected => vi_state::CONNECTED,
            ViPhase::ConnectPending => vi_state::CONNECT_PENDING,
            ViPhase::Error => vi_state::ERROR,
        };
        let n = nic_of(nic_handle)?;
        out(state, st)?;
        out(attrs, c_vi_attrs(&a, ptag_handle(&n, a.ptag)))?;
        out(send_empty, se as VipBoolean)?;
        out(recv_empty, re as VipBoolean)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipSetViAttributes(vi: VipHandle, attrs: *const VipViAttributes) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        nic.raw().vi_set_attributes(id, &vi_attrs(attrs)?)
    })
}

// ---- data transfer ----

fn post(vi: VipHandle, desc: *mut c_void, mem: VipMemHandle, send: bool) -> R {
    let pinned = vi_of(vi)?;
    let (nic, _, id) = pinned.parts();
    if desc.is_null() {
        return Err(invalid("NULL descriptor"));
    }
    nic.raw().vi_post(id, desc as usize, mem, send)
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipPostSend(vi: VipHandle, desc: *mut c_void, mem: VipMemHandle) -> VipReturnCode {
    guard(|| post(vi, desc, mem, true))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipPostRecv(vi: VipHandle, desc: *mut c_void, mem: VipMemHandle) -> VipReturnCode {
    guard(|| post(vi, desc, mem, false))
}

/// `VipSendDone`/`VipRecvDone`.
///
/// # Safety
/// `out_desc` is NULL (refused) or valid for writing a pointer.
unsafe fn done(vi: VipHandle, out_desc: *mut *mut c_void, send: bool) -> R {
    let pinned = vi_of(vi)?;
    let (nic, _, id) = pinned.parts();
    if out_desc.is_null() {
        return Err(invalid("NULL descriptor pointer"));
    }
    match nic.raw().vi_done(id, send)? {
        Some(a) => out(out_desc, a as *mut c_void),
        None => Err(ViaError::not_done()),
    }
}

/// `VipSendWait`/`VipRecvWait`.
///
/// # Safety
/// As for [`done`].
unsafe fn wait(vi: VipHandle, ms: c_ulong, out_desc: *mut *mut c_void, send: bool) -> R {
    let pinned = vi_of(vi)?;
    let (nic, _, id) = pinned.parts();
    if out_desc.is_null() {
        return Err(invalid("NULL descriptor pointer"));
    }
    let a = nic.raw().vi_wait(id, send, timeout(ms))?;
    out(out_desc, a as *mut c_void)
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipSendDone(vi: VipHandle, desc: *mut *mut c_void) -> VipReturnCode {
    guard(|| done(vi, desc, true))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipRecvDone(vi: VipHandle, desc: *mut *mut c_void) -> VipReturnCode {
    guard(|| done(vi, desc, false))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipSendWait(vi: VipHandle, ms: c_ulong, desc: *mut *mut c_void) -> VipReturnCode {
    guard(|| wait(vi, ms, desc, true))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipRecvWait(vi: VipHandle, ms: c_ulong, desc: *mut *mut c_void) -> VipReturnCode {
    guard(|| wait(vi, ms, desc, false))
}

/// A C context pointer carried into a callback on another thread.
#[derive(Clone, Copy)]
pub(crate) struct Context(pub(crate) VipPvoid);
// SAFETY: VIPL hands the context back to the program's own callback; what
// it points to is the program's business, as in C.
unsafe impl Send for Context {}

type DescCallback = extern "C" fn(VipPvoid, VipHandle, VipHandle, *mut c_void);

fn notify(vi: VipHandle, ctx: VipPvoid, f: Option<DescCallback>, send: bool) -> R {
    let pinned = vi_of(vi)?;
    let (nic, nic_handle, id) = pinned.parts();
    let f = f.ok_or_else(|| invalid("NULL callback"))?;
    let (ctx, nh, vh) = (Context(ctx), Context(nic_handle), Context(vi));
    let target = if send { NotifyTarget::Send(id) } else { NotifyTarget::Recv(id) };
    nic.notify(
        target,
        Box::new(move |n| {
            if let Notice::Descriptor(a) = n {
                let (ctx, nh, vh) = (ctx, nh, vh);
                f(ctx.0, nh.0, vh.0, a as *mut c_void);
            }
        }),
    );
    Ok(())
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipSendNotify(vi: VipHandle, ctx: VipPvoid, f: Option<DescCallback>) -> VipReturnCode {
    guard(|| notify(vi, ctx, f, true))
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipRecvNotify(vi: VipHandle, ctx: VipPvoid, f: Option<DescCallback>) -> VipReturnCode {
    guard(|| notify(vi, ctx, f, false))
}

// ---- connections ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectWait(nic: VipHandle, local: *const VipNetAddress, ms: c_ulong, remote: *mut VipNetAddress, remote_attrs: *mut VipViAttributes, conn: *mut VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        let (_, disc) = net_address(local)?;
        if remote.is_null() || remote_attrs.is_null() || conn.is_null() {
            return Err(invalid("NULL output pointer"));
        }
        let req = n.nic.connect_wait(disc, timeout(ms))?;
        write_host(remote, req.remote_mac, None)?;
        let a = VipViAttributes {
            reliability_level: req.reliability.map_or(0, Reliability::bits),
            max_transfer_size: req.max_transfer_size as c_ulong,
            qos: std::ptr::null_mut(),
            ptag: std::ptr::null_mut(),
            enable_rdma_write: req.enable_rdma_write as VipBoolean,
            enable_rdma_read: req.enable_rdma_read as VipBoolean,
        };
        out(remote_attrs, a)?;
        out(conn, handles::insert(Object::Conn { nic: n.nic, req }))
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectAccept(conn: VipHandle, vi: VipHandle) -> VipReturnCode {
    guard(|| {
        let Some(Object::Conn { nic, req }) = handles::get(conn) else { return Err(invalid("not a connection handle")) };
        let pinned = vi_of(vi)?;
        let (_, _, id) = pinned.parts();
        let r = nic.raw().vi_accept(req.conn, id);
        handles::remove(conn); // accepted or refused over attributes: either way it is used up
        r
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectReject(conn: VipHandle) -> VipReturnCode {
    guard(|| {
        let Some(Object::Conn { nic, req }) = handles::remove(conn) else { return Err(invalid("not a connection handle")) };
        nic.raw().reject(req.conn)
    })
}

/// Writes the remote end's VI attributes.
///
/// # Safety
/// `p` is NULL (refused) or valid for writing a `VIP_VI_ATTRIBUTES`.
unsafe fn write_remote_attrs(nic: &Nic, id: u16, p: *mut VipViAttributes) -> R {
    if p.is_null() {
        return Ok(()); // optional
    }
    if let Some((rel, mts, w, r)) = nic.raw().vi_peer_attributes(id)? {
        let a = VipViAttributes { reliability_level: rel, max_transfer_size: mts as c_ulong, qos: std::ptr::null_mut(), ptag: std::ptr::null_mut(), enable_rdma_write: w as VipBoolean, enable_rdma_read: r as VipBoolean };
        out(p, a)?;
    }
    Ok(())
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectRequest(vi: VipHandle, local: *const VipNetAddress, remote: *const VipNetAddress, ms: c_ulong, remote_attrs: *mut VipViAttributes) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        net_address(local)?;
        let (host, disc) = net_address(remote)?;
        nic.raw().vi_connect(id, mac_of(host)?, disc, timeout(ms))?;
        write_remote_attrs(nic, id, remote_attrs)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipDisconnect(vi: VipHandle) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        nic.raw().vi_disconnect(id)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerRequest(vi: VipHandle, local: *const VipNetAddress, remote: *const VipNetAddress, ms: c_ulong) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        let (_, mine) = net_address(local)?;
        let (host, theirs) = net_address(remote)?;
        nic.raw().vi_peer_request(id, mac_of(host)?, mine, theirs, timeout(ms))
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerDone(vi: VipHandle, remote_attrs: *mut VipViAttributes) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        if !nic.raw().vi_peer_done(id)? {
            return Err(ViaError::not_done());
        }
        write_remote_attrs(nic, id, remote_attrs)
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerWait(vi: VipHandle, remote_attrs: *mut VipViAttributes) -> VipReturnCode {
    guard(|| {
        let pinned = vi_of(vi)?;
        let (nic, _, id) = pinned.parts();
        nic.raw().vi_peer_wait(id)?;
        write_remote_attrs(nic, id, remote_attrs)
    })
}

// ---- completion queues ----

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCreateCQ(nic: VipHandle, entries: c_ulong, cq: *mut VipHandle) -> VipReturnCode {
    guard(|| {
        let n = nic_of(nic)?;
        if cq.is_null() {
            return Err(invalid("NULL CQ handle pointer"));
        }
        let id = n.nic.raw().cq_create(entries as usize)?;
        out(cq, handles::insert(Object::Cq { nic: n.nic, nic_handle: nic, vis: n.vis, id }))
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipDestroyCQ(cq: VipHandle) -> VipReturnCode {
    guard(|| {
        let pinned = cq_of(cq)?;
        let (nic, _, _, id) = pinned.parts();
        nic.raw().cq_destroy(id)?;
        handles::remove(cq);
        Ok(())
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipResizeCQ(cq: VipHandle, entries: c_ulong) -> VipReturnCode {
    guard(|| {
        let pinned = cq_of(cq)?;
        let (nic, _, _, id) = pinned.parts();
        nic.raw().cq_resize(id, entries as usize)
    })
}

/// Writes a completion queue's answer: the VI's handle and which queue.
///
/// # Safety
/// Each pointer is NULL (refused) or valid for writing its type.
unsafe fn cq_answer(vis: &handles::ViHandles, (vi, recv): (u16, bool), vi_out: *mut VipHandle, recv_out: *mut VipBoolean) -> R {
    out(vi_out, handles::vi_handle(vis, vi))?;
    out(recv_out, recv as VipBoolean)
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCQDone(cq: VipHandle, vi: *mut VipHandle, recv_queue: *mut VipBoolean) -> VipReturnCode {
    guard(|| {
        let pinned = cq_of(cq)?;
        let (nic, _, vis, id) = pinned.parts();
        if vi.is_null() || recv_queue.is_null() {
            return Err(invalid("NULL output pointer"));
        }
        match nic.raw().cq_done(id)? {
            Some(c) => cq_answer(vis, c, vi, recv_queue),
            None => Err(ViaError::not_done()),
        }
    })
}

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCQWait(cq: VipHandle, ms: c_ulong, vi: *mut VipHandle, recv_queue: *mut VipBoolean) -> VipReturnCode {
    guard(|| {
        let pinned = cq_of(cq)?;
        let (nic, _, vis, id) = pinned.parts();
        if vi.is_null() || recv_queue.is_null() {
            return Err(invalid("NULL output pointer"));
        }
        let c = nic.raw().cq_wait(id, timeout(ms))?;
        cq_answer(vis, c, vi, recv_queue)
    })
}

type CqCallback = extern "C" fn(VipPvoid, VipHandle, VipHandle, VipBoolean);

/// # Safety
/// The VIPL contract (see the module): each pointer argument is NULL
/// (refused) or valid for the object VIPL gives it, for the call.
#[no_mangle]
pub unsafe extern "C" fn VipCQNotify(cq: VipHandle, ctx: VipPvoid, f: Option<CqCallback>) -> VipReturnCode {
    guard(|| {
        let pinned = cq_of(cq)?;
        let (nic, nic_handle, vis, id) = pinned.parts();
        let f = f.ok_or_else(|| invalid("NULL callback"))?;
        let (ctx, nh, vis) = (Context(ctx), Context(nic_handle), vis.clone());
        nic.notify(
            NotifyTarget::Cq(id),
            Box::new(move |n| {
                if let Notice::Completion(vi, recv) = n {
                    let (ctx, nh) = (ctx, nh);
                    f(ctx.0, nh.0, handles::vi_handle(&vis, vi), recv as VipBoolean);
                }
            }),
        );
        Ok(())
    })
}
