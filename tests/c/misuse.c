/* What a careless or hostile C program can do to VIPL, each case checked
 * for its exact return codes and statuses: no crash, no hang (a watchdog
 * ends the program after 60 s), no leak. Two NICs on the in-process
 * loopback wire, connected with the peer model.
 *   misuse close      VipCloseNic refused while objects exist, then closes
 *   misuse cycles     100 open/create/connect/close cycles: fds, threads
 *                     and VmRSS back to their baseline
 *   misuse recvgone   a posted receive whose memory is deregistered (and
 *                     unmapped) before data arrives
 *   misuse sendgone   a send buffer deregistered (and unmapped) after
 *                     posting, before it goes out
 *   misuse wake       waits woken by VipDisconnect, VipDestroyVi and
 *                     VipDestroyCQ from another thread
 *   misuse foreigncq  VipCreateVi with a CQ of another NIC
 *   misuse cqoverflow a CQ overflow through the error callback
 * Prints "OK <mode>" when every check held. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vipl.h>

#define TIMEOUT 10000UL /* ms */
#define DEV "/dev/via_lo"

#include "check.h"
#include "address.h"

static void watchdog(int sig) {
    (void)sig;
    static const char m[] = "misuse: HANG: the watchdog fired\n";
    if (write(2, m, sizeof m - 1) < 0) _exit(4);
    _exit(3);
}

/* ---- one side: a NIC, a ptag, 2 MiB of registered memory, a VI ---- */

enum { MEM = 2 << 20, BUF = 4096, BIG = 1 << 20 };

struct side {
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES na;
    VIP_PROTECTION_HANDLE ptag;
    char *mem; /* descriptors (64 bytes each) from 0, buffers from 64 KiB, a 1 MiB buffer at 1 MiB */
    VIP_MEM_HANDLE mh;
    VIP_CQ_HANDLE cq; /* the VI's receive CQ, or NULL */
    VIP_VI_HANDLE vi;
};

static VIP_DESCRIPTOR *desc(struct side *s, int i) { return (VIP_DESCRIPTOR *)(s->mem + 64 * i); }
static char *buf(struct side *s, int i) { return s->mem + 65536 + BUF * i; }
static char *big(struct side *s) { return s->mem + BIG; }

static void *map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    return p;
}

/* Fills descriptor `d` for one segment of `len` bytes at `data` (handle `mh`). */
static VIP_DESCRIPTOR *fill(VIP_DESCRIPTOR *d, void *data, VIP_MEM_HANDLE mh, unsigned len) {
    memset(d, 0, 64);
    d->CS.Control = VIP_CONTROL_OP_SENDRECV;
    d->CS.SegCount = 1;
    d->CS.Length = len;
    d->DS[0].Local.Data.Address = data;
    d->DS[0].Local.Handle = mh;
    d->DS[0].Local.Length = len;
    return d;
}

static VIP_VI_ATTRIBUTES vi_attrs(struct side *s) {
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, BIG, NULL, s->ptag, VIP_FALSE, VIP_FALSE};
    return va;
}

static void open_side(struct side *s, int with_cq) {
    memset(s, 0, sizeof *s);
    MUST(VipOpenNic(DEV, &s->nic));
    MUST(VipQueryNic(s->nic, &s->na));
    MUST(VipCreatePtag(s->nic, &s->ptag));
    s->mem = map(MEM);
    VIP_MEM_ATTRIBUTES ma = {s->ptag, VIP_FALSE, VIP_FALSE};
    MUST(VipRegisterMem(s->nic, s->mem, MEM, &ma, &s->mh));
    if (with_cq) MUST(VipCreateCQ(s->nic, 64, &s->cq));
    VIP_VI_ATTRIBUTES va = vi_attrs(s);
    MUST(VipCreateVi(s->nic, &va, NULL, s->cq, &s->vi));
}

