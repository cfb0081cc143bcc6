//! The check `a_poll_asks_the_ring_if_a_frame_is_there`: a NIC driver
//! says in one look at its ring whether a receive would find a frame
//! (`FrameDevice::rx_pending`: the next receive descriptor's status word
//! in our DMA memory), so that a poll that finds nothing complete skips
//! its round of progress while nothing came.
//!
//! On the receiving NIC, with its ring emptied, `rx_pending` must say no
//! frame; after a frame from the other NIC it must say one is there
//! (asked until it does, within a deadline), a receive must then hand
//! over that frame, and after it nothing is pending again. A driver that
//! cannot say (None), or whose answer does not follow the ring, fails.

use std::time::{Duration, Instant};
use via_device::{FrameDevice, TxFrame};

/// How long the frame may take to show once it was sent.
const DEADLINE: Duration = Duration::from_secs(10);
const ETHERTYPE: u16 = 0x88B6;

fn open(dev: &str) -> Result<Box<dyn FrameDevice>, String> {
    via_user::open_device(dev).map_err(|e| format!("opening {dev}: {e}"))
}

/// Takes every frame waiting on `d`.
fn drain(d: &mut dyn FrameDevice) -> Result<(), String> {
    while d.receive(64, &mut |_| {}).map_err(|e| format!("receive: {e}"))? > 0 {}
    Ok(())
}

pub fn a_poll_asks_the_ring_if_a_frame_is_there(devs: &[String]) -> Result<(), String> {
    let (mut rx, mut tx) = (open(&devs[0])?, open(&devs[1])?);
    drain(rx.as_mut())?;
    if rx.rx_pending() != Some(false) {
        return Err(format!("{}: rx_pending with the ring empty says {:?}", devs[0], rx.rx_pending()));
    }
    let mut frame = vec![0u8; 64];
    frame[..6].copy_from_slice(&rx.mac().0);
    frame[6..12].copy_from_slice(&tx.mac().0);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    frame[14..23].copy_from_slice(b"pending!\0");
    let t0 = Instant::now();
    while tx.transmit(&[TxFrame::new(&frame)]).map_err(|e| format!("transmit: {e}"))? == 0 {
        if t0.elapsed() > DEADLINE {
            return Err("the sending NIC took no frame".into());
        }
    }
    while rx.rx_pending() != Some(true) {
        if t0.elapsed() > DEADLINE {
            return Err(format!("rx_pending did not say the frame was there within {DEADLINE:?} of its sending: {:?}", rx.rx_pending()));
        }
        std::hint::spin_loop();
    }
    let mut got = Vec::new();
    rx.receive(64, &mut |f| got.push(f.to_vec())).map_err(|e| format!("receive: {e}"))?;
    if !got.iter().any(|f| f.len() >= 23 && f[..23] == frame[..23]) {
        return Err(format!("the receive after rx_pending said yes did not hand over the frame ({} frames)", got.len()));
    }
    if rx.rx_pending() != Some(false) {
        return Err(format!("rx_pending after the frame was taken: {:?}", rx.rx_pending()));
    }
    println!("  rx_pending said the frame was there {:?} after it was handed to the other NIC", t0.elapsed());
    Ok(())
}
