//! Name discovery on the Ethernet segment, for names the hosts file does
//! not know (`VipNSGetHostByName`) and addresses it has no name for
//! (`VipNSGetHostByAddr`), as a sans-IO state machine.
//!
//! Asking: `NameQuery` with the name, broadcast to endpoint
//! [`ANY_ENDPOINT`], retransmitted with backoff until an answer or the
//! deadline; or, for an address, `NameQuery` with an empty name sent to
//! that MAC. Answering: every opened NIC knows the names it answers for
//! ([`Resolver::set_local_names`]) and answers a query for one of them, or
//! an empty one sent to its own MAC, with `NameReply` carrying the name. An
//! empty query broadcast to the segment ("everybody, say who you are") is
//! [`QueryRefused`]: answering it would list every NIC's MAC, endpoint and
//! name to whoever asks. Answers are cached until [`Resolver::shutdown`]
//! (`VipNSShutdown`).

use crate::backoff::{Backoff, Due, Retried, RetryTable};
use crate::conn::CmFrame;
use via_wire::MacAddr;
use via_wire::{ConnRepr, Kind, ANY_ENDPOINT, MAX_DISCRIMINATOR};
use std::time::{Duration, Instant};

/// First retransmission interval of a query.
pub const QUERY_RTO: Duration = Duration::from_millis(5);
/// Longest interval between retransmissions.
pub const QUERY_RTO_MAX: Duration = Duration::from_millis(100);
/// Longest name carried on the wire.
pub const MAX_NAME: usize = MAX_DISCRIMINATOR;

/// Where a lookup stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    InProgress,
    /// The host's MAC and name.
    Found(MacAddr, String),
    NotFound,
}

struct Query {
    id: u32,
    /// The name sought; empty when asking `target` for its name.
    name: String,
    target: MacAddr,
    state: Lookup,
}

impl Retried for Query {
    fn in_progress(&self) -> bool {
        self.state == Lookup::InProgress
    }
}

/// A broadcast name query with an empty name: not answered (the engine
/// counts it as `rx_query_refused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryRefused;

/// The name discovery of one opened NIC.
pub struct Resolver {
    local_names: Vec<String>,
    queries: RetryTable<Query>,
    cache: Vec<(String, MacAddr)>,
    next_id: u32,
    out: Vec<CmFrame>,
}

impl Resolver {
    /// A resolver answering for `local_names`.
    pub fn new(local_names: Vec<String>) -> Self {
        Resolver { local_names, queries: RetryTable::default(), cache: Vec::new(), next_id: crate::memory::random_u32(), out: Vec::new() }
    }

    /// The names this NIC answers for (the first is its own name).
    pub fn set_local_names(&mut self, names: Vec<String>) {
        self.local_names = names;
    }

    pub fn local_names(&self) -> &[String] {
        &self.local_names
    }

    /// Frames queued for transmission; the engine drains them.
    pub fn outgoing(&mut self) -> &mut Vec<CmFrame> {
        &mut self.out
    }

    /// A cached answer for `name`.
    pub fn cached(&self, name: &str) -> Option<MacAddr> {
        self.cache.iter().find(|(n, _)| n == name).map(|(_, m)| *m)
    }

    /// A cached name of `mac`.
    pub fn cached_name(&self, mac: MacAddr) -> Option<&str> {
        self.cache.iter().find(|(_, m)| *m == mac).map(|(n, _)| n.as_str())
    }

    /// Starts looking for the host called `name`; returns the query id.
    pub fn begin_name(&mut self, name: &str, now: Instant, deadline: Instant) -> u32 {
        self.begin(name.to_string(), MacAddr::BROADCAST, now, deadline)
    }

    /// Starts asking `mac` for its name; returns the query id.
    pub fn begin_addr(&mut self, mac: MacAddr, now: Instant, deadline: Instant) -> u32 {
        self.begin(String::new(), mac, now, deadline)
    }

    fn begin(&mut self, name: String, target: MacAddr, now: Instant, deadline: Instant) -> u32 {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let backoff = Backoff::new(now, deadline, QUERY_RTO, QUERY_RTO_MAX);
        self.queries.start(backoff, Query { id, name, target, state: Lookup::InProgress }, |q| q.id == id);
        self.on_timer(now);
        id
    }

    /// Where query `id` stands; a finished query is forgotten.
    pub fn poll(&mut self, id: u32, now: Instant) -> Lookup {
        self.on_timer(now);
        self.queries.poll(|q| q.id == id, |q| q.state.clone()).unwrap_or(Lookup::NotFound)
    }