/* Collects every completed descriptor of `s` (and its CQ entries). */
static void collect(struct side *s) {
    VIP_DESCRIPTOR *d;
    while (VipSendDone(s->vi, &d) == VIP_SUCCESS) {}
    while (VipRecvDone(s->vi, &d) == VIP_SUCCESS) {}
    VIP_VI_HANDLE v;
    VIP_BOOLEAN r;
    while (s->cq && VipCQDone(s->cq, &v, &r) == VIP_SUCCESS) {}
}

static void close_side(struct side *s) {
    EXPECT(VipDestroyVi(s->vi), VIP_SUCCESS);
    if (s->cq) EXPECT(VipDestroyCQ(s->cq), VIP_SUCCESS);
    EXPECT(VipDeregisterMem(s->nic, s->mem, s->mh), VIP_SUCCESS);
    munmap(s->mem, MEM);
    EXPECT(VipDestroyPtag(s->nic, s->ptag), VIP_SUCCESS);
    EXPECT(VipCloseNic(s->nic), VIP_SUCCESS);
    EXPECT(VipCloseNic(s->nic), VIP_INVALID_PARAMETER); /* closed: stale */
}

/* Connects a's VI with b's (peer model; polls both, so it needs no
 * progress thread). */
static void connect_pair(struct side *a, struct side *b) {
    char la[64], ra[64], lb[64], rb[64];
    MUST(VipConnectPeerRequest(a->vi, address(la, a->na.LocalNicAddress, "a"), address(ra, b->na.LocalNicAddress, "b"), TIMEOUT));
    MUST(VipConnectPeerRequest(b->vi, address(lb, b->na.LocalNicAddress, "b"), address(rb, a->na.LocalNicAddress, "a"), TIMEOUT));
    VIP_VI_ATTRIBUTES remote;
    VIP_RETURN ra_ = VIP_NOT_DONE, rb_ = VIP_NOT_DONE;
    while (ra_ == VIP_NOT_DONE || rb_ == VIP_NOT_DONE) {
        if (ra_ == VIP_NOT_DONE) ra_ = VipConnectPeerDone(a->vi, &remote);
        if (rb_ == VIP_NOT_DONE) rb_ = VipConnectPeerDone(b->vi, &remote);
    }
    MUST(ra_);
    MUST(rb_);
}

static void disconnect_pair(struct side *a, struct side *b) {
    EXPECT(VipDisconnect(a->vi), VIP_SUCCESS);
    EXPECT(VipDisconnect(b->vi), VIP_SUCCESS);
    collect(a);
    collect(b);
}

static unsigned status_of(VIP_DESCRIPTOR *d) { return d->CS.Status; }

/* ---- close ---- */

/* One open/create/connect/send/close cycle of two NICs; VipCloseNic is
 * refused while the NIC's objects exist (the server with a receive posted
 * on a connected VI), and the NIC stays usable after the refusal. */
static void cycle(void) {
    struct side a, b;
    open_side(&a, 1);
    open_side(&b, 1);
    MUST(VipPostRecv(b.vi, fill(desc(&b, 0), buf(&b, 0), b.mh, 64), b.mh));
    connect_pair(&a, &b);
    strcpy(buf(&a, 1), "hello");
    MUST(VipPostSend(a.vi, fill(desc(&a, 1), buf(&a, 1), a.mh, 6), a.mh));
    VIP_DESCRIPTOR *d;
    EXPECT(VipRecvWait(b.vi, TIMEOUT, &d), VIP_SUCCESS);
    CHECK(d == desc(&b, 0) && strcmp(buf(&b, 0), "hello") == 0);
    EXPECT(VipSendWait(a.vi, TIMEOUT, &d), VIP_SUCCESS);
    MUST(VipPostRecv(b.vi, fill(desc(&b, 2), buf(&b, 2), b.mh, 64), b.mh));

    EXPECT(VipCloseNic(b.nic), VIP_INVALID_STATE); /* a VI (connected, a receive posted), a CQ, a ptag */
    EXPECT(VipCloseNic(a.nic), VIP_INVALID_STATE);
    VIP_NIC_ATTRIBUTES na;
    EXPECT(VipQueryNic(b.nic, &na), VIP_SUCCESS); /* still open */
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN se, re;
    EXPECT(VipQueryVi(b.vi, &st, &va, &se, &re), VIP_SUCCESS);
    CHECK(st == VIP_STATE_CONNECTED && re == VIP_FALSE);

    disconnect_pair(&a, &b);
    /* Objects gone one by one: the close is refused until the last. */
    EXPECT(VipDestroyVi(b.vi), VIP_SUCCESS);
    EXPECT(VipCloseNic(b.nic), VIP_INVALID_STATE); /* the CQ and the ptag */
    EXPECT(VipCreateVi(b.nic, &va, NULL, b.cq, &b.vi), VIP_SUCCESS);
    close_side(&a);
    close_side(&b);
}

