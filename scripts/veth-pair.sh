# Sourced by the probe scripts (not run): two network namespaces joined by
# a veth pair, the test hosts of a measurement. The caller removes the
# namespaces in its own exit trap (remove_hosts, below).

# veth_pair NS_A NS_B IF_A IF_B: namespaces NS_A and NS_B, joined by a veth
# pair whose end IF_A lies in NS_A and IF_B in NS_B, both ends up.
veth_pair() {
    ip netns add "$1"; ip netns add "$2"
    ip link add "$3" type veth peer name "$4"
    ip link set "$3" netns "$1"; ip link set "$4" netns "$2"
    ip -n "$1" link set "$3" up; ip -n "$2" link set "$4" up
}

# mac_of NS IF: the MAC address of interface IF in namespace NS.
mac_of() {
    ip -n "$1" -o link show "$2" | grep -o 'link/ether [0-9a-f:]*' | cut -d' ' -f2
}

# remove_hosts NS...: deletes each namespace that exists (for the caller's
# exit trap; one already gone, or never made, is no error).
remove_hosts() {
    local ns
    for ns in "$@"; do ip netns del "$ns" 2>/dev/null || true; done
}