    /// A `NameQuery` from `(mac, ep)`, `broadcast` to the segment or sent
    /// to our MAC: answered when the name is ours, or when it is empty
    /// ("what is your name?") and was sent to us alone.
    pub fn on_query(&mut self, mac: MacAddr, ep: u32, q: &ConnRepr, broadcast: bool) -> Result<(), QueryRefused> {
        if broadcast && q.discriminator.is_empty() {
            return Err(QueryRefused);
        }
        let Ok(name) = std::str::from_utf8(&q.discriminator) else { return Ok(()) };
        let answer = if name.is_empty() { self.local_names.first().cloned() } else { self.local_names.iter().find(|n| *n == name).cloned() };
        let Some(answer) = answer else { return Ok(()) };
        let conn = ConnRepr { request_id: q.request_id, discriminator: answer.into_bytes(), ..ConnRepr::default() };
        self.out.push(CmFrame { dst_mac: mac, dst_ep: ep, kind: Kind::NameReply, dst_vi: 0, src_vi: 0, generation: 0, imm: 0, ack: None, conn });
        Ok(())
    }

    /// A `NameReply` from `mac`.
    pub fn on_reply(&mut self, mac: MacAddr, r: &ConnRepr) {
        let Ok(name) = std::str::from_utf8(&r.discriminator) else { return };
        let Some(q) = self.queries.find_in_progress_mut(|q| q.id == r.request_id) else { return };
        if (!q.name.is_empty() && q.name != name) || (q.name.is_empty() && q.target != mac) || name.is_empty() {
            return; // not an answer to what we asked
        }
        q.state = Lookup::Found(mac, name.to_string());
        if !self.cache.iter().any(|(n, m)| n == name && *m == mac) {
            self.cache.push((name.to_string(), mac));
        }
    }

    /// Nothing timed: [`Self::on_timer`] would do nothing.
    pub fn timers_idle(&self) -> bool {
        self.queries.is_empty()
    }

    /// Retransmits due queries and ends those whose deadline passed.
    #[inline]
    pub fn on_timer(&mut self, now: Instant) {
        if !self.timers_idle() {
            self.on_timer_queries(now);
        }
    }

    fn on_timer_queries(&mut self, now: Instant) {
        let out = &mut self.out;
        self.queries.on_timer(now, |_| {}, |q, due| match due {
            Due::Expired => q.state = Lookup::NotFound,
            Due::Send => {
                let conn = ConnRepr { request_id: q.id, discriminator: q.name.clone().into_bytes(), ..ConnRepr::default() };
                out.push(CmFrame { dst_mac: q.target, dst_ep: ANY_ENDPOINT, kind: Kind::NameQuery, dst_vi: 0, src_vi: 0, generation: 0, imm: 0, ack: None, conn });
            }
        });
    }

    /// The next instant [`Resolver::on_timer`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queries.next_deadline(|_| None)
    }

    /// `VipNSShutdown`: forgets the cache and abandons queries.
    pub fn shutdown(&mut self) {
        self.cache.clear();
        self.queries.remove_where(|_| true);
    }
}

/// The names a NIC with address `mac` answers for by default: `$VIA_NAME`
/// (comma-separated) or else the host name, then the hosts-file names of
/// `mac`.
pub fn default_local_names(hosts: &crate::names::NameService, mac: MacAddr) -> Vec<String> {
    let mut names: Vec<String> = match std::env::var("VIA_NAME") {
        Ok(v) => v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
        Err(_) => host_name().into_iter().collect(),
    };
    for n in hosts.names_of(mac) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names.retain(|n| n.len() <= MAX_NAME);
    names
}