static int mode_close(void) {
    cycle();
    return 0;
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) { perror("/proc/self/fd"); exit(1); }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

/* A number field ("Threads:", "VmRSS:") of /proc/self/status. */
static long status_field(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) { perror("/proc/self/status"); exit(1); }
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, k)) v = strtol(line + k, NULL, 10);
    fclose(f);
    return v;
}

enum { CYCLES = 100, RSS_SLACK_KB = 16 * 1024 };

/* The thread count once the kernel has reaped the threads joined before
 * the call: pthread_join returns when the thread's exit clears its tid
 * (mm_release), a moment before the kernel drops it from the count in
 * /proc/self/status. Looks again, yielding, up to a bound: a thread that
 * really remains keeps the count up and fails the check. */
static long settled_threads(long want) {
    long n = status_field("Threads:");
    for (int i = 0; i < 100000 && n != want; i++) {
        sched_yield();
        n = status_field("Threads:");
    }
    return n;
}

static int mode_cycles(void) {
    cycle(); /* warm-up: first-use allocations, the thread's wake-up eventfd */
    int fds0 = count_fds();
    long threads0 = status_field("Threads:"), rss0 = status_field("VmRSS:");
    int lingering = 0; /* cycles after which a thread or fd of a closed NIC remained */
    for (int i = 0; i < CYCLES && !failures; i++) {
        cycle();
        lingering += settled_threads(threads0) != threads0 || count_fds() != fds0;
    }
    int fds = count_fds();
    long threads = settled_threads(threads0), rss = status_field("VmRSS:");
    printf("after %d cycles: fds %d -> %d, threads %ld -> %ld, VmRSS %ld -> %ld kB (slack %d kB)\n", CYCLES, fds0, fds, threads0, threads, rss0, rss,
           RSS_SLACK_KB);
    CHECK(lingering == 0); /* VipCloseNic returns once its thread and fds are gone */
    CHECK(fds == fds0);
    CHECK(threads == threads0);
    CHECK(rss - rss0 <= RSS_SLACK_KB);
    return 0;
}

/* ---- recvgone ---- */

