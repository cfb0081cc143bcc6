//! Area "queries and attributes": VipQueryNic, VipQueryVi,
//! VipSetViAttributes, VipQueryMem/VipSetMemAttributes, VipResizeCQ.

use super::rdma::{attach, PAGE, REGION, WINDOW};
use super::{fill, Ctx, Rule, MTS, T};
use crate::check;
use via_user::{MemAttributes, Op, Reliability, ViAttributes, ViPhase, VipReturn};

macro_rules! rule {
    ($name:ident, $text:expr, $t:expr, $i:expr) => {
        Rule { name: stringify!($name), area: "queries and attributes", text: $text, target: $t, initiator: $i, target_passive: false }
    };
}

pub fn rules() -> Vec<Rule> {
    vec![
        rule!(query_nic_reports_the_device_honestly,
            "VipQueryNic gives the device's own MTU and address, every reliability level, RDMA read on the reliable levels, and limits the engine enforces.",
            plain_target, query_nic_initiator),
        rule!(query_vi_reports_state_attributes_and_queue_emptiness,
            "VipQueryVi gives the VI's state (Idle, then Connected, then Idle after Disconnect), its attributes, and whether each queue holds posted descriptors.",
            plain_target, query_vi_initiator),
        rule!(set_vi_attributes_respects_the_state,
            "VipSetViAttributes changes the RDMA enables and the ptag at any time, but the reliability level only while Idle (INVALID_STATE otherwise); a MaxTransferSize above the NIC's gives INVALID_MTU, an unknown ptag INVALID_PTAG.",
            plain_target, set_vi_initiator),
        rule!(set_mem_attributes_takes_effect_for_later_rdma,
            "VipSetMemAttributes turning EnableRdmaWrite on makes later RDMA writes into the region succeed; VipQueryMem reports the new attributes.",
            set_mem_target, set_mem_initiator),
        rule!(cq_keeps_completions_past_its_size_and_resizes,
            "A CQ never loses a completion: past its size it keeps them, counts the overflow and reports it once through the error callback (VIP_RESOURCE_CQ, VIP_ERROR_CATASTROPHIC, naming the CQ and its size); VipResizeCQ below the number queued fails with ERROR_RESOURCE, a larger size succeeds.",
            plain_target, cq_initiator),
    ]
}

fn plain_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(4096, false, false);
    for i in 0..8 {
        vi.post_recv(c.desc(Op::SendRecv, &buf, i * 256..i * 256 + 256, None, false)).unwrap();
    }
    c.accept(&vi);
    c.heard();
}

