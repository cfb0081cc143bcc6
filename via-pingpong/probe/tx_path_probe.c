/* tx_path_probe: which way of handing a UDP superframe to AF_PACKET gets
 * it across a veth pair soonest (issue 25: the candidates for the large
 * message path, measured before one is built).
 *
 * A ping-pong between two hosts: the client sends one superframe of
 * PAYLOAD bytes (Ethernet + IPv4 + UDP headers, a virtio_net_hdr asking
 * for UDP segmentation into SEG-byte units, each unit a 64-byte header
 * piece and its share of the payload, as the software NIC's engine builds
 * a message's fragments), the server answers each with a 64-byte datagram.
 * Both receive through a TPACKET_V2 ring, busy-polled, as the software NIC
 * does. The client sends by one of three paths, in alternating rounds:
 *
 *   gather  sendmsg with the pieces as the engine hands them (the outer
 *           headers, then per unit its header and its payload, from
 *           separate memory): the kernel copies them into its buffers;
 *   flat    send of the same bytes from one contiguous buffer: the floor
 *           of a send the kernel copies (no pieces);
 *   copied  the pieces copied into one staging buffer first, then sent
 *           as `flat` (one copy more, no pieces);
 *   txring  the same bytes written into a PACKET_TX_RING slot (the payload
 *           copied in from separate memory, as the engine would copy from
 *           registered memory), then send() to flush: the kernel's buffer
 *           points at the ring's pages, with no copy of its own.
 *
 *   tx_path_probe server IFNAME DST_MAC
 *   tx_path_probe client IFNAME DST_MAC PAYLOAD SEG ROUNDS ITERS
 *
 * The client prints, per path, the median over rounds of each round's
 * median round trip (us). UDP port 4792, IPs 10.9.0.1 <-> 10.9.0.2
 * (scripts/tx-path-probe.sh sets the hosts up).
 */
#define _GNU_SOURCE
#include "probe_frames.h"

#define UNIT_HEADER 64
#define SLOT (1 << 17)
#define MAX_PAY 65000

/* An AF_PACKET socket on `ifname` with virtio-net headers and no qdisc. */
static int packet_socket(int ifindex, int bind_it) {
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd < 0) die("socket(AF_PACKET)");
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one)) die("PACKET_VNET_HDR");
    if (setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one)) die("PACKET_QDISC_BYPASS");
    if (bind_it) {
        struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = ifindex};
        if (bind(fd, (void *)&a, sizeof a)) die("bind");
    }
    return fd;
}

struct ring {
    unsigned char *base;
    unsigned n, at;
};

/* A TPACKET_V2 ring of 64 slots of 128 KiB, `which` = PACKET_RX_RING or
 * PACKET_TX_RING, mapped. */
static struct ring map_ring(int fd, int which) {
    int version = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version)) die("PACKET_VERSION");
    struct tpacket_req req = {.tp_block_size = SLOT, .tp_block_nr = 64, .tp_frame_size = SLOT, .tp_frame_nr = 64};
    if (setsockopt(fd, SOL_PACKET, which, &req, sizeof req)) die("PACKET_*_RING");
    void *p = mmap(NULL, (size_t)SLOT * 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) die("mmap");
    return (struct ring){p, 64, 0};
}

/* A receive ring on `ifindex`, bound once it is there, blind to our own
 * transmissions. */
static struct ring receive_ring(int ifindex) {
    int rx = packet_socket(ifindex, 0);
    int one = 1;
    setsockopt(rx, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    struct ring r = map_ring(rx, PACKET_RX_RING);
    struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = ifindex};
    if (bind(rx, (void *)&a, sizeof a)) die("bind");
    return r;
}

/* Waits for the next UDP datagram to our port in the receive ring; its
 * payload length. */
static int next_datagram(struct ring *r) {
    for (;;) {
        struct tpacket2_hdr *h = (void *)(r->base + (size_t)r->at * SLOT);
        if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) continue;
        unsigned char *e = (unsigned char *)h + h->tp_mac;
        int len = -1;
        if (h->tp_snaplen >= OUTER && e[12] == 0x08 && e[14 + 9] == IPPROTO_UDP && ntohs(*(unsigned short *)(e + 36)) == PORT)
            len = (int)h->tp_len - OUTER;
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        r->at = (r->at + 1) % r->n;
        if (len >= 0) return len;
    }
}

static int serve(int ifindex, const unsigned char mac[6]) {
    struct ring r = receive_ring(ifindex);
    int tx = packet_socket(ifindex, 1);
    unsigned char reply[VNET + OUTER + 64];
    outer(reply, mac, 64, 1472, 0);
    memset(reply + VNET + OUTER, 0x5a, 64);
    printf("READY\n");
    fflush(stdout);
    for (;;) {
        if (next_datagram(&r) == 0) return 0; /* an empty datagram: the end */
        if (send(tx, reply, sizeof reply, 0) < 0) die("send (reply)");
    }
}

/* The superframe's bytes laid out at `d`: the outer headers `head` (in
 * place when `d` is `head`), then
 * per unit of `seg` bytes its header and its share of `msg`. */