static int mode_recvgone(void) {
    struct side a, b;
    open_side(&a, 0);
    open_side(&b, 0);
    VIP_MEM_ATTRIBUTES ma = {b.ptag, VIP_FALSE, VIP_FALSE};
    /* r1: descriptor and buffer in memory that is deregistered and unmapped. */
    char *gone = map(2 * BUF);
    VIP_MEM_HANDLE mgone;
    MUST(VipRegisterMem(b.nic, gone, 2 * BUF, &ma, &mgone));
    VIP_DESCRIPTOR *r1 = fill((VIP_DESCRIPTOR *)gone, gone + BUF, mgone, BUF);
    MUST(VipPostRecv(b.vi, r1, mgone));
    /* r2: the descriptor stays, its buffer is deregistered (still mapped). */
    char *dereg = map(BUF);
    memset(dereg, 0, BUF);
    VIP_MEM_HANDLE mdereg;
    MUST(VipRegisterMem(b.nic, dereg, BUF, &ma, &mdereg));
    VIP_DESCRIPTOR *r2 = fill(desc(&b, 2), dereg, mdereg, BUF);
    MUST(VipPostRecv(b.vi, r2, b.mh));
    /* r3: nothing is taken away. */
    VIP_DESCRIPTOR *r3 = fill(desc(&b, 3), buf(&b, 3), b.mh, BUF);
    MUST(VipPostRecv(b.vi, r3, b.mh));
    connect_pair(&a, &b);

    EXPECT(VipDeregisterMem(b.nic, gone, mgone), VIP_SUCCESS);
    munmap(gone, 2 * BUF);
    EXPECT(VipDeregisterMem(b.nic, dereg, mdereg), VIP_SUCCESS);

    for (int i = 1; i <= 3; i++) {
        memset(buf(&a, i), 'A' + i, 100);
        MUST(VipPostSend(a.vi, fill(desc(&a, i), buf(&a, i), a.mh, 100), a.mh));
    }
    VIP_DESCRIPTOR *d;
    EXPECT(VipRecvWait(b.vi, TIMEOUT, &d), VIP_SUCCESS);
    CHECK(d == r1); /* completed; its status could not be written (unmapped) */
    EXPECT(VipRecvWait(b.vi, TIMEOUT, &d), VIP_SUCCESS);
    CHECK(d == r2);
    CHECK((status_of(r2) & (VIP_STATUS_DONE | VIP_STATUS_ERROR_MASK)) == (VIP_STATUS_DONE | VIP_STATUS_PROTECTION_ERROR));
    int untouched = 1;
    for (int i = 0; i < BUF; i++) untouched &= dereg[i] == 0;
    CHECK(untouched); /* nothing written into the deregistered buffer */
    EXPECT(VipRecvWait(b.vi, TIMEOUT, &d), VIP_SUCCESS);
    CHECK(d == r3);
    CHECK(status_of(r3) == (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE) && r3->CS.Length == 100 && buf(&b, 3)[99] == 'A' + 3);
    for (int i = 1; i <= 3; i++) {
        EXPECT(VipSendWait(a.vi, TIMEOUT, &d), VIP_SUCCESS);
        CHECK(d == desc(&a, i) && (status_of(d) & VIP_STATUS_ERROR_MASK) == 0);
    }
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN se, re;
    EXPECT(VipQueryVi(b.vi, &st, &va, &se, &re), VIP_SUCCESS);
    CHECK(st == VIP_STATE_CONNECTED);
    munmap(dereg, BUF);
    disconnect_pair(&a, &b);
    close_side(&a);
    close_side(&b);
    return 0;
}

/* ---- sendgone ---- */

