//! The `raw` baseline: messages as plain Ethernet frames through the same
//! software NIC (EtherType 0x88B6, nothing of VIA on top): the floor of the
//! path. Each frame carries an 8-byte header (a tag the receive filter
//! matches, and the message length); a message longer than one frame goes
//! as consecutive frames. No loss recovery: the link is a veth pair and the
//! protocol's credits keep the receive ring from overflowing.

use crate::common::{spin_then_sleep, Link, Step};
use std::cell::RefCell;
use std::io;
use std::time::Duration;
use via_device::{FrameDevice, MacAddr, RxFilter, RxWatches, TxFrame};

const ETHERTYPE: u16 = 0x88B6;
const TAG: u32 = 0x7261_7721;
const HDR: usize = 14 + 8;
const BATCH: usize = 32;

pub struct RawLink {
    dev: Box<dyn FrameDevice>,
    /// Ethernet + raw header template for each frame of a batch.
    hdrs: Vec<[u8; HDR]>,
    frag: usize,
    fd: i32,
}

impl RawLink {
    pub fn open(device: &str, peer: Option<MacAddr>) -> io::Result<RawLink> {
        let mut dev = via_user::open_device(device)?;
        dev.set_filter(RxFilter { ethertype: ETHERTYPE, offset: 14, accept: [TAG, TAG] })?;
        let mut h = [0u8; HDR];
        h[0..6].copy_from_slice(&peer.unwrap_or(MacAddr::BROADCAST).0);
        h[6..12].copy_from_slice(&dev.mac().0);
        h[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        h[14..18].copy_from_slice(&TAG.to_be_bytes());
        let frag = dev.mtu() - 8;
        let fd = dev.wait_fd();
        Ok(RawLink { dev, hdrs: vec![h; BATCH], frag, fd })
    }

    pub fn mac(&self) -> MacAddr {
        self.dev.mac()
    }

    /// The server learns its peer from the first frame.
    fn set_peer(&mut self, mac: [u8; 6]) {
        for h in &mut self.hdrs {
            h[0..6].copy_from_slice(&mac);
        }
    }
}

impl Link for RawLink {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        // No allocation and nothing per message beyond the frames it takes:
        // this is the floor the others are held to.
        let len = (msg.len() as u32).to_be_bytes();
        let nframes = msg.len().div_ceil(self.frag).max(1);
        if nframes == 1 {
            let h = &mut self.hdrs[0];
            h[18..22].copy_from_slice(&len);
            let mut f = TxFrame::new(&self.hdrs[0]);
            f.push(msg);
            while self.dev.transmit(std::slice::from_ref(&f))? == 0 {}
            return Ok(());
        }
        for h in self.hdrs.iter_mut().take(nframes) {
            h[18..22].copy_from_slice(&len);
        }
        let mut first = 0;
        while first < nframes {
            let n = (nframes - first).min(BATCH);
            let mut frames = [TxFrame::new(&[]); BATCH];
            for (i, f) in frames.iter_mut().enumerate().take(n) {
                let at = (first + i) * self.frag;
                *f = TxFrame::new(&self.hdrs[i]);
                f.push(&msg[at..(at + self.frag).min(msg.len())]);
            }
            let mut done = 0;
            while done < n {
                done += self.dev.transmit(&frames[done..n])?;
            }
            first += n;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut total: Option<usize> = None;
        let mut got = 0usize;
        let mut peer = None;
        let frag = self.frag;
        let fd = self.fd;
        let dev = RefCell::new(&mut self.dev);
        let mut watches = RxWatches::default();
        let attempt = || {
            let mut dev = dev.borrow_mut();
            let mut arrived = false;
            loop {
                // Take only the frames this message still needs.
                let want = match total {
                    None => 1,
                    Some(t) => (t - got).div_ceil(frag).max(1),
                };
                let n = dev.receive(want.min(64), &mut |f| {
                    if f.len() < HDR {
                        return;
                    }
                    let t = u32::from_be_bytes(f[18..22].try_into().unwrap()) as usize;
                    let t = *total.get_or_insert(t);
                    let p = &f[HDR..];
                    let end = (got + p.len()).min(t).min(buf.len());
                    if end > got {
                        buf[got..end].copy_from_slice(&p[..end - got]);
                    }
                    got += p.len();
                    peer.get_or_insert_with(|| <[u8; 6]>::try_from(&f[6..12]).unwrap());
                })?;
                if let Some(t) = total {
                    if got >= t {
                        return Ok(Step::Done(t));
                    }
                }
                if n == 0 {
                    if !arrived {
                        // Before it spins again, what VIA's wait does
                        // before each spin: the device's look at where its
                        // next frame shows, which on the software NIC
                        // prefetches the ring's next slots (a baseline
                        // waits as VIA does; DESIGN-NOTES, "The raw
                        // floor's wait").
                        watches.clear();
                        dev.rx_watch(&mut watches);
                    }
                    return Ok(if arrived { Step::Partial } else { Step::Empty });
                }
                arrived = true;
            }
        };
        spin_then_sleep(fd, libc::POLLIN, Duration::from_secs(30), attempt, || dev.borrow_mut().prepare_sleep())
        .inspect(|_| {
            if let Some(p) = peer {
                self.set_peer(p);
            }
        })
    }

    fn lossless_bytes(&self) -> Option<usize> {
        // Nothing resends a frame the ring dropped. A NIC's ring of
        // descriptors (the tulip's 1,024 frames) bounds the window: its
        // frames are all of unconfirmed messages. Else a third of what the
        // software NIC's 8 MiB receive ring holds at MTU 1500 (4096 frames
        // of 1492 bytes), well within it at 9000.
        let ring = self.dev.rx_ring_frames().map_or(usize::MAX, |f| f * self.frag);
        Some(ring.min(2 << 20))
    }
}
