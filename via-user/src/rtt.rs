//! The round-trip estimator of a reliable VI (RFC 6298's smoothed RTT and
//! deviation), in integer nanoseconds: a sample costs a few adds and
//! shifts, where `Duration` arithmetic normalises seconds and nanoseconds
//! at every step.

use std::time::Duration;

/// Smoothed round trip and its mean deviation, once a sample came.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttEstimator {
    /// 0 until the first sample.
    srtt_ns: u64,
    rttvar_ns: u64,
}

impl RttEstimator {
    /// Takes one measured round trip, in nanoseconds (never of a
    /// retransmitted frame: Karn).
    pub fn sample(&mut self, r_ns: u64) {
        let r = r_ns.max(1);
        if self.srtt_ns == 0 {
            (self.srtt_ns, self.rttvar_ns) = (r, r / 2);
        } else {
            let dev = self.srtt_ns.abs_diff(r);
            self.rttvar_ns = (self.rttvar_ns * 3 + dev) / 4;
            self.srtt_ns = (self.srtt_ns * 7 + r) / 8;
        }
    }

    /// The smoothed round trip, if measured.
    pub fn srtt(&self) -> Option<Duration> {
        (self.srtt_ns != 0).then(|| Duration::from_nanos(self.srtt_ns))
    }

    /// The retransmission timeout after progress, in nanoseconds: the
    /// smoothed round trip plus four deviations, at least `initial` (the
    /// configured one), at most `max`; `initial` before any sample. A link
    /// with a long delay then does not time out every frame before its ACK
    /// can come back.
    pub fn rto(&self, initial: u64, max: u64) -> u64 {
        if self.srtt_ns == 0 {
            return initial;
        }
        let rto = self.srtt_ns.saturating_add(self.rttvar_ns.saturating_mul(4));
        rto.clamp(initial, max.max(initial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooths_like_rfc_6298() {
        let us = |n: u64| n * 1000; // nanoseconds
        let mut e = RttEstimator::default();
        assert_eq!(e.srtt(), None);
        assert_eq!(e.rto(us(200), us(1000)), us(200), "initial before any sample");
        e.sample(us(40));
        assert_eq!((e.srtt(), e.rttvar_ns), (Some(Duration::from_micros(40)), 20_000));
        e.sample(us(80)); // dev 40: rttvar (60 + 40) / 4 = 25, srtt (280 + 80) / 8 = 45
        assert_eq!((e.srtt(), e.rttvar_ns), (Some(Duration::from_micros(45)), 25_000));
        assert_eq!(e.rto(us(100), us(1000)), us(145));
        assert_eq!(e.rto(us(200), us(1000)), us(200), "at least the initial");
        assert_eq!(e.rto(us(10), us(120)), us(120), "at most the maximum");
        e.sample(0);
        assert!(e.srtt().is_some_and(|s| s > Duration::ZERO), "a zero sample still counts as measured");
    }
}
