//! Areas "protection" and "errors": protection tags on every descriptor
//! and at the RDMA target, descriptor status errors, asynchronous errors,
//! the Error state, disconnect and destroy.

use super::rdma::{attach, check_region, serve, PAGE, REGION, WINDOW};
use super::{fill, Ctx, Rule, T};
use crate::check;
use std::time::{Duration, Instant};
use via_user::descriptor::status;
use via_user::{AsyncErrorKind, Descriptor, MemAttributes, MemoryRegion, Op, Reliability, RemoteBuffer, Vi, ViPhase, VipReturn};

macro_rules! rule {
    ($name:ident, $area:expr, $text:expr, $t:expr, $i:expr) => {
        Rule { name: stringify!($name), area: $area, text: $text, target: $t, initiator: $i, target_passive: false }
    };
}

pub fn rules() -> Vec<Rule> {
    vec![
        rule!(rdma_write_into_region_without_enable_bit_is_refused, "protection",
            "An RDMA write into a region whose EnableRdmaWrite is off fails: the initiator's descriptor completes with RDMA_PROT_ERROR, the target reports RDMAW_PROT, the target's memory is untouched, and on a reliable VI both ends go to the Error state.",
            |c| violation_target(c, (true, false), (false, false), false, AsyncErrorKind::RdmaWriteProt), |c| violation_initiator(c, false, 0)),
        rule!(rdma_write_on_vi_without_enable_bit_is_refused, "protection",
            "An RDMA write to a VI whose EnableRdmaWrite is off fails the same way, even into an enabled region.",
            |c| violation_target(c, (false, false), (true, false), false, AsyncErrorKind::RdmaWriteProt), |c| violation_initiator(c, false, 0)),
        rule!(rdma_write_past_the_region_end_is_refused, "protection",
            "An RDMA write that starts inside the registered region and runs past its end is refused as a whole: not even the bytes inside the region are written.",
            |c| violation_target(c, (true, false), (true, false), false, AsyncErrorKind::RdmaWriteProt), |c| violation_initiator(c, false, (WINDOW + PAGE - 100) as u64)),
        rule!(rdma_write_into_region_of_another_ptag_is_refused, "protection",
            "The target region's protection tag must equal the target VI's: an RDMA write into an enabled region of another tag fails with RDMA_PROT_ERROR.",
            |c| violation_target(c, (true, false), (true, false), true, AsyncErrorKind::RdmaWriteProt), |c| violation_initiator(c, false, 0)),
        rule!(rdma_read_of_region_without_enable_bit_is_refused, "protection",
            "An RDMA read of a region whose EnableRdmaRead is off fails with RDMA_PROT_ERROR at the initiator and RDMAR_PROT at the target; the initiator's buffer is not written.",
            |c| violation_target(c, (false, true), (false, false), false, AsyncErrorKind::RdmaReadProt), |c| violation_initiator(c, true, 0)),
        rule!(unreliable_rdma_violation_is_dropped_and_reported_at_the_target, "protection",
            "On an unreliable VI a refused RDMA write is dropped: the target's memory is untouched and RDMAW_PROT is reported there, and the connection goes on.",
            unrel_violation_target, unrel_violation_initiator),
        rule!(segment_in_memory_of_another_ptag_gives_protection_error, "protection",
            "A data segment in memory registered under another protection tag than the VI's completes the descriptor with PROTECTION_ERROR, in posting order, and the connection goes on; nothing of it reaches the peer: no receive completes for it and the peer's buffers are untouched.",
            refused_send_target, segment_ptag_initiator),
        rule!(descriptor_in_memory_of_another_ptag_gives_protection_error, "protection",
            "The descriptor's own memory must carry the VI's protection tag too: otherwise the descriptor completes with PROTECTION_ERROR, and nothing of it reaches the peer.",
            refused_send_target, descriptor_ptag_initiator),
        rule!(ptag_in_use_cannot_be_destroyed, "protection",
            "VipDestroyPtag of a tag still used by a VI or a region fails with INVALID_STATE; once unused it succeeds, and the destroyed tag is refused (INVALID_PTAG) when creating a VI.",
            idle_target, ptag_initiator),
        rule!(rdma_with_a_forged_memory_handle_is_refused, "protection",
            "A memory handle carries random bits beside its table slot: an RDMA write naming the right address and slot with other random bits is refused like any violation (RDMA_PROT_ERROR, RDMAW_PROT at the target, memory untouched, both ends in Error).",
            |c| violation_target(c, (true, false), (true, false), false, AsyncErrorKind::RdmaWriteProt), forged_handle_initiator),
        rule!(deregistration_revokes_rdma_access_at_once, "protection",
            "Once VipDeregisterMem returns, the peer's RDMA with the old handle is refused: a write that landed before the deregistration fails after it (RDMA_PROT_ERROR, RDMAW_PROT), and the memory keeps what the first write put there.",
            dereg_target, dereg_initiator),
        rule!(destroying_a_vi_with_posted_descriptors_fails, "errors",
            "VipDestroyVi fails with INVALID_STATE while the VI is connected (even with nothing posted) or has descriptors posted; after disconnecting and collecting them it succeeds.",
            idle_target, destroy_initiator),
        rule!(malformed_descriptors_complete_with_format_error, "errors",
            "A descriptor with reserved control bits set, a send whose Length differs from the sum of its segments, or an RDMA operation on the receive queue completes with FORMAT_ERROR, in posting order, without breaking the connection.",
            idle_target, format_initiator),
        rule!(receive_error_on_reliable_reception_reports_remote_desc_error, "errors",
            "On Reliable Reception a receive that fails (buffer too small: LENGTH_ERROR) completes the sender's descriptor with REMOTE_DESC_ERROR; the connection goes on.",
            remote_desc_target, remote_desc_initiator),
        rule!(missing_receive_breaks_a_reliable_connection, "errors",
            "A send arriving at a reliable VI with no receive posted breaks the connection: the target reports RECVQ_EMPTY and goes to Error, the initiator's send completes with DESC_FLUSHED (it was not delivered) and it reports CONN_LOST.",
            no_recv_target, no_recv_initiator),
        rule!(missing_receive_on_unreliable_is_dropped_and_counted, "errors",
            "A send arriving at an unreliable VI with no receive posted is dropped and counted; the connection goes on and the next send lands.",
            unrel_no_recv_target, unrel_no_recv_initiator),
        rule!(disconnect_flushes_and_the_peer_sees_conn_lost, "errors",
            "VipDisconnect completes everything posted with DESC_FLUSHED and leaves the VI Idle; the peer's error callback reports CONN_LOST and its VI is in the Error state.",
            disconnect_target, disconnect_initiator),
    ]
}

