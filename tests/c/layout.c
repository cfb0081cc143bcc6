/* The structure layouts of include/vipl.h, checked at compile time (they
 * must equal what libvipl's Rust side asserts in vipl/src/types.rs), and
 * the library's entry points resolved at link time. */
#include <stddef.h>
#include <stdio.h>
#include <vipl.h>

#define CHECK(cond) _Static_assert(cond, #cond)

CHECK(sizeof(VIP_ULONG) == 8);
CHECK(sizeof(VIP_NIC_ATTRIBUTES) == 200);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, HardwareVersion) == 64);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, NicAddressLen) == 80);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, LocalNicAddress) == 88);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, ThreadSafe) == 96);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, MaxDiscriminatorLen) == 100);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, MaxRegisterBytes) == 104);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, MaxPtags) == 184);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, ReliabilityLevelSupport) == 192);
CHECK(offsetof(VIP_NIC_ATTRIBUTES, RDMAReadSupport) == 194);
CHECK(sizeof(VIP_VI_ATTRIBUTES) == 40);
CHECK(offsetof(VIP_VI_ATTRIBUTES, MaxTransferSize) == 8);
CHECK(offsetof(VIP_VI_ATTRIBUTES, QoS) == 16);
CHECK(offsetof(VIP_VI_ATTRIBUTES, Ptag) == 24);
CHECK(offsetof(VIP_VI_ATTRIBUTES, EnableRdmaWrite) == 32);
CHECK(offsetof(VIP_VI_ATTRIBUTES, EnableRdmaRead) == 36);
CHECK(sizeof(VIP_MEM_ATTRIBUTES) == 16);
CHECK(offsetof(VIP_MEM_ATTRIBUTES, EnableRdmaRead) == 12);
CHECK(offsetof(VIP_NET_ADDRESS, HostAddress) == 4);
CHECK(sizeof(VIP_ERROR_DESCRIPTOR) == 48);
CHECK(offsetof(VIP_ERROR_DESCRIPTOR, OpCode) == 32);
CHECK(offsetof(VIP_ERROR_DESCRIPTOR, ResourceCode) == 40);
CHECK(offsetof(VIP_ERROR_DESCRIPTOR, ErrorCode) == 44);
CHECK(sizeof(VIP_AUTODISCOVERY_LIST) == 24);
CHECK(sizeof(VIP_CONTROL_SEGMENT) == 32);
CHECK(offsetof(VIP_CONTROL_SEGMENT, NextHandle) == 8);
CHECK(offsetof(VIP_CONTROL_SEGMENT, SegCount) == 12);
CHECK(offsetof(VIP_CONTROL_SEGMENT, Control) == 14);
CHECK(offsetof(VIP_CONTROL_SEGMENT, ImmediateData) == 20);
CHECK(offsetof(VIP_CONTROL_SEGMENT, Length) == 24);
CHECK(offsetof(VIP_CONTROL_SEGMENT, Status) == 28);
CHECK(sizeof(VIP_DATA_SEGMENT) == 16);
CHECK(sizeof(VIP_ADDRESS_SEGMENT) == 16);
CHECK(sizeof(VIP_DESCRIPTOR) == 64);
CHECK(_Alignof(VIP_DESCRIPTOR) == 64);
CHECK(VIP_NO_MATCH == 14);
CHECK(VIP_STATE_ERROR == 3);
CHECK(VIP_ERROR_CATASTROPHIC == 10);

int main(void) {
    /* Taking each function's address makes the link fail if one is missing. */
    void *fns[] = {
        (void *)VipOpenNic, (void *)VipCloseNic, (void *)VipQueryNic, (void *)VipCreateVi, (void *)VipDestroyVi,
        (void *)VipQueryVi, (void *)VipSetViAttributes, (void *)VipConnectWait, (void *)VipConnectAccept,
        (void *)VipConnectReject, (void *)VipConnectRequest, (void *)VipDisconnect, (void *)VipConnectPeerRequest,
        (void *)VipConnectPeerDone, (void *)VipConnectPeerWait, (void *)VipCreatePtag, (void *)VipDestroyPtag,
        (void *)VipRegisterMem, (void *)VipDeregisterMem, (void *)VipQueryMem, (void *)VipSetMemAttributes,
        (void *)VipPostSend, (void *)VipSendDone, (void *)VipSendWait, (void *)VipSendNotify, (void *)VipPostRecv,
        (void *)VipRecvDone, (void *)VipRecvWait, (void *)VipRecvNotify, (void *)VipCreateCQ, (void *)VipDestroyCQ,
        (void *)VipResizeCQ, (void *)VipCQDone, (void *)VipCQWait, (void *)VipCQNotify,
        (void *)VipQuerySystemManagementInfo, (void *)VipErrorCallback, (void *)VipNSInit, (void *)VipNSGetHostByName,
        (void *)VipNSGetHostByAddr, (void *)VipNSShutdown,
    };
    size_t n = sizeof fns / sizeof fns[0];
    for (size_t i = 0; i < n; i++)
        if (!fns[i])
            return 1;
    printf("OK %zu functions\n", n);
    return 0;
}
