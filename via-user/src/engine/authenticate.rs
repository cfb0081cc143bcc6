//! The receive path's first check: is a frame what it says it is? Without
//! a cluster secret, its CRC-32C (when it carries one, and always when
//! neither the device nor the path the frame came by vouches for what it
//! delivers); with one, its MAC under
//! the key it must have ([`via_kernel_agent::auth`]). Either way a failed
//! check is a counted drop; a connection request that fails for want of
//! authentication (or for carrying one we cannot check) is answered by a
//! plain `ConnReject` saying so, so that the requester learns why.

use super::Core;
use via_device::Ahead;
use via_kernel_agent::conn::{CmFrame, RejectReason};
use via_wire::tag::{unit_tags4, Key, KEY_LEN, WIDE_FROM};
use via_wire::{flags, ConnRepr, Frame, Kind, ANY_ENDPOINT, ETH_HEADER_LEN, FRAME_HEADER_LEN, TAG_LEN, VIA_HEADER_LEN};

/// Tags checked ahead: when a frame's tag is checked together with the
/// three that follow it in the same delivery ([`Ahead`]), the verdicts on
/// those three, each kept with where its VIA header lies and the key
/// bytes it was checked under. A frame takes its verdict only when it is
/// the next one kept, at that address, under that key; anything else
/// clears them (and the engine clears them when a delivery ends).
#[derive(Default)]
pub(crate) struct CheckedAhead {
    next: [(usize, bool); 3],
    key: [u8; KEY_LEN],
    at: usize,
    n: usize,
}

impl CheckedAhead {
    pub(crate) fn clear(&mut self) {
        (self.at, self.n) = (0, 0);
    }

    /// The verdict kept for the frame whose VIA header is at `via`, under
    /// `key`, if it is the next one kept.
    fn take(&mut self, via: *const u8, key: &Key) -> Option<bool> {
        let (addr, ok) = *self.next.get(self.at).filter(|_| self.at < self.n)?;
        if addr != via as usize || self.key != *key.bytes() {
            self.clear();
            return None;
        }
        self.at += 1;
        Some(ok)
    }
}

/// Is the frame `f` (its payload in the frame) authentic under `key`? Its
/// verdict may have been reached with a frame before it; else, when the
/// three frames `ahead` are of its kind (the same VI and length, tagged:
/// a message's fragments), its tag is checked with theirs four at a time
/// (`via_wire::tag::lanes`) and their verdicts are kept.
/// (`checked_ahead`: counts the frames whose verdict was kept.)
fn authentic_in_fours<T: AsRef<[u8]>>(memo: &mut CheckedAhead, checked_ahead: &mut u64, f: &Frame<T>, key: &Key, ahead: Ahead<'_>) -> bool {
    let via = &f.as_bytes()[ETH_HEADER_LEN..];
    if let Some(ok) = memo.take(via.as_ptr(), key) {
        *checked_ahead += 1;
        return ok;
    }
    let len = f.payload_len() as usize;
    let stride = VIA_HEADER_LEN + len + TAG_LEN;
    if f.flags() & flags::AUTH == 0 || len >= WIDE_FROM || via.len() != stride || ahead.stride != stride || ahead.bytes.len() < 3 * stride {
        return f.authentic(key);
    }
    let units: [&[u8]; 4] = [via, &ahead.bytes[..stride], &ahead.bytes[stride..2 * stride], &ahead.bytes[2 * stride..3 * stride]];
    let alike = |u: &[u8]| {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[ETH_HEADER_LEN..].copy_from_slice(&u[..VIA_HEADER_LEN]);
        let g = Frame::of_headers(&h);
        g.kind() == f.kind() && g.flags() & flags::AUTH != 0 && g.dst_ep() == f.dst_ep() && g.dst_vi() == f.dst_vi() && g.payload_len() == f.payload_len()
    };
    if !units[1..].iter().all(|u| alike(u)) {
        return f.authentic(key);
    }
    let Some(tags) = unit_tags4(key, units) else { return f.authentic(key) };
    let ok = |j: usize| tags[j].iter().zip(&units[j][VIA_HEADER_LEN + len..]).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    memo.next = [(units[1].as_ptr() as usize, ok(1)), (units[2].as_ptr() as usize, ok(2)), (units[3].as_ptr() as usize, ok(3))];
    memo.key = *key.bytes();
    memo.at = 0;
    memo.n = 3;
    ok(0)
}