fn query_nic_initiator(c: &mut Ctx) {
    let a = c.nic.attributes();
    if ["tulip:", "/dev/via_tulip", "e1000e:", "/dev/via_e1000e"].iter().any(|p| c.dev.starts_with(p)) {
        // A NIC over VFIO: Ethernet's MTU unless the name asks for another
        // (`,mtu=N`), and the unicast address from its serial ROM or EEPROM.
        let mtu = c.dev.split(',').find_map(|o| o.strip_prefix("mtu=")).and_then(|m| m.parse().ok()).unwrap_or(1500);
        check!(c, a.native_mtu == mtu, "NativeMTU {} on {}, expected {mtu}", a.native_mtu, c.dev);
        check!(c, a.mac.0[0] & 1 == 0 && a.mac != via_user::MacAddr::ZERO, "station address {} is not a unicast address", a.mac);
    } else if let Some(spec) = c.dev.strip_prefix("udp:") {
        // VIA in UDP/IPv4: the interface's MTU less the IPv4 and UDP
        // headers, and the interface's IPv4 address as the identity.
        let ifname = spec.split(',').next().unwrap_or_default();
        let mtu: usize = std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu")).map(|s| s.trim().parse().unwrap_or(0)).unwrap_or(0);
        check!(c, a.native_mtu + 28 == mtu, "NativeMTU {} over UDP, but the interface's MTU is {mtu} (28 bytes of IPv4 and UDP headers)", a.native_mtu);
        let out = std::process::Command::new("ip").args(["-o", "-4", "addr", "show", "dev", ifname]).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        let ip = out.split_whitespace().skip_while(|w| *w != "inet").nth(1).and_then(|a| a.split('/').next()).unwrap_or_default().to_string();
        check!(c, a.mac.to_string() == ip, "address {} but the interface's IPv4 address is {ip:?}", a.mac);
    } else {
        // A software NIC: its interface's MTU and address (a composite's
        // MTU is the smaller of the NIC's and the shared-memory wire's).
        let (nic, composite) = c.dev.split_once("+shm:").map_or((c.dev.as_str(), false), |(n, _)| (n, true));
        let ifname = nic.trim_start_matches("/dev/via_");
        let mtu: usize = std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu")).map(|s| s.trim().parse().unwrap_or(0)).unwrap_or(0);
        let mtu = if composite { mtu.min(via_softnic::shm::MTU) } else { mtu };
        check!(c, a.native_mtu == mtu, "NativeMTU {} but the interface's MTU is {mtu}", a.native_mtu);
        let mac = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address")).unwrap_or_default();
        check!(c, a.mac.to_string() == mac.trim(), "address {} but the interface's is {}", a.mac, mac.trim());
    }
    check!(c, a.reliability_level_support == 0x7, "ReliabilityLevelSupport {:#x}", a.reliability_level_support);
    check!(c, a.rdma_read_support == 0x6, "RDMAReadSupport {:#x}", a.rdma_read_support);
    check!(c, a.max_transfer_size >= MTS, "MaxTransferSize {}", a.max_transfer_size);
    // The limits are enforced: one over MaxTransferSize is refused.
    let over = ViAttributes { max_transfer_size: a.max_transfer_size + 1, ..c.attrs(Reliability::ReliableDelivery, false, false) };
    let e = c.nic.create_vi(&over, None, None).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidMtu), "a VI over MaxTransferSize: {e:?}");
    let e = c.nic.create_cq(a.max_cq_entries + 1).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidParameter), "a CQ over MaxCQEntries: {e:?}, expected INVALID_PARAMETER");
    c.ok(c.nic.create_cq(a.max_cq_entries), "a CQ of exactly MaxCQEntries");
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    c.pass();
}

fn query_vi_initiator(c: &mut Ctx) {
    let attrs = c.attrs(Reliability::ReliableDelivery, true, false);
    let mut vi = c.vi(attrs);
    let (st, a, sq_empty, rq_empty) = vi.query();
    check!(c, st == ViPhase::Idle && a == attrs && sq_empty && rq_empty, "fresh VI: {st:?} {a:?} {sq_empty} {rq_empty}");
    let buf = c.region(4096, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..100, None, false)).unwrap();
    let (_, _, sq_empty, rq_empty) = vi.query();
    check!(c, sq_empty && !rq_empty, "after posting a receive: send empty {sq_empty}, receive empty {rq_empty}");
    c.connect(&mut vi);
    check!(c, vi.query().0 == ViPhase::Connected, "after connecting: {:?}", vi.query().0);
    c.ok(vi.disconnect(), "Disconnect");
    check!(c, vi.query().0 == ViPhase::Idle, "after disconnecting: {:?}", vi.query().0);
    c.ok(vi.recv_done(), "RecvDone");
    let (_, _, _, rq_empty) = vi.query();
    check!(c, rq_empty, "the flushed receive was collected but the queue is not empty");
    c.pass();
}

fn set_vi_initiator(c: &mut Ctx) {
    let attrs = c.attrs(Reliability::ReliableDelivery, false, false);
    let mut vi = c.vi(attrs);
    c.ok(vi.set_attributes(&ViAttributes { reliability: Reliability::ReliableReception, ..attrs }), "changing the level while Idle");
    c.ok(vi.set_attributes(&attrs), "and back");
    c.connect(&mut vi);
    let e = vi.set_attributes(&ViAttributes { reliability: Reliability::Unreliable, ..attrs }).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidState), "changing the level while connected: {e:?}");
    c.ok(vi.set_attributes(&ViAttributes { enable_rdma_write: true, ..attrs }), "enabling RDMA write while connected");
    check!(c, vi.attributes().enable_rdma_write, "the change did not take");
    let e = vi.set_attributes(&ViAttributes { max_transfer_size: u32::MAX, ..attrs }).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidMtu), "MaxTransferSize over the NIC's: {e:?}");
    let e = vi.set_attributes(&ViAttributes { ptag: via_user::Ptag(0xdead), ..attrs }).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidPtag), "an unknown ptag: {e:?}");
    c.pass();
}

