/* udp_offload.h: what the probes of issue 25 (gso_probe.c, tx_path_probe.c,
 * rx_path_probe.c) write after a datagram's IPv4 header for the kernel (or a NIC) to finish
 * it: the UDP checksum field holding the pseudo-header's sum
 * (VIRTIO_NET_HDR_F_NEEDS_CSUM), and, for a payload longer than `seg`, a
 * request to cut it into `seg`-byte datagrams (VIRTIO_NET_HDR_GSO_UDP_L4)
 * behind `hdr_len` bytes of headers. The UDP header starts 34 bytes into
 * the frame (Ethernet, IPv4 without options). */
#ifndef UDP_OFFLOAD_H
#define UDP_OFFLOAD_H

#include <arpa/inet.h>
#include <linux/virtio_net.h>
#include <netinet/ip.h>
#include <netinet/udp.h>

#ifndef VIRTIO_NET_HDR_GSO_UDP_L4
#define VIRTIO_NET_HDR_GSO_UDP_L4 5
#endif

static void udp_offload(struct virtio_net_hdr *v, const struct iphdr *ip, struct udphdr *u, int pay, int seg, int hdr_len) {
    unsigned long s = 0;
    const unsigned short *w = (const void *)&ip->saddr;
    for (int i = 0; i < 4; i++) s += w[i];
    s += htons(IPPROTO_UDP) + htons(8 + pay);
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    u->check = (unsigned short)s;
    v->flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    v->csum_start = 34;
    v->csum_offset = 6;
    if (pay > seg) {
        v->gso_type = VIRTIO_NET_HDR_GSO_UDP_L4;
        v->gso_size = (unsigned short)seg;
        v->hdr_len = (unsigned short)hdr_len;
    }
}

#endif