static int mode_sendgone(void) {
    /* No progress threads: nothing moves unless this thread calls in, so
     * the sends posted behind two 1 MiB messages are still unsent when
     * their buffer goes (the two fill the window of 1,024 frames at once). */
    setenv("VIA_PROGRESS_THREAD", "0", 1);
    struct side a, b;
    open_side(&a, 0);
    open_side(&b, 0);
    MUST(VipPostRecv(b.vi, fill(desc(&b, 0), big(&b), b.mh, BIG), b.mh));
    MUST(VipPostRecv(b.vi, fill(desc(&b, 4), big(&b), b.mh, BIG), b.mh));
    MUST(VipPostRecv(b.vi, fill(desc(&b, 1), buf(&b, 1), b.mh, BUF), b.mh));
    MUST(VipPostRecv(b.vi, fill(desc(&b, 2), buf(&b, 2), b.mh, BUF), b.mh));
    connect_pair(&a, &b);

    char *gone = map(BUF);
    strcpy(gone, "gone");
    VIP_MEM_ATTRIBUTES ma = {a.ptag, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mgone;
    MUST(VipRegisterMem(a.nic, gone, BUF, &ma, &mgone));
    memset(big(&a), 7, BIG);
    VIP_DESCRIPTOR *s0 = fill(desc(&a, 4), big(&a), a.mh, BIG);
    VIP_DESCRIPTOR *s1 = fill(desc(&a, 1), big(&a), a.mh, BIG);
    VIP_DESCRIPTOR *s2 = fill(desc(&a, 2), gone, mgone, 5);
    strcpy(buf(&a, 3), "three");
    VIP_DESCRIPTOR *s3 = fill(desc(&a, 3), buf(&a, 3), a.mh, 6);
    MUST(VipPostSend(a.vi, s0, a.mh));
    MUST(VipPostSend(a.vi, s1, a.mh));
    MUST(VipPostSend(a.vi, s2, a.mh));
    MUST(VipPostSend(a.vi, s3, a.mh));
    EXPECT(VipDeregisterMem(a.nic, gone, mgone), VIP_SUCCESS);
    munmap(gone, BUF);

    /* Both sides polled every round (a poll runs a round of progress when
     * nothing is complete), so each acknowledges the other. */
    VIP_DESCRIPTOR *sent[4], *got[4], *d;
    int ns = 0, nr = 0;
    while (ns < 4 || nr < 3) {
        if (ns < 4 && VipSendDone(a.vi, &d) == VIP_SUCCESS) sent[ns++] = d;
        if (VipRecvDone(b.vi, &d) == VIP_SUCCESS && nr < 4) got[nr++] = d;
        if (ns == 4 && (status_of(sent[3]) & VIP_STATUS_DESC_FLUSHED_ERROR)) break; /* the old behaviour: all flushed */
    }
    CHECK(ns == 4 && sent[0] == s0 && sent[1] == s1 && sent[2] == s2 && sent[3] == s3);
    CHECK(nr == 3);
    CHECK(status_of(s1) == (VIP_STATUS_DONE | VIP_STATUS_OP_SEND));
    CHECK(status_of(s2) == (VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_PROTECTION_ERROR));
    CHECK(status_of(s3) == (VIP_STATUS_DONE | VIP_STATUS_OP_SEND));
    if (ns == 4 && nr == 3) {
        CHECK(got[0] == desc(&b, 0) && got[0]->CS.Length == BIG && got[1] == desc(&b, 4) && big(&b)[BIG - 1] == 7);
        /* The refused send sent nothing: the next receive holds the third. */
        CHECK(got[2] == desc(&b, 1) && got[2]->CS.Length == 6 && strcmp(buf(&b, 1), "three") == 0);
    }
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES va;
    VIP_BOOLEAN se, re;
    EXPECT(VipQueryVi(a.vi, &st, &va, &se, &re), VIP_SUCCESS);
    CHECK(st == VIP_STATE_CONNECTED);
    disconnect_pair(&a, &b);
    close_side(&a);
    close_side(&b);
    return 0;
}

/* ---- wake ---- */

/* A waiting thread: runs one wait, records its return and results. */
struct waiter {
    pthread_t thread;
    _Atomic pid_t tid;
    int kind; /* 0 RecvWait, 1 SendWait, 2 CQWait */
    VIP_VI_HANDLE vi;
    VIP_CQ_HANDLE cq;
    VIP_RETURN rc;
    VIP_DESCRIPTOR *desc;
    VIP_VI_HANDLE cq_vi;
    VIP_BOOLEAN cq_recv;
};

static void *wait_thread(void *p) {
    struct waiter *w = p;
    atomic_store(&w->tid, (pid_t)syscall(SYS_gettid));
    if (w->kind == 0) w->rc = VipRecvWait(w->vi, VIP_INFINITE, &w->desc);
    else if (w->kind == 1) w->rc = VipSendWait(w->vi, VIP_INFINITE, &w->desc);
    else w->rc = VipCQWait(w->cq, VIP_INFINITE, &w->cq_vi, &w->cq_recv);
    return NULL;
}

/* Starts a waiter and returns once it is asleep in the wait (in ppoll,
 * as /proc/self/task/TID/syscall shows), so what follows must wake it. */
static void start_waiter(struct waiter *w) {
    atomic_store(&w->tid, 0);
    w->rc = -1;
    if (pthread_create(&w->thread, NULL, wait_thread, w)) { perror("pthread_create"); exit(1); }
    pid_t tid;
    while (!(tid = atomic_load(&w->tid))) sched_yield();
    char path[64], want[16], line[128];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    snprintf(want, sizeof want, "%d ", (int)SYS_ppoll);
    for (;;) {
        FILE *f = fopen(path, "r");
        if (!f) { perror(path); exit(1); }
        int asleep = fgets(line, sizeof line, f) && !strncmp(line, want, strlen(want));
        fclose(f);
        if (asleep) return;
        sched_yield();
    }
}

static int mode_wake(void) {
    struct side a, b;
    open_side(&a, 1);
    open_side(&b, 0);
    VIP_DESCRIPTOR *r = fill(desc(&a, 0), buf(&a, 0), a.mh, BUF);
    MUST(VipPostRecv(a.vi, r, a.mh));
    connect_pair(&a, &b);
    struct waiter w;

    /* RecvWait, then VipDisconnect: the wait returns the flushed receive. */
    w = (struct waiter){.kind = 0, .vi = a.vi};
    start_waiter(&w);
    EXPECT(VipDisconnect(a.vi), VIP_SUCCESS);
    pthread_join(w.thread, NULL);
    EXPECT(w.rc, VIP_SUCCESS);
    CHECK(w.desc == r && status_of(r) == (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR));
    VIP_VI_HANDLE v;
    VIP_BOOLEAN rq;
    EXPECT(VipCQDone(a.cq, &v, &rq), VIP_SUCCESS);
    CHECK(v == a.vi && rq == VIP_TRUE);

    /* CQWait, then VipDisconnect: the flushed receive's completion. */
    MUST(VipPostRecv(a.vi, r, a.mh));
    w = (struct waiter){.kind = 2, .cq = a.cq};
    start_waiter(&w);
    EXPECT(VipDisconnect(a.vi), VIP_SUCCESS);
    pthread_join(w.thread, NULL);
    EXPECT(w.rc, VIP_SUCCESS);
    CHECK(w.cq_vi == a.vi && w.cq_recv == VIP_TRUE);
    VIP_DESCRIPTOR *d;
    EXPECT(VipRecvDone(a.vi, &d), VIP_SUCCESS);
    CHECK(d == r && (status_of(r) & VIP_STATUS_DESC_FLUSHED_ERROR));

    /* SendWait and RecvWait, then VipDestroyVi: INVALID_STATE. */
    VIP_VI_ATTRIBUTES va = vi_attrs(&a);
    for (int kind = 0; kind <= 1; kind++) {
        VIP_VI_HANDLE vi;
        MUST(VipCreateVi(a.nic, &va, NULL, NULL, &vi));
        w = (struct waiter){.kind = kind, .vi = vi};
        start_waiter(&w);
        EXPECT(VipDestroyVi(vi), VIP_SUCCESS);
        pthread_join(w.thread, NULL);
        EXPECT(w.rc, VIP_INVALID_STATE);
    }

    /* CQWait, then VipDestroyCQ: INVALID_STATE. */
    VIP_CQ_HANDLE cq;
    MUST(VipCreateCQ(a.nic, 4, &cq));
    w = (struct waiter){.kind = 2, .cq = cq};
    start_waiter(&w);
    EXPECT(VipDestroyCQ(cq), VIP_SUCCESS);
    pthread_join(w.thread, NULL);
    EXPECT(w.rc, VIP_INVALID_STATE);

    disconnect_pair(&a, &b);
    close_side(&a);
    close_side(&b);
    return 0;
}

/* ---- foreigncq ---- */

static int mode_foreigncq(void) {
    struct side a, b;
    open_side(&a, 1);
    open_side(&b, 1); /* both CQs are number 1 of their NIC */
    VIP_VI_ATTRIBUTES va = vi_attrs(&a);
    VIP_VI_HANDLE vi;
    EXPECT(VipCreateVi(a.nic, &va, b.cq, NULL, &vi), VIP_INVALID_PARAMETER);
    EXPECT(VipCreateVi(a.nic, &va, NULL, b.cq, &vi), VIP_INVALID_PARAMETER);
    EXPECT(VipCreateVi(a.nic, &va, a.cq, b.cq, &vi), VIP_INVALID_PARAMETER);
    EXPECT(VipCreateVi(a.nic, &va, a.cq, a.cq, &vi), VIP_SUCCESS);
    EXPECT(VipDestroyVi(vi), VIP_SUCCESS);
    close_side(&a);
    close_side(&b);
    return 0;
}

/* ---- cqoverflow ---- */

static _Atomic int errors_seen;
static VIP_ERROR_DESCRIPTOR last_error;

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e) {
    (void)ctx;
    last_error = *e;
    atomic_fetch_add(&errors_seen, 1);
}

