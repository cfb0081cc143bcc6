/* VIPL is thread-safe (VIP_NIC_ATTRIBUTES.ThreadSafe): four threads share
 * one NIC, each creating, using and destroying its own VIs, CQs and
 * registrations at once, while each checks every return. Runs on the
 * in-process loopback (/dev/via_lo). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vipl.h>

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE ptag;

static void *worker(void *arg) {
    long failures = 0;
    char *mem = aligned_alloc(4096, 8192);
    memset(mem, 0, 8192);
    for (int round = 0; round < 200; round++) {
        VIP_MEM_ATTRIBUTES ma = {ptag, VIP_FALSE, VIP_FALSE};
        VIP_MEM_HANDLE mh;
        VIP_CQ_HANDLE cq;
        VIP_VI_HANDLE vi;
        VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, VIP_FALSE, VIP_FALSE};
        failures += VipRegisterMem(nic, mem, 8192, &ma, &mh) != VIP_SUCCESS;
        failures += VipCreateCQ(nic, 8, &cq) != VIP_SUCCESS;
        failures += VipCreateVi(nic, &va, NULL, cq, &vi) != VIP_SUCCESS;
        VIP_DESCRIPTOR *d = (VIP_DESCRIPTOR *)mem;
        memset(d, 0, sizeof *d);
        d->CS.SegCount = 1;
        d->DS[0].Local.Data.Address = mem + 4096;
        d->DS[0].Local.Handle = mh;
        d->DS[0].Local.Length = 100;
        failures += VipPostRecv(vi, d, mh) != VIP_SUCCESS;
        failures += VipDisconnect(vi) != VIP_SUCCESS; /* flushes the receive */
        VIP_VI_HANDLE who;
        VIP_BOOLEAN rq;
        failures += VipCQWait(cq, 1000, &who, &rq) != VIP_SUCCESS || who != vi || rq != VIP_TRUE;
        VIP_DESCRIPTOR *back;
        failures += VipRecvDone(vi, &back) != VIP_SUCCESS || back != d;
        failures += VipDestroyVi(vi) != VIP_SUCCESS;
        failures += VipDestroyCQ(cq) != VIP_SUCCESS;
        failures += VipDeregisterMem(nic, mem, mh) != VIP_SUCCESS;
    }
    free(mem);
    *(long *)arg = failures;
    return NULL;
}

int main(void) {
    if (VipOpenNic("/dev/via_lo", &nic) != VIP_SUCCESS || VipCreatePtag(nic, &ptag) != VIP_SUCCESS) {
        fprintf(stderr, "threads: cannot open the NIC\n");
        return 1;
    }
    VIP_NIC_ATTRIBUTES na;
    if (VipQueryNic(nic, &na) != VIP_SUCCESS || na.ThreadSafe != VIP_TRUE) return 1;
    pthread_t t[4];
    long fails[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, &fails[i]);
    long total = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        total += fails[i];
    }
    if (total) {
        fprintf(stderr, "threads: %ld calls failed\n", total);
        return 1;
    }
    printf("OK threads\n");
    return 0;
}
