//! The VIA layer's connections: one Reliable Delivery VI per peer, made
//! by the peer-to-peer model (this rank's VI `mttl-<me>-<peer>` seeks the
//! peer's `mttl-<peer>-<me>`, so two ranks that ask at once still make one
//! connection). By default they are made on demand: to a peer when the
//! first message or RDMA operation goes to it, or when its request comes
//! (a peer keeps asking until we ask too; `brecany` wakes for it and the
//! scheduler's polls look now and then). A process then holds VIs, posted
//! receives and their memory only for the peers it talks to, and start-up
//! makes no connection at all. `MTTL_VIA_CONNECT=all` connects every pair
//! at start-up instead, as before.
//!
//! While a rank waits for one connection it answers the requests of
//! others, so that ranks each waiting for a third cannot wait for each
//! other.

use super::{err, Credits, Peer, Result, ViaTransport};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use via_user::{MacAddr, RemoteBuffer, Vi, ViAttributes};

/// How long a connection may take: a peer busy computing (NPB CG's matrix
/// generation) answers only when it next polls.
const CONNECT_WITHIN: Duration = Duration::from_secs(120);
/// The scheduler's polls look at waiting requests every this many calls
/// (each look is a round of the engine).
const LOOK_EVERY: u32 = 64;

/// A VI whose connection was asked for and is not yet made.
struct Connecting {
    vi: Vi,
}

/// What the layer knows of each peer before and while connecting.
pub(super) struct Links {
    /// Each rank's MAC address and heap (None: this rank).
    addrs: Vec<Option<(MacAddr, RemoteBuffer)>>,
    /// Each peer's credit window.
    recvs: u32,
    attrs: ViAttributes,
    on_demand: bool,
    connecting: Vec<Option<Connecting>>,
    /// Peers not yet connected.
    unconnected: usize,
    polls: u32,
}

impl Links {
    pub(super) fn new(addrs: Vec<Option<(MacAddr, RemoteBuffer)>>, recvs: u32, attrs: ViAttributes, on_demand: bool) -> Links {
        let unconnected = addrs.iter().flatten().count();
        let connecting = (0..addrs.len()).map(|_| None).collect();
        Links { addrs, recvs, attrs, on_demand, connecting, unconnected, polls: 0 }
    }

    /// Peers not yet connected.
    pub(super) fn unconnected(&self) -> usize {
        self.unconnected
    }

    /// Connections being made.
    pub(super) fn connecting(&self) -> usize {
        self.connecting.iter().flatten().count()
    }
}

impl ViaTransport {
    /// Connects every peer now (`MTTL_VIA_CONNECT=all`): all requests
    /// first, then the waits.
    pub(super) fn connect_all(&mut self) -> Result<()> {
        for j in 0..self.peers.len() {
            if j != self.rank {
                self.start_connect(j)?;
            }
        }
        for j in 0..self.peers.len() {
            if j != self.rank {
                self.connect(j)?;
            }
        }
        Ok(())
    }

    /// Creates the VI to `j`, drawing its receives from the pool, and asks for the
    /// connection (unless asked already).
    fn start_connect(&mut self, j: usize) -> Result<()> {
        if self.peers[j].is_some() || self.links.connecting[j].is_some() {
            return Ok(());
        }
        let rank = self.rank;
        let Some((mac, _)) = self.links.addrs[j] else { return Err(err(format!("rank {rank}: no address of rank {j}"))) };
        let mut vi = self.nic.create_vi(&self.links.attrs, Some(&self.cq), Some(&self.cq)).map_err(err)?;
        let id = vi.id() as usize;
        if self.vi_node.len() <= id {
            self.vi_node.resize(id + 1, usize::MAX);
        }
        self.vi_node[id] = j;
        vi.use_srq(&self.srq).map_err(err)?;
        let (me_name, peer_name) = (format!("mttl-{rank}-{j}"), format!("mttl-{j}-{rank}"));
        vi.connect_peer_request(mac, me_name.as_bytes(), peer_name.as_bytes(), Some(CONNECT_WITHIN)).map_err(|e| err(format!("rank {rank}: connecting to rank {j}: {e}")))?;
        self.links.connecting[j] = Some(Connecting { vi });
        Ok(())
    }