impl Core {
    /// May the frame `f` go on to be handled? `lent`: its payload was lent
    /// by a sender on this host (it never crossed a wire); `vouched`: it
    /// came by a path that cannot corrupt it (shared memory, a veth pair).
    /// `ahead`: the frames that follow it in this delivery, whose tags
    /// may be checked with its own.
    pub(super) fn frame_trusted<T: AsRef<[u8]>>(&mut self, f: &Frame<T>, lent: bool, vouched: bool, ahead: Ahead<'_>) -> bool {
        let tagged = f.flags() & flags::AUTH != 0;
        if self.auth.is_none() {
            if tagged {
                // Both ends have a secret or neither: we cannot check it.
                self.counters.rx_bad_auth += 1;
                self.refuse_unauthenticated(f);
                return false;
            }
            // A frame that carries a CRC is checked, vouched for or not.
            let sealed = f.flags() & flags::CHECKSUM != 0;
            if !lent && (sealed || (self.checksum && !vouched)) && !f.checksum_ok() {
                self.counters.rx_bad_checksum += 1;
                return false;
            }
            if !sealed {
                self.counters.rx_unsealed += 1; // lent, vouched for, or a device that needs none
            }
            return true;
        }
        let kind = f.kind().expect("checked by new_checked");
        if !kind.is_connection_management() && f.dst_ep() != self.ep {
            return true; // another endpoint's: dropped unread by the dispatch
        }
        // A keyed sender never lends (its tag would stay behind), so a lent
        // frame comes from a host member without the secret.
        if !lent && self.authentic(f, kind, ahead) {
            self.counters.rx_authenticated += 1;
            return true;
        }
        self.counters.rx_bad_auth += 1;
        if kind.is_connection_management() {
            let mac = f.src_mac();
            if let Some(k) = self.auth.as_mut() {
                k.saw_unauthenticated(mac);
            }
            self.refuse_unauthenticated(f);
        }
        false
    }

    /// Is the keyed frame `f` (of `kind`, its payload in the frame)
    /// authentic under the key it must have: the cluster's for connection
    /// management, else its VI's (not when the VI has none)?
    /// A VI's frames may be checked four at a time ([`authentic_in_fours`]).
    /// (Inlined: out of line, the receive path of an engine without a
    /// secret cost ~35 instructions a message more, by how the compiler
    /// then laid out `on_frame`: `scripts/engine-instructions.sh`.)
    #[inline(always)]
    fn authentic<T: AsRef<[u8]>>(&mut self, f: &Frame<T>, kind: Kind, ahead: Ahead<'_>) -> bool {
        let super::Context { auth, checked_ahead, counters, .. } = &mut self.cx;
        let Some(keys) = auth.as_ref() else { return false };
        if kind.is_connection_management() {
            return f.authentic(&keys.cm);
        }
        keys.vi(f.dst_vi()).is_some_and(|k| authentic_in_fours(checked_ahead, &mut counters.rx_checked_ahead, f, &k.rx, ahead))
    }

    /// Answers a connection request addressed to us that failed its
    /// authentication with a plain `ConnReject` (reason
    /// [`RejectReason::Authentication`]): an unkeyed requester takes it
    /// and says why; a keyed one refuses it as unauthenticated, notes
    /// that we answer so, and says why when its request times out.
    fn refuse_unauthenticated<T: AsRef<[u8]>>(&mut self, f: &Frame<T>) {
        let Some(Kind::ConnRequest | Kind::PeerRequest) = f.kind() else { return };
        if f.dst_mac() != self.mac || (f.dst_ep() != self.ep && f.dst_ep() != ANY_ENDPOINT) {
            return;
        }
        let Ok(theirs) = ConnRepr::parse(f.payload()) else { return };
        let conn = ConnRepr { request_id: theirs.request_id, ..ConnRepr::default() };
        self.cm.outgoing().push(CmFrame {
            dst_mac: f.src_mac(),
            dst_ep: f.src_ep(),
            kind: Kind::ConnReject,
            dst_vi: f.src_vi(),
            src_vi: 0,
            generation: 0,
            imm: RejectReason::Authentication as u32,
            ack: None,
            conn,
        });
    }
}
