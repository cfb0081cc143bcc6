//! The receive side: parsing and dispatching frames, acknowledgement
//! processing for the sender, and reassembly of messages into posted
//! receive descriptors. Nothing that comes off the wire is trusted: every
//! check failure is a counted drop.

use super::post::Queue;
use super::{vi_at, AsyncError, AsyncErrorKind, Core};
use crate::descriptor::status;
use crate::usermem;
use crate::vi::{RxMessage, ViPhase};
use std::time::Instant;
use via_kernel_agent::conn::CmHeader;
use via_kernel_agent::wire::{flags, seq_le, seq_lt, ConnRepr, Frame, Kind, ANY_ENDPOINT};

impl Core {
    /// Handles one received Ethernet frame.
    pub fn on_frame(&mut self, bytes: &[u8], now: Instant) {
        self.counters.rx_frames += 1;
        let Ok(f) = Frame::new_checked(bytes) else {
            self.counters.rx_malformed += 1;
            return;
        };
        let dst = f.dst_mac();
        if (dst != self.mac && !dst.is_broadcast()) || (f.dst_ep() != self.ep && f.dst_ep() != ANY_ENDPOINT) {
            self.counters.rx_not_for_us += 1;
            return;
        }
        let kind = f.kind().expect("checked by new_checked");
        if kind == Kind::Disconnect {
            self.on_disconnect(&f, now);
            return;
        }
        if kind.is_connection_management() {
            match ConnRepr::parse(f.payload()) {
                Ok(c) => {
                    let h = CmHeader { kind, src_mac: f.src_mac(), src_ep: f.src_ep(), src_vi: f.src_vi(), dst_vi: f.dst_vi(), generation: f.generation(), imm: f.imm() };
                    self.cm.on_frame(h, c, now)
                }
                Err(_) => self.counters.rx_malformed += 1,
            }
            return;
        }
        if f.dst_ep() != self.ep {
            self.counters.rx_not_for_us += 1;
            return;
        }
        let id = f.dst_vi();
        let Ok(vi) = self.vi(id) else {
            self.counters.rx_no_vi += 1;
            return;
        };
        let matches_peer = vi.phase == ViPhase::Connected
            && vi.peer.as_ref().is_some_and(|p| p.mac == f.src_mac() && p.ep == f.src_ep() && p.vi == f.src_vi() && p.generation == f.generation());
        if !matches_peer {
            self.counters.rx_stale += 1;
            return;
        }
        if f.flags() & flags::ACK != 0 {
            let nak = kind == Kind::Ack && f.flags() & flags::ACK_REQ != 0;
            self.on_ack(id, f.ack(), nak, now);
        }
        match kind {
            Kind::Data => self.on_data(id, &f, now),
            Kind::Ack => {}
            _ => self.counters.rx_malformed += 1, // RDMA kinds: not supported yet
        }
    }

    /// The peer disconnected: what it acknowledged completes, then the
    /// connection is lost.
    fn on_disconnect<T: AsRef<[u8]>>(&mut self, f: &Frame<T>, now: Instant) {
        let id = f.dst_vi();
        let Ok(vi) = self.vi(id) else { return };
        let ours = vi.phase == ViPhase::Connected && vi.peer.as_ref().is_some_and(|p| p.mac == f.src_mac() && p.ep == f.src_ep() && p.generation == f.generation());
        if ours {
            if f.flags() & flags::ACK != 0 && vi.reliable() {
                self.on_ack(id, f.ack(), false, now);
            }
            self.connection_lost(id);
        }
    }

    /// Puts VI `id` into the Error state: its connection is gone.
    pub fn connection_lost(&mut self, id: u16) {
        let Ok(vi) = self.vi_mut(id) else { return };
        if vi.phase == ViPhase::Error {
            return;
        }
        vi.phase = ViPhase::Error;
        self.counters.connections_lost += 1;
        self.async_errors.push(AsyncError { vi: id, kind: AsyncErrorKind::ConnLost });
        self.flush_vi(id);
    }

