/* One side of a two-host VIPL scenario, run in a test namespace:
 *   twohost server SCENARIO DEVICE          prints "READY <mac>", then serves
 *   twohost client SCENARIO DEVICE MAC      connects to the server at MAC
 * Both print "READY <mac>" first; for the peer scenario the server then
 * reads the client's MAC from stdin.
 * Scenarios: pingpong (a CQ-driven ping-pong, prints its latency), pingwait
 * (the same with RecvWait, the shape of the Rust via-pingpong), pingrcq
 * (receives through a CQ, the shape of via-pingpong --recv-cq), rdmaimm
 * (RDMA write with immediate data), reject (a refused connection), peer
 * (the peer-to-peer model). Exits 0 only if every check held. Plain VIA 1.0
 * C, as existing programs are written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vipl.h>
#include "address.h"

#define TIMEOUT 10000UL /* ms */

static void die(const char *what, VIP_RETURN r) {
    fprintf(stderr, "twohost: %s failed: %d\n", what, (int)r);
    exit(1);
}
#define OK(call) do { VIP_RETURN r_ = (call); if (r_ != VIP_SUCCESS) die(#call, r_); } while (0)

static VIP_NIC_HANDLE nic;
static VIP_NIC_ATTRIBUTES na;
static VIP_PROTECTION_HANDLE ptag;
static char *mem;          /* registered: descriptors, then buffers */
static VIP_MEM_HANDLE mh;
enum { MEM = 1 << 20, NDESC = 64, BUF = 4096 };

static VIP_DESCRIPTOR *desc(int i) { return (VIP_DESCRIPTOR *)(mem + 64 * i); }
static char *buf(int i) { return mem + 65536 + BUF * i; }

static VIP_DESCRIPTOR *fill(int i, unsigned op, unsigned len, int segbuf) {
    VIP_DESCRIPTOR *d = desc(i);
    memset(d, 0, 64);
    d->CS.Control = op;
    d->CS.SegCount = 1;
    d->CS.Length = len;
    d->DS[0].Local.Data.Address = buf(segbuf);
    d->DS[0].Local.Handle = mh;
    d->DS[0].Local.Length = len;
    return d;
}

static void parse_mac(const char *s, unsigned char *mac) {
    unsigned v[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) {
        fprintf(stderr, "twohost: bad MAC %s\n", s);
        exit(2);
    }
    for (int i = 0; i < 6; i++) mac[i] = (unsigned char)v[i];
}

