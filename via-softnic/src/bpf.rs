//! Classic BPF receive filters for the packet socket: the kernel drops
//! every frame that is not for one of our endpoints before it reaches the
//! receive ring. One program for raw VIA frames (EtherType 0x88B5), one
//! for VIA in UDP/IPv4 datagrams (`udp`); both accept iff the frame's
//! destination-endpoint word is one of the filter's.

use std::io;
use via_device::{RxFilter, ETH_HEADER_LEN};

const LDW_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const LDH_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Where a test jumps: the next instruction, or one of the two returns
/// every program ends with.
#[derive(Clone, Copy)]
enum To {
    Next,
    Drop,
    Accept,
}

/// A program under construction: tests whose jumps name their targets,
/// resolved to the kernel's relative offsets by [`Program::finish`].
struct Program {
    ins: Vec<(u16, To, To, u32)>,
}

impl Program {
    fn new() -> Program {
        Program { ins: Vec::new() }
    }

    /// Loads `code` (a load opcode) from byte offset `at`.
    fn load(&mut self, code: u16, at: usize) -> io::Result<&mut Self> {
        let k = u32::try_from(at)
            .ok()
            .filter(|o| *o < 0x1_0000)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("receive filter offset {at} is beyond any frame")))?;
        self.ins.push((code, To::Next, To::Next, k));
        Ok(self)
    }

    fn test(&mut self, code: u16, k: u32, yes: To, no: To) -> &mut Self {
        self.ins.push((code, yes, no, k));
        self
    }

    /// The endpoint test: the word at `at` is one of `accept`.
    fn endpoint(&mut self, at: usize, accept: [u32; 2]) -> io::Result<&mut Self> {
        self.load(LDW_ABS, at)?;
        self.test(JEQ_K, accept[0], To::Accept, To::Next);
        Ok(self.test(JEQ_K, accept[1], To::Accept, To::Drop))
    }

    /// The program, with `ret -1` (accept the whole frame) and `ret 0`
    /// (drop) at its end: a program whose tests all pass falls through to
    /// the accept.
    fn finish(&self) -> Vec<libc::sock_filter> {
        let n = self.ins.len();
        let (accept_at, drop_at) = (n, n + 1);
        let rel = |pc: usize, to: To| -> u8 {
            let target = match to {
                To::Next => pc + 1,
                To::Drop => drop_at,
                To::Accept => accept_at,
            };
            (target - pc - 1) as u8
        };
        let mut out: Vec<libc::sock_filter> = self.ins.iter().enumerate().map(|(pc, &(code, yes, no, k))| libc::sock_filter { code, jt: rel(pc, yes), jf: rel(pc, no), k }).collect();
        out.push(libc::sock_filter { code: RET_K, jt: 0, jf: 0, k: u32::MAX });
        out.push(libc::sock_filter { code: RET_K, jt: 0, jf: 0, k: 0 });
        out
    }
}

/// Raw VIA frames: accept iff the EtherType is `f.ethertype` and the
/// big-endian word at `f.offset` is one of `f.accept`. Loads past the end
/// of a frame drop it.
pub(crate) fn ethernet_program(f: &RxFilter) -> io::Result<Vec<libc::sock_filter>> {
    let mut p = Program::new();
    p.load(LDH_ABS, 12)?.test(JEQ_K, u32::from(f.ethertype), To::Next, To::Drop);
    p.endpoint(f.offset, f.accept)?;
    Ok(p.finish())
}

/// VIA in UDP/IPv4 (`crate::udp`): accept iff the frame is an IPv4
/// datagram with a 20-byte header, not a fragment, UDP to `port`, and (with
/// a filter) the word at the filter's offset, moved past the IPv4 and UDP
/// headers, is one of its `accept`. `f.offset` counts from the start of
/// the raw VIA frame the device hands on (Ethernet header, VIA header).
pub(crate) fn udp_program(port: u16, f: Option<&RxFilter>) -> io::Result<Vec<libc::sock_filter>> {
    use crate::udp::{ENCAP_LEN, IPV4_START};
    let mut p = Program::new();
    p.load(LDH_ABS, 12)?.test(JEQ_K, 0x0800, To::Next, To::Drop);
    p.load(LDB_ABS, IPV4_START)?.test(JEQ_K, 0x45, To::Next, To::Drop); // version 4, no options
    p.load(LDB_ABS, IPV4_START + 9)?.test(JEQ_K, 17, To::Next, To::Drop); // UDP
    p.load(LDH_ABS, IPV4_START + 6)?.test(JSET_K, 0x3fff, To::Drop, To::Next); // MF or an offset: a fragment
    p.load(LDH_ABS, IPV4_START + 22)?.test(JEQ_K, u32::from(port), To::Next, To::Drop); // destination port
    if let Some(f) = f {
        if f.offset < ETH_HEADER_LEN {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("receive filter offset {} lies in the Ethernet header, which UDP frames do not carry", f.offset)));
        }
        p.endpoint(f.offset + ENCAP_LEN, f.accept)?;
    }
    Ok(p.finish())
}

