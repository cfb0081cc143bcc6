/* gso_probe: what one send of a UDP "superframe" moves across a veth pair
 * (issue 25's first measurement: which large-message path to build).
 *
 * The sender writes Ethernet + IPv4 + UDP frames through an AF_PACKET
 * socket with PACKET_VNET_HDR, each with a virtio_net_hdr asking for UDP
 * segmentation (VIRTIO_NET_HDR_GSO_UDP_L4) into SEG-byte datagrams and for
 * the UDP checksum (NEEDS_CSUM). A real NIC (or the kernel's software GSO
 * in front of one) cuts such a frame into MTU-sized datagrams, each with
 * its own IP and UDP headers; a veth pair hands it to the peer whole. The
 * receiver, an AF_PACKET socket with PACKET_VNET_HDR on the peer, counts
 * the frames it gets, their size, and whether they still carry the GSO
 * note (one whole superframe: gso_type set). With PAYLOAD <= SEG the
 * frames are plain datagrams: the 1500-byte frame floor, one send each.
 *
 *   gso_probe send IFNAME DST_MAC MBYTES PAYLOAD [SEG]
 *   gso_probe recv IFNAME SECONDS
 *   gso_probe ring IFNAME SECONDS
 *
 * `ring` receives as the software NIC does: a TPACKET_V2 receive ring,
 * busy-polled in place, here with PACKET_VNET_HDR and 128 KiB slots.
 *
 * The sender prints "sent N frames of P B payload: X MB/s"; the receiver
 * "READY" once bound, then "received N frames, B payload bytes, largest L, gso G; X MB/s". Nothing
 * paces the sender: a receiver that falls behind loses frames (counted by
 * the difference), so X at the receiver is what got through. UDP port
 * 4791, IPs 10.9.0.1 -> 10.9.0.2 (scripts/gso-probe.sh sets them up).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "udp_offload.h"


#define HEADERS (14 + 20 + 8)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The Internet checksum of n bytes at p (network order). */
static unsigned short inet_sum(const void *p, int n) {
    const unsigned short *w = p;
    unsigned long s = 0;
    for (; n > 1; n -= 2) s += *w++;
    if (n) s += *(const unsigned char *)w;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (unsigned short)~s;
}

static int die(const char *what) {
    perror(what);
    return 1;
}

static unsigned char buf[70000];