fn idle_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(4096, false, false);
    for i in 0..4 {
        vi.post_recv(c.desc(Op::SendRecv, &buf, i * 1024..i * 1024 + 1024, None, false)).unwrap();
    }
    c.accept(&vi);
    c.heard();
}

/// Target of the RDMA violations: `other_ptag` registers the window under
/// a tag other than the VI's.
fn violation_target(c: &mut Ctx, vi_bits: (bool, bool), region_bits: (bool, bool), other_ptag: bool, want: AsyncErrorKind) {
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let e2 = errors.clone();
    c.nic.set_error_callback(Some(Box::new(move |e| e2.lock().unwrap().push(e.kind))));
    let (vi, mem) = if other_ptag {
        let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, vi_bits.0, vi_bits.1));
        let other = c.ok(c.nic.create_ptag(), "second ptag");
        let mem = c.region_in(other, REGION, region_bits.0, region_bits.1);
        mem.write(0, &fill(7, REGION)).unwrap();
        c.accept(&vi);
        let offer = mem.remote(PAGE..PAGE + WINDOW).unwrap();
        c.offer(&mut vi, offer);
        (vi, mem)
    } else {
        let (vi, mem, _) = serve(c, Reliability::ReliableDelivery, vi_bits, region_bits, 0);
        (vi, mem)
    };
    let deadline = Instant::now() + T.unwrap();
    while vi.state() != ViPhase::Error && Instant::now() < deadline {
        c.nic.progress();
    }
    check!(c, vi.state() == ViPhase::Error, "the target VI is {:?}, expected Error", vi.state());
    check_region(c, &mem, &fill(7, REGION)[PAGE..PAGE + WINDOW]);
    let errs = errors.lock().unwrap().clone();
    check!(c, errs.contains(&want), "asynchronous errors {errs:?}, expected {want:?}");
    c.heard();
}

fn violation_initiator(c: &mut Ctx, read: bool, offset: u64) {
    violation_initiator_at(c, read, |rb| rb.offset(offset))
}

