//! The `stream` scenario: `--count` messages one way on a reliable VI,
//! `--window` sends in flight, lengths from `--sizes` (`random:MAX` for
//! random ones), each carrying its number as immediate data. The server
//! checks that every message arrives exactly once, in order, intact; it
//! grants the client credits (a 0-byte message whose immediate data is the
//! count of messages it has taken and reposted a receive for), so the
//! client never sends into a receive queue that is empty, as a runtime over
//! VIA does.
//!
//! The server prints `STREAMED <messages> <bytes>`, the client `SENT
//! <messages> <bytes> <seconds>` and `LINK lost .. retransmits ..
//! bad_checksum ..`.

use super::{fail, Args, OrFail, Side, T};
use std::time::{Duration, Instant};
use via_tests::pattern;
use via_user::Reliability;

/// Receives the server keeps posted.
const RECVS: usize = 256;
/// The server grants credits every this many messages.
const CREDIT_EVERY: usize = 32;
/// Receives the client keeps posted for credits (more than can be in
/// flight: RECVS / CREDIT_EVERY).
const CREDIT_RECVS: usize = 16;

pub fn stream(a: &Args) {
    if a.level == Reliability::Unreliable {
        fail("the stream scenario needs a reliable level (--level rel)");
    }
    if a.role == "server" {
        server(a)
    } else {
        client(a)
    }
}

fn server(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let max = a.max_size();
    let buf = s.region(RECVS * max);
    let credit = s.region(64);
    let mut vi = s.vi(None);
    let at = s.post_slots(&mut vi, &buf, 0, RECVS, max);
    s.ready();
    s.accept(&vi, b"stream");
    let (mut next, mut bytes, mut credits_out) = (0usize, 0u64, 0usize);
    while next < a.count {
        let d = vi.recv_wait(T).or_fail(&format!("message {next} of {}", a.count));
        d.check_ok().or_fail(&format!("message {next}"));
        let seq = d.immediate().unwrap_or_else(|| fail("a message without its number")) as usize;
        if seq != next {
            fail(&format!("message {seq} arrived where {next} was expected (lost, duplicated or out of order)"));
        }
        let (len, want) = (d.length() as usize, a.size_of(seq));
        let off = at[&d.addr()];
        if len != want || buf.to_vec(off..off + len).or_fail("read") != pattern(seq as u32, len) {
            fail(&format!("message {seq}: {len} bytes (sent {want}) differ from what was sent"));
        }
        next += 1;
        bytes += len as u64;
        vi.post_recv(d).or_fail("repost");
        if next % CREDIT_EVERY == 0 || next == a.count {
            while let Some(c) = vi.send_done().or_fail("credit completion") {
                c.check_ok().or_fail("credit send");
                credits_out -= 1;
            }
            vi.post_send(s.desc(&credit, 0, 0, Some(next as u32))).or_fail("post credit");
            credits_out += 1;
        }
    }
    for _ in 0..credits_out {
        vi.send_wait(T).or_fail("credit completion").check_ok().or_fail("credit send");
    }
    println!("STREAMED {next} {bytes}");
    // Every credit has been acknowledged: nothing is owed to the client,
    // which stays until we hang up.
}

fn client(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let (max, window) = (a.max_size(), a.window);
    let sbuf = s.region(window * max);
    let cbuf = s.region(CREDIT_RECVS * 64);
    let cq = s.nic.create_cq(window + CREDIT_RECVS + 8).or_fail("create CQ");
    let mut vi = s.nic.create_vi(&s.attrs(), Some(&cq), Some(&cq)).or_fail("create VI");
    for i in 0..CREDIT_RECVS {
        vi.post_recv(s.desc(&cbuf, i * 64, 64, None)).or_fail("post credit recv");
    }
    s.connect(&mut vi, &a.peer, b"stream");
    let t0 = Instant::now();
    // Messages the server may be sent: those below `taken + RECVS`.
    let (mut sent, mut done, mut taken, mut bytes) = (0usize, 0usize, 0usize, 0u64);
    while done < a.count {
        if sent < a.count && sent - done < window && sent < taken + RECVS {
            let len = a.size_of(sent);
            let off = (sent % window) * max;
            sbuf.write(off, &pattern(sent as u32, len)).or_fail("fill");
            vi.post_send(s.desc(&sbuf, off, len, Some(sent as u32))).or_fail("post send");
            sent += 1;
            bytes += len as u64;
            continue;
        }
        let c = cq.wait(T).or_fail(&format!("a completion ({done} of {} sent messages done, {taken} taken)", a.count));
        if c.recv_queue {
            let d = vi.recv_done().or_fail("credit").unwrap_or_else(|| fail("the CQ named a receive that is not done"));
            d.check_ok().or_fail("credit");
            taken = taken.max(d.immediate().unwrap_or_else(|| fail("a credit without its count")) as usize);
            vi.post_recv(d).or_fail("repost credit recv");
        } else {
            let d = vi.send_done().or_fail("send").unwrap_or_else(|| fail("the CQ named a send that is not done"));
            d.check_ok().or_fail(&format!("send {done}"));
            done += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!("SENT {sent} {bytes} {secs:.3}");
    let c = s.nic.counters();
    let lost = s.nic.device_counters().iter().find(|(k, _)| *k == "faults_lost").map_or(0, |(_, v)| *v);
    println!("LINK lost {lost} retransmits {} bad_checksum {}", c.retransmits, c.rx_bad_checksum);
    // Wait for the last credit, so that the server's final send completes
    // before we hang up.
    while taken < a.count {
        let d = match cq.wait(Some(Duration::from_secs(5))) {
            Ok(c) if c.recv_queue => vi.recv_done().or_fail("credit").unwrap_or_else(|| fail("no credit")),
            Ok(_) => continue,
            Err(e) => fail(&format!("the last credit ({taken} of {} taken): {e}", a.count)),
        };
        taken = taken.max(d.immediate().unwrap_or(0) as usize);
        vi.post_recv(d).or_fail("repost credit recv");
    }
    // Stay until the server hangs up: on a lossy link our ACK of its last
    // credit may be lost, and its send completes only when a
    // retransmission draws another from us. (Its Disconnect ends the wait;
    // if that is lost too, the wait's time limit does.)
    let _ = cq.wait(Some(Duration::from_secs(5)));
}
