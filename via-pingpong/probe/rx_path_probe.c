/* rx_path_probe: which receive-side socket setup gets a 64 KiB message
 * across a veth pair soonest (issue 25, VIA in UDP over AF_PACKET: the
 * receiving half of the large-message path, after tx_path_probe.c's
 * sending half).
 *
 * A ping-pong between two hosts. A message is 65,536 bytes of payload
 * cut into units of 1,472 bytes, each a 64-byte header piece and 1,408
 * bytes of payload, as the software NIC's engine cuts a message's
 * fragments. It goes as two UDP superframes (Ethernet + IPv4 + UDP
 * headers, a virtio_net_hdr asking for segmentation into units:
 * udp_offload.h), the first of 32 units, the second the rest (15), as
 * the engine hands the device 32 frames a call; each is one sendmsg whose
 * pieces come from separate memory (the outer headers, then per unit its
 * header piece and its payload). The answer is either a 64-byte datagram
 * (`small`) or the same message back (`big`: half its round trip is the
 * one-way figure to compare with via-pingpong's 64 KiB latency).
 *
 * Both ends receive as the software NIC does: from a TPACKET_V2 receive
 * ring, busy-polled, copying each unit's payload out of the slot into a
 * message buffer (as the engine places fragments). The receive socket is
 * set up one of three ways, the same on both ends:
 *
 *   all     ring slots of 128 KiB, the socket bound to every protocol
 *           (ETH_P_ALL): a tap, served in __netif_receive_skb_core before
 *           any protocol handler;
 *   ip      the same ring, the socket bound to IPv4 (ETH_P_IP): bound to
 *           one interface, it is on that interface's list of IPv4
 *           handlers, which the kernel walks after the global one, where
 *           ip_rcv is, so the IP layer (up to the port rule that drops the
 *           datagram) runs before the socket gets the datagram;
 *   thresh  slots of 2 KiB, PACKET_COPY_THRESH and a 32 MiB receive
 *           buffer: a superframe too big for its slot is queued to the
 *           socket too (TP_STATUS_COPY in the slot says so) and read by
 *           recvmsg, whose iovecs put each unit's payload straight into
 *           the message buffer (no copy out of a slot; the kernel's copy
 *           into the slot is of the first 2 KiB only).
 *
 * Sending through the receive socket instead of a second one, and a
 * larger SO_SNDBUF, measured level with these and are not kept.
 *
 *   rx_path_probe server IFNAME DST_MAC CONFIG ANSWER
 *   rx_path_probe client IFNAME DST_MAC CONFIG ANSWER ITERS
 *
 * CONFIG is all, ip or thresh; ANSWER small or big. The server prints
 * READY once it can receive and ends at an empty datagram, which the
 * client sends when done. The client prints one line: the configuration,
 * the answer, the median round trip and the mean time in the two sendmsg
 * calls of a message (us). UDP port 4792, IPs 10.9.0.1 (client) <->
 * 10.9.0.2 (server); scripts/rx-path-probe.sh sets the hosts up, with the
 * port rule of `via-agent udp-port install 4792` on both, and runs the
 * configurations in alternating rounds.
 */
#define _GNU_SOURCE
#include "probe_frames.h"

#define MESSAGE 65536
#define SEG 1472 /* a unit: its header piece and its payload */
#define UNIT_HEADER 64
#define UNIT_PAYLOAD (SEG - UNIT_HEADER)
#define UNITS ((MESSAGE + UNIT_PAYLOAD - 1) / UNIT_PAYLOAD) /* 47 */
#define FIRST_UNITS 32 /* the units of the first superframe */
#define ANSWER 64 /* the small answer's UDP payload: one bare header piece */

enum config { ALL, IP, THRESH, CONFIGS };
static const char *config_names[CONFIGS] = {"all", "ip", "thresh"};

/* A failure that is no system call's. */
static int fail(const char *what) {
    fprintf(stderr, "rx_path_probe: %s\n", what);
    exit(1);
}

/* The message's bytes: no period a misplaced unit would hide in. */
static unsigned char message_byte(int i) {
    return (unsigned char)(i + (i >> 8));
}

/* The sending socket on `ifindex`: virtio-net headers, no qdisc. Made
 * and bound with protocol 0, so it receives nothing: bound to ETH_P_ALL
 * it would be one more tap on the interface and queue a clone of every
 * frame that passes (its own included), which nobody reads. */