fn set_mem_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, true, false));
    let mem = c.region(REGION, false, false);
    mem.write(0, &fill(7, REGION)).unwrap();
    let before = c.ok(mem.attributes(), "VipQueryMem");
    check!(c, !before.enable_rdma_write, "fresh region has RDMA write enabled");
    c.ok(mem.set_attributes(MemAttributes { ptag: c.ptag, enable_rdma_write: true, enable_rdma_read: false }), "VipSetMemAttributes");
    let after = c.ok(mem.attributes(), "VipQueryMem");
    check!(c, after.enable_rdma_write && after.ptag == c.ptag, "VipQueryMem after the change: {after:?}");
    c.accept(&vi);
    let offer = mem.remote(PAGE..PAGE + WINDOW).unwrap();
    c.offer(&mut vi, offer);
    c.heard();
    check!(c, mem.to_vec(PAGE..PAGE + 100).unwrap() == vec![0x77; 100], "the RDMA write did not land");
}

fn set_mem_initiator(c: &mut Ctx) {
    let (mut vi, rb) = attach(c, Reliability::ReliableDelivery, false);
    let src = c.region(100, false, false);
    src.write(0, &[0x77; 100]).unwrap();
    vi.post_send(c.desc(Op::RdmaWrite(rb), &src, 0..100, None, false)).unwrap();
    c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "RDMA write into the newly enabled region");
    c.pass();
}

fn cq_initiator(c: &mut Ctx) {
    // The overflow must reach the error callback (vipl maps this kind to
    // VIP_RESOURCE_CQ / VIP_ERROR_CATASTROPHIC with the CQ's handle).
    let (tx, errors) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    c.nic.set_error_callback(Some(Box::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    })));
    let cq = c.ok(c.nic.create_cq(2), "VipCreateCQ");
    let mut vi = c.ok(c.nic.create_vi(&c.attrs(Reliability::ReliableDelivery, false, false), Some(&cq), None), "VipCreateVi");
    c.connect(&mut vi);
    let buf = c.region(4096, false, false);
    for _ in 0..3 {
        vi.post_send(c.desc(Op::SendRecv, &buf, 0..10, None, false)).unwrap();
    }
    for _ in 0..3 {
        c.ok(c.ok(vi.send_wait(T), "SendWait").check_ok(), "send");
    }
    check!(c, c.nic.counters().cq_overflows == 1, "overflows counted: {}", c.nic.counters().cq_overflows);
    let want = via_user::AsyncError { vi: vi.id(), kind: via_user::AsyncErrorKind::CqOverflow { cq: cq.id(), entries: 2 } };
    let got = c.ok(errors.recv_timeout(T.unwrap()), "the error callback (no CQ overflow reported)");
    check!(c, got == want, "the error callback got {got:?}, expected {want:?}");
    let e = cq.resize(2).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::ErrorResource), "resizing to 2 with 3 queued: {e:?}, expected ERROR_RESOURCE");
    c.ok(cq.resize(8), "resizing to 8");
    for _ in 0..3 {
        let comp = c.ok(cq.wait(T), "CQWait");
        check!(c, comp.vi == vi.id() && !comp.recv_queue, "{comp:?}");
    }
    check!(c, cq.done().unwrap().is_none(), "a fourth completion");
    c.nic.progress(); // delivers anything still pending to the callback
    let more: Vec<_> = errors.try_iter().collect();
    check!(c, more.is_empty(), "the error callback got more than the one overflow: {more:?}");
    check!(c, c.nic.take_async_errors().is_empty(), "errors were kept for polling although a callback is set");
    c.pass();
}
