//! The interrupt check of `sleeping_waits_wake_on_interrupts`: a receive
//! wait that sleeps with nothing else able to wake it, woken by the
//! receiving NIC's interrupt through the VFIO eventfd. Nothing in it is
//! particular to one kind of NIC: it needs of the driver only an
//! interrupt eventfd and an `interrupts` device counter.
//!
//! Both NICs are opened in this process, each without the progress thread
//! and without spinning (`spin` 0), and the VI is unreliable, so no
//! retransmission or ACK timer is armed. The receiving thread's wait then
//! sleeps in ppoll(2) on the NIC's interrupt eventfd and its own wake-up
//! eventfd, which only a thread calling into the same NIC writes (none
//! does: the sender uses the other NIC). Only once the receiver is seen
//! asleep in ppoll (`/proc/self/task/TID/syscall`) does the other NIC
//! send; the wait must then return the message, and the receiving NIC's
//! `interrupts` counter (interrupts taken from the eventfd, counted when
//! the driver lets the interrupt through again before the next sleep) must
//! have moved. With the interrupt path broken (the NIC not raising it, or VFIO
//! not delivering it) the wait times out, or returns on some engine timer
//! without an interrupt counted: either fails.

use std::time::{Duration, Instant};
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, Vi, ViAttributes};

/// How long the woken wait may take before the check gives up on it.
const WAIT: Duration = Duration::from_secs(20);
const MESSAGE: &[u8] = b"woken by the receive interrupt";

/// Opens `dev` in this process with every wake-up source but the device off.
fn open_quiet(dev: &str) -> Result<Nic, String> {
    let device = via_user::open_device(dev).map_err(|e| format!("opening {dev}: {e}"))?;
    let config = Config { spin: Duration::ZERO, progress_thread: false, ..Config::from_env() };
    Nic::with_device(dev, device, config).map_err(|e| format!("VipOpenNic {dev}: {e}"))
}

fn interrupts(nic: &Nic) -> Result<u64, String> {
    nic.device_counters().into_iter().find(|(k, _)| *k == "interrupts").map(|(_, v)| v).ok_or_else(|| format!("{} reports no interrupts counter", nic.name()))
}

/// Is thread `tid` of this process blocked in ppoll(2)? (The first field
/// of /proc/self/task/TID/syscall is the number of the system call it is
/// blocked in, or `running`.)
fn asleep_in_ppoll(tid: i32) -> Result<bool, String> {
    let path = format!("/proc/self/task/{tid}/syscall");
    let s = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    Ok(s.split_whitespace().next() == Some(&libc::SYS_ppoll.to_string()))
}

fn descriptor(nic: &Nic, vi: &Vi, r: &MemoryRegion, len: usize) -> Result<Descriptor, String> {
    let mut d = Descriptor::new(nic, vi.attributes().ptag, 1).map_err(|e| format!("descriptor: {e}"))?;
    d.set_op(Op::SendRecv, &[(r, 0..len)], None, false).map_err(|e| format!("filling the descriptor: {e}"))?;
    Ok(d)
}