/// Initiator of a violation: RDMA into what `aim` makes of the offered
/// window; the violation must fail and break the connection.
fn violation_initiator_at(c: &mut Ctx, read: bool, aim: impl Fn(RemoteBuffer) -> RemoteBuffer) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, read);
    let rb = aim(rb);
    let local = c.region(8192, false, false);
    local.write(0, &[0x55; 8192]).unwrap();
    let op = if read { Op::RdmaRead(rb) } else { Op::RdmaWrite(rb) };
    vi.post_send(c.desc(op, &local, 0..4096, None, false)).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &local, 0..10, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    check!(c, d.errors() == status::RDMA_PROT_ERROR, "status {:#x}, expected RDMA_PROT_ERROR", d.status());
    let d = c.ok(vi.send_wait(T), "SendWait (the send after it)");
    check!(c, d.errors() == status::DESC_FLUSHED_ERROR, "the descriptor after the violation: status {:#x}, expected DESC_FLUSHED", d.status());
    check!(c, vi.state() == ViPhase::Error, "initiator VI {:?}, expected Error", vi.state());
    check!(c, local.to_vec(0..8192).unwrap() == vec![0x55; 8192], "the local buffer changed");
    c.pass();
}

fn unrel_violation_target(c: &mut Ctx) {
    let (mut vi, mem, rbuf) = serve(c, Reliability::Unreliable, (true, false), (false, false), 1);
    let d = c.ok(vi.recv_wait(T), "RecvWait (the send after the refused write)");
    c.ok(d.check_ok(), "send");
    check!(c, rbuf.to_vec(0..4).unwrap() == b"next", "payload");
    check_region(c, &mem, &fill(7, REGION)[PAGE..PAGE + WINDOW]);
    let errs = c.nic.take_async_errors();
    check!(c, errs.iter().any(|e| e.kind == AsyncErrorKind::RdmaWriteProt), "asynchronous errors {errs:?}");
    check!(c, vi.state() == ViPhase::Connected, "state {:?}", vi.state());
    c.tell("checked"); // the initiator stays connected until now
    c.heard();
}

fn unrel_violation_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::Unreliable, false);
    let src = c.region(4096, false, false);
    vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0..4096, None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "unreliable RDMA write (completes once sent)");
    c.send_control(&mut vi, b"next");
    check!(c, c.heard() == "checked", "the target's checks");
    c.pass();
}

/// What the initiators of the refused sends send after the refusal: the
/// one message the target may receive.
const MARKER: &[u8] = b"the marker";
/// Receives the target of the refused sends posts, and their size.
const REFUSED_RECVS: usize = 4;
const REFUSED_RECV_LEN: usize = 1024;

/// Target of the refused sends: its receive buffers hold a known pattern;
/// the one receive that may complete is the initiator's marker (sent after
/// the refused descriptor, so on a reliable VI everything before it has
/// arrived by then), the rest of the buffers keep the pattern, and no
/// other receive completes.
fn refused_send_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(REFUSED_RECVS * REFUSED_RECV_LEN, false, false);
    let pattern = fill(3, REFUSED_RECVS * REFUSED_RECV_LEN);
    buf.write(0, &pattern).unwrap();
    for i in 0..REFUSED_RECVS {
        vi.post_recv(c.desc(Op::SendRecv, &buf, i * REFUSED_RECV_LEN..(i + 1) * REFUSED_RECV_LEN, None, false)).unwrap();
    }
    c.accept(&vi);
    let d = c.ok(vi.recv_wait(T), "RecvWait (the marker)");
    c.ok(d.check_ok(), "the first receive");
    let got = buf.to_vec(0..MARKER.len()).unwrap();
    check!(c, d.length() as usize == MARKER.len() && got == MARKER, "the first receive holds {} bytes {:?}, not the marker: the refused send reached the target", d.length(), String::from_utf8_lossy(&got));
    let extra = c.ok(vi.recv_done(), "RecvDone");
    check!(c, extra.is_none(), "a second receive completed (status {:#x}, {} bytes): the refused send reached the target", extra.as_ref().map_or(0, |d| d.status()), extra.as_ref().map_or(0, |d| d.length()));
    let now = buf.to_vec(0..REFUSED_RECVS * REFUSED_RECV_LEN).unwrap();
    if let Some(i) = (MARKER.len()..now.len()).find(|&i| now[i] != pattern[i]) {
        check!(c, false, "receive buffer byte {i} changed ({:#x}, was {:#x}): the refused send reached the target", now[i], pattern[i]);
    }
    check!(c, vi.state() == ViPhase::Connected, "target VI {:?}, expected Connected", vi.state());
    c.tell("checked"); // the initiator stays connected until now
    c.heard();
}

