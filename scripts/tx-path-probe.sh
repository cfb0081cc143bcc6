#!/usr/bin/env bash
# Issue 25's candidates for the large-message path, measured before one is
# built: which way of handing a UDP superframe to AF_PACKET gets it across
# a veth pair (MTU 1500) soonest. A ping-pong of one superframe against a
# 64-byte answer, the client sending by three paths in alternating rounds
# (via-pingpong/probe/tx_path_probe.c says which). Two test hosts as
# network namespaces, server pinned to CPU 0, client to CPU 1.
# Needs root and a C compiler.
# Usage: scripts/tx-path-probe.sh [PAYLOAD [SEG [ROUNDS [ITERS]]]]
#        (default 64768 1472 7 2000: one superframe of 44 units)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/veth-pair.sh
pay="${1:-64768}"; seg="${2:-1472}"; rounds="${3:-7}"; iters="${4:-2000}"
work="$(mktemp -d /tmp/tx-path-probe.XXXXXX)"
a="txp-a-$$"; b="txp-b-$$"; va="txa$$"; vb="txb$$"
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null || true
    remove_hosts "$a" "$b"; rm -rf "$work"
}
trap cleanup EXIT
cc -O2 -o "$work/tx_path_probe" via-pingpong/probe/tx_path_probe.c
veth_pair "$a" "$b" "$va" "$vb"
mac_a="$(mac_of "$a" "$va")"
mac_b="$(mac_of "$b" "$vb")"
exec 3< <(exec ip netns exec "$b" taskset -c 0 "$work/tx_path_probe" server "$vb" "$mac_a")
read -r ready <&3
[ "$ready" = READY ] || { echo "tx_path_probe server did not start" >&2; exit 1; }
ip netns exec "$a" taskset -c 1 "$work/tx_path_probe" client "$va" "$mac_b" "$pay" "$seg" "$rounds" "$iters"
