/* The extensions of vipl_ext.h from C: two NICs of this process on the
 * in-process loopback (/dev/via_lo). Remote atomics: a target word in
 * memory registered with RDMA write, fetch-and-add and compare-and-swap
 * descriptors built with VipExtAtomicDescriptor and posted with plain
 * VipPostSend; checks each value before, the word after, the completion's
 * status and length, and that a VIA 1.0 reserved operation is still
 * refused. Then a shared receive queue on the target: the target's VI
 * draws from it, sends land in the pool's descriptors and come back by
 * the VI's VipRecvWait; VipPostRecv on that VI, a bad descriptor for the
 * pool and destroying a pool in use are refused. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vipl_ext.h>
#include "address.h"

#define TIMEOUT 10000UL
#define CHECK(cond) _Static_assert(cond, #cond)
CHECK(sizeof(VIP_EXT_ATOMIC_OPERANDS) == 16);
CHECK(offsetof(VIP_EXT_ATOMIC_DESCRIPTOR, Remote) == 32);
CHECK(offsetof(VIP_EXT_ATOMIC_DESCRIPTOR, Operands) == 48);
CHECK(offsetof(VIP_EXT_ATOMIC_DESCRIPTOR, Local) == 64);

static void die(const char *what, long r) {
    fprintf(stderr, "atomics: %s failed: %ld\n", what, r);
    exit(1);
}
#define OK(call) do { VIP_RETURN r_ = (call); if (r_ != VIP_SUCCESS) die(#call, r_); } while (0)

struct side {
    VIP_NIC_HANDLE nic;
    VIP_NIC_ATTRIBUTES na;
    VIP_PROTECTION_HANDLE ptag;
    char *mem;
    VIP_MEM_HANDLE mh;
    VIP_VI_HANDLE vi;
};

static void open_side(struct side *s, VIP_BOOLEAN rdma_write) {
    OK(VipOpenNic("/dev/via_lo", &s->nic));
    OK(VipQueryNic(s->nic, &s->na));
    OK(VipCreatePtag(s->nic, &s->ptag));
    s->mem = aligned_alloc(4096, 65536);
    memset(s->mem, 0, 65536);
    VIP_MEM_ATTRIBUTES ma = {s->ptag, rdma_write, VIP_FALSE};
    OK(VipRegisterMem(s->nic, s->mem, 65536, &ma, &s->mh));
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, s->ptag, rdma_write, VIP_FALSE};
    OK(VipCreateVi(s->nic, &va, NULL, NULL, &s->vi));
}

static struct side target, initiator;

static void *serve(void *arg) {
    (void)arg;
    char la[64], ra[64];
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES remote_attrs;
    OK(VipConnectWait(target.nic, address(la, target.na.LocalNicAddress, "atomics"), TIMEOUT, (VIP_NET_ADDRESS *)ra, &remote_attrs, &conn));
    OK(VipConnectAccept(conn, target.vi));
    return NULL;
}

static void *serve_pool(void *vi) {
    char la[64], ra[64];
    VIP_CONN_HANDLE conn;
    VIP_VI_ATTRIBUTES remote_attrs;
    OK(VipConnectWait(target.nic, address(la, target.na.LocalNicAddress, "pool"), TIMEOUT, (VIP_NET_ADDRESS *)ra, &remote_attrs, &conn));
    OK(VipConnectAccept(conn, (VIP_VI_HANDLE)vi));
    return NULL;
}

/* Posts the atomic `op` on the target's word, the value before landing
 * at byte `at` of our memory; returns it, after checking the completion. */
static VIP_UINT64 atomic(int slot, VIP_UINT16 op, VIP_UINT64 compare_add, VIP_UINT64 swap, int at) {
    VIP_EXT_ATOMIC_DESCRIPTOR *d = (VIP_EXT_ATOMIC_DESCRIPTOR *)(initiator.mem + 128 * slot);
    VipExtAtomicDescriptor(d, op, target.mem + 8192, target.mh, compare_add, swap, initiator.mem + 16384 + at, initiator.mh);
    OK(VipPostSend(initiator.vi, (VIP_DESCRIPTOR *)d, initiator.mh));
    VIP_DESCRIPTOR *back;
    OK(VipSendWait(initiator.vi, TIMEOUT, &back));
    if ((void *)back != (void *)d) die("the completed descriptor is the one posted", 0);
    VIP_UINT32 st = back->CS.Status;
    if (!(st & VIP_STATUS_DONE) || (st & VIP_STATUS_ERROR_MASK) || (st & VIP_STATUS_OP_MASK) != VIP_EXT_STATUS_OP_ATOMIC || back->CS.Length != 8) {
        fprintf(stderr, "atomics: status %#x length %u\n", st, back->CS.Length);
        exit(1);
    }
    VIP_UINT64 v;
    memcpy(&v, initiator.mem + 16384 + at, 8);
    return v;
}

