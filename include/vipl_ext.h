/*
 * vipl_ext.h -- via-rs extensions to the VIA 1.0 interface (libvipl).
 * Nothing here changes what a VIA 1.0 program sees: every name is
 * prefixed VIP_EXT_ / VipExt, and each extension is asked for explicitly.
 *
 * Remote atomics. A descriptor posted with VipPostSend on a reliable VI
 * whose Control is VIP_EXT_CONTROL_OP_ATOMIC with one of
 * VIP_EXT_ATOMIC_FETCH_ADD or VIP_EXT_ATOMIC_CMP_SWAP (and optionally
 * VIP_CONTROL_QFENCE) runs a 64-bit atomic on the peer's memory:
 *
 *   segment 0  VIP_ADDRESS_SEGMENT      the 8-byte target, 8-byte aligned,
 *                                       in memory registered with
 *                                       EnableRdmaWrite on a VI with
 *                                       EnableRdmaWrite;
 *   segment 1  VIP_EXT_ATOMIC_OPERANDS  the addend (fetch-and-add), or the
 *                                       compare and swap values;
 *   segment 2  VIP_DATA_SEGMENT         8 local bytes that receive the
 *                                       target's value before the atomic.
 *
 * SegCount is 3 and Length 8. The atomic runs once at the target, even
 * when the request is sent again over a lossy link (the target keeps
 * its answer for repeats), and atomically with respect to the target
 * host's own atomic instructions on the same word. It completes with
 * VIP_EXT_STATUS_OP_ATOMIC in Status and Length 8; a target outside
 * enabled memory gives VIP_STATUS_RDMA_PROT_ERROR (and, as for RDMA,
 * breaks the connection); a malformed descriptor, an unreliable VI or a
 * misaligned target VIP_STATUS_FORMAT_ERROR.
 *
 * VIA 1.0's reserved operation (VIP_CONTROL_OP_RESERVED) without one of
 * the atomic bits is still a VIP_STATUS_FORMAT_ERROR.
 *
 * Shared receive queues. A pool of receive descriptors, under one
 * protection tag, that VIs of one NIC draw from as messages arrive:
 * VipExtViUseSrq makes an idle VI with no receive posted take its
 * receives from the pool (its own VipPostRecv is then refused with
 * VIP_INVALID_STATE); when a message needs a receive on it, the pool's
 * oldest descriptor becomes the VI's, completes there as a receive posted
 * on it would (VipRecvDone, VipRecvWait, the VI's receive CQ) and is
 * handed back by that VI. A descriptor that is no valid receive is
 * refused by VipExtPostSrq (VIP_DESCRIPTOR_ERROR). An empty pool is a VI
 * with no receive posted: the connection breaks, unless the receiving
 * process set VIA_RNR=1 (receiver not ready: the sender holds the message
 * and sends it again after a back-off, VIA_RNR_RETRY refusals at most).
 */
#ifndef VIPL_EXT_H
#define VIPL_EXT_H

#include <vipl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VIP_EXT_CONTROL_OP_ATOMIC  VIP_CONTROL_OP_RESERVED
#define VIP_EXT_ATOMIC_FETCH_ADD   0x10
#define VIP_EXT_ATOMIC_CMP_SWAP    0x20
#define VIP_EXT_STATUS_OP_ATOMIC   0x00050000

typedef struct {
    VIP_UINT64 CompareAdd; /* fetch-and-add: the addend; compare-and-swap: the value compared */
    VIP_UINT64 Swap;       /* compare-and-swap: the value stored when it matched */
} VIP_EXT_ATOMIC_OPERANDS;

/* An atomic's descriptor, segment by segment (80 bytes; a VIP_DESCRIPTOR
 * pointer to it is what VipPostSend takes). */
typedef struct {
    VIP_CONTROL_SEGMENT     CS;
    VIP_ADDRESS_SEGMENT     Remote;
    VIP_EXT_ATOMIC_OPERANDS Operands;
    VIP_DATA_SEGMENT        Local;
} __attribute__((aligned(VIP_DESCRIPTOR_ALIGNMENT))) VIP_EXT_ATOMIC_DESCRIPTOR;

/* Fills `d` for a fetch-and-add (`swap` unused) or compare-and-swap
 * (`op` VIP_EXT_ATOMIC_FETCH_ADD or VIP_EXT_ATOMIC_CMP_SWAP) on the peer's
 * word at `remote` (handle `remote_handle`), the value before landing at
 * `local` (handle `local_handle`). */
static inline void VipExtAtomicDescriptor(VIP_EXT_ATOMIC_DESCRIPTOR *d, VIP_UINT16 op, void *remote, VIP_MEM_HANDLE remote_handle,
                                          VIP_UINT64 compare_add, VIP_UINT64 swap, void *local, VIP_MEM_HANDLE local_handle) {
    VIP_EXT_ATOMIC_DESCRIPTOR z = {0};
    *d = z;
    d->CS.Control = (VIP_UINT16)(VIP_EXT_CONTROL_OP_ATOMIC | op);
    d->CS.SegCount = 3;
    d->CS.Length = 8;
    d->Remote.Data.Address = remote;
    d->Remote.Handle = remote_handle;
    d->Operands.CompareAdd = compare_add;
    d->Operands.Swap = swap;
    d->Local.Data.Address = local;
    d->Local.Handle = local_handle;
    d->Local.Length = 8;
}

typedef VIP_PVOID VIP_EXT_SRQ_HANDLE;

VIP_RETURN VipExtCreateSrq(VIP_NIC_HANDLE NicHandle, VIP_PROTECTION_HANDLE Ptag, VIP_ULONG Depth, VIP_EXT_SRQ_HANDLE *SrqHandle);
VIP_RETURN VipExtDestroySrq(VIP_EXT_SRQ_HANDLE SrqHandle);
VIP_RETURN VipExtPostSrq(VIP_EXT_SRQ_HANDLE SrqHandle, VIP_DESCRIPTOR *DescriptorPtr, VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipExtViUseSrq(VIP_VI_HANDLE ViHandle, VIP_EXT_SRQ_HANDLE SrqHandle);

#ifdef __cplusplus
}
#endif

#endif /* VIPL_EXT_H */