    /// The sender learns that the peer expects `ack` next; with `nak`, that
    /// the peer saw a gap and wants everything from `ack` again.
    fn on_ack(&mut self, id: u16, ack: u32, nak: bool, now: Instant) {
        let Some(vi) = vi_at(&mut self.vis, id) else { return };
        // Older than what we know, or acknowledging frames never sent: ignore.
        if !seq_le(vi.una, ack) || !seq_le(ack, vi.sent_hi) {
            return;
        }
        if ack != vi.una {
            vi.una = ack;
            vi.retries = 0;
            vi.rto = self.config.rto_initial;
            vi.nak_rewound = None;
            vi.rto_at = if vi.una == vi.sent_hi { None } else { Some(now + vi.rto) };
            let (rto_at, behind) = (vi.rto_at, seq_lt(vi.tx_psn, ack));
            if let Some(t) = rto_at {
                self.arm(t);
            }
            if behind {
                // Frames sent before a rewind got through: skip past them.
                self.seek(id, ack);
            }
            self.complete_acked(id);
            let vi = self.vi(id).unwrap();
            if vi.tx_idx != vi.sq.tail {
                self.doorbell.ring(id); // the window opened
            }
        }
        let vi = vi_at(&mut self.vis, id).unwrap();
        if nak && vi.una != vi.sent_hi && vi.nak_rewound != Some(vi.una) {
            vi.nak_rewound = Some(vi.una);
            let una = vi.una;
            self.seek(id, una);
            self.doorbell.ring(id);
        }
    }

    /// Completes send descriptors whose every frame is acknowledged.
    fn complete_acked(&mut self, id: u16) {
        loop {
            let Ok(vi) = self.vi(id) else { return };
            if vi.sq.done == vi.sq.tail {
                return;
            }
            let e = vi.sq.get(vi.sq.done);
            if e.nframes == 0 || !seq_le(e.first_psn.wrapping_add(e.nframes), vi.una) {
                return;
            }
            let len = e.len;
            self.complete_next(id, Queue::Send, len, 0, None);
        }
    }

    /// A data fragment for VI `id` from its peer.
    fn on_data<T: AsRef<[u8]>>(&mut self, id: u16, f: &Frame<T>, now: Instant) {
        let reliable;
        let psn = f.psn();
        {
            let vi = vi_at(&mut self.vis, id).unwrap();
            reliable = vi.reliable();
            if reliable {
                if psn != vi.rx_expected {
                    if seq_lt(psn, vi.rx_expected) {
                        self.counters.rx_duplicate += 1;
                        vi.ack_now = true;
                    } else {
                        self.counters.rx_out_of_order += 1;
                        if vi.nak_sent_for != Some(vi.rx_expected) {
                            vi.nak = true;
                        }
                    }
                    self.acks_due.push(id);
                    return;
                }
            } else if psn != vi.rx_expected {
                // Unreliable: a gap loses the message being reassembled.
                if vi.rx.is_some() {
                    vi.rx = None;
                }
            }
            vi.rx_expected = psn.wrapping_add(1);
        }
        if !self.place(id, f) {
            return; // the VI broke
        }
        if reliable {
            let every = self.config.ack_every;
            let delay = self.config.ack_delay;
            let vi = self.vi_mut(id).unwrap();
            vi.ack_count += 1;
            if vi.ack_count >= every || f.flags() & flags::ACK_REQ != 0 {
                vi.ack_now = true;
                self.acks_due.push(id);
            } else if vi.ack_at.is_none() {
                vi.ack_at = Some(now + delay);
                self.arm(now + delay);
            }
        }
    }

