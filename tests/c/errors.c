/* Every error return of VIPL this program can provoke on one NIC, each
 * checked for its exact code, and that nothing is lost on the way: the
 * checks a C user of the ABI relies on. `errors [DEVICE]`: on the device
 * named (default the in-process loopback /dev/via_lo); no peer is needed
 * (the two-host errors, REJECT among them, are twohost.c's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vipl.h>

#include "check.h"

int main(int argc, char **argv) {
    const char *dev = argc > 1 ? argv[1] : "/dev/via_lo";
    VIP_NIC_HANDLE nic = NULL;
    EXPECT(VipOpenNic(NULL, &nic), VIP_INVALID_PARAMETER);
    EXPECT(VipOpenNic("/dev/via_no_such_interface0", &nic), VIP_INVALID_PARAMETER);
    EXPECT(VipOpenNic(dev, &nic), VIP_SUCCESS);

    VIP_NIC_ATTRIBUTES na;
    EXPECT(VipQueryNic(nic, &na), VIP_SUCCESS);
    CHECK(na.ThreadSafe == VIP_TRUE);
    CHECK(na.NicAddressLen == 6 && na.LocalNicAddress != NULL);
    CHECK(na.ReliabilityLevelSupport == (VIP_SERVICE_UNRELIABLE | VIP_SERVICE_RELIABLE_DELIVERY | VIP_SERVICE_RELIABLE_RECEPTION));
    CHECK(na.RDMAReadSupport == (VIP_SERVICE_RELIABLE_DELIVERY | VIP_SERVICE_RELIABLE_RECEPTION));
    CHECK(na.MaxTransferSize >= 65536 && na.NativeMTU > 0);
    EXPECT(VipQueryNic(nic, NULL), VIP_INVALID_PARAMETER);
    EXPECT(VipQueryNic((VIP_NIC_HANDLE)0x12345, &na), VIP_INVALID_PARAMETER);

    VIP_PROTECTION_HANDLE ptag, other;
    EXPECT(VipCreatePtag(nic, &ptag), VIP_SUCCESS);
    EXPECT(VipCreatePtag(nic, &other), VIP_SUCCESS);

    /* VI attributes, each wrong in one way. */
    VIP_VI_ATTRIBUTES va = {VIP_SERVICE_RELIABLE_DELIVERY, 65536, NULL, ptag, VIP_FALSE, VIP_FALSE};
    VIP_VI_HANDLE vi;
    EXPECT(VipCreateVi(nic, NULL, NULL, NULL, &vi), VIP_INVALID_PARAMETER);
    VIP_VI_ATTRIBUTES bad = va;
    bad.ReliabilityLevel = 0x8;
    EXPECT(VipCreateVi(nic, &bad, NULL, NULL, &vi), VIP_INVALID_RELIABILITY_LEVEL);
    bad = va;
    bad.ReliabilityLevel = VIP_SERVICE_UNRELIABLE;
    bad.EnableRdmaRead = VIP_TRUE;
    EXPECT(VipCreateVi(nic, &bad, NULL, NULL, &vi), VIP_INVALID_RDMAREAD);
    bad = va;
    bad.MaxTransferSize = na.MaxTransferSize + 1;
    EXPECT(VipCreateVi(nic, &bad, NULL, NULL, &vi), VIP_INVALID_MTU);
    bad = va;
    bad.QoS = &bad;
    EXPECT(VipCreateVi(nic, &bad, NULL, NULL, &vi), VIP_INVALID_QOS);
    bad = va;
    bad.Ptag = (VIP_PROTECTION_HANDLE)0x777;
    EXPECT(VipCreateVi(nic, &bad, NULL, NULL, &vi), VIP_INVALID_PTAG);

    VIP_CQ_HANDLE cq;
    EXPECT(VipCreateCQ(nic, 0, &cq), VIP_INVALID_PARAMETER);
    EXPECT(VipCreateCQ(nic, 4, &cq), VIP_SUCCESS);
    EXPECT(VipCreateVi(nic, &va, NULL, cq, &vi), VIP_SUCCESS);
    EXPECT(VipDestroyCQ(cq), VIP_INVALID_STATE); /* a VI uses it */

    /* Registered memory: descriptors and a buffer. */
    char *mem = aligned_alloc(4096, 8192);
    memset(mem, 0, 8192);
    VIP_MEM_ATTRIBUTES ma = {ptag, VIP_FALSE, VIP_FALSE};
    VIP_MEM_HANDLE mh;
    EXPECT(VipRegisterMem(nic, mem, 8192, NULL, &mh), VIP_INVALID_PARAMETER);
    EXPECT(VipRegisterMem(nic, mem, 8192, &ma, &mh), VIP_SUCCESS);
    VIP_MEM_ATTRIBUTES got;
    EXPECT(VipQueryMem(nic, mem, mh, &got), VIP_SUCCESS);
    CHECK(got.Ptag == ptag && got.EnableRdmaWrite == VIP_FALSE);
    EXPECT(VipQueryMem(nic, mem + 64, mh, &got), VIP_INVALID_PARAMETER);
    EXPECT(VipDestroyPtag(nic, ptag), VIP_INVALID_STATE); /* in use */

    VIP_DESCRIPTOR *d = (VIP_DESCRIPTOR *)mem;
    memset(d, 0, sizeof *d);
    d->CS.SegCount = 1;
    d->DS[0].Local.Data.Address = mem + 4096;
    d->DS[0].Local.Handle = mh;
    d->DS[0].Local.Length = 1024;

    EXPECT(VipPostRecv(vi, (VIP_DESCRIPTOR *)(mem + 8), mh), VIP_DESCRIPTOR_ERROR); /* misaligned */
    EXPECT(VipPostRecv(vi, NULL, mh), VIP_INVALID_PARAMETER);
    EXPECT(VipPostSend(vi, d, mh), VIP_INVALID_STATE); /* not connected */
    VIP_DESCRIPTOR *back;
    EXPECT(VipRecvDone(vi, &back), VIP_NOT_DONE);
    EXPECT(VipRecvWait(vi, 20, &back), VIP_TIMEOUT);
    EXPECT(VipPostRecv(vi, d, mh), VIP_SUCCESS);

    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES qa;
    VIP_BOOLEAN se, re;
    EXPECT(VipQueryVi(vi, &st, &qa, &se, &re), VIP_SUCCESS);
    CHECK(st == VIP_STATE_IDLE && se == VIP_TRUE && re == VIP_FALSE && qa.Ptag == ptag);
    EXPECT(VipDestroyVi(vi), VIP_INVALID_STATE); /* a receive is posted */

    /* Nobody answers on the loopback: the request times out. */
    char addr_buf[64];
    VIP_NET_ADDRESS *local = (VIP_NET_ADDRESS *)addr_buf, *remote = (VIP_NET_ADDRESS *)(addr_buf + 32);
    local->HostAddressLen = 6;
    local->DiscriminatorLen = 0;
    memcpy(local->HostAddress, na.LocalNicAddress, 6);
    remote->HostAddressLen = 6;
    remote->DiscriminatorLen = 2;
    memcpy(remote->HostAddress, "\x02\x00\x00\x00\x00\x63", 6);
    memcpy(remote->HostAddress + 6, "zz", 2);
    EXPECT(VipConnectRequest(vi, local, remote, 50, NULL), VIP_TIMEOUT);
    remote->HostAddressLen = 4;
    EXPECT(VipConnectRequest(vi, local, remote, 50, NULL), VIP_INVALID_PARAMETER);

    /* Disconnect flushes what is posted; then the VI can go. */
    EXPECT(VipDisconnect(vi), VIP_SUCCESS);
    EXPECT(VipCQDone(cq, &vi, &re), VIP_SUCCESS);
    CHECK(re == VIP_TRUE);
    EXPECT(VipRecvDone(vi, &back), VIP_SUCCESS);
    CHECK(back == d && (d->CS.Status & VIP_STATUS_DESC_FLUSHED_ERROR) && (d->CS.Status & VIP_STATUS_DONE));
    EXPECT(VipCQDone(cq, &vi, &re), VIP_NOT_DONE);
    EXPECT(VipResizeCQ(cq, 0), VIP_ERROR_RESOURCE);
    EXPECT(VipResizeCQ(cq, 16), VIP_SUCCESS);
    EXPECT(VipDestroyVi(vi), VIP_SUCCESS);
    EXPECT(VipDestroyVi(vi), VIP_INVALID_PARAMETER); /* stale */
    EXPECT(VipDestroyCQ(cq), VIP_SUCCESS);

    /* Name service: NSInit(NULL) reads the default hosts file. */
    EXPECT(VipNSInit(nic, NULL), VIP_SUCCESS);
    char host[64];
    VIP_NET_ADDRESS *ha = (VIP_NET_ADDRESS *)host;
    ha->HostAddressLen = 6;
    ha->DiscriminatorLen = 0;
    EXPECT(VipNSGetHostByName(nic, "no-such-host-anywhere", ha, 0), VIP_ERROR_NAMESERVICE);
    EXPECT(VipNSGetHostByName(nic, "02:00:00:00:00:2a", ha, 0), VIP_SUCCESS);
    CHECK(ha->HostAddressLen == 6 && ha->HostAddress[5] == 0x2a);
    EXPECT(VipNSShutdown(nic), VIP_SUCCESS);

    EXPECT(VipDeregisterMem(nic, mem, mh), VIP_SUCCESS);
    EXPECT(VipDeregisterMem(nic, mem, mh), VIP_INVALID_PARAMETER);
    EXPECT(VipDestroyPtag(nic, ptag), VIP_SUCCESS);
    EXPECT(VipDestroyPtag(nic, ptag), VIP_INVALID_PTAG);
    EXPECT(VipDestroyPtag(nic, other), VIP_SUCCESS);
    EXPECT(VipCloseNic(nic), VIP_SUCCESS);
    EXPECT(VipCloseNic(nic), VIP_INVALID_PARAMETER);
    free(mem);

    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("OK errors\n");
    return 0;
}
