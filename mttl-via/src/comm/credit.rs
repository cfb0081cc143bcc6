//! Credit flow control for one VI: a window of `posted` data frames in
//! flight to the peer, each counted until the peer's program has taken it.
//!
//! The receiver reports, in every frame it sends, how many of our frames
//! it has consumed in all; we may have `posted` data frames outstanding.
//! When it owes a report for half the window and has no data to carry it,
//! it sends a credit-only frame. Those take no credit: the peer absorbs
//! them as they arrive (their receive is posted again at once), while a
//! data frame waits in the peer's queue until its program takes it. (A
//! credit-only frame that took a credit could itself wait behind data the
//! peer's program does not want yet, and when two such frames had used up
//! the reserve both sides waited for each other's report for good.) A
//! frame that finds the peer's receive pool empty is refused and sent
//! again (receiver-not-ready mode, which the layer turns on), so none of
//! them needs a receive kept for it.

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
        assert!(posted > 1, "a window of at least 2 frames");
        Credits { posted, sent: 0, peer_consumed: 0, consumed: 0, reported: 0 }
    }

    fn outstanding(&self) -> u32 {
        self.sent.wrapping_sub(self.peer_consumed)
    }

    /// May a data frame go now?
    pub fn can_send_data(&self) -> bool {
        self.outstanding() < self.posted
    }

    /// Should a credit-only frame go (the peer may be waiting for it)?
    pub fn owe_report(&self) -> bool {
        self.consumed.wrapping_sub(self.reported) >= self.posted / 2
    }

    /// A data frame goes out: returns the report it carries.
    pub fn on_send(&mut self) -> u32 {
        self.sent = self.sent.wrapping_add(1);
        self.on_send_report()
    }

    /// A credit-only frame goes out (it takes no credit): returns its report.
    pub fn on_send_report(&mut self) -> u32 {
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
    fn data_stops_at_the_window_and_reports_reopen_it() {
        let mut a = Credits::new(8);
        let mut b = Credits::new(8);
        let mut wire = Vec::new();
        while a.can_send_data() {
            wire.push(a.on_send());
        }
        assert_eq!(wire.len(), 8, "a window of data frames");
        // b consumes them all; it owes a report after half.
        for r in wire.drain(..) {
            b.on_report(r);
            b.on_consume();
        }
        assert!(b.owe_report());
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

    #[test]
    fn reports_go_with_the_window_full_and_take_no_credit() {
        // Both windows full of data neither program has taken yet: each
        // side can still tell the other what it consumed.
        let (mut a, mut b) = (Credits::new(4), Credits::new(4));
        for _ in 0..4 {
            a.on_send();
        }
        let to_a: Vec<u32> = (0..4).map(|_| b.on_send()).collect();
        assert!(!a.can_send_data() && !b.can_send_data());
        for r in to_a {
            a.on_report(r);
            a.on_consume();
        }
        assert!(a.owe_report());
        for _ in 0..3 {
            let report = a.on_send_report();
            b.on_report(report);
        }
        assert_eq!(a.outstanding(), 4, "credit-only frames take no credit");
        assert!(b.can_send_data(), "b learned that a took its frames");
    }
}