/* A second connection whose target VI takes its receives from a pool. */
static int pool(void) {
    VIP_EXT_SRQ_HANDLE srq;
    OK(VipExtCreateSrq(target.nic, target.ptag, 4, &srq));
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, target.ptag, VIP_FALSE, VIP_FALSE};
    VIP_VI_HANDLE tvi, ivi;
    OK(VipCreateVi(target.nic, &va, NULL, NULL, &tvi));
    va.Ptag = initiator.ptag;
    OK(VipCreateVi(initiator.nic, &va, NULL, NULL, &ivi));
    OK(VipExtViUseSrq(tvi, srq));
    /* Its own receive queue takes nothing now. */
    VIP_DESCRIPTOR *own = (VIP_DESCRIPTOR *)(target.mem + 4096);
    memset(own, 0, sizeof *own);
    own->CS.SegCount = 1;
    own->DS[0].Local.Data.Address = target.mem + 32768;
    own->DS[0].Local.Handle = target.mh;
    own->DS[0].Local.Length = 256;
    if (VipPostRecv(tvi, own, target.mh) != VIP_INVALID_STATE) die("VipPostRecv on a VI of a pool", 0);
    /* A descriptor that is no receive (an RDMA write) is refused by the pool. */
    own->CS.Control = VIP_CONTROL_OP_RDMAWRITE;
    if (VipExtPostSrq(srq, own, target.mh) != VIP_DESCRIPTOR_ERROR) die("a bad descriptor for the pool", 0);
    for (int k = 0; k < 3; k++) {
        VIP_DESCRIPTOR *d = (VIP_DESCRIPTOR *)(target.mem + 4096 + 64 * (k + 1));
        memset(d, 0, sizeof *d);
        d->CS.SegCount = 1;
        d->DS[0].Local.Data.Address = target.mem + 32768 + 256 * k;
        d->DS[0].Local.Handle = target.mh;
        d->DS[0].Local.Length = 256;
        OK(VipExtPostSrq(srq, d, target.mh));
    }
    /* Connect the pair (the target waits on another discriminator). */
    char la[64], ra[64];
    pthread_t t;
    pthread_create(&t, NULL, serve_pool, tvi);
    VIP_RETURN r;
    while ((r = VipConnectRequest(ivi, address(la, initiator.na.LocalNicAddress, ""), address(ra, target.na.LocalNicAddress, "pool"), TIMEOUT, NULL)) == VIP_NO_MATCH) {}
    if (r != VIP_SUCCESS) die("VipConnectRequest (pool)", r);
    pthread_join(t, NULL);
    for (int k = 0; k < 3; k++) {
        VIP_DESCRIPTOR *s = (VIP_DESCRIPTOR *)(initiator.mem + 4096 + 64 * k);
        memset(s, 0, sizeof *s);
        sprintf(initiator.mem + 32768 + 256 * k, "message %d", k);
        s->CS.SegCount = 1;
        s->CS.Length = 10;
        s->DS[0].Local.Data.Address = initiator.mem + 32768 + 256 * k;
        s->DS[0].Local.Handle = initiator.mh;
        s->DS[0].Local.Length = 10;
        OK(VipPostSend(ivi, s, initiator.mh));
    }
    for (int k = 0; k < 3; k++) {
        VIP_DESCRIPTOR *d;
        OK(VipRecvWait(tvi, TIMEOUT, &d));
        if ((char *)d != target.mem + 4096 + 64 * (k + 1)) die("the pool's descriptors in posting order", k);
        if (d->CS.Length != 10 || memcmp(target.mem + 32768 + 256 * k, initiator.mem + 32768 + 256 * k, 10) != 0) die("a message through the pool", k);
        VIP_DESCRIPTOR *s;
        OK(VipSendWait(ivi, TIMEOUT, &s));
    }
    if (VipExtDestroySrq(srq) != VIP_INVALID_STATE) die("destroying a pool a VI uses", 0);
    printf("OK pool\n");
    return 0;
}

int main(void) {
    open_side(&target, VIP_TRUE);
    open_side(&initiator, VIP_FALSE);
    VIP_UINT64 start = 1000;
    memcpy(target.mem + 8192, &start, 8);
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
    char la[64], ra[64];
    VIP_RETURN r;
    while ((r = VipConnectRequest(initiator.vi, address(la, initiator.na.LocalNicAddress, ""), address(ra, target.na.LocalNicAddress, "atomics"), TIMEOUT, NULL)) == VIP_NO_MATCH) {}
    if (r != VIP_SUCCESS) die("VipConnectRequest", r);
    pthread_join(t, NULL);

    if (atomic(0, VIP_EXT_ATOMIC_FETCH_ADD, 5, 0, 0) != 1000) die("fetch-and-add's value before", 0);
    if (atomic(1, VIP_EXT_ATOMIC_CMP_SWAP, 1005, 77, 8) != 1005) die("a matching compare-and-swap's value before", 0);
    if (atomic(2, VIP_EXT_ATOMIC_CMP_SWAP, 1005, 99, 3) != 77) die("a failing compare-and-swap's value before", 0);
    VIP_UINT64 now;
    memcpy(&now, target.mem + 8192, 8);
    if (now != 77) die("the target word after the atomics", (long)now);

    /* VIA 1.0's reserved operation without the atomic bits: FORMAT_ERROR. */
    VIP_EXT_ATOMIC_DESCRIPTOR *d = (VIP_EXT_ATOMIC_DESCRIPTOR *)(initiator.mem + 128 * 3);
    VipExtAtomicDescriptor(d, 0, target.mem + 8192, target.mh, 1, 0, initiator.mem + 16384, initiator.mh);
    OK(VipPostSend(initiator.vi, (VIP_DESCRIPTOR *)d, initiator.mh));
    VIP_DESCRIPTOR *back;
    OK(VipSendWait(initiator.vi, TIMEOUT, &back));
    if ((back->CS.Status & VIP_STATUS_ERROR_MASK) != VIP_STATUS_FORMAT_ERROR) die("the reserved operation's status", (long)back->CS.Status);
    memcpy(&now, target.mem + 8192, 8);
    if (now != 77) die("the target word after a refused descriptor", (long)now);

    printf("OK atomics\n");
    return pool();
}