static int tx_socket(int ifindex) {
    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (fd < 0) die("socket(AF_PACKET)");
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one)) die("PACKET_VNET_HDR");
    if (setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one)) die("PACKET_QDISC_BYPASS");
    struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_protocol = 0, .sll_ifindex = ifindex};
    if (bind(fd, (void *)&a, sizeof a)) die("bind (tx)");
    return fd;
}

/* A message as the engine hands it to the device: two superframes, the
 * first of FIRST_UNITS units, the second the rest, each one sendmsg whose
 * iovecs are the outer headers, then per unit its header piece (from a
 * header arena) and its payload (from the message's memory). */
struct outgoing {
    unsigned char head[2][VNET + OUTER];
    unsigned char unit_heads[UNITS][UNIT_HEADER];
    struct iovec iov[2][1 + 2 * FIRST_UNITS];
    struct msghdr mh[2];
};

/* Cuts `msg` (MESSAGE bytes) into `o`'s two superframes to `mac`. */
static void cut_message(struct outgoing *o, const unsigned char *msg, const unsigned char mac[6], int from_client) {
    int pay[2] = {0, 0}, k[2] = {1, 1};
    for (int u = 0, m = 0; u < UNITS; u++) {
        int f = u < FIRST_UNITS ? 0 : 1;
        int n = MESSAGE - m < UNIT_PAYLOAD ? MESSAGE - m : UNIT_PAYLOAD;
        memset(o->unit_heads[u], u, UNIT_HEADER);
        o->iov[f][k[f]++] = (struct iovec){o->unit_heads[u], UNIT_HEADER};
        o->iov[f][k[f]++] = (struct iovec){(void *)(msg + m), (size_t)n};
        pay[f] += UNIT_HEADER + n;
        m += n;
    }
    for (int f = 0; f < 2; f++) {
        outer(o->head[f], mac, pay[f], SEG, from_client);
        o->iov[f][0] = (struct iovec){o->head[f], VNET + OUTER};
        o->mh[f] = (struct msghdr){.msg_iov = o->iov[f], .msg_iovlen = (size_t)k[f]};
    }
}

/* Sends `o`'s message on `tx`: its two superframes. */
static void send_message(int tx, struct outgoing *o) {
    if (sendmsg(tx, &o->mh[0], 0) < 0) die("sendmsg (first superframe)");
    if (sendmsg(tx, &o->mh[1], 0) < 0) die("sendmsg (second superframe)");
}

/* A datagram of `pay` UDP payload bytes to PORT, sent flat on `tx` (the
 * small answer, or the empty datagram that ends the server). */
static void send_datagram(int tx, const unsigned char mac[6], int pay, int from_client) {
    unsigned char d[VNET + OUTER + ANSWER];
    outer(d, mac, pay, SEG, from_client);
    memset(d + VNET + OUTER, 0x5a, (size_t)pay);
    if (send(tx, d, (size_t)(VNET + OUTER + pay), 0) < 0) die("send");
}

/* The receiving end: a TPACKET_V2 ring of `slots` slots of `slot` bytes
 * on socket `fd`, and the slot to look at next. */
struct receiver {
    int fd;
    unsigned char *base;
    unsigned slot, slots, at;
    unsigned char unit_heads[UNITS][UNIT_HEADER]; /* where recvmsg puts header pieces */
};

/* Sets up `r` on `ifindex` as `cfg` says. The socket is made with
 * protocol 0 (it sees nothing yet), and bound to the interface and its
 * protocol once the ring is there, blind to our own transmissions. */