/// Sends the marker on `vi` and waits until the target has checked that
/// nothing but the marker arrived.
fn send_marker_and_wait_for_checks(c: &Ctx, vi: &mut Vi) {
    let own = c.region(4096, false, false);
    own.write(0, MARKER).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &own, 0..MARKER.len(), None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait (the marker)").check_ok(), "the send after the refused one");
    check!(c, vi.state() == ViPhase::Connected, "state {:?}", vi.state());
    check!(c, c.heard() == "checked", "the target's checks");
}

fn segment_ptag_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    let other = c.ok(c.nic.create_ptag(), "ptag");
    let foreign = c.region_in(other, 4096, false, false);
    foreign.write(0, &[0xee; 4096]).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &foreign, 0..100, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    check!(c, d.errors() == status::PROTECTION_ERROR, "status {:#x}", d.status());
    send_marker_and_wait_for_checks(c, &mut vi);
    c.pass();
}

fn format_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(4096, false, false);
    let mut reserved = c.desc(Op::SendRecv, &buf, 0..10, None, false);
    reserved.set_raw_control(0x0010, 1, 10); // a reserved control bit
    let mut wrong_len = c.desc(Op::SendRecv, &buf, 0..10, None, false);
    wrong_len.set_raw_control(0, 1, 11);
    let rb = c.ok(buf.remote(0..10), "remote");
    vi.post_recv(c.desc(Op::RdmaWrite(rb), &buf, 0..10, None, false)).unwrap();
    let d = c.ok(vi.recv_done(), "RecvDone").unwrap_or_else(|| super::fail(c.rule, "the RDMA descriptor on the receive queue did not complete"));
    check!(c, d.errors() == status::FORMAT_ERROR, "RDMA on the receive queue: status {:#x}", d.status());
    c.connect(&mut vi);
    vi.post_send(reserved).unwrap();
    vi.post_send(wrong_len).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..10, None, false)).unwrap();
    for what in ["reserved bits", "Length not the segments' sum"] {
        let d = c.ok(vi.send_wait(T), "SendWait");
        check!(c, d.errors() == status::FORMAT_ERROR, "{what}: status {:#x}", d.status());
    }
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "the good send after them");
    check!(c, vi.state() == ViPhase::Connected, "state {:?}", vi.state());
    c.pass();
}

fn descriptor_ptag_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    let other = c.ok(c.nic.create_ptag(), "ptag");
    let own = c.region(4096, false, false);
    own.write(0, &[0xee; 4096]).unwrap();
    let mut d = c.ok(Descriptor::new(&c.nic, other, 1), "descriptor under another tag");
    c.ok(d.set(&[(&own, 0..100)], None), "set");
    vi.post_send(d).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    check!(c, d.errors() == status::PROTECTION_ERROR, "status {:#x}", d.status());
    send_marker_and_wait_for_checks(c, &mut vi);
    c.pass();
}

fn ptag_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    let tag = c.ok(c.nic.create_ptag(), "ptag");
    let region: MemoryRegion = c.region_in(tag, 4096, false, false);
    let e = c.nic.destroy_ptag(tag).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidState), "destroying a tag used by a region: {e:?}");
    drop(region);
    let vi2 = c.ok(c.nic.create_vi(&via_user::ViAttributes { ptag: tag, ..c.attrs(Reliability::ReliableDelivery, false, false) }, None, None), "VI under the tag");
    let e = c.nic.destroy_ptag(tag).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidState), "destroying a tag used by a VI: {e:?}");
    drop(vi2);
    c.ok(c.nic.destroy_ptag(tag), "destroying the unused tag");
    let e = c.nic.create_vi(&via_user::ViAttributes { ptag: tag, ..c.attrs(Reliability::ReliableDelivery, false, false) }, None, None).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidPtag), "a VI under a destroyed tag: {e:?}");
    c.pass();
}