static void lay_out(unsigned char *d, const unsigned char *head, const unsigned char (*heads)[UNIT_HEADER], const unsigned char *msg, int pay, int seg) {
    if (d != head) memcpy(d, head, VNET + OUTER);
    for (int at = 0, u = 0, m = 0; at < pay; at += seg, u++) {
        int n = pay - at < seg ? pay - at : seg;
        memcpy(d + VNET + OUTER + at, heads[u], UNIT_HEADER);
        memcpy(d + VNET + OUTER + at + UNIT_HEADER, msg + m, (size_t)(n - UNIT_HEADER));
        m += n - UNIT_HEADER;
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { GATHER, FLAT, COPIED, TXRING, PATHS };
static const char *names[PATHS] = {"gather", "flat", "copied", "txring"};

static int client(int ifindex, const unsigned char mac[6], int pay, int seg, int rounds, int iters) {
    if (pay > MAX_PAY || seg <= UNIT_HEADER || pay / seg > 120) {
        fprintf(stderr, "tx_path_probe: payload or unit size out of range\n");
        return 2;
    }
    struct ring r = receive_ring(ifindex);
    int tx = packet_socket(ifindex, 1);
    int txr = packet_socket(ifindex, 0);
    struct ring t = map_ring(txr, PACKET_TX_RING);
    struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = ifindex};
    if (bind(txr, (void *)&a, sizeof a)) die("bind (tx ring)");

    /* The message (separate memory, as registered memory is), the units'
     * headers (as the engine's header arena), and the whole superframe
     * laid out flat. */
    static unsigned char msg[MAX_PAY], heads[120][UNIT_HEADER], flat[VNET + OUTER + MAX_PAY], stage[VNET + OUTER + MAX_PAY];
    for (int i = 0; i < MAX_PAY; i++) msg[i] = (unsigned char)(i * 7);
    outer(flat, mac, pay, seg, 1);
    struct iovec iov[2 + 2 * 120];
    int k = 0;
    iov[k++] = (struct iovec){flat, VNET + OUTER};
    int units = 0;
    for (int at = 0, m = 0; at < pay; at += seg, units++) {
        int u = pay - at < seg ? pay - at : seg;
        memset(heads[units], units, UNIT_HEADER);
        iov[k++] = (struct iovec){heads[units], UNIT_HEADER};
        iov[k++] = (struct iovec){msg + m, (size_t)(u - UNIT_HEADER)};
        m += u - UNIT_HEADER;
    }
    lay_out(flat, flat, heads, msg, pay, seg);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    int total = VNET + OUTER + pay;
    int off = TPACKET2_HDRLEN - sizeof(struct sockaddr_ll);

    double *med[PATHS];
    for (int p = 0; p < PATHS; p++) med[p] = calloc((size_t)rounds, sizeof(double));
    double *rtt = calloc((size_t)iters, sizeof(double));
    for (int round = 0; round < rounds; round++) {
        for (int q = 0; q < PATHS; q++) {
            int p = (q + round) % PATHS; /* each round starts one path further along */
            for (int i = 0; i < iters; i++) {
                double t0 = now();
                if (p == GATHER) {
                    if (sendmsg(tx, &mh, 0) < 0) die("sendmsg");
                } else if (p == FLAT) {
                    if (send(tx, flat, (size_t)total, 0) < 0) die("send");
                } else if (p == COPIED) {
                    lay_out(stage, flat, heads, msg, pay, seg);
                    if (send(tx, stage, (size_t)total, 0) < 0) die("send (copied)");
                } else {
                    struct tpacket2_hdr *h = (void *)(t.base + (size_t)t.at * SLOT);
                    while (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) != TP_STATUS_AVAILABLE) {
                        if (h->tp_status == TP_STATUS_WRONG_FORMAT) {
                            fprintf(stderr, "tx_path_probe: the TX ring refused the frame\n");
                            return 1;
                        }
                    }
                    lay_out((unsigned char *)h + off, flat, heads, msg, pay, seg);
                    h->tp_len = (unsigned)total;
                    __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
                    if (send(txr, NULL, 0, MSG_DONTWAIT) < 0 && errno != EAGAIN && errno != ENOBUFS) die("send (tx ring)");
                    t.at = (t.at + 1) % t.n;
                }
                if (next_datagram(&r) != 64) {
                    fprintf(stderr, "tx_path_probe: an answer that is not the server's\n");
                    return 1;
                }
                rtt[i] = (now() - t0) * 1e6;
            }
            qsort(rtt, (size_t)iters, sizeof *rtt, cmp);
            med[p][round] = rtt[iters / 2];
        }
    }
    outer(flat, mac, 0, seg, 1); /* the end */
    send(tx, flat, VNET + OUTER, 0);
    for (int p = 0; p < PATHS; p++) {
        printf("%-6s %d B in %d units: round trip per round (us):", names[p], pay, units);
        for (int i = 0; i < rounds; i++) printf(" %.2f", med[p][i]);
        qsort(med[p], (size_t)rounds, sizeof(double), cmp);
        printf("; median %.2f\n", med[p][rounds / 2]);
    }
    return 0;
}

int main(int argc, char **argv) {
    unsigned char mac[6];
    if (argc >= 4 && !strcmp(argv[1], "server") && !parse_mac(argv[3], mac)) {
        int ifindex = (int)if_nametoindex(argv[2]);
        if (!ifindex) die(argv[2]);
        return serve(ifindex, mac);
    }
    if (argc == 8 && !strcmp(argv[1], "client") && !parse_mac(argv[3], mac)) {
        int ifindex = (int)if_nametoindex(argv[2]);
        if (!ifindex) die(argv[2]);
        return client(ifindex, mac, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]));
    }
    fprintf(stderr, "usage: tx_path_probe server IFNAME DST_MAC | tx_path_probe client IFNAME DST_MAC PAYLOAD SEG ROUNDS ITERS\n");
    return 2;
}