static void open_receiver(struct receiver *r, int ifindex, enum config cfg) {
    r->slot = cfg == THRESH ? 2048 : 1 << 17;
    r->slots = cfg == THRESH ? 4096 : 256;
    r->at = 0;
    r->fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (r->fd < 0) die("socket(AF_PACKET)");
    int one = 1;
    if (setsockopt(r->fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one)) die("PACKET_VNET_HDR");
    if (setsockopt(r->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one)) die("PACKET_IGNORE_OUTGOING");
    int version = TPACKET_V2;
    if (setsockopt(r->fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version)) die("PACKET_VERSION");
    unsigned block = r->slot < 4096 ? 4096 : r->slot;
    struct tpacket_req req = {
        .tp_block_size = block,
        .tp_block_nr = (unsigned)((size_t)r->slot * r->slots / block),
        .tp_frame_size = r->slot,
        .tp_frame_nr = r->slots,
    };
    if (setsockopt(r->fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req)) die("PACKET_RX_RING");
    void *p = mmap(NULL, (size_t)r->slot * r->slots, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (p == MAP_FAILED) die("mmap");
    r->base = p;
    if (cfg == THRESH) {
        int rcvbuf = 32 << 20;
        if (setsockopt(r->fd, SOL_PACKET, PACKET_COPY_THRESH, &one, sizeof one)) die("PACKET_COPY_THRESH");
        if (setsockopt(r->fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf)) die("SO_RCVBUFFORCE");
    }
    int protocol = cfg == IP ? ETH_P_IP : ETH_P_ALL;
    struct sockaddr_ll a = {.sll_family = AF_PACKET, .sll_protocol = htons(protocol), .sll_ifindex = ifindex};
    if (bind(r->fd, (void *)&a, sizeof a)) die("bind (rx)");
}

/* Fails unless a datagram of `len` UDP payload bytes, cut into units,
 * fits the message whose first `at` bytes are there. */
static void check_fits(int len, int at) {
    int units = (len + SEG - 1) / SEG;
    if (len % SEG && len % SEG < UNIT_HEADER) fail("a unit shorter than its header piece");
    if (at + len - units * UNIT_HEADER > MESSAGE) fail("a datagram past the message's end");
}

/* Copies the units' payloads of the datagram at `udp` (`len` bytes, in a
 * ring slot) to `msg` + *at, advancing *at. */
static void place_from_slot(const unsigned char *udp, int len, unsigned char *msg, int *at) {
    check_fits(len, *at);
    for (int o = 0; o < len; o += SEG) {
        int n = len - o < SEG ? len - o : SEG;
        memcpy(msg + *at, udp + o + UNIT_HEADER, (size_t)(n - UNIT_HEADER));
        *at += n - UNIT_HEADER;
    }
}

/* Reads the datagram of `len` UDP payload bytes that the kernel queued to
 * `r`'s socket (its slot holds only the start) with one recvmsg, each
 * unit's header piece to the header arena and its payload straight to
 * `msg` + *at, advancing *at. */
static void place_from_queue(struct receiver *r, int len, unsigned char *msg, int *at) {
    check_fits(len, *at);
    unsigned char head[VNET + OUTER];
    struct iovec iov[1 + 2 * UNITS];
    int k = 0;
    iov[k++] = (struct iovec){head, sizeof head};
    for (int o = 0, u = 0; o < len; o += SEG, u++) {
        int n = len - o < SEG ? len - o : SEG;
        iov[k++] = (struct iovec){r->unit_heads[u], UNIT_HEADER};
        iov[k++] = (struct iovec){msg + *at, (size_t)(n - UNIT_HEADER)};
        *at += n - UNIT_HEADER;
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t got = recvmsg(r->fd, &mh, MSG_DONTWAIT);
    if (got < 0) die("recvmsg");
    if (got != VNET + OUTER + len) fail("recvmsg read another datagram than the slot's");
}

/* Is the frame at `e` (`snaplen` bytes of it in the slot) a UDP datagram
 * to PORT? */
static int ours(const unsigned char *e, unsigned snaplen) {
    return snaplen >= OUTER && e[12] == 0x08 && e[13] == 0x00 && e[14 + 9] == IPPROTO_UDP &&
           ntohs(*(const unsigned short *)(e + 36)) == PORT;
}

/* Waits for the next UDP datagram to PORT in `r`'s ring and places its
 * units' payloads at `msg` + *at (advancing *at); its UDP payload length.
 * Other frames are passed over (and, queued too, taken off the queue). */
static int next_datagram(struct receiver *r, unsigned char *msg, int *at) {
    for (;;) {
        struct tpacket2_hdr *h = (void *)(r->base + (size_t)r->at * r->slot);
        unsigned status = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
        if (!(status & TP_STATUS_USER)) continue;
        unsigned char *e = (unsigned char *)h + h->tp_mac;
        int len = -1;
        if (ours(e, h->tp_snaplen)) {
            len = (int)h->tp_len - OUTER;
            if (status & TP_STATUS_COPY)
                place_from_queue(r, len, msg, at);
            else if (h->tp_snaplen < h->tp_len)
                fail("a datagram cut short in its slot and not queued (receive buffer full?)");
            else
                place_from_slot(e + OUTER, len, msg, at);
        } else if (status & TP_STATUS_COPY) {
            if (recv(r->fd, NULL, 0, MSG_DONTWAIT | MSG_TRUNC) < 0) die("recv (a frame not ours)");
        }
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        r->at = (r->at + 1) % r->slots;
        if (len >= 0) return len;
    }
}

/* Receives one whole message into `msg`: 1, or 0 at an empty datagram
 * (the end). */
static int receive_message(struct receiver *r, unsigned char *msg) {
    int at = 0;
    while (at < MESSAGE)
        if (next_datagram(r, msg, &at) == 0) return 0;
    return 1;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int serve(int ifindex, const unsigned char mac[6], enum config cfg, int big) {
    static struct receiver r;
    static struct outgoing o;
    static unsigned char msg[MESSAGE], got[MESSAGE];
    for (int i = 0; i < MESSAGE; i++) msg[i] = message_byte(i);
    open_receiver(&r, ifindex, cfg);
    int tx = tx_socket(ifindex);
    cut_message(&o, msg, mac, 0);
    printf("READY\n");
    fflush(stdout);
    int messages = 0;
    while (receive_message(&r, got)) {
        if (big)
            send_message(tx, &o);
        else
            send_datagram(tx, mac, ANSWER, 0);
        messages++;
    }
    if (messages && memcmp(got, msg, MESSAGE)) fail("the server's last message is not the one sent");
    return 0;
}

static int client(int ifindex, const unsigned char mac[6], enum config cfg, int big, int iters) {
    static struct receiver r;
    static struct outgoing o;
    static unsigned char msg[MESSAGE], got[MESSAGE];
    if (iters < 1) fail("ITERS must be at least 1");
    for (int i = 0; i < MESSAGE; i++) msg[i] = message_byte(i);
    open_receiver(&r, ifindex, cfg);
    int tx = tx_socket(ifindex);
    cut_message(&o, msg, mac, 1);
    double *rtt = calloc((size_t)iters, sizeof(double));
    if (!rtt) die("calloc");
    double sending = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        send_message(tx, &o);
        sending += now() - t0;
        if (big) {
            if (!receive_message(&r, got)) fail("an empty answer");
        } else {
            int at = 0;
            if (next_datagram(&r, got, &at) != ANSWER) fail("an answer that is not the server's");
        }
        rtt[i] = (now() - t0) * 1e6;
    }
    send_datagram(tx, mac, 0, 1); /* the end */
    if (big && memcmp(got, msg, MESSAGE)) fail("the client's last answer is not the message sent");
    qsort(rtt, (size_t)iters, sizeof *rtt, cmp);
    printf("%s answer=%s rtt_median_us=%.2f send_us=%.2f\n", config_names[cfg], big ? "big" : "small",
           rtt[iters / 2], sending / iters * 1e6);
    return 0;
}

/* The configuration named `s`, or -1. */
static int parse_config(const char *s) {
    for (int c = 0; c < CONFIGS; c++)
        if (!strcmp(s, config_names[c])) return c;
    return -1;
}

/* The answer named `s`: 1 for big, 0 for small, or -1. */
static int parse_answer(const char *s) {
    if (!strcmp(s, "big")) return 1;
    if (!strcmp(s, "small")) return 0;
    return -1;
}

int main(int argc, char **argv) {
    unsigned char mac[6];
    int is_server = argc == 6 && !strcmp(argv[1], "server");
    int is_client = argc == 7 && !strcmp(argv[1], "client");
    int cfg = argc >= 6 ? parse_config(argv[4]) : -1;
    int big = argc >= 6 ? parse_answer(argv[5]) : -1;
    if ((is_server || is_client) && !parse_mac(argv[3], mac) && cfg >= 0 && big >= 0) {
        int ifindex = (int)if_nametoindex(argv[2]);
        if (!ifindex) die(argv[2]);
        if (is_server) return serve(ifindex, mac, cfg, big);
        return client(ifindex, mac, cfg, big, atoi(argv[6]));
    }
    fprintf(stderr, "usage: rx_path_probe server IFNAME DST_MAC CONFIG ANSWER | "
                    "rx_path_probe client IFNAME DST_MAC CONFIG ANSWER ITERS\n"
                    "       CONFIG: all | ip | thresh; ANSWER: small | big\n");
    return 2;
}
