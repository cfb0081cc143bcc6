#!/usr/bin/env python3
"""Writes the receive_path seeds (fuzz/seeds/receive_path/) in the input
format of tests/src/rig/receive_path.rs: a level byte (0 unreliable,
1 reliable delivery, 2 reliable reception), then operations, each an op
byte (taken mod 10) and its arguments, numbers big-endian:
  0 foreign frame: u16 length, u16 fix mask, the frame's bytes
  4/9 step; 5 the peer sends: u16 length
  6 victim op: u8 choice (0 send, 1 RDMA write, 2 RDMA read), u16 length, u16 remote offset
  7 the victim posts a receive
  8 violation: u8 target (0 past the window, 1 RDMA off, 2 other tag, 3 guard), u16 offset, u8 ahead, u16 length
Run from fuzz/: python3 receive_path_seeds.py"""
import os
import struct

HEADER = 78
ALL = 0xFFFE  # every field the genuine peer's, the victim's MAC
DATA, ACK, RDMA_WRITE, READ_REQ, READ_RESP, DISCONNECT, CONN_REQUEST = 0, 1, 2, 3, 4, 5, 6


def u16(v):
    return struct.pack(">H", v)


def frame(fix, payload=b"\xee" * 100, kind=DATA, **fields):
    """A foreign frame: zero header bytes but for the kind and `fields`
    (name: (offset, bytes)), then the payload."""
    f = bytearray(HEADER) + payload
    f[15] = kind
    for at, raw in fields.values():
        f[at:at + len(raw)] = raw
    return b"\x00" + u16(len(f)) + u16(fix) + bytes(f)


def step(n=1):
    return b"\x04" * n


def peer_sends(n):
    return b"\x05" + u16(n)


def victim(choice, n, remote=0):
    return b"\x06" + bytes([choice]) + u16(n) + u16(remote)


def violation(target, off=0, ahead=0, n=64):
    return b"\x08" + bytes([target]) + u16(off) + bytes([ahead]) + u16(n)


SRC_MAC = (6, bytes([2, 0xEE, 0, 0, 0, 9]))
SRC_EP = (22, struct.pack(">I", 0x12345678))
SRC_VI = (28, u16(0x77))
traffic = peer_sends(300) + peer_sends(512) + step(3) + peer_sends(0) + step(2)
seeds = {}
for level, name in [(0, "unreliable"), (1, "delivery"), (2, "reception")]:
    lv = bytes([level])
    # The genuine peer's frame in full but for one field, next in sequence,
    # ahead of the genuine messages: an engine that took it would put it
    # in receive 0.
    seeds[f"stale_generation_{name}"] = lv + frame(ALL) + traffic
    seeds[f"foreign_host_{name}"] = lv + frame(ALL & ~(1 << 4), src_mac=SRC_MAC) + traffic
    seeds[f"foreign_endpoint_{name}"] = lv + frame(ALL & ~(1 << 14), src_ep=SRC_EP) + traffic
    seeds[f"foreign_vi_{name}"] = lv + frame(ALL & ~(1 << 15), src_vi=SRC_VI) + traffic
    seeds[f"stale_disconnect_{name}"] = lv + peer_sends(100) + step() + frame(ALL, b"", kind=DISCONNECT) + traffic
    seeds[f"stale_rdma_write_{name}"] = lv + frame(ALL, kind=RDMA_WRITE) + victim(1, 200, 64) + traffic
    seeds[f"mixed_{name}"] = (lv + peer_sends(40) + b"\x07" + victim(0, 300) + frame(ALL & ~(1 << 6)) + victim(1, 512, 3000)
                               + frame(ALL, kind=ACK, payload=b"") + peer_sends(512) + frame(ALL & ~(1 << 13), kind=CONN_REQUEST, payload=bytes(40))
                               + victim(2, 400, 100) + step(2) + frame(0x0001, payload=bytes(range(200))) + peer_sends(1) + b"\x07" + peer_sends(77)
                               + frame(ALL & ~(1 << 7)) + victim(0, 0) + step(5))
# A stale read response while the victim reads: it must not land.
seeds["stale_read_response"] = b"\x01" + victim(2, 300, 50) + frame(ALL, kind=READ_RESP) + step() + frame(ALL, kind=READ_RESP) + traffic
seeds["stale_read_request"] = b"\x02" + frame(ALL, kind=READ_REQ, payload=b"") + traffic
# The peer's own violations: the connection breaks, reported as such.
seeds["violation_past_window"] = b"\x01" + peer_sends(100) + step(3) + violation(0, 5, 0, 64) + traffic
seeds["violation_rdma_off"] = b"\x02" + peer_sends(100) + victim(0, 100) + step(3) + violation(1, 100, 0, 200) + traffic
seeds["violation_ahead"] = b"\x01" + violation(2, 7, 1, 20) + traffic + victim(1, 100, 8)
seeds["violation_guard"] = b"\x02" + peer_sends(512) + violation(3, 0, 0, 1) + traffic
seeds["violation_stale_psn"] = b"\x01" + peer_sends(200) + step() + violation(1, 0, 0, 8) + step(4) + peer_sends(9) + peer_sends(33) + step()

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "receive_path")
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {out}")