fn destroy_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    let (_, _, sq_empty, rq_empty) = vi.query();
    check!(c, sq_empty && rq_empty, "a fresh connected VI has descriptors posted (send empty {sq_empty}, receive empty {rq_empty})");
    let (mut vi, e) = vi.destroy().err().unwrap_or_else(|| super::fail(c.rule, "destroying a connected VI with nothing posted succeeded"));
    check!(c, e.code == VipReturn::InvalidState, "destroying a connected VI with nothing posted: {e}");
    check!(c, vi.state() == ViPhase::Connected, "the refused destroy left the VI {:?}", vi.state());
    let buf = c.region(4096, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..100, None, false)).unwrap();
    let (mut vi, e) = vi.destroy().err().unwrap_or_else(|| super::fail(c.rule, "destroying a connected VI with a receive posted succeeded"));
    check!(c, e.code == VipReturn::InvalidState, "destroying a connected VI with a receive posted: {e}");
    c.ok(vi.disconnect(), "VipDisconnect");
    let (mut vi, e) = vi.destroy().err().unwrap_or_else(|| super::fail(c.rule, "destroying a VI with a posted (flushed, not collected) receive succeeded"));
    check!(c, e.code == VipReturn::InvalidState, "destroying with descriptors posted: {e}");
    let d = c.ok(vi.recv_done(), "RecvDone").unwrap_or_else(|| super::fail(c.rule, "no flushed receive"));
    check!(c, d.errors() == status::DESC_FLUSHED_ERROR, "status {:#x}", d.status());
    check!(c, vi.destroy().is_ok(), "destroying the idle, empty VI failed");
    c.pass();
}

fn remote_desc_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableReception, false, false));
    let buf = c.region(4096, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..100, None, false)).unwrap();
    vi.post_recv(c.desc(Op::SendRecv, &buf, 1000..3000, None, false)).unwrap();
    c.accept(&vi);
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    check!(c, d.errors() == status::LENGTH_ERROR, "receive status {:#x}, expected LENGTH_ERROR", d.status());
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "the next receive");
    check!(c, buf.to_vec(1000..1500).unwrap() == fill(8, 500), "payload");
    c.pass();
    c.heard();
}

fn remote_desc_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableReception, false, false));
    c.connect(&mut vi);
    let buf = c.region(4096, false, false);
    buf.write(0, &fill(8, 1000)).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..1000, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    check!(c, d.errors() == status::REMOTE_DESC_ERROR, "send status {:#x}, expected REMOTE_DESC_ERROR", d.status());
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..500, None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "the next send");
    check!(c, vi.state() == ViPhase::Connected, "state {:?}", vi.state());
    c.pass();
}

fn wait_for_state(c: &Ctx, vi: &Vi, want: ViPhase) {
    let deadline = Instant::now() + T.unwrap();
    while vi.state() != want && Instant::now() < deadline {
        c.nic.progress();
    }
    check!(c, vi.state() == want, "VI state {:?}, expected {want:?}", vi.state());
}

fn no_recv_target(c: &mut Ctx) {
    let vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.accept(&vi);
    wait_for_state(c, &vi, ViPhase::Error);
    let errs = c.nic.take_async_errors();
    check!(c, errs.iter().any(|e| e.kind == AsyncErrorKind::RecvQueueEmpty), "asynchronous errors {errs:?}");
    check!(c, c.nic.counters().rx_no_receive_posted == 1, "counted {}", c.nic.counters().rx_no_receive_posted);
    c.heard();
}

fn no_recv_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    let buf = c.region(4096, false, false);
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..100, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait");
    check!(c, d.errors() == status::DESC_FLUSHED_ERROR, "send status {:#x}, expected DESC_FLUSHED", d.status());
    check!(c, vi.state() == ViPhase::Error, "state {:?}", vi.state());
    let errs = c.nic.take_async_errors();
    check!(c, errs.iter().any(|e| e.kind == AsyncErrorKind::ConnLost), "asynchronous errors {errs:?}");
    c.pass();
}

fn unrel_no_recv_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::Unreliable, false, false));
    c.accept(&vi);
    let deadline = Instant::now() + T.unwrap();
    while c.nic.counters().rx_no_receive_posted == 0 && Instant::now() < deadline {
        c.nic.progress();
    }
    check!(c, c.nic.counters().rx_no_receive_posted == 1, "the dropped message was not counted");
    let buf = c.region(4096, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..4096, None, false)).unwrap();
    c.tell("again");
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "receive");
    check!(c, buf.to_vec(0..6).unwrap() == b"second", "the first (dropped) message landed instead of the second");
    check!(c, vi.state() == ViPhase::Connected, "state {:?}", vi.state());
    c.tell("checked"); // the initiator stays connected until now
    c.heard();
}

fn unrel_no_recv_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::Unreliable, false, false));
    c.connect(&mut vi);
    let buf = c.region(4096, false, false);
    buf.write(0, b"first!").unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..6, None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "first send");
    check!(c, c.heard() == "again", "expected again");
    buf.write(0, b"second").unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..6, None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "second send");
    check!(c, c.heard() == "checked", "the target's checks");
    c.pass();
}

