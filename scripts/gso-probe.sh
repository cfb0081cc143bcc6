#!/usr/bin/env bash
# Issue 25's first measurement: what one AF_PACKET send of a UDP GSO
# "superframe" moves across a veth pair (MTU 1500), against one send per
# 1500-byte datagram, received with recv() and through a TPACKET_V2 ring
# (via-pingpong/probe/gso_probe.c says what it does).
# Two test hosts as network namespaces, sender pinned to CPU 0, receiver
# to CPU 1; 1,500 MB per size. Needs root and a C compiler.
# Usage: scripts/gso-probe.sh [PAYLOAD ...]   (default 1472 8832 32384 64768)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/veth-pair.sh
sizes=("${@:-1472 8832 32384 64768}")
work="$(mktemp -d /tmp/gso-probe.XXXXXX)"
a="gso-a-$$"; b="gso-b-$$"; va="gsa$$"; vb="gsb$$"
cleanup() { remove_hosts "$a" "$b"; rm -rf "$work"; }
trap cleanup EXIT
cc -O2 -o "$work/gso_probe" via-pingpong/probe/gso_probe.c
veth_pair "$a" "$b" "$va" "$vb"
mac="$(mac_of "$b" "$vb")"
for pay in ${sizes[*]}; do
    exec 3< <(ip netns exec "$b" taskset -c 1 "$work/gso_probe" recv "$vb" 4)
    read -r ready <&3 # bound before the first frame
    [ "$ready" = READY ] || { echo "gso_probe recv did not start" >&2; exit 1; }
    echo "payload $pay: $(ip netns exec "$a" taskset -c 0 "$work/gso_probe" send "$va" "$mac" 1500 "$pay")"
    echo "             $(cat <&3)"
    exec 3<&-
    # The same into a TPACKET_V2 receive ring, as the software NIC reads.
    exec 3< <(ip netns exec "$b" taskset -c 1 "$work/gso_probe" ring "$vb" 4)
    read -r ready <&3
    [ "$ready" = READY ] || { echo "gso_probe ring did not start" >&2; exit 1; }
    ip netns exec "$a" taskset -c 0 "$work/gso_probe" send "$va" "$mac" 1500 "$pay" >/dev/null
    echo "             $(cat <&3)"
    exec 3<&-
done
