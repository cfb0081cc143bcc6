/* sockprobe: the simplest fast TCP or UDP ping-pong, the reference that
 * via-pingpong's own tcp and udp baselines are held to (via-pingpong
 * --demo runs it in the same rounds and prints both).
 *
 * One send() per message, one recv() per arrival, busy-polled
 * (MSG_DONTWAIT in a loop: no poll(), no sleep), TCP_NODELAY, messages of
 * a fixed size both sides know (no length header), the process pinned to
 * one CPU. Latency is one-way: a round trip / 2.
 *
 *   sockprobe server tcp|udp BIND_IP PORT SIZE COUNT CPU
 *   sockprobe client tcp|udp PEER_IP PORT SIZE COUNT CPU
 *
 * COUNT includes a tenth as warm-up (not measured). The server prints
 * "READY" once it listens; the client prints
 *   "t_min_us=... t_typical_us=... t_p99_us=... iters=N"
 * with t_typical the median. Exit status 0 on success, 1 with a message
 * on stderr otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int die(const char *what) {
    fprintf(stderr, "sockprobe: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Sends all of buf: one send() per message unless the kernel takes less. */
static void send_all(int fd, const char *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = send(fd, buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) done += (size_t)r;
        else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) die("send");
    }
}

/* Receives exactly n bytes (TCP) or one datagram (UDP), busy-polling. */
static void recv_msg(int fd, char *buf, size_t n, int udp) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
        if (r > 0) {
            if (udp) return;
            got += (size_t)r;
        } else if (r == 0 && !udp) {
            errno = ECONNRESET;
            die("recv (peer closed)");
        } else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            die("recv");
        }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: sockprobe server|client tcp|udp IP PORT SIZE COUNT CPU\n");
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0, udp = strcmp(argv[2], "udp") == 0;
    size_t size = strtoul(argv[5], 0, 10);
    long count = strtol(argv[6], 0, 10), warm = count / 10;
    int cpu = atoi(argv[7]);
    if (size == 0) size = 1; /* a zero-byte UDP datagram is fine, TCP has none */

    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");

    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[4]))};
    if (inet_pton(AF_INET, argv[3], &a.sin_addr) != 1) {
        fprintf(stderr, "sockprobe: bad address %s\n", argv[3]);
        return 1;
    }
    int fd = socket(AF_INET, udp ? SOCK_DGRAM : SOCK_STREAM, 0), one = 1;
    if (fd < 0) die("socket");
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    char *buf = calloc(1, size);
    if (!buf) die("calloc");

    if (server) {
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) die("bind");
        if (!udp && listen(fd, 1) != 0) die("listen");
        printf("READY\n");
        fflush(stdout);
        if (!udp) {
            int c = accept(fd, 0, 0);
            if (c < 0) die("accept");
            close(fd);
            fd = c;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            for (long i = 0; i < count; i++) {
                recv_msg(fd, buf, size, 0);
                send_all(fd, buf, size);
            }
        } else {
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            ssize_t r;
            while ((r = recvfrom(fd, buf, size, 0, (struct sockaddr *)&from, &fl)) < 0) /* first: blocking */
                if (errno != EINTR) die("recvfrom");
            if (connect(fd, (struct sockaddr *)&from, fl) != 0) die("connect");
            send_all(fd, buf, size);
            for (long i = 1; i < count; i++) {
                recv_msg(fd, buf, size, 1);
                send_all(fd, buf, size);
            }
        }
        return 0;
    }

    /* Client: the server may not listen yet; retry for ~5 s. */
    int ok = -1;
    for (int i = 0; i < 500 && ok != 0; i++) {
        ok = connect(fd, (struct sockaddr *)&a, sizeof a);
        if (ok != 0) {
            if (udp) die("connect");
            close(fd);
            fd = socket(AF_INET, SOCK_STREAM, 0);
            usleep(10000);
        }
    }
    if (ok != 0) die("connect");
    if (!udp) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double *lat = calloc((size_t)count, sizeof(double));
    if (!lat) die("calloc");
    memset(buf, 0x5a, size);
    long n = 0;
    for (long i = 0; i < count; i++) {
        double t0 = now_us();
        send_all(fd, buf, size);
        recv_msg(fd, buf, size, udp);
        double t1 = now_us();
        if (i >= warm) lat[n++] = (t1 - t0) / 2;
    }
    qsort(lat, (size_t)n, sizeof(double), cmp);
    printf("t_min_us=%.3f t_typical_us=%.3f t_p99_us=%.3f iters=%ld\n", lat[0], lat[n / 2], lat[(long)(n * 0.99)], n);
    return 0;
}