static int mode_cqoverflow(void) {
    struct side a;
    open_side(&a, 0);
    VIP_CQ_HANDLE cq;
    MUST(VipCreateCQ(a.nic, 1, &cq));
    VIP_VI_ATTRIBUTES va = vi_attrs(&a);
    VIP_VI_HANDLE vi;
    MUST(VipCreateVi(a.nic, &va, NULL, cq, &vi));
    MUST(VipErrorCallback(a.nic, NULL, on_error));
    for (int i = 0; i < 3; i++) MUST(VipPostRecv(vi, fill(desc(&a, i), buf(&a, i), a.mh, BUF), a.mh));
    EXPECT(VipDisconnect(vi), VIP_SUCCESS); /* three flushed completions into a CQ of one entry */
    while (atomic_load(&errors_seen) == 0) sched_yield(); /* from whichever thread ran progress */
    CHECK(atomic_load(&errors_seen) == 1); /* once per overflow, not per completion */
    CHECK(last_error.ErrorCode == VIP_ERROR_CATASTROPHIC && last_error.ResourceCode == VIP_RESOURCE_CQ);
    CHECK(last_error.CQHandle == cq && last_error.NicHandle == a.nic);
    VIP_VI_HANDLE v;
    VIP_BOOLEAN rq;
    for (int i = 0; i < 3; i++) { /* none lost */
        EXPECT(VipCQDone(cq, &v, &rq), VIP_SUCCESS);
        CHECK(v == vi && rq == VIP_TRUE);
    }
    EXPECT(VipCQDone(cq, &v, &rq), VIP_NOT_DONE);
    VIP_DESCRIPTOR *d;
    for (int i = 0; i < 3; i++) EXPECT(VipRecvDone(vi, &d), VIP_SUCCESS);
    MUST(VipErrorCallback(a.nic, NULL, NULL));
    EXPECT(VipDestroyVi(vi), VIP_SUCCESS);
    EXPECT(VipDestroyCQ(cq), VIP_SUCCESS);
    close_side(&a);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: misuse MODE\n"); return 2; }
    signal(SIGALRM, watchdog);
    alarm(60);
    const char *m = argv[1];
    int rc;
    if (!strcmp(m, "close")) rc = mode_close();
    else if (!strcmp(m, "cycles")) rc = mode_cycles();
    else if (!strcmp(m, "recvgone")) rc = mode_recvgone();
    else if (!strcmp(m, "sendgone")) rc = mode_sendgone();
    else if (!strcmp(m, "wake")) rc = mode_wake();
    else if (!strcmp(m, "foreigncq")) rc = mode_foreigncq();
    else if (!strcmp(m, "cqoverflow")) rc = mode_cqoverflow();
    else { fprintf(stderr, "misuse: unknown mode %s\n", m); return 2; }
    if (rc || failures) {
        fprintf(stderr, "misuse %s: %d checks failed\n", m, failures);
        return 1;
    }
    printf("OK %s\n", m);
    return 0;
}