/// This host's name (gethostname(2)).
pub fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it when the name fits.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    /// Delivers `from`'s frames (sent from `from_mac`) to `to`, dropping the first `drop`.
    fn pump(from: &mut Resolver, from_mac: MacAddr, to: &mut Resolver, drop: usize) {
        let frames: Vec<_> = from.outgoing().drain(..).collect();
        for f in frames.into_iter().skip(drop) {
            let mut buf = [0u8; 160];
            let n = f.conn.emit(&mut buf);
            let c = ConnRepr::parse(&buf[..n]).unwrap();
            match f.kind {
                Kind::NameQuery => to.on_query(from_mac, 7, &c, f.dst_mac.is_broadcast()).expect("a query this resolver asks"),
                _ => to.on_reply(from_mac, &c),
            }
        }
    }

    #[test]
    fn finds_a_name_and_caches_it() {
        let t0 = Instant::now();
        let (mut a, mut b) = (Resolver::new(vec![]), Resolver::new(vec!["bee".into(), "alias".into()]));
        let q = a.begin_name("alias", t0, t0 + Duration::from_secs(1));
        pump(&mut a, A, &mut b, 1); // the first query is lost
        assert_eq!(a.poll(q, t0), Lookup::InProgress);
        a.on_timer(t0 + QUERY_RTO);
        pump(&mut a, A, &mut b, 0);
        pump(&mut b, B, &mut a, 0);
        assert_eq!(a.poll(q, t0 + QUERY_RTO), Lookup::Found(B, "alias".into()));
        assert_eq!(a.cached("alias"), Some(B));
        a.shutdown();
        assert_eq!(a.cached("alias"), None);
    }

    #[test]
    fn asks_an_address_for_its_name() {
        let t0 = Instant::now();
        let (mut a, mut b) = (Resolver::new(vec![]), Resolver::new(vec!["bee".into()]));
        let q = a.begin_addr(B, t0, t0 + Duration::from_secs(1));
        assert_eq!(a.outgoing()[0].dst_mac, B);
        pump(&mut a, A, &mut b, 0);
        pump(&mut b, B, &mut a, 0);
        assert_eq!(a.poll(q, t0), Lookup::Found(B, "bee".into()));
    }

    /// "Everybody, say your name" is refused; the same empty query sent
    /// to one MAC is answered.
    #[test]
    fn an_empty_broadcast_query_is_not_answered() {
        let mut b = Resolver::new(vec!["bee".into()]);
        let empty = ConnRepr { request_id: 5, ..ConnRepr::default() };
        assert_eq!(b.on_query(A, 7, &empty, true), Err(QueryRefused));
        assert!(b.outgoing().is_empty());
        assert_eq!(b.on_query(A, 7, &empty, false), Ok(()));
        assert_eq!(b.outgoing().len(), 1);
    }

    #[test]
    fn unknown_names_are_not_found_at_the_deadline() {
        let t0 = Instant::now();
        let (mut a, mut b) = (Resolver::new(vec![]), Resolver::new(vec!["bee".into()]));
        let q = a.begin_name("wasp", t0, t0 + Duration::from_millis(30));
        pump(&mut a, A, &mut b, 0);
        assert!(b.outgoing().is_empty(), "b answered for a name it does not have");
        assert_eq!(a.poll(q, t0 + Duration::from_millis(30)), Lookup::NotFound);
        // A reply nobody asked for is ignored.
        a.on_reply(B, &ConnRepr { request_id: 12345, discriminator: b"bee".to_vec(), ..ConnRepr::default() });
        assert_eq!(a.cached("bee"), None);
    }

    #[test]
    fn duplicate_and_late_replies_are_harmless() {
        let t0 = Instant::now();
        const C: MacAddr = MacAddr([2, 0, 0, 0, 0, 3]);
        let (mut a, mut b) = (Resolver::new(vec![]), Resolver::new(vec!["bee".into()]));
        let q = a.begin_name("bee", t0, t0 + Duration::from_secs(1));
        pump(&mut a, A, &mut b, 0);
        a.on_timer(t0 + QUERY_RTO); // retransmitted before the first answer came
        pump(&mut a, A, &mut b, 0);
        let replies: Vec<_> = b.outgoing().drain(..).collect();
        assert_eq!(replies.len(), 2, "each query copy is answered");
        for r in &replies {
            assert_eq!((r.kind, r.dst_mac, r.dst_ep), (Kind::NameReply, A, 7));
            a.on_reply(B, &r.conn);
        }
        // Another host claiming the same name later does not change the answer.
        a.on_reply(C, &replies[0].conn);
        assert_eq!(a.poll(q, t0 + QUERY_RTO), Lookup::Found(B, "bee".into()));
        assert_eq!(a.cache, vec![("bee".to_string(), B)]);
        // After the query is finished and forgotten, a late copy is ignored.
        a.on_reply(B, &replies[1].conn);
        assert_eq!(a.poll(q, t0 + QUERY_RTO), Lookup::NotFound);
        assert_eq!(a.cache.len(), 1);
    }

    #[test]
    fn odd_names_from_the_wire_are_ignored() {
        let t0 = Instant::now();
        let (mut a, mut b) = (Resolver::new(vec![]), Resolver::new(vec!["bee".into()]));
        // Not UTF-8: no answer, no panic.
        b.on_query(A, 7, &ConnRepr { request_id: 1, discriminator: vec![0xff, 0xfe, b'b'], ..ConnRepr::default() }, true).unwrap();
        assert!(b.outgoing().is_empty());
        let q = a.begin_name("bee", t0, t0 + Duration::from_secs(1));
        // A reply with the right id but another name, an empty name, or bad UTF-8 does not answer it.
        for d in [b"wasp".to_vec(), Vec::new(), vec![0xc3, 0x28]] {
            a.on_reply(B, &ConnRepr { request_id: q, discriminator: d, ..ConnRepr::default() });
        }
        assert_eq!(a.poll(q, t0), Lookup::InProgress);
        assert!(a.cache.is_empty());
        // An address query is answered only by the address asked.
        let q = a.begin_addr(B, t0, t0 + Duration::from_secs(1));
        a.on_reply(MacAddr([2, 0, 0, 0, 0, 9]), &ConnRepr { request_id: q, discriminator: b"bee".to_vec(), ..ConnRepr::default() });
        assert_eq!(a.poll(q, t0), Lookup::InProgress);
        // A frame too short for its name is a parse error, never a panic.
        let mut buf = [0u8; 160];
        let n = ConnRepr { request_id: q, discriminator: b"bee".to_vec(), ..ConnRepr::default() }.emit(&mut buf);
        for cut in 0..n {
            assert!(ConnRepr::parse(&buf[..cut]).is_err());
        }
    }
}
