//! The `deadpeer` scenario: a peer killed mid-transfer, then restarted.
//!
//! The server takes messages and reposts its receives (the test runs
//! both in receiver-not-ready mode: the client sends without credits, and
//! a server slow to repost refuses rather than breaks); a message whose
//! immediate data has [`ECHO`] set is echoed back. The client streams 64
//! KiB messages, eight in flight, and prints `STREAMING` once some have
//! completed; the test then kills the server (SIGKILL: nothing is said on
//! the wire). The client must see, within the configured connection
//! timeout of its last completed send, the send at the head complete with
//! TRANSPORT_ERROR and every other outstanding descriptor (sends and
//! posted receives) with DESC_FLUSHED, the VI in the Error state and
//! CONN_LOST reported; it prints `LOST <ms> <timeout ms>`. The test starts
//! a new server and tells the client `RESTARTED <mac>`: the client creates
//! a new VI, connects to it and checks echoed messages, printing
//! `RECONNECTED <messages>`.

use super::{check_payload, fail, Args, OrFail, Side, T};
use std::time::{Duration, Instant};
use via_tests::pattern;
use via_user::descriptor::status;
use via_user::{AsyncErrorKind, Config, MacAddr, ViPhase};

/// Immediate-data bit asking the server to echo the message.
const ECHO: u32 = 1 << 31;
const LEN: usize = 65536;
const IN_FLIGHT: usize = 8;
const RECVS: usize = 16;
const ECHOES: u32 = 100;

pub fn deadpeer(a: &Args) {
    if a.role == "server" {
        server(a)
    } else {
        client(a)
    }
}

fn server(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let rbuf = s.region(RECVS * LEN);
    let sbuf = s.region(LEN);
    let mut vi = s.vi(None);
    let at = s.post_slots(&mut vi, &rbuf, 0, RECVS, LEN);
    s.ready();
    s.accept(&vi, b"deadpeer");
    println!("CONNECTED");
    loop {
        let Ok(d) = vi.recv_wait(T) else { return };
        if vi.state() != ViPhase::Connected {
            return; // the client hung up
        }
        d.check_ok().or_fail("receive");
        let imm = d.immediate().unwrap_or_else(|| fail("a message without its number"));
        let (off, len) = (at[&d.addr()], d.length() as usize);
        if rbuf.to_vec(off..off + len).or_fail("read") != pattern(imm & !ECHO, len) {
            fail(&format!("message {imm:#x} differs from what was sent"));
        }
        vi.post_recv(d).or_fail("repost");
        if imm & ECHO != 0 {
            sbuf.write(0, &pattern(imm & !ECHO, len)).or_fail("fill");
            vi.post_send(s.desc(&sbuf, 0, len, Some(imm))).or_fail("post echo");
            vi.send_wait(T).or_fail("echo").check_ok().or_fail("echo status");
        }
    }
}

fn client(a: &Args) {
    let s = Side::new(&a.dev, a.level);
    let sbuf = s.region(IN_FLIGHT * LEN);
    let rbuf = s.region(LEN);
    let mut vi = s.vi(None);
    for _ in 0..2 {
        vi.post_recv(s.desc(&rbuf, 0, LEN, None)).or_fail("post recv");
    }
    s.connect(&mut vi, &a.peer, b"deadpeer");
    println!("CONNECTED");

    // Stream until the connection breaks (the server is killed).
    let timeout = Config::from_env().connection_timeout();
    let (mut sent, mut done) = (0u32, 0u32);
    let mut last_ok = Instant::now();
    let failed_at = loop {
        while (sent - done) < IN_FLIGHT as u32 {
            let off = (sent as usize % IN_FLIGHT) * LEN;
            sbuf.write(off, &pattern(sent, LEN)).or_fail("fill");
            vi.post_send(s.desc(&sbuf, off, LEN, Some(sent))).or_fail("post send");
            sent += 1;
        }
        let d = vi.send_wait(Some(timeout * 4 + Duration::from_secs(10))).or_fail("a send should complete (in error once the peer is gone), not hang");
        if d.errors() != 0 {
            if d.errors() != status::TRANSPORT_ERROR {
                fail(&format!("send {done}: the head send should fail with TRANSPORT_ERROR, got status {:#x}; asynchronous errors {:?}; {}", d.status(), s.nic.take_async_errors(), vi.transport_state()));
            }
            break Instant::now();
        }
        done += 1;
        last_ok = Instant::now();
        if done == 50 {
            println!("STREAMING");
        }
    };
    // Everything else outstanding completes as flushed, at once.
    for i in done + 1..sent {
        let d = vi.send_wait(Some(Duration::from_secs(1))).or_fail(&format!("send {i} should be flushed"));
        if d.errors() != status::DESC_FLUSHED_ERROR {
            fail(&format!("send {i}: expected DESC_FLUSHED, got status {:#x}", d.status()));
        }
    }
    for i in 0..2 {
        let d = vi.recv_wait(Some(Duration::from_secs(1))).or_fail(&format!("posted receive {i} should be flushed"));
        if d.errors() & status::DESC_FLUSHED_ERROR == 0 {
            fail(&format!("posted receive {i}: status {:#x}, not flushed", d.status()));
        }
    }
    if vi.posted() != (0, 0) {
        fail(&format!("descriptors still posted after the flush: {:?}", vi.posted()));
    }
    if vi.state() != ViPhase::Error {
        fail(&format!("VI state {:?}, expected Error", vi.state()));
    }
    if !s.nic.take_async_errors().iter().any(|e| e.kind == AsyncErrorKind::ConnLost && e.vi == vi.id()) {
        fail("no CONN_LOST reported");
    }
    let lost_after = failed_at - last_ok;
    // The configured timeout, and a second for a loaded machine's
    // scheduling: the check is that it is the timeout, not forever.
    if lost_after > timeout + Duration::from_secs(1) {
        fail(&format!("CONN_LOST came {lost_after:?} after the last completion; the configured timeout is {timeout:?}"));
    }
    println!("LOST {} {}", lost_after.as_millis(), timeout.as_millis());

    // The peer comes back (a new process): a new VI connects to it.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).or_fail("stdin");
    let mac: MacAddr = line.trim().strip_prefix("RESTARTED ").unwrap_or_else(|| fail(&format!("expected RESTARTED <mac>, got {line:?}"))).parse().or_fail("MAC");
    drop(vi);
    let mut vi = s.vi(None);
    vi.post_recv(s.desc(&rbuf, 0, LEN, None)).or_fail("post recv");
    vi.connect_retrying(mac, b"deadpeer", Duration::from_secs(20)).or_fail("reconnect to the restarted peer");
    for k in 0..ECHOES {
        let len = via_tests::random_size(k, LEN);
        sbuf.write(0, &pattern(k, len)).or_fail("fill");
        vi.post_send(s.desc(&sbuf, 0, len, Some(k | ECHO))).or_fail("post send");
        vi.send_wait(T).or_fail("send").check_ok().or_fail("send status");
        let d = vi.recv_wait(T).or_fail(&format!("echo {k}"));
        check_payload(&rbuf, &d, k, len);
        vi.post_recv(d).or_fail("repost");
    }
    println!("RECONNECTED {ECHOES}");
}
