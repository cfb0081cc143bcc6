//! Frame authentication against a live, keyed connection (issue 22), on
//! the rig of `via_tests::rig` (two engines and a raw injector on one
//! loopback wire, one thread, a clock moved by hand), both engines opened
//! with the same cluster secret (`VIA_SECRET`), so the connection was
//! made with nonces and per-connection keys. A copy of a delivered frame,
//! tagged with the connection's own key (what a replay is; the loopback
//! wire has no sniffer, so the copy is rebuilt), is a duplicate: it passes
//! its tag and delivers nothing. The next frame in sequence without a tag,
//! with another key's tag, or with a good tag and a flipped payload bit,
//! and a Disconnect without a tag, are counted (`rx_bad_auth`) and have
//! no effect; genuine traffic goes on intact.

use std::path::PathBuf;
use std::sync::OnceLock;
use via_wire::tag::Key;
use via_wire::{self as wire, Frame, HeaderRepr, Kind, FRAME_HEADER_LEN};
use via_tests::rig::{frame_bytes, Rig};
use via_user::descriptor::status;
use via_user::engine::post::Queue;
use via_user::{Reliability, ViPhase};

const LEVELS: [Reliability; 3] = [Reliability::Unreliable, Reliability::ReliableDelivery, Reliability::ReliableReception];
/// One fragment: one frame per message, as long as a full frame of an MTU
/// 1500 link's is nearly (tagged with AEGISMAC-128L, as the connection
/// requests and ACKs around it are: `via_wire::tag::WIDE_FROM`).
const MSG: usize = 1200;
/// Where receive and send slot k lies in the window: `SLOT * k`.
const SLOT: usize = 2000;
const _: () = assert!(MSG < via_wire::tag::WIDE_FROM && MSG <= SLOT);

/// Every engine of this test binary opens with this secret.
fn keyed() {
    static SECRET: OnceLock<PathBuf> = OnceLock::new();
    let p = SECRET.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("via-auth-frames-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let p = dir.join("secret");
        via_kernel_agent::auth::create_secret_file(&p).unwrap();
        p
    });
    // SAFETY (edition 2021: safe): every test of this binary sets the same value.
    std::env::set_var("VIA_SECRET", p);
}

fn message(seed: u8) -> Vec<u8> {
    (0..MSG).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Sends message `k` from the peer.
fn send(rig: &mut Rig, k: usize) {
    rig.b.post_send(k % 4, (k % 4) * SLOT, &message(k as u8), None);
    rig.b.engine.ring_doorbell();
}

/// The frame with header `h` and `payload`, tagged under `key`.
fn tagged(h: &HeaderRepr, payload: &[u8], key: &Key) -> Vec<u8> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    h.emit(&mut head);
    let tag = wire::seal_authenticated(&mut head, key, [payload]);
    let mut f = head.to_vec();
    f.extend_from_slice(payload);
    f.extend_from_slice(&tag);
    assert!(Frame::new_checked(&f[..]).unwrap().authentic(key));
    f
}

/// Steps until the victim completes a receive; checks it is message `k`.
fn expect_message(rig: &mut Rig, k: usize) {
    let mut got = None;
    assert!(rig.step_until(5000, |r| {
        got = r.a.done(Queue::Recv);
        got.is_some()
    }), "message {k} did not arrive");
    let slot = got.unwrap();
    let (st, len, _) = rig.a.completion(slot);
    assert_eq!(st & status::ERROR_MASK, 0, "message {k}: status {st:#x}");
    assert_eq!(len as usize, MSG);
    let at = (slot % 4) * SLOT;
    assert_eq!(rig.a.buf(at..at + MSG), message(k as u8), "message {k} arrived corrupted");
}

/// Runs the clock a while; asserts the victim completed nothing.
fn expect_nothing(rig: &mut Rig, what: &str) {
    for _ in 0..200 {
        rig.step();
        assert_eq!(rig.a.done(Queue::Recv), None, "{what} completed a receive");
    }
    assert_eq!(rig.a.engine.core.vi(rig.a.vi).unwrap().phase, ViPhase::Connected, "{what} changed the victim's state");
}

#[test]
fn replayed_forged_and_untagged_frames_have_no_effect_on_a_keyed_connection() {
    keyed();
    for level in LEVELS {
        let mut rig = Rig::new(level);
        for core in [&rig.a.engine.core, &rig.b.engine.core] {
            let k = core.auth.as_ref().expect("the engine has the secret");
            assert!(k.vi(1).is_some(), "{level:?}: no connection keys");
        }
        for s in 0..3 {
            rig.a.post_recv(s, &[s * SLOT..s * SLOT + MSG]);
        }
        let key = rig.b.engine.core.auth.as_ref().unwrap().vi(rig.b.vi).unwrap().tx.clone();
        assert_eq!(Some(&key), rig.a.engine.core.auth.as_ref().unwrap().vi(rig.a.vi).map(|k| &k.rx), "{level:?}: what one sends the other checks");
        let first = rig.genuine(MSG);
        send(&mut rig, 0);
        expect_message(&mut rig, 0);
        let c = rig.a.engine.core.counters;
        assert!(c.rx_authenticated > 0 && c.rx_bad_auth == 0, "{level:?}: {c:?}");

        // Message 0's frame again, with a good tag: a duplicate.
        assert!(rig.inject(&tagged(&first, &message(0), &key)));
        expect_nothing(&mut rig, "a replayed frame");
        assert_eq!(rig.a.engine.core.counters.rx_bad_auth, 0, "{level:?}: the replay passed its tag; the sequence refused it");

        let next = rig.genuine(MSG);
        // Next in sequence, untagged (as from a host without the secret).
        assert!(rig.inject(&frame_bytes(&next, &message(9))));
        // Next in sequence, tagged under another key (the cluster's).
        let cm = rig.a.engine.core.auth.as_ref().unwrap().cm.clone();
        assert!(rig.inject(&tagged(&next, &message(9), &cm)));
        // Next in sequence, tagged right, one payload bit flipped on the way.
        let mut flipped = tagged(&next, &message(9), &key);
        flipped[FRAME_HEADER_LEN + 7] ^= 0x10;
        assert!(rig.inject(&flipped));
        // A Disconnect from the peer's identity, untagged.
        let disc = HeaderRepr { kind: Kind::Disconnect as u8, flags: 0, payload_len: 0, msg_len: 0, ..next };
        assert!(rig.inject(&frame_bytes(&disc, &[])));
        expect_nothing(&mut rig, "a forged frame");
        assert_eq!(rig.a.engine.core.counters.rx_bad_auth, 4, "{level:?}: each forgery counted");

        // Genuine traffic goes on.
        send(&mut rig, 1);
        expect_message(&mut rig, 1);
        assert_eq!(rig.a.engine.core.counters.rx_bad_auth, 4, "{level:?}");
    }
}