static int send_frames(int fd, const char *mac, long mbytes, int pay, int seg) {
    unsigned m[6];
    if (sscanf(mac, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6) {
        fprintf(stderr, "gso_probe: bad MAC %s\n", mac);
        return 1;
    }
    if (pay < 1 || HEADERS + pay > 65535 + 14 - 20) {
        fprintf(stderr, "gso_probe: payload %d out of range\n", pay);
        return 1;
    }
    struct virtio_net_hdr *v = (void *)buf;
    unsigned char *e = buf + sizeof *v;
    memset(buf, 0, sizeof *v + HEADERS);
    for (int i = 0; i < 6; i++) e[i] = (unsigned char)m[i];
    memset(e + 6, 0x02, 6);
    e[12] = 0x08; /* IPv4 */
    struct iphdr *ip = (void *)(e + 14);
    ip->version = 4;
    ip->ihl = 5;
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->saddr = inet_addr("10.9.0.1");
    ip->daddr = inet_addr("10.9.0.2");
    ip->tot_len = htons(20 + 8 + pay);
    ip->check = inet_sum(ip, 20);
    struct udphdr *u = (void *)(e + 34);
    u->source = u->dest = htons(4791);
    u->len = htons(8 + pay);
    udp_offload(v, ip, u, pay, seg, HEADERS);
    int len = (int)sizeof *v + HEADERS + pay;
    long total = mbytes * 1000000L, sent = 0, n = 0;
    double t0 = now();
    while (sent < total) {
        if (send(fd, buf, len, 0) < 0) return die("send");
        sent += pay;
        n++;
    }
    double dt = now() - t0;
    printf("sent %ld frames of %d B payload: %.1f MB/s\n", n, pay, sent / dt / 1e6);
    return 0;
}

static int receive_frames(int fd, double seconds) {
    printf("READY\n"); /* bound: frames sent from now on are seen */
    fflush(stdout);
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    long bytes = 0, n = 0, gso = 0;
    int largest = 0;
    double first = 0, last = 0, end = now() + seconds;
    while (now() < end) {
        int r = (int)recv(fd, buf, sizeof buf, 0);
        if (r < (int)sizeof(struct virtio_net_hdr) + HEADERS) continue;
        struct virtio_net_hdr *v = (void *)buf;
        unsigned char *e = buf + sizeof *v;
        if (e[12] != 0x08 || e[14 + 9] != IPPROTO_UDP) continue;
        if (!first) first = now();
        last = now();
        n++;
        bytes += r - (long)sizeof *v - HEADERS;
        if (r > largest) largest = r;
        if (v->gso_type != VIRTIO_NET_HDR_GSO_NONE) gso++;
    }
    double span = last - first > 0 ? last - first : 1;
    printf("received %ld frames, %ld payload bytes, largest %d, gso %ld; %.1f MB/s\n", n, bytes, largest, gso, bytes / span / 1e6);
    return 0;
}

/* Frames out of a TPACKET_V2 receive ring (PACKET_VNET_HDR set before
 * the ring: each frame is preceded by its virtio_net_hdr). */
static int ring_frames(int fd, const struct sockaddr_ll *a, double seconds) {
    int version = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version)) return die("PACKET_VERSION");
    struct tpacket_req req = {.tp_block_size = 1 << 17, .tp_block_nr = 64, .tp_frame_size = 1 << 17, .tp_frame_nr = 64};
    if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req)) return die("PACKET_RX_RING");
    unsigned char *ring = mmap(NULL, (size_t)req.tp_block_size * req.tp_block_nr, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) return die("mmap");
    if (bind(fd, (const void *)a, sizeof *a)) return die("bind");
    printf("READY\n");
    fflush(stdout);
    long bytes = 0, n = 0, gso = 0;
    unsigned largest = 0, at = 0;
    double first = 0, last = 0, end = now() + seconds;
    while (now() < end) {
        struct tpacket2_hdr *h = (void *)(ring + (size_t)at * req.tp_frame_size);
        if (!(h->tp_status & TP_STATUS_USER)) continue;
        unsigned char *e = (unsigned char *)h + h->tp_mac;
        struct virtio_net_hdr *v = (void *)(e - sizeof *v);
        if (e[12] == 0x08 && e[14 + 9] == IPPROTO_UDP) {
            if (!first) first = now();
            last = now();
            n++;
            bytes += h->tp_len - HEADERS;
            if (h->tp_len > largest) largest = h->tp_len;
            if (v->gso_type != VIRTIO_NET_HDR_GSO_NONE) gso++;
        }
        h->tp_status = TP_STATUS_KERNEL;
        at = (at + 1) % req.tp_frame_nr;
    }
    double span = last - first > 0 ? last - first : 1;
    printf("ring received %ld frames, %ld payload bytes, largest %u, gso %ld; %.1f MB/s\n", n, bytes, largest, gso, bytes / span / 1e6);
    return 0;
}

int main(int argc, char **argv) {
    int sending = argc >= 6 && !strcmp(argv[1], "send");
    int ring = argc == 4 && !strcmp(argv[1], "ring");
    if (!sending && !ring && !(argc == 4 && !strcmp(argv[1], "recv"))) {
        fprintf(stderr, "usage: gso_probe send IFNAME DST_MAC MBYTES PAYLOAD [SEG] | gso_probe recv|ring IFNAME SECONDS\n");
        return 2;
    }
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd < 0) return die("socket(AF_PACKET)");
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one)) return die("PACKET_VNET_HDR");
    struct sockaddr_ll a = {0};
    a.sll_family = AF_PACKET;
    a.sll_protocol = htons(ETH_P_ALL);
    a.sll_ifindex = (int)if_nametoindex(argv[2]);
    if (!a.sll_ifindex) return die(argv[2]);
    if (ring) return ring_frames(fd, &a, atof(argv[3])); /* binds once its ring is there */
    if (bind(fd, (void *)&a, sizeof a)) return die("bind");
    if (sending) return send_frames(fd, argv[3], atol(argv[4]), atoi(argv[5]), argc > 6 ? atoi(argv[6]) : 1472);
    return receive_frames(fd, atof(argv[3]));
}
