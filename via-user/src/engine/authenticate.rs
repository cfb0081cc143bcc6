//! The receive path's first check: is a frame what it says it is? Without
//! a cluster secret, its CRC-32C (when it carries one, and always when
//! neither the device nor the path the frame came by vouches for what it
//! delivers); with one, its MAC under
//! the key it must have ([`via_kernel_agent::auth`]). Either way a failed
//! check is a counted drop; a connection request that fails for want of
//! authentication (or for carrying one we cannot check) is answered by a
//! plain `ConnReject` saying so, so that the requester learns why.

use super::Core;
use via_kernel_agent::conn::{CmFrame, RejectReason};
use via_wire::{flags, ConnRepr, Frame, Kind, ANY_ENDPOINT};

impl Core {
    /// May the frame `f` go on to be handled? `lent`: its payload was lent
    /// by a sender on this host (it never crossed a wire); `vouched`: it
    /// came by a path that cannot corrupt it (shared memory, a veth pair).
    pub(super) fn frame_trusted<T: AsRef<[u8]>>(&mut self, f: &Frame<T>, lent: bool, vouched: bool) -> bool {
        let tagged = f.flags() & flags::AUTH != 0;
        let Some(keys) = self.auth.as_ref() else {
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
        };
        let kind = f.kind().expect("checked by new_checked");
        let key = if kind.is_connection_management() {
            Some(&keys.cm)
        } else if f.dst_ep() != self.ep {
            return true; // another endpoint's: dropped unread by the dispatch
        } else {
            keys.vi(f.dst_vi()).map(|k| &k.rx)
        };
        // A keyed sender never lends (its tag would stay behind), so a lent
        // frame comes from a host member without the secret.
        if !lent && key.is_some_and(|k| f.authentic(k)) {
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