    /// Places an in-sequence fragment; false when the VI broke.
    fn place<T: AsRef<[u8]>>(&mut self, id: u16, f: &Frame<T>) -> bool {
        let fl = f.flags();
        let vi = vi_at(&mut self.vis, id).unwrap();
        let reliable = vi.reliable();
        if fl & flags::FIRST != 0 {
            if vi.rx.is_some() && reliable {
                self.counters.rx_bad_offset += 1;
            }
            let mut m = RxMessage { entry: None, msg_seq: f.msg_seq(), msg_len: f.msg_len(), got: 0, error: 0, imm: None, seg: 0, seg_off: 0 };
            if fl & flags::IMMEDIATE != 0 {
                m.imm = Some(f.imm());
            }
            if vi.rq.done == vi.rq.tail {
                self.counters.rx_no_receive_posted += 1;
                if reliable {
                    self.async_errors.push(AsyncError { vi: id, kind: AsyncErrorKind::RecvQueueEmpty });
                    self.break_connection(id);
                    return false;
                }
                vi.rx = Some(m); // discard this message
            } else {
                let e = vi.rq.get(vi.rq.done);
                m.entry = Some(vi.rq.done);
                if m.msg_len > e.len || m.msg_len > vi.attrs.max_transfer_size {
                    m.error = status::LENGTH_ERROR;
                    self.counters.length_errors += 1;
                }
                vi.rx = Some(m);
            }
        }
        let vi = vi_at(&mut self.vis, id).unwrap();
        let Some(mut m) = vi.rx else {
            // A middle fragment with no message: its start was lost.
            return true;
        };
        let payload = f.payload();
        let end = m.got as u64 + payload.len() as u64;
        let last = fl & flags::LAST != 0;
        if f.msg_seq() != m.msg_seq || f.msg_len() != m.msg_len || f.offset() != m.got || end > m.msg_len as u64 || last != (end == m.msg_len as u64) {
            self.counters.rx_bad_offset += 1;
            vi.rx = None;
            if reliable {
                self.break_connection(id);
                return false;
            }
            return true;
        }
        if let (Some(entry), 0) = (m.entry, m.error) {
            let e = *vi.rq.get(entry);
            let ptag = vi.attrs.ptag;
            if !self.scatter(e.desc, e.segs as usize, ptag, &mut m, payload) {
                m.error = status::PROTECTION_ERROR;
            }
        }
        m.got += payload.len() as u32;
        let vi = self.vi_mut(id).unwrap();
        if last {
            vi.rx = None;
            if m.entry.is_some() {
                let len = if m.error == status::LENGTH_ERROR { 0 } else { m.got };
                self.complete_next(id, Queue::Recv, len, m.error, m.imm);
            }
        } else {
            vi.rx = Some(m);
        }
        true
    }

    /// Copies `payload` into the receive descriptor at `desc` from the
    /// message's scatter cursor on; false on a protection failure.
    /// `segs` is the segment count validated when the descriptor was posted.
    fn scatter(&self, desc: usize, segs: usize, ptag: via_kernel_agent::memory::Ptag, m: &mut RxMessage, mut payload: &[u8]) -> bool {
        while !payload.is_empty() {
            if m.seg as usize >= segs {
                return false;
            }
            let s = usermem::read_segment(desc, m.seg as usize);
            let room = s.length.saturating_sub(m.seg_off) as usize;
            if room == 0 {
                m.seg += 1;
                m.seg_off = 0;
                continue;
            }
            let n = room.min(payload.len());
            let addr = s.data.address_bits as usize + m.seg_off as usize;
            if self.mem.check(s.handle, addr, n, ptag).is_err() {
                return false;
            }
            // SAFETY: [addr, addr + n) was just checked against the table.
            unsafe { usermem::copy_in(addr, &payload[..n]) };
            payload = &payload[n..];
            m.seg_off += n as u32;
        }
        true
    }

    /// Breaks a reliable connection from our side: the peer is told.
    pub fn break_connection(&mut self, id: u16) {
        if let Ok(vi) = self.vi(id) {
            if let Some(p) = vi.peer.clone() {
                self.queue_disconnect(id, &p);
            }
        }
        self.connection_lost(id);
    }
}
