#!/usr/bin/env bash
# Instructions per one-way 64-byte message, both ends, counted by callgrind
# on the engine_cost bench (two NICs in one thread over an in-memory queue
# device, the full Rust API): the measured loop only (setup excluded), as
# send/receive and as RDMA write; and per RDMA read (the read_cost bench,
# the same harness: a read's request and response, both ends).
# Needs valgrind. Usage: scripts/engine-instructions.sh [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
iters="${1:-50000}"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
built="$(cargo bench -p via-user --bench engine_cost --bench read_cost --no-run --message-format=json 2>/dev/null)"
bench="$(echo "$built" | sed -n 's/.*"executable":"\([^"]*engine_cost[^"]*\)".*/\1/p' | tail -1)"
reads="$(echo "$built" | sed -n 's/.*"executable":"\([^"]*read_cost[^"]*\)".*/\1/p' | tail -1)"
[ -x "$bench" ] && [ -x "$reads" ] || { echo "could not build the engine_cost and read_cost benches" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# Instructions of the measured loop (setup left out) of one bench run
# with the environment given, its profile saved as $out/$1. The engine's
# clock reuses a reading for 10,000 counter ticks (~3 us natively);
# callgrind runs ~50x slower against the same counter, so the window is
# scaled alike, or every reading would go to the system clock as a native
# run's do not (via-user/src/clock.rs); the pause before a standalone ACK
# (VIA_ACK_IDLE_US, 20 us natively) likewise, or ACKs would go that a
# native run's messages, 0.2 us apart, never pause long enough for. The
# CRC is the instruction's, as
# natively: left to itself, a process under valgrind, whose crc32 is
# emulated bit by bit, would time the tables faster (via-wire crc32c.rs).
count() {
    local name="$1" bin="$bench"; shift
    if [ "${1%%=*}" = BIN ]; then bin="${1#BIN=}"; shift; fi
    env "$@" VIA_CLOCK_FRESH_TICKS="${VIA_CLOCK_FRESH_TICKS:-500000}" VIA_ACK_IDLE_US="${VIA_ACK_IDLE_US:-2000}" VIA_CRC32C="${VIA_CRC32C:-sse42}" valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*ping_pong*' \
         --callgrind-out-file="$out/$name" "$bin" >/dev/null 2>&1
    callgrind_annotate "$out/$name" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}
printf '%-14s %-7s %12s\n' mode device instructions
for device in queue shm composite; do
for mode in send write; do
    total="$(count "$device-$mode" DEVICE="$device" ITERS="$iters" ONLY="$mode")"
    printf '%-14s %-7s %12d\n' "$mode" "$device" $((total / (iters * 2)))
done
done
# An RDMA read of 64 bytes, its request and its response, both ends'
# work, the peer's engine serving it as a passive target's does: what
# MTTL's small remote read costs the engines (the read_cost bench).
for device in queue shm; do
    total="$(count "$device-read" BIN="$reads" DEVICE="$device" ITERS="$iters" ONLY=read)"
    printf '%-14s %-7s %12d   (an RDMA read: request and response)\n' read "$device" $((total / (iters * 2)))
done
# Receives of two segments (a 32-byte header, then the rest), as
# via-pingpong posts them.
total="$(count "shm-send-2seg" RECV_SEGS=2 DEVICE=shm ITERS="$iters" ONLY=send)"
printf '%-14s %-7s %12d   (receives of two segments)\n' send shm $((total / (iters * 2)))
# A 64 KiB message: 46 fragments of a 1500-byte MTU on the queue device,
# its frames vouched for (no CRC-32C, as VIA in UDP with the checksum
# offloaded): what each fragment costs the engine, both ends.
big_iters=$(( iters / 50 > 100 ? iters / 50 : 100 ))
for mode in send write; do
    total="$(count "big-$mode" SIZE=65536 VOUCHED=1 DEVICE=queue ITERS="$big_iters" ONLY="$mode")"
    printf '%-14s %-7s %12d   (64 KiB, vouched; %d per fragment)\n' "$mode" "queue" $((total / (big_iters * 2))) $((total / (big_iters * 2 * 46)))
done
echo "(per one-way 64 B message, both ends, $iters round trips, callgrind; the"
echo " device's own work is included: the queue device's mutex and copy per frame"
echo " and the CRC-32C; the shared-memory wire's slot writes, no CRC; the"
echo " composite's routing over that wire beside an idle NIC, as via-shm runs)"