/// Receives on `receiver_dev`, sends from `sender_dev` (see the module).
pub fn receive_wait_is_woken_by_the_interrupt(receiver_dev: &str, sender_dev: &str) -> Result<(), String> {
    let (rx_nic, tx_nic) = (open_quiet(receiver_dev)?, open_quiet(sender_dev)?);
    let attrs = |nic: &Nic| -> Result<ViAttributes, String> {
        let ptag = nic.create_ptag().map_err(|e| format!("VipCreatePtag: {e}"))?;
        Ok(ViAttributes { reliability: Reliability::Unreliable, max_transfer_size: 1 << 16, ptag, enable_rdma_write: false, enable_rdma_read: false })
    };
    let mut rx_vi = rx_nic.create_vi(&attrs(&rx_nic)?, None, None).map_err(|e| format!("VipCreateVi: {e}"))?;
    let mut tx_vi = tx_nic.create_vi(&attrs(&tx_nic)?, None, None).map_err(|e| format!("VipCreateVi: {e}"))?;
    let region = |nic: &Nic, vi: &Vi| {
        MemoryRegion::new(nic, 4096, 4096, MemAttributes { ptag: vi.attributes().ptag, enable_rdma_write: false, enable_rdma_read: false }).map_err(|e| format!("VipRegisterMem: {e}"))
    };
    let (rx_buf, tx_buf) = (region(&rx_nic, &rx_vi)?, region(&tx_nic, &tx_vi)?);
    rx_vi.post_recv(descriptor(&rx_nic, &rx_vi, &rx_buf, 4096)?).map_err(|e| format!("VipPostRecv: {e}"))?;
    // Connect: the receiver accepts on a thread, the sender asks.
    let disc = b"irq-wake";
    let rx_mac = rx_nic.mac();
    std::thread::scope(|s| {
        let (nic, vi) = (&rx_nic, &mut rx_vi);
        let accepted = s.spawn(move || -> Result<(), String> {
            let req = nic.connect_wait(disc, Some(WAIT)).map_err(|e| format!("VipConnectWait: {e}"))?;
            nic.accept(&req, vi).map_err(|e| format!("VipConnectAccept: {e}"))
        });
        let asked = tx_vi.connect_retrying(rx_mac, disc, WAIT).map_err(|e| format!("VipConnectRequest: {e}"));
        accepted.join().map_err(|_| "the accepting thread panicked".to_string())??;
        asked
    })?;
    tx_buf.write(0, MESSAGE).map_err(|e| e.to_string())?;

    let (wait_result, before, waited) = std::thread::scope(|s| -> Result<_, String> {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let rx_vi = &mut rx_vi;
        let waiter = s.spawn(move || {
            // SAFETY: gettid(2) has no preconditions.
            let _ = tid_tx.send(unsafe { libc::gettid() });
            let t0 = Instant::now();
            let r = rx_vi.recv_wait(Some(WAIT));
            (r, t0.elapsed())
        });
        let tid = tid_rx.recv().map_err(|_| "the waiting thread did not start".to_string())?;
        // The receiver must be asleep, its count read, and still asleep
        // (so no interrupt was taken in between) before anything is sent.
        let deadline = Instant::now() + WAIT;
        let before = loop {
            if asleep_in_ppoll(tid)? {
                let n = interrupts(&rx_nic)?;
                if asleep_in_ppoll(tid)? {
                    break n;
                }
            }
            if waiter.is_finished() || Instant::now() > deadline {
                let (r, _) = waiter.join().map_err(|_| "the waiting thread panicked".to_string())?;
                return Err(format!("the receive wait never slept in ppoll (it returned {:?})", r.map(|d| d.status())));
            }
            std::thread::yield_now();
        };
        tx_vi.post_send(descriptor(&tx_nic, &tx_vi, &tx_buf, MESSAGE.len())?).map_err(|e| format!("VipPostSend: {e}"))?;
        tx_vi.send_wait(Some(WAIT)).map_err(|e| format!("VipSendWait: {e}"))?.check_ok().map_err(|e| format!("the send: {e}"))?;
        let (r, waited) = waiter.join().map_err(|_| "the waiting thread panicked".to_string())?;
        Ok((r, before, waited))
    })?;
    // The driver takes (and counts) an interrupt from the eventfd when a
    // wait is about to sleep again (FrameDevice::prepare_sleep): a short
    // wait that finds nothing sleeps, and so takes it.
    rx_vi.post_recv(descriptor(&rx_nic, &rx_vi, &rx_buf, 4096)?).map_err(|e| format!("VipPostRecv: {e}"))?;
    if rx_vi.recv_wait(Some(Duration::from_millis(2))).is_ok() {
        return Err("a second message arrived; one was sent".into());
    }
    let after = interrupts(&rx_nic)?;
    println!("  receive wait: woke after {:.1} ms; {} interrupts taken meanwhile", waited.as_secs_f64() * 1e3, after - before);
    let d = wait_result.map_err(|e| format!("the sleeping receive wait was not woken by the arriving frame ({} interrupts taken): {e}", after - before))?;
    d.check_ok().map_err(|e| format!("the receive: {e}"))?;
    let got = rx_buf.to_vec(0..MESSAGE.len()).map_err(|e| e.to_string())?;
    if d.length() as usize != MESSAGE.len() || got != MESSAGE {
        return Err(format!("received {} bytes {:?}, expected {:?}", d.length(), String::from_utf8_lossy(&got), String::from_utf8_lossy(MESSAGE)));
    }
    if after == before {
        return Err(format!("the receive completed after {waited:?} but no interrupt was taken: something other than the NIC's interrupt woke the wait"));
    }
    Ok(())
}
