//! The check `the_next_frame_moves_the_watched_word`: a NIC driver says
//! where its next received frame will show (`FrameDevice::rx_watch`, the
//! next receive descriptor's status word in our DMA memory), so that a
//! waiting thread spins on one load between rounds of progress and a poll
//! that finds nothing complete skips its round (`rx_pending`).
//!
//! On the receiving NIC, with its ring emptied: the watch must be usable
//! and unmoved, and `rx_pending` must say no frame. A frame from the other
//! NIC must then move the word (looked at until it does, within a
//! deadline), `rx_pending` must say a frame is there, and a receive must
//! hand over that frame; after it, nothing is pending again. A driver
//! that reports no word, a word the NIC does not write, or a pending
//! answer that does not follow the ring fails.

use std::time::{Duration, Instant};
use via_device::{FrameDevice, RxWatches, TxFrame};

/// How long the word may take to move once the frame was sent.
const DEADLINE: Duration = Duration::from_secs(10);
const ETHERTYPE: u16 = 0x88B6;

fn open(dev: &str) -> Result<Box<dyn FrameDevice>, String> {
    via_user::open_device(dev).map_err(|e| format!("opening {dev}: {e}"))
}

/// Takes every frame waiting on `d`; how many.
fn drain(d: &mut dyn FrameDevice) -> Result<usize, String> {
    let mut n = 0;
    loop {
        let got = d.receive(64, &mut |_| {}).map_err(|e| format!("receive: {e}"))?;
        if got == 0 {
            return Ok(n);
        }
        n += got;
    }
}

pub fn the_next_frame_moves_the_watched_word(devs: &[String]) -> Result<(), String> {
    let (mut rx, mut tx) = (open(&devs[0])?, open(&devs[1])?);
    drain(rx.as_mut())?;
    let mut w = RxWatches::default();
    rx.rx_watch(&mut w);
    if !w.usable() {
        return Err(format!("{} reports no watched word for its next frame", devs[0]));
    }
    if w.changed() {
        return Err("the watched word moved with the ring empty".into());
    }
    if rx.rx_pending() != Some(false) {
        return Err(format!("rx_pending with the ring empty: {:?}", rx.rx_pending()));
    }
    let mut frame = vec![0u8; 64];
    frame[..6].copy_from_slice(&rx.mac().0);
    frame[6..12].copy_from_slice(&tx.mac().0);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    frame[14..23].copy_from_slice(b"watched!\0");
    let t0 = Instant::now();
    while tx.transmit(&[TxFrame::new(&frame)]).map_err(|e| format!("transmit: {e}"))? == 0 {
        if t0.elapsed() > DEADLINE {
            return Err("the sending NIC took no frame".into());
        }
    }
    while !w.changed() {
        if t0.elapsed() > DEADLINE {
            return Err(format!("the watched word did not move within {DEADLINE:?} of the frame's sending"));
        }
        std::hint::spin_loop();
    }
    if rx.rx_pending() != Some(true) {
        return Err(format!("the word moved but rx_pending says {:?}", rx.rx_pending()));
    }
    let mut got = Vec::new();
    rx.receive(64, &mut |f| got.push(f.to_vec())).map_err(|e| format!("receive: {e}"))?;
    if !got.iter().any(|f| f.len() >= 23 && f[..23] == frame[..23]) {
        return Err(format!("the receive after the word moved did not hand over the frame ({} frames)", got.len()));
    }
    if rx.rx_pending() != Some(false) {
        return Err(format!("rx_pending after the frame was taken: {:?}", rx.rx_pending()));
    }
    println!("  the word moved {:?} after the frame was handed to the other NIC", t0.elapsed());
    Ok(())
}
