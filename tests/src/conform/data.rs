//! Area "data transfer": sends and receives, immediate data, Reliable
//! Reception's completion rule, notifications.

use super::{fill, Ctx, Rule, T};
use crate::check;
use std::sync::mpsc;
use std::time::Duration;
use via_user::descriptor::status;
use via_user::{Op, Reliability};

pub fn rules() -> Vec<Rule> {
    vec![
        Rule {
            name: "send_immediate_data_arrives_with_status_immediate",
            area: "data transfer",
            text: "A send with CONTROL_IMMEDIATE delivers its 32 bits in the receive descriptor's ImmediateData, with STATUS_IMMEDIATE and OP_RECEIVE; a send without it leaves STATUS_IMMEDIATE clear.",
            target: immediate_target,
            initiator: immediate_initiator,
            target_passive: false,
        },
        Rule {
            name: "reliable_reception_send_completes_only_after_placement",
            area: "data transfer",
            text: "On a Reliable Reception VI a send completes only once the peer has placed the data: while the peer does not run (no progress thread, no calls) the send stays posted; once it runs, the send completes and the receive holds the data.",
            target: rr_target,
            initiator: rr_initiator,
            target_passive: true,
        },
        Rule {
            name: "notify_callbacks_hand_over_completed_descriptors",
            area: "data transfer",
            text: "VipRecvNotify, VipSendNotify and VipCQNotify each fire once for the next completion, taking it off its queue (RecvDone/SendDone/CQDone then see the following one).",
            target: notify_target,
            initiator: notify_initiator,
            target_passive: false,
        },
    ]
}

fn immediate_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(4096, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..100, None, false)).unwrap();
    vi.post_recv(c.desc(Op::SendRecv, &buf, 100..200, None, false)).unwrap();
    c.accept(&vi);
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "receive with immediate");
    check!(c, d.status() & status::IMMEDIATE != 0, "STATUS_IMMEDIATE missing: {:#x}", d.status());
    check!(c, d.status() & status::OP_MASK == status::OP_RECEIVE, "op {:#x}", d.status());
    check!(c, d.immediate() == Some(0xDEAD_BEEF), "immediate {:?}", d.immediate());
    check!(c, buf.to_vec(0..10).unwrap() == fill(3, 10), "payload differs");
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    check!(c, d.status() & status::IMMEDIATE == 0 && d.immediate().is_none(), "STATUS_IMMEDIATE set without immediate data: {:#x}", d.status());
    c.pass();
    c.heard();
}

fn immediate_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    c.connect(&mut vi);
    let buf = c.region(4096, false, false);
    buf.write(0, &fill(3, 10)).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..10, Some(0xDEAD_BEEF), false)).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..10, None, false)).unwrap();
    for _ in 0..2 {
        let d = c.ok(vi.send_wait(T), "SendWait");
        c.ok(d.check_ok(), "send");
        check!(c, d.status() & status::OP_MASK == status::OP_SEND, "send op {:#x}", d.status());
    }
    c.pass();
}

fn rr_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableReception, false, false));
    let buf = c.region(65536, false, false);
    vi.post_recv(c.desc(Op::SendRecv, &buf, 0..65536, None, false)).unwrap();
    c.accept(&vi);
    // Hold still: no progress thread, no calls, until the initiator saw
    // that its send did not complete.
    check!(c, c.heard() == "go", "expected go");
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    c.ok(d.check_ok(), "receive");
    check!(c, buf.to_vec(0..40000).unwrap() == fill(5, 40000), "payload differs");
    // Our reply carries the acknowledgement and keeps us running until
    // the initiator has it.
    c.send_control(&mut vi, b"placed");
    c.heard();
}

fn rr_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableReception, false, false));
    c.post_control_recv(&mut vi);
    c.connect(&mut vi);
    let buf = c.region(65536, false, false);
    buf.write(0, &fill(5, 40000)).unwrap();
    vi.post_send(c.desc(Op::SendRecv, &buf, 0..40000, None, false)).unwrap();
    let e = vi.send_wait(Some(Duration::from_millis(300)));
    check!(c, e.as_ref().is_err_and(|e| e.code == via_user::VipReturn::Timeout), "the send completed while the peer had not placed the data: {:?}", e.map(|d| d.status()));
    c.tell("go");
    let d = c.ok(vi.send_wait(T), "SendWait after the peer ran");
    c.ok(d.check_ok(), "send");
    check!(c, d.length() == 40000, "length {}", d.length());
    check!(c, c.recv_control(&mut vi) == b"placed", "reply");
    c.pass();
}

fn notify_target(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableDelivery, false, false));
    let buf = c.region(4096, false, false);
    for i in 0..3 {
        vi.post_recv(c.desc(Op::SendRecv, &buf, i * 100..i * 100 + 100, None, false)).unwrap();
    }
    c.accept(&vi);
    let (tx, rx) = mpsc::channel();
    c.ok(vi.recv_notify(move |d| tx.send((d.status(), d.length(), d.immediate())).unwrap()), "VipRecvNotify");
    // The progress thread delivers it: this thread only waits on the channel.
    let (st, len, imm) = c.ok(rx.recv_timeout(T.unwrap()), "recv notification");
    check!(c, st & status::DONE != 0 && st & status::ERROR_MASK == 0, "status {st:#x}");
    check!(c, len == 1 && imm == Some(1), "the notification got message ({len}, {imm:?}), expected the first");
    let d = c.ok(vi.recv_wait(T), "RecvWait");
    check!(c, d.immediate() == Some(2), "RecvWait after the notification got {:?}, expected the second", d.immediate());
    c.pass();
    c.heard();
}

fn notify_initiator(c: &mut Ctx) {
    let cq = c.ok(c.nic.create_cq(8), "VipCreateCQ");
    let mut vi = c.ok(c.nic.create_vi(&c.attrs(Reliability::ReliableDelivery, false, false), Some(&cq), None), "VipCreateVi");
    c.connect(&mut vi);
    let buf = c.region(4096, false, false);
    let (tx, rx) = mpsc::channel();
    c.ok(vi.send_notify(move |d| tx.send(d.immediate_data_sent()).unwrap()), "VipSendNotify");
    let (ctx, crx) = mpsc::channel();
    cq.notify(move |comp| ctx.send(comp).unwrap());
    for i in 1..=3 {
        vi.post_send(c.desc(Op::SendRecv, &buf, 0..1, Some(i), false)).unwrap();
    }
    let first = c.ok(rx.recv_timeout(T.unwrap()), "send notification");
    check!(c, first == 1, "send notification got send {first}, expected 1");
    let comp = c.ok(crx.recv_timeout(T.unwrap()), "CQ notification");
    check!(c, comp.vi == vi.id() && !comp.recv_queue, "CQ notification {comp:?}");
    for want in 2..=3 {
        let d = c.ok(vi.send_wait(T), "SendWait");
        check!(c, d.immediate_data_sent() == want, "SendWait got send {}, expected {want}", d.immediate_data_sent());
    }
    // The CQ notification consumed one entry; two remain.
    for _ in 0..2 {
        c.ok(cq.wait(T), "CQWait");
    }
    check!(c, cq.done().unwrap().is_none(), "a third CQ entry: the notification did not consume one");
    c.pass();
}