fn disconnect_target(c: &mut Ctx) {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    c.nic.set_error_callback(Some(Box::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    })));
    let vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.accept(&vi);
    let e = c.ok(rx.recv_timeout(Duration::from_secs(10)), "the error callback");
    check!(c, e.kind == AsyncErrorKind::ConnLost && e.vi == vi.id(), "callback got {e:?}");
    check!(c, vi.state() == ViPhase::Error, "state {:?}", vi.state());
    c.pass();
    c.heard();
}

fn disconnect_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(4096, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..100, None, false)).unwrap();
    vi.post_recv(c.desc(Op::SendRecv, &buf, 100..200, None, false)).unwrap();
    c.connect(&mut vi);
    c.ok(vi.disconnect(), "VipDisconnect");
    check!(c, vi.state() == ViPhase::Idle, "state {:?}", vi.state());
    for _ in 0..2 {
        let d = c.ok(vi.recv_done(), "RecvDone").unwrap_or_else(|| super::fail(c.rule, "a receive was not flushed"));
        check!(c, d.errors() == status::DESC_FLUSHED_ERROR, "status {:#x}", d.status());
    }
    c.pass();
}


/// The offered window's handle with one of its random bits flipped (the
/// slot, its low 16 bits, stays: the table finds the region, and the
/// random bits must refuse it).
fn forged_handle_initiator(c: &mut Ctx) {
    violation_initiator_at(c, false, |rb| RemoteBuffer { handle: rb.handle ^ 0x0004_0000, ..rb })
}

/// Target: the window registered a second time (RDMA write enabled) over
/// memory of a region without RDMA; offered, written once, deregistered.
fn dereg_target(c: &mut Ctx) {
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let e2 = errors.clone();
    c.nic.set_error_callback(Some(Box::new(move |e| e2.lock().unwrap().push(e.kind))));
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, true, false));
    let mem = c.region(REGION, false, false);
    mem.write(0, &fill(7, REGION)).unwrap();
    let addr = mem.as_ptr() as usize + PAGE;
    // SAFETY: the window lies inside `mem`, which outlives the
    // registration (deregistered below, before `mem` is dropped).
    let handle = c.ok(unsafe { c.nic.raw().register(addr, WINDOW, MemAttributes { ptag: c.ptag, enable_rdma_write: true, enable_rdma_read: false }) }, "VipRegisterMem (the window)");
    c.accept(&vi);
    c.offer(&mut vi, RemoteBuffer { addr: addr as u64, handle, len: WINDOW as u64 });
    check!(c, c.heard() == "written", "expected written");
    let mut first = fill(7, REGION)[PAGE..PAGE + WINDOW].to_vec();
    first[..4096].copy_from_slice(&[0x55; 4096]);
    check_region(c, &mem, &first);
    c.ok(c.nic.raw().deregister(addr, handle), "VipDeregisterMem");
    c.tell("deregistered");
    let deadline = Instant::now() + T.unwrap();
    while vi.state() != ViPhase::Error && Instant::now() < deadline {
        c.nic.progress();
    }
    check!(c, vi.state() == ViPhase::Error, "the target VI is {:?}, expected Error", vi.state());
    check_region(c, &mem, &first);
    let errs = errors.lock().unwrap().clone();
    check!(c, errs.contains(&AsyncErrorKind::RdmaWriteProt), "asynchronous errors {errs:?}, expected RdmaWriteProt");
    c.heard();
}

fn dereg_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, false);
    let local = c.region(8192, false, false);
    local.write(0, &[0x55; 4096]).unwrap();
    local.write(4096, &[0x66; 4096]).unwrap();
    vi.post_send(c.desc(Op::RdmaWrite(rb), &local, 0..4096, None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait (the first write)").check_ok(), "the write before the deregistration");
    c.tell("written");
    check!(c, c.heard() == "deregistered", "expected deregistered");
    vi.post_send(c.desc(Op::RdmaWrite(rb), &local, 4096..8192, None, false)).unwrap();
    let d = c.ok(vi.send_wait(T), "SendWait (the write after)");
    check!(c, d.errors() == status::RDMA_PROT_ERROR, "the write after the deregistration: status {:#x}, expected RDMA_PROT_ERROR", d.status());
    check!(c, vi.state() == ViPhase::Error, "initiator VI {:?}, expected Error", vi.state());
    c.pass();
}