static VIP_VI_HANDLE make_vi(unsigned level, int rdma, VIP_CQ_HANDLE cq) {
    VIP_VI_ATTRIBUTES va = {(VIP_RELIABILITY_LEVEL)level, 65536, NULL, ptag, rdma, VIP_FALSE};
    VIP_VI_HANDLE vi;
    OK(VipCreateVi(nic, &va, cq, cq, &vi));
    return vi;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Waits on `cq` for the next receive completion of `vi`; send completions
 * met on the way (a send completes when the peer's next frame acknowledges
 * it, which may come first) are collected and counted in *sends. */
static VIP_DESCRIPTOR *cq_recv(VIP_CQ_HANDLE cq, VIP_VI_HANDLE vi, int *sends) {
    for (;;) {
        VIP_VI_HANDLE who;
        VIP_BOOLEAN rq;
        OK(VipCQWait(cq, TIMEOUT, &who, &rq));
        if (who != vi) { fprintf(stderr, "twohost: CQ gave another VI\n"); exit(1); }
        VIP_DESCRIPTOR *d;
        OK(rq ? VipRecvDone(vi, &d) : VipSendDone(vi, &d));
        if ((d->CS.Status & VIP_STATUS_DONE) == 0 || (d->CS.Status & VIP_STATUS_ERROR_MASK)) {
            fprintf(stderr, "twohost: descriptor status %#x\n", d->CS.Status);
            exit(1);
        }
        if (rq) return d;
        (*sends)++;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Waits for the next receive with VipRecvWait. */
static VIP_DESCRIPTOR *wait_recv(VIP_VI_HANDLE vi) {
    VIP_DESCRIPTOR *d;
    OK(VipRecvWait(vi, TIMEOUT, &d));
    return d;
}

/* Waits on `cq`, which only the receive queue of `vi` uses, for its next
 * receive: CQWait, then RecvDone. */
static VIP_DESCRIPTOR *cq_recv_only(VIP_CQ_HANDLE cq, VIP_VI_HANDLE vi) {
    VIP_VI_HANDLE who;
    VIP_BOOLEAN rq;
    OK(VipCQWait(cq, TIMEOUT, &who, &rq));
    if (who != vi || !rq) { fprintf(stderr, "twohost: the CQ gave another VI or a send\n"); exit(1); }
    VIP_DESCRIPTOR *d;
    OK(VipRecvDone(vi, &d));
    return d;
}

/* How a ping-pong waits for its receives. */
enum wait_mode {
    WAIT_RECV,    /* VipRecvWait; sends reaped with VipSendDone */
    WAIT_CQ,      /* both queues on a CQ: CQWait, then Done */
    WAIT_RECV_CQ, /* the receive queue on a CQ (CQWait, then RecvDone); sends reaped with VipSendDone */
};

/* A 64-byte ping-pong. WAIT_RECV and WAIT_RECV_CQ make the calls of the
 * Rust via-pingpong's loop (without and with --recv-cq), in the same
 * places: sends are reaped after the round trip's time was taken. */
static int pingpong(int server, const unsigned char *peer, enum wait_mode mode) {
    enum { ITERS = 10000, WARM = 1000, SIZE = 64 };
    char la[64], ra[64];
    VIP_CQ_HANDLE cq = NULL;
    if (mode != WAIT_RECV) OK(VipCreateCQ(nic, 64, &cq));
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, 0, VIP_FALSE};
    VIP_VI_HANDLE vi;
    OK(VipCreateVi(nic, &va, mode == WAIT_CQ ? cq : NULL, cq, &vi));
    for (int i = 0; i < 8; i++) OK(VipPostRecv(vi, fill(i, VIP_CONTROL_OP_SENDRECV, BUF, i), mh));
    if (server) {
        VIP_CONN_HANDLE conn;
        VIP_VI_ATTRIBUTES remote_attrs;
        OK(VipConnectWait(nic, address(la, na.LocalNicAddress, "pp"), TIMEOUT, (VIP_NET_ADDRESS *)ra, &remote_attrs, &conn));
        OK(VipConnectAccept(conn, vi));
    } else {
        VIP_RETURN r;
        while ((r = VipConnectRequest(vi, address(la, na.LocalNicAddress, ""), address(ra, peer, "pp"), TIMEOUT, NULL)) == VIP_NO_MATCH) {}
        if (r != VIP_SUCCESS) die("VipConnectRequest", r);
    }
    static double samples[ITERS];
    int sends = 0;
    /* As via-pingpong's loop: the server answers, then posts the receive
     * again; the client posts the receive its pong took again while the
     * next ping is on its way. */
    VIP_DESCRIPTOR *taken = NULL;
    for (int i = 0; i < ITERS + WARM; i++) {
        int slot = 8 + (i & 7); /* at most 8 sends outstanding (see below) */
        double t0 = now_us();
        if (!server) OK(VipPostSend(vi, fill(slot, VIP_CONTROL_OP_SENDRECV, SIZE, 8), mh));
        if (taken) OK(VipPostRecv(vi, taken, mh));
        taken = NULL;
        VIP_DESCRIPTOR *r = mode == WAIT_CQ ? cq_recv(cq, vi, &sends) : mode == WAIT_RECV_CQ ? cq_recv_only(cq, vi) : wait_recv(vi);
        if (i >= WARM) samples[i - WARM] = (now_us() - t0) / 2; /* one-way: half the round trip */
        if (r->CS.Length != SIZE) { fprintf(stderr, "twohost: got %u bytes\n", r->CS.Length); return 1; }
        if (server) {
            OK(VipPostSend(vi, fill(slot, VIP_CONTROL_OP_SENDRECV, SIZE, 8), mh));
            OK(VipPostRecv(vi, r, mh));
        } else {
            taken = r;
        }
        if (mode != WAIT_CQ) {
            VIP_DESCRIPTOR *s;
            while (VipSendDone(vi, &s) == VIP_SUCCESS) sends++;
        }
        if (i + 1 - sends >= 8) { fprintf(stderr, "twohost: sends are not completing\n"); return 1; }
    }
    if (taken) OK(VipPostRecv(vi, taken, mh));
    if (!server) {
        qsort(samples, ITERS, sizeof samples[0], cmp_double);
        printf("LATENCY_US %.3f (median one-way of %d round trips of %d bytes)\n", samples[ITERS / 2], ITERS, SIZE);
    }
    OK(VipDisconnect(vi));
    return 0;
}

static int rdmaimm(int server, const unsigned char *peer) {
    char la[64], ra[64];
    VIP_VI_HANDLE vi = make_vi(VIP_SERVICE_RELIABLE_RECEPTION, 1, NULL);
    if (server) {
        VIP_MEM_ATTRIBUTES ma = {ptag, VIP_TRUE, VIP_FALSE};
        OK(VipSetMemAttributes(nic, mem, mh, &ma));
        OK(VipPostRecv(vi, fill(0, VIP_CONTROL_OP_SENDRECV, BUF, 0), mh));
        VIP_CONN_HANDLE conn;
        VIP_VI_ATTRIBUTES remote_attrs;
        OK(VipConnectWait(nic, address(la, na.LocalNicAddress, "rdma"), TIMEOUT, (VIP_NET_ADDRESS *)ra, &remote_attrs, &conn));
        OK(VipConnectAccept(conn, vi));
        /* Tell the client where to write: buffer 3's address and the handle. */
        VIP_UINT64 where[2] = {(VIP_UINT64)(uintptr_t)buf(3), mh};
        memcpy(buf(1), where, sizeof where);
        OK(VipPostSend(vi, fill(1, VIP_CONTROL_OP_SENDRECV, sizeof where, 1), mh));
        VIP_DESCRIPTOR *d;
        OK(VipSendWait(vi, TIMEOUT, &d));
        OK(VipRecvWait(vi, TIMEOUT, &d));
        unsigned st = d->CS.Status;
        if ((st & VIP_STATUS_OP_MASK) != VIP_STATUS_OP_REMOTE_RDMA_WRITE || !(st & VIP_STATUS_IMMEDIATE) || d->CS.ImmediateData != 0xC0FFEE) {
            fprintf(stderr, "twohost: receive status %#x immediate %#x\n", st, d->CS.ImmediateData);
            return 1;
        }
        for (int i = 0; i < 3000; i++)
            if (buf(3)[i] != (char)(i * 7)) { fprintf(stderr, "twohost: byte %d differs\n", i); return 1; }
        printf("OK rdmaimm\n");
    } else {
        OK(VipPostRecv(vi, fill(0, VIP_CONTROL_OP_SENDRECV, BUF, 0), mh));
        VIP_RETURN r;
        while ((r = VipConnectRequest(vi, address(la, na.LocalNicAddress, ""), address(ra, peer, "rdma"), TIMEOUT, NULL)) == VIP_NO_MATCH) {}
        if (r != VIP_SUCCESS) die("VipConnectRequest", r);
        VIP_DESCRIPTOR *d;
        OK(VipRecvWait(vi, TIMEOUT, &d));
        VIP_UINT64 where[2];
        memcpy(where, buf(0), sizeof where);
        for (int i = 0; i < 3000; i++) buf(2)[i] = (char)(i * 7);
        VIP_DESCRIPTOR *w = desc(2);
        memset(w, 0, 64);
        w->CS.Control = VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE;
        w->CS.ImmediateData = 0xC0FFEE;
        w->CS.SegCount = 2;
        w->CS.Length = 3000;
        w->DS[0].Remote.Data.AddressBits = where[0];
        w->DS[0].Remote.Handle = (VIP_MEM_HANDLE)where[1];
        w->DS[1].Local.Data.Address = buf(2);
        w->DS[1].Local.Handle = mh;
        w->DS[1].Local.Length = 3000;
        OK(VipPostSend(vi, w, mh));
        OK(VipSendWait(vi, TIMEOUT, &d));
        if ((d->CS.Status & VIP_STATUS_ERROR_MASK) || (d->CS.Status & VIP_STATUS_OP_MASK) != VIP_STATUS_OP_RDMA_WRITE) {
            fprintf(stderr, "twohost: write status %#x\n", d->CS.Status);
            return 1;
        }
    }
    OK(VipDisconnect(vi));
    return 0;
}

static int reject(int server, const unsigned char *peer) {
    char la[64], ra[64];
    VIP_VI_HANDLE vi = make_vi(VIP_SERVICE_RELIABLE_DELIVERY, 0, NULL);
    if (server) {
        VIP_CONN_HANDLE conn;
        VIP_VI_ATTRIBUTES remote_attrs;
        OK(VipConnectWait(nic, address(la, na.LocalNicAddress, "no"), TIMEOUT, (VIP_NET_ADDRESS *)ra, &remote_attrs, &conn));
        OK(VipConnectReject(conn));
        if (VipConnectReject(conn) != VIP_INVALID_PARAMETER) { fprintf(stderr, "twohost: a used connection handle was accepted\n"); return 1; }
    } else {
        VIP_RETURN r;
        while ((r = VipConnectRequest(vi, address(la, na.LocalNicAddress, ""), address(ra, peer, "no"), TIMEOUT, NULL)) == VIP_NO_MATCH) {}
        if (r != VIP_REJECT) { fprintf(stderr, "twohost: ConnectRequest gave %d, expected VIP_REJECT\n", (int)r); return 1; }
        VIP_VI_STATE st;
        VIP_VI_ATTRIBUTES qa;
        VIP_BOOLEAN se, re;
        OK(VipQueryVi(vi, &st, &qa, &se, &re));
        if (st != VIP_STATE_IDLE) { fprintf(stderr, "twohost: VI state %d after a reject\n", (int)st); return 1; }
        printf("OK reject\n");
    }
    return 0;
}

static int peer_model(int server, const unsigned char *peer_mac) {
    char la[64], ra[64];
    VIP_VI_HANDLE vi = make_vi(VIP_SERVICE_RELIABLE_DELIVERY, 0, NULL);
    OK(VipPostRecv(vi, fill(0, VIP_CONTROL_OP_SENDRECV, BUF, 0), mh));
    const char *mine = server ? "east" : "west", *theirs = server ? "west" : "east";
    OK(VipConnectPeerRequest(vi, address(la, na.LocalNicAddress, mine), address(ra, peer_mac, theirs), TIMEOUT));
    VIP_VI_ATTRIBUTES remote;
    if (server) {
        OK(VipConnectPeerWait(vi, &remote));
    } else {
        VIP_RETURN r;
        while ((r = VipConnectPeerDone(vi, &remote)) == VIP_NOT_DONE) {}
        if (r != VIP_SUCCESS) die("VipConnectPeerDone", r);
    }
    if (remote.ReliabilityLevel != VIP_SERVICE_RELIABLE_DELIVERY) { fprintf(stderr, "twohost: remote level %u\n", remote.ReliabilityLevel); return 1; }
    strcpy(buf(1), mine);
    OK(VipPostSend(vi, fill(1, VIP_CONTROL_OP_SENDRECV, 5, 1), mh));
    VIP_DESCRIPTOR *d;
    OK(VipRecvWait(vi, TIMEOUT, &d));
    if (strncmp(buf(0), theirs, 4) != 0) { fprintf(stderr, "twohost: got %.4s\n", buf(0)); return 1; }
    OK(VipSendWait(vi, TIMEOUT, &d));
    printf("OK peer\n");
    /* Both sides got their message; wait until the other side has too. */
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: twohost server|client SCENARIO DEVICE [MAC]\n"); return 2; }
    int server = strcmp(argv[1], "server") == 0;
    unsigned char peer[6] = {0};
    if (argc > 4) parse_mac(argv[4], peer);
    OK(VipOpenNic(argv[3], &nic));
    OK(VipQueryNic(nic, &na));
    OK(VipCreatePtag(nic, &ptag));
    mem = aligned_alloc(4096, MEM);
    memset(mem, 0, MEM);
    VIP_MEM_ATTRIBUTES ma = {ptag, VIP_FALSE, VIP_FALSE};
    OK(VipRegisterMem(nic, mem, MEM, &ma, &mh));
    const unsigned char *m = na.LocalNicAddress;
    printf("READY %02x:%02x:%02x:%02x:%02x:%02x\n", m[0], m[1], m[2], m[3], m[4], m[5]);
    fflush(stdout);
    if (server && !strcmp(argv[2], "peer")) {
        /* Peers must know each other: the harness tells us the client's MAC. */
        char line[64];
        if (!fgets(line, sizeof line, stdin)) { fprintf(stderr, "twohost: no peer MAC on stdin\n"); return 2; }
        parse_mac(line, peer);
    }
    int rc;
    if (!strcmp(argv[2], "pingpong")) rc = pingpong(server, peer, WAIT_CQ);
    else if (!strcmp(argv[2], "pingwait")) rc = pingpong(server, peer, WAIT_RECV);
    else if (!strcmp(argv[2], "pingrcq")) rc = pingpong(server, peer, WAIT_RECV_CQ);
    else if (!strcmp(argv[2], "rdmaimm")) rc = rdmaimm(server, peer);
    else if (!strcmp(argv[2], "reject")) rc = reject(server, peer);
    else if (!strcmp(argv[2], "peer")) rc = peer_model(server, peer);
    else { fprintf(stderr, "twohost: unknown scenario %s\n", argv[2]); return 2; }
    fflush(stdout);
    return rc;
}
