//! Area "connections": attribute checks at connect time and what
//! ConnectWait tells the server.

use super::{Ctx, Rule, DISC, MTS, T};
use crate::check;
use std::time::Duration;
use via_user::{Reliability, ViAttributes, VipReturn};

macro_rules! rule {
    ($name:ident, $text:expr, $t:expr, $i:expr) => {
        Rule { name: stringify!($name), area: "connections", text: $text, target: $t, initiator: $i, target_passive: false }
    };
}

pub fn rules() -> Vec<Rule> {
    vec![
        rule!(mismatched_reliability_level_gives_invalid_reliability_level,
            "A client and server VI of different reliability levels do not connect: both ConnectAccept and ConnectRequest return INVALID_RELIABILITY_LEVEL.",
            |c| mismatch_target(c, VipReturn::InvalidReliabilityLevel), |c| mismatch_initiator(c, ViAttributes { reliability: Reliability::Unreliable, ..base(c) }, VipReturn::InvalidReliabilityLevel)),
        rule!(mismatched_max_transfer_size_gives_invalid_mtu,
            "VIs of different MaxTransferSize do not connect: INVALID_MTU on both sides.",
            |c| mismatch_target(c, VipReturn::InvalidMtu), |c| mismatch_initiator(c, ViAttributes { max_transfer_size: MTS / 2, ..base(c) }, VipReturn::InvalidMtu)),
        rule!(mismatched_rdma_read_enable_gives_invalid_rdmaread,
            "VIs that differ in EnableRdmaRead do not connect: INVALID_RDMAREAD on both sides.",
            |c| mismatch_target(c, VipReturn::InvalidRdmaRead), |c| mismatch_initiator(c, ViAttributes { enable_rdma_read: true, ..base(c) }, VipReturn::InvalidRdmaRead)),
        rule!(connect_wait_reports_the_clients_address_and_attributes,
            "ConnectWait hands the server the client's NIC address and VI attributes (reliability level, MaxTransferSize, RDMA enables) before it accepts.",
            wait_target, wait_initiator),
    ]
}

fn base(c: &Ctx) -> ViAttributes {
    c.attrs(Reliability::ReliableDelivery, false, false)
}

fn mismatch_target(c: &mut Ctx, want: VipReturn) {
    let vi = c.vi(base(c));
    let req = c.ok(c.nic.connect_wait(DISC, T), "ConnectWait");
    let e = c.nic.accept(&req, &vi).err().map(|e| e.code);
    check!(c, e == Some(want), "ConnectAccept gave {e:?}, expected {want:?}");
    check!(c, vi.state() == via_user::ViPhase::Idle, "the server VI is {:?}", vi.state());
    c.heard();
}

fn mismatch_initiator(c: &mut Ctx, attrs: ViAttributes, want: VipReturn) {
    let mut vi = c.vi(attrs);
    let e = vi.connect_retrying(c.peer.unwrap(), DISC, Duration::from_secs(20)).err().map(|e| e.code);
    check!(c, e == Some(want), "ConnectRequest gave {e:?}, expected {want:?}");
    check!(c, vi.state() == via_user::ViPhase::Idle, "the client VI is {:?}", vi.state());
    c.pass();
}

fn wait_target(c: &mut Ctx) {
    let vi = c.vi(c.attrs(Reliability::ReliableReception, true, true));
    let req = c.ok(c.nic.connect_wait(DISC, T), "ConnectWait");
    c.tell(&req.remote_mac.to_string());
    check!(c, req.reliability == Some(Reliability::ReliableReception), "reliability {:?}", req.reliability);
    check!(c, req.max_transfer_size == MTS, "MaxTransferSize {}", req.max_transfer_size);
    check!(c, req.enable_rdma_write && req.enable_rdma_read, "RDMA enables {} {}", req.enable_rdma_write, req.enable_rdma_read);
    c.ok(c.nic.accept(&req, &vi), "ConnectAccept");
    c.heard();
}

fn wait_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableReception, true, true));
    c.connect(&mut vi);
    let seen = c.heard();
    check!(c, seen == c.nic.mac().to_string(), "the server saw address {seen}, ours is {}", c.nic.mac());
    c.pass();
}
