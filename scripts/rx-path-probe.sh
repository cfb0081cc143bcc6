#!/usr/bin/env bash
# Issue 25's receiving half of the large-message path, measured before it
# is settled: which receive-side socket setup gets a 64 KiB message (two
# UDP superframes of 1,472-byte units) across a veth pair (MTU 1500)
# soonest. A ping-pong against a 64-byte answer (small) or the message
# back (big: half the round trip is the one-way time), both ends
# receiving through a TPACKET_V2 ring set up one of three ways
# (via-pingpong/probe/rx_path_probe.c says which): all, ip, thresh.
# Two test hosts as network namespaces (10.9.0.1 and 10.9.0.2), each with
# the port rule of `via-agent udp-port install 4792`; server pinned to
# CPU 0, client to CPU 1. Both ends must use the same setup, so each
# (round, setup) is a fresh server and client, the setups alternating
# round by round. Prints per setup the median round trip of each round
# and the median of those, and the mean time of a message's two sendmsg
# calls (the median of the rounds'; over veth the peer's receive, its
# ring's copy included, runs inside them).
# Needs root, nft and a C compiler.
# Usage: scripts/rx-path-probe.sh [ANSWER [ROUNDS [ITERS]]]
#        (default big 5 20000; ANSWER small or big)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/veth-pair.sh
answer="${1:-big}"; rounds="${2:-5}"; iters="${3:-20000}"
case "$answer" in
    small|big) ;;
    *) echo "usage: scripts/rx-path-probe.sh [small|big [ROUNDS [ITERS]]]" >&2; exit 2 ;;
esac
configs=(all ip thresh)
port=4792
work="$(mktemp -d /tmp/rx-path-probe.XXXXXX)"
a="rxp-a-$$"; b="rxp-b-$$"; va="rxa$$"; vb="rxb$$"
server=""
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null || true
    remove_hosts "$a" "$b"; rm -rf "$work"
}
trap cleanup EXIT

# drop_udp_port NS PORT: in namespace NS, the rule `via-agent udp-port
# install PORT` installs: UDP datagrams to PORT and to this host dropped
# at the IP layer's first hook (packet sockets have had theirs by then).
drop_udp_port() {
    ip netns exec "$1" nft add table ip "via_udp_$2"
    ip netns exec "$1" nft add chain ip "via_udp_$2" prerouting \
        '{ type filter hook prerouting priority raw; policy accept; }'
    ip netns exec "$1" nft add rule ip "via_udp_$2" prerouting udp dport "$2" fib daddr type local drop
}

# stop_server: waits up to 5 s for the server to end (at the empty
# datagram the client sends last); fails if it does not, or fails.
stop_server() {
    local i
    for ((i = 0; i < 50; i++)); do
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    if kill "$server" 2>/dev/null; then
        echo "rx_path_probe server did not end" >&2; exit 1
    fi
    wait "$server" || { server=""; echo "rx_path_probe server failed" >&2; exit 1; }
    server=""
    exec 3<&-
}

# median: the median of the numbers on stdin, one a line (the upper one
# of an even count, as the probes take it).
median() {
    sort -g | awk '{ v[NR] = $1 } END { print v[int(NR / 2) + 1] }'
}

cc -O2 -Wall -Wextra -o "$work/rx_path_probe" via-pingpong/probe/rx_path_probe.c
veth_pair "$a" "$b" "$va" "$vb"
ip -n "$a" addr add 10.9.0.1/24 dev "$va"
ip -n "$b" addr add 10.9.0.2/24 dev "$vb"
drop_udp_port "$a" "$port"
drop_udp_port "$b" "$port"
mac_a="$(mac_of "$a" "$va")"
mac_b="$(mac_of "$b" "$vb")"

for ((round = 0; round < rounds; round++)); do
    for ((q = 0; q < ${#configs[@]}; q++)); do
        cfg="${configs[(q + round) % ${#configs[@]}]}" # each round starts one setup further along
        exec 3< <(exec ip netns exec "$b" taskset -c 0 "$work/rx_path_probe" server "$vb" "$mac_a" "$cfg" "$answer")
        server=$!
        ready=""
        read -r -t 10 ready <&3 || true
        [ "$ready" = READY ] || { echo "rx_path_probe server ($cfg) did not start" >&2; exit 1; }
        ip netns exec "$a" taskset -c 1 "$work/rx_path_probe" client "$va" "$mac_b" "$cfg" "$answer" "$iters" \
            >> "$work/$cfg.out"
        stop_server
    done
done

for cfg in "${configs[@]}"; do
    rtts="$(sed -n 's/.* rtt_median_us=\([0-9.]*\).*/\1/p' "$work/$cfg.out")"
    sends="$(sed -n 's/.* send_us=\([0-9.]*\).*/\1/p' "$work/$cfg.out")"
    rtt="$(median <<< "$rtts")"
    line="$(printf '%-6s answer=%s: round trip per round (us): %s; median %s' \
        "$cfg" "$answer" "$(paste -sd" " <<< "$rtts")" "$rtt")"
    if [ "$answer" = big ]; then
        line+="$(awk -v r="$rtt" 'BEGIN { printf " (one way %.2f)", r / 2 }')"
    fi
    echo "$line; sendmsg pair (us): median $(median <<< "$sends")"
done