    /// Makes the VI to `j` a peer if its connection is made; true if `j`
    /// is connected now.
    pub(super) fn promote(&mut self, j: usize) -> Result<bool> {
        if self.peers[j].is_some() {
            return Ok(true);
        }
        let rank = self.rank;
        let Some(c) = self.links.connecting[j].as_mut() else { return Ok(false) };
        if !c.vi.connect_peer_done().map_err(|e| err(format!("rank {rank}: connecting to rank {j}: {e}")))? {
            return Ok(false);
        }
        let c = self.links.connecting[j].take().expect("checked above");
        let heap = self.links.addrs[j].expect("a peer's address").1;
        self.peers[j] = Some(Peer {
            vi: c.vi,
            credits: Credits::new(self.links.recvs),
            partial: Vec::new(),
            unpacked: VecDeque::new(),
            arrived: VecDeque::new(),
            backlog: VecDeque::new(),
            posted: VecDeque::new(),
            queued: 0,
            completed: 0,
            heap,
            closed: false,
        });
        self.links.unconnected -= 1;
        Ok(true)
    }

    /// Connects to `j` and waits until it is connected, answering other
    /// peers' requests (and filing completions) meanwhile.
    pub(super) fn connect(&mut self, j: usize) -> Result<()> {
        self.start_connect(j)?;
        let deadline = Instant::now() + CONNECT_WITHIN;
        loop {
            if self.promote(j)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(err(format!("rank {}: rank {j} did not connect within {CONNECT_WITHIN:?}", self.rank)));
            }
            self.wait_event(Some(Duration::from_millis(1)))?;
        }
    }

    /// Asks in turn for the connections peers asked for (on demand), and
    /// makes peers of the connections that were made.
    pub(super) fn answer_requests(&mut self) -> Result<()> {
        for w in self.nic.peer_requests_waiting() {
            let Some(j) = asking_rank(&w.discriminator, &w.seeks, self.rank) else { continue };
            if self.links.addrs.get(j).and_then(|a| a.as_ref()).is_some_and(|(mac, _)| *mac == w.mac) {
                self.start_connect(j)?;
            }
        }
        for j in 0..self.peers.len() {
            if self.links.connecting[j].is_some() {
                self.promote(j)?;
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` (None: no limit) for a completion, which it
    /// files, or a peer's request, which it answers; when the time is up
    /// it asks whether connections in progress were made.
    pub(super) fn wait_event(&mut self, timeout: Option<Duration>) -> Result<()> {
        match self.cq.wait_or_peer_request(timeout) {
            Ok(Some(c)) => self.on_completion(c),
            Ok(None) => self.answer_requests(),
            Err(e) if e.code == via_user::VipReturn::Timeout => self.answer_requests(),
            Err(e) => Err(err(e)),
        }
    }

    /// [`ViaTransport::answer_requests`] from the scheduler's polls, every
    /// [`LOOK_EVERY`] calls while peers are unconnected.
    pub(super) fn answer_now_and_then(&mut self) -> Result<()> {
        if !self.links.on_demand || self.links.unconnected == 0 {
            return Ok(());
        }
        self.links.polls = self.links.polls.wrapping_add(1);
        if self.links.polls.is_multiple_of(LOOK_EVERY) {
            self.answer_requests()?;
        }
        Ok(())
    }
}

/// The rank that asks as `mttl-<j>-<me>` for our `mttl-<me>-<j>`.
fn asking_rank(theirs: &[u8], seeks: &[u8], me: usize) -> Option<usize> {
    let theirs = std::str::from_utf8(theirs).ok()?.strip_prefix("mttl-")?;
    let (j, to) = theirs.split_once('-')?;
    let (j, to): (usize, usize) = (j.parse().ok()?, to.parse().ok()?);
    (to == me && seeks == format!("mttl-{me}-{j}").as_bytes()).then_some(j)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_request_of_the_layer_for_this_rank_names_a_peer() {
        use super::asking_rank;
        assert_eq!(asking_rank(b"mttl-3-1", b"mttl-1-3", 1), Some(3));
        assert_eq!(asking_rank(b"mttl-3-2", b"mttl-2-3", 1), None, "for another rank");
        assert_eq!(asking_rank(b"mttl-3-1", b"mttl-1-4", 1), None, "seeking another VI");
        assert_eq!(asking_rank(b"other-3-1", b"mttl-1-3", 1), None);
        assert_eq!(asking_rank(b"mttl-x-1", b"mttl-1-x", 1), None);
    }
}