/// Runs a program with the kernel's semantics for the opcodes used here
/// (a load past the end drops the frame): the verdict.
#[cfg(test)]
pub(crate) fn run(prog: &[libc::sock_filter], frame: &[u8]) -> u32 {
    let (mut pc, mut a) = (0usize, 0u32);
    loop {
        let i = prog[pc];
        let k = i.k as usize;
        let load = |n: usize| frame.get(k..k + n).map(|b| b.iter().fold(0u32, |a, &x| a << 8 | u32::from(x)));
        match i.code {
            LDW_ABS | LDH_ABS | LDB_ABS => match load([4, 2, 1][usize::from((i.code - LDW_ABS) / 8)]) {
                Some(v) => a = v,
                None => return 0,
            },
            JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
            JSET_K => pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf }),
            RET_K => return i.k,
            c => panic!("opcode {c:#x} not expected"),
        }
        pc += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize, ethertype: u16, offset: usize, word: u32) -> Vec<u8> {
        let mut f = vec![0xa5u8; len];
        if len >= 14 {
            f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        }
        if let Some(w) = f.get_mut(offset..offset + 4) {
            w.copy_from_slice(&word.to_be_bytes());
        }
        f
    }

    fn well_formed(prog: &[libc::sock_filter]) {
        for (pc, i) in prog.iter().enumerate().filter(|(_, i)| i.code == JEQ_K || i.code == JSET_K) {
            assert!(pc + 1 + usize::from(i.jt.max(i.jf)) < prog.len(), "jump out of the program at {pc}");
        }
        assert_eq!(prog.last().unwrap().code, RET_K);
    }

    #[test]
    fn ethernet_program_agrees_with_the_software_filter() {
        for (ethertype, offset, accept) in [(0x88b5, 18, [7, 0]), (0x88b6, 18, [0xdead_beef, 0xdead_beef]), (0x88b5, 30, [1, 2])] {
            let f = RxFilter { ethertype, offset, accept };
            let prog = ethernet_program(&f).unwrap();
            well_formed(&prog);
            for len in [0, 13, 14, offset + 3, offset + 4, 64, 1514] {
                for et in [ethertype, 0x0800, 0x88b7] {
                    for word in [accept[0], accept[1], 3, 0xffff_ffff] {
                        let fr = frame(len, et, offset, word);
                        let verdict = run(&prog, &fr);
                        assert_eq!(verdict != 0, f.matches(&fr), "{f:?} len {len} ethertype {et:#x} word {word:#x}");
                        assert!(verdict == 0 || verdict as usize >= fr.len(), "accepting truncates");
                    }
                }
            }
        }
        let absurd = RxFilter { ethertype: 0x88b5, offset: 1 << 20, accept: [0, 0] };
        assert_eq!(ethernet_program(&absurd).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn udp_program_takes_our_datagrams_for_our_endpoints_only() {
        use crate::udp::{Outer, ENCAP_LEN};
        use std::net::Ipv4Addr;
        let port = 34997;
        let f = RxFilter { ethertype: via_device::ETHERTYPE, offset: 18, accept: [7, 9] };
        let with_filter = udp_program(port, Some(&f)).unwrap();
        let any = udp_program(port, None).unwrap();
        well_formed(&with_filter);
        well_formed(&any);
        let mut outer = Outer::new(via_device::MacAddr([2, 0, 0, 0, 0, 1]), Ipv4Addr::new(10, 0, 1, 1), port);
        let datagram = |outer: &mut Outer, word: u32, len: usize| {
            let mut fr = vec![0u8; ENCAP_LEN + 14 + len];
            let mut h = [0u8; crate::udp::OUTER_LEN];
            outer.emit(&mut h, via_device::MacAddr([2, 0, 0, 0, 0, 2]), Ipv4Addr::new(10, 0, 2, 2), len);
            fr[..h.len()].copy_from_slice(&h);
            if let Some(w) = fr.get_mut(ENCAP_LEN + 18..ENCAP_LEN + 22) {
                w.copy_from_slice(&word.to_be_bytes());
            }
            fr
        };
        for (word, want) in [(7, true), (9, true), (8, false)] {
            let fr = datagram(&mut outer, word, 64);
            assert_eq!(run(&with_filter, &fr) != 0, want, "endpoint {word}");
            assert!(run(&any, &fr) != 0);
        }
        let ok = datagram(&mut outer, 7, 64);
        let spoil = |at: usize, v: u8| {
            let mut fr = ok.clone();
            fr[at] = v;
            fr
        };
        for (what, fr) in [
            ("another EtherType", spoil(12, 0x86)),
            ("IPv4 options", spoil(14, 0x46)),
            ("TCP", spoil(23, 6)),
            ("a fragment (MF)", spoil(20, 0x20)),
            ("a fragment (offset)", spoil(21, 1)),
            ("another port", spoil(37, 0)),
        ] {
            assert_eq!(run(&with_filter, &fr), 0, "{what}");
            assert_eq!(run(&any, &fr), 0, "{what}");
        }
        // Too short to hold the endpoint word.
        assert_eq!(run(&with_filter, &ok[..ENCAP_LEN + 20]), 0);
        let in_eth = RxFilter { offset: 4, ..f };
        assert_eq!(udp_program(port, Some(&in_eth)).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
