/* probe_frames.h: what the ping-pong probes of issue 25 (tx_path_probe.c,
 * rx_path_probe.c) share: their includes, the socket options older headers
 * lack, the sizes of the headers in front of a datagram's payload, the UDP
 * port 4792, a clock in seconds, dying at a failed system call, reading a
 * MAC address, and the headers of a datagram or superframe between the
 * client (10.9.0.1) and the server (10.9.0.2). Define _GNU_SOURCE before
 * including it. */
#ifndef PROBE_FRAMES_H
#define PROBE_FRAMES_H

#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "udp_offload.h"

#ifndef PACKET_QDISC_BYPASS
#define PACKET_QDISC_BYPASS 20
#endif
#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

#define VNET ((int)sizeof(struct virtio_net_hdr))
#define OUTER (14 + 20 + 8)
#define PORT 4792

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int die(const char *what) {
    perror(what);
    exit(1);
}

static int parse_mac(const char *s, unsigned char mac[6]) {
    unsigned m[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6) return -1;
    for (int i = 0; i < 6; i++) mac[i] = (unsigned char)m[i];
    return 0;
}

/* virtio_net_hdr + Ethernet + IPv4 + UDP for `pay` bytes of UDP payload to
 * `mac`, cut into `seg`-byte units when longer (NEEDS_CSUM: the field holds
 * the pseudo-header's sum: udp_offload.h). */
static void outer(unsigned char *b, const unsigned char mac[6], int pay, int seg, int from_client) {
    memset(b, 0, VNET + OUTER);
    struct virtio_net_hdr *v = (void *)b;
    unsigned char *e = b + VNET;
    memcpy(e, mac, 6);
    memset(e + 6, 0x02, 6);
    e[12] = 0x08;
    struct iphdr *ip = (void *)(e + 14);
    ip->version = 4;
    ip->ihl = 5;
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->saddr = inet_addr(from_client ? "10.9.0.1" : "10.9.0.2");
    ip->daddr = inet_addr(from_client ? "10.9.0.2" : "10.9.0.1");
    ip->tot_len = htons(20 + 8 + pay);
    unsigned long s = 0;
    for (int i = 0; i < 10; i++) s += ((unsigned short *)ip)[i];
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    ip->check = (unsigned short)~s;
    struct udphdr *u = (void *)(e + 34);
    u->source = u->dest = htons(PORT);
    u->len = htons(8 + pay);
    udp_offload(v, ip, u, pay, seg, OUTER);
}

#endif
