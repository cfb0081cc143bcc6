#!/bin/bash
# Striping: 1 MiB bandwidth of VIA over two links against one, in the same
# run (issue 28). Needs root.
#
# Hosts sa and sb (network namespaces) are joined by two veth pairs, each
# end shaped by a token bucket to RATE (default 1gbit: the Gigabit
# Ethernet NICs MP_Lite bonded), since veth itself has no line rate. In
# RUNS alternating rounds it times, at 1 MiB:
#   one   VIA over the first link (/dev/via_sa0, the plain device)
#   two   VIA over a composite of both links whose hosts files name the
#         peer on both: its large frames are striped across them
#   tcp   TCP over the first link (the same shaping), for reference
# and prints every round's MB/s and the ratio two/one of each round and of
# the medians. The transmit queues are not bypassed (VIA_QDISC_BYPASS=0)
# so that the shaping holds for VIA as for TCP.
#
# Usage: scripts/stripe-bandwidth.sh [RUNS]     (env: RATE, ITERS, MTU)
set -euo pipefail
RUNS=${1:-5}
RATE=${RATE:-1gbit}
ITERS=${ITERS:-200}
MTU=${MTU:-1500}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "stripe-bandwidth: needs root (namespaces, veth, tc)" >&2; exit 1; }
cargo build -q --release --bin via-pingpong
PP=$PWD/target/release/via-pingpong
TAG=st$$
A=${TAG}a B=${TAG}b
DIR=$(mktemp -d)
cleanup() {
    ip netns pids "$B" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
ip netns add "$A"
ip netns add "$B"
for i in 0 1; do
    ip link add "${A}$i" mtu "$MTU" netns "$A" type veth peer name "${B}$i" mtu "$MTU" netns "$B"
    for end in "$A:${A}$i" "$B:${B}$i"; do
        ns=${end%%:*} dev=${end#*:}
        ip -n "$ns" link set "$dev" up
        # A 4 MB queue: a window of either transport waits, never drops.
        ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst 32kb limit 4mb
    done
done
ip -n "$A" link set lo up
ip -n "$B" link set lo up
ip -n "$A" addr add 10.77.0.1/24 dev "${A}0"
ip -n "$B" addr add 10.77.0.2/24 dev "${B}0"
mac() { ip -n "$1" -o link show "$2" | sed -E 's/.*link\/ether ([0-9a-f:]+).*/\1/'; }
MA0=$(mac "$A" "${A}0") MA1=$(mac "$A" "${A}1") MB0=$(mac "$B" "${B}0") MB1=$(mac "$B" "${B}1")
# Each host names the other by its first MAC, reached by both links.
echo "sa $MA0" >"$DIR/hosts-one"
echo "sb $MB0" >>"$DIR/hosts-one"
printf 'sa %s /dev/via_%s=%s /dev/via_%s=%s\nsb %s\n' "$MA0" "${B}0" "$MA0" "${B}1" "$MA1" "$MB0" >"$DIR/hosts-b"
printf 'sb %s /dev/via_%s=%s /dev/via_%s=%s\nsa %s\n' "$MB0" "${A}0" "$MB0" "${A}1" "$MB1" "$MA0" >"$DIR/hosts-a"

# One round of `kind`: prints its 1 MiB MB/s.
round() {
    local kind=$1 port=$((20000 + RANDOM % 20000)) sdev cdev shosts chosts peer out
    local common=(--bw-sizes 1048576 --sizes 1048576 --iters "$ITERS" --port "$port")
    case $kind in
        one) sdev=/dev/via_${B}0 cdev=/dev/via_${A}0 shosts=$DIR/hosts-one chosts=$DIR/hosts-one peer=sb ;;
        two) sdev=/dev/via_${B}0+/dev/via_${B}1 cdev=/dev/via_${A}0+/dev/via_${A}1 shosts=$DIR/hosts-b chosts=$DIR/hosts-a peer=sb ;;
        tcp) ;;
    esac
    if [ "$kind" = tcp ]; then
        ip netns exec "$B" "$PP" server --transport tcp --cpu 0 "${common[@]}" >"$DIR/server.log" 2>&1 &
        out=$(ip netns exec "$A" "$PP" client --transport tcp --peer 10.77.0.2 --cpu 1 --json "${common[@]}" 2>"$DIR/client.err")
    else
        VIA_QDISC_BYPASS=0 VIA_HOSTS=$shosts ip netns exec "$B" "$PP" server --device "$sdev" --cpu 0 "${common[@]}" >"$DIR/server.log" 2>&1 &
        out=$(VIA_QDISC_BYPASS=0 VIA_HOSTS=$chosts ip netns exec "$A" "$PP" client --device "$cdev" --peer "$peer" --cpu 1 --json --stats "${common[@]}" 2>"$DIR/client.err")
        cp "$DIR/client.err" "$DIR/stats-$kind"
    fi
    wait $! || true
    echo "$out" | python3 -c '
import json, sys
rows = [r for r in json.load(sys.stdin) if r["op"] == "bw"]
print("%.1f" % rows[-1]["mb_per_s"])' 2>/dev/null || { echo "stripe-bandwidth: $kind round failed:" >&2; cat "$DIR/client.err" "$DIR/server.log" >&2; exit 1; }
}

echo "1 MiB bandwidth, links shaped to $RATE each, MTU $MTU, $ITERS messages a round, $RUNS rounds"
declare -a ONE TWO TCP
for r in $(seq 1 "$RUNS"); do
    o=$(round one) t=$(round two) c=$(round tcp)
    ONE+=("$o") TWO+=("$t") TCP+=("$c")
    printf 'round %d: one link %8s MB/s   two links %8s MB/s   tcp one link %8s MB/s   two/one %s\n' "$r" "$o" "$t" "$c" "$(python3 -c "print('%.3f' % ($t / $o))")"
done
echo "engine counters of the last striped round (client):"; grep -E "retrans|out_of_order|duplicate|composite_tx|rto" "$DIR/stats-two" | tr -s " " | head -20 || true
python3 - "${ONE[*]}" "${TWO[*]}" "${TCP[*]}" <<'EOF'
import statistics, sys
one, two, tcp = ([float(x) for x in a.split()] for a in sys.argv[1:4])
m1, m2, mt = statistics.median(one), statistics.median(two), statistics.median(tcp)
print(f"medians: one link {m1:.1f} MB/s, two links {m2:.1f} MB/s, tcp one link {mt:.1f} MB/s")
print(f"two/one = {m2 / m1:.3f} (target >= 1.8); one/tcp = {m1 / mt:.3f}; two/tcp = {m2 / mt:.3f}")
EOF
