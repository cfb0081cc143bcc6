//! Credit flow control for one reliable VI: a frame is sent only when the
//! peer has a receive posted for it, so the VI never breaks for want of one
//! (VIA turns a missing receive on a reliable VI into a lost connection).
//!
//! The receiver keeps `posted` receives up at all times (each consumed one
//! is posted again at once) and reports, in every frame it sends, how many
//! of our frames it has consumed in all. We may have `posted - RESERVED`
//! data frames outstanding; the last `RESERVED` receives are kept for
//! credit-only frames, so reports can always get through. A receiver
//! sends a credit-only frame when it owes half its receives.

/// Receives kept for credit-only frames.
pub const RESERVED: u32 = 2;

/// Both directions of one VI's flow control.
#[derive(Debug, Clone, Copy)]
pub struct Credits {
    /// Receives the peer keeps posted for us (the same as we keep for it).
    posted: u32,
    /// Frames we sent in all (wrapping).
    sent: u32,
    /// Frames of ours the peer reported consumed (wrapping).
    peer_consumed: u32,
    /// Frames of the peer's we consumed in all (wrapping).
    consumed: u32,
    /// `consumed` as last reported to the peer.
    reported: u32,
}

impl Credits {
    pub fn new(posted: u32) -> Credits {
        assert!(posted > RESERVED + 1, "need more than {} receives per VI", RESERVED + 1);
        Credits { posted, sent: 0, peer_consumed: 0, consumed: 0, reported: 0 }
    }

    fn outstanding(&self) -> u32 {
        self.sent.wrapping_sub(self.peer_consumed)
    }

    /// May a data frame go now?
    pub fn can_send_data(&self) -> bool {
        self.outstanding() < self.posted - RESERVED
    }

    /// May a credit-only frame go now?
    pub fn can_send_credit(&self) -> bool {
        self.outstanding() < self.posted
    }

    /// Should a credit-only frame go (the peer may be waiting for it)?
    pub fn owe_report(&self) -> bool {
        self.consumed.wrapping_sub(self.reported) >= self.posted / 2
    }

    /// A frame goes out: returns the report it carries.
    pub fn on_send(&mut self) -> u32 {
        self.sent = self.sent.wrapping_add(1);
        self.reported = self.consumed;
        self.consumed
    }

    /// A transfer that carries no report goes out but takes a receive
    /// (an RDMA write with immediate data).
    pub fn on_send_without_report(&mut self) {
        self.sent = self.sent.wrapping_add(1);
    }

    /// A frame of the peer's arrived carrying `report` (read at arrival,
    /// not when the frame is consumed: a program that waits for its own
    /// sends without taking messages must still learn of credits).
    pub fn on_report(&mut self, report: u32) {
        // Reports only grow (wrapping); an old one (reordered) is ignored.
        if report.wrapping_sub(self.peer_consumed) as i32 > 0 {
            self.peer_consumed = report;
        }
    }

    /// A frame of the peer's was consumed (its receive posted again).
    pub fn on_consume(&mut self) {
        self.consumed = self.consumed.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_stops_before_the_reserved_receives_and_reports_reopen_it() {
        let mut a = Credits::new(8);
        let mut b = Credits::new(8);
        let mut wire = Vec::new();
        while a.can_send_data() {
            wire.push(a.on_send());
        }
        assert_eq!(wire.len(), 6, "posted - RESERVED data frames");
        assert!(a.can_send_credit());
        // b consumes them all; it owes a report after half.
        for r in wire.drain(..) {
            b.on_report(r);
            b.on_consume();
        }
        assert!(b.owe_report() && b.can_send_credit());
        let report = b.on_send();
        assert!(!b.owe_report());
        a.on_report(report);
        assert!(a.can_send_data());
        // Wrapping counters keep working.
        let mut c = Credits { sent: u32::MAX - 1, peer_consumed: u32::MAX - 1, consumed: 0, reported: 0, posted: 8 };
        for _ in 0..4 {
            c.on_send();
        }
        assert!(c.can_send_data());
        c.on_report(1);
        assert_eq!(c.outstanding(), 1);
        c.on_report(u32::MAX - 3); // stale
        assert_eq!(c.outstanding(), 1);
    }
}
