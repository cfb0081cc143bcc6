/*
 * vipl.h -- the VIA 1.0 VI Provider Library interface, as implemented by
 * via-rs (libvipl). Layouts and values follow VIA 1.0 for x86_64 Linux
 * (LP64): VIP_ULONG is 8 bytes, VIP_BOOLEAN an int. Link with -lvipl, or
 * `cc prog.c $(pkg-config --cflags --libs vipl)`.
 *
 * Written for via-rs from the public facts of the VIA 1.0 interface.
 */
#ifndef VIPL_H
#define VIPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- basic types ---- */
typedef void           *VIP_PVOID;
typedef int             VIP_BOOLEAN;
typedef char            VIP_CHAR;
typedef unsigned char   VIP_UCHAR;
typedef unsigned short  VIP_USHORT;
typedef unsigned long   VIP_ULONG;
typedef uint64_t        VIP_UINT64;
typedef uint32_t        VIP_UINT32;
typedef uint16_t        VIP_UINT16;
typedef uint8_t         VIP_UINT8;

#define VIP_TRUE  1
#define VIP_FALSE 0
#define VIP_INFINITE (~0UL)
#define VIP_DESCRIPTOR_ALIGNMENT 64

typedef VIP_PVOID VIP_QOS;
typedef VIP_PVOID VIP_NIC_HANDLE;
typedef VIP_PVOID VIP_VI_HANDLE;
typedef VIP_PVOID VIP_PROTECTION_HANDLE;
typedef VIP_PVOID VIP_CONN_HANDLE;
typedef VIP_PVOID VIP_CQ_HANDLE;
typedef VIP_UINT32 VIP_MEM_HANDLE;

typedef VIP_USHORT VIP_RELIABILITY_LEVEL;
#define VIP_SERVICE_UNRELIABLE        0x01
#define VIP_SERVICE_RELIABLE_DELIVERY 0x02
#define VIP_SERVICE_RELIABLE_RECEPTION 0x04

/* ---- return codes ---- */
typedef enum {
    VIP_SUCCESS,
    VIP_NOT_DONE,
    VIP_INVALID_PARAMETER,
    VIP_ERROR_RESOURCE,
    VIP_TIMEOUT,
    VIP_REJECT,
    VIP_INVALID_RELIABILITY_LEVEL,
    VIP_INVALID_MTU,
    VIP_INVALID_QOS,
    VIP_INVALID_PTAG,
    VIP_INVALID_RDMAREAD,
    VIP_DESCRIPTOR_ERROR,
    VIP_INVALID_STATE,
    VIP_ERROR_NAMESERVICE,
    VIP_NO_MATCH
} VIP_RETURN;

/* ---- addresses ---- */
typedef struct {
    VIP_UINT16 HostAddressLen;
    VIP_UINT16 DiscriminatorLen;
    VIP_UINT8  HostAddress[1]; /* HostAddressLen bytes, then the discriminator */
} VIP_NET_ADDRESS;

/* ---- attributes ---- */
typedef struct {
    VIP_CHAR              Name[64];
    VIP_ULONG             HardwareVersion;
    VIP_ULONG             ProviderVersion;
    VIP_UINT16            NicAddressLen;
    const VIP_UINT8      *LocalNicAddress;
    VIP_BOOLEAN           ThreadSafe;
    VIP_UINT16            MaxDiscriminatorLen;
    VIP_ULONG             MaxRegisterBytes;
    VIP_ULONG             MaxRegisterRegions;
    VIP_ULONG             MaxRegisterBlockBytes;
    VIP_ULONG             MaxVI;
    VIP_ULONG             MaxDescriptorsPerQueue;
    VIP_ULONG             MaxSegmentsPerDesc;
    VIP_ULONG             MaxCQ;
    VIP_ULONG             MaxCQEntries;
    VIP_ULONG             MaxTransferSize;
    VIP_ULONG             NativeMTU;
    VIP_ULONG             MaxPtags;
    VIP_RELIABILITY_LEVEL ReliabilityLevelSupport;
    VIP_RELIABILITY_LEVEL RDMAReadSupport;
} VIP_NIC_ATTRIBUTES;

typedef struct {
    VIP_RELIABILITY_LEVEL ReliabilityLevel;
    VIP_ULONG             MaxTransferSize;
    VIP_QOS               QoS;
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN           EnableRdmaWrite;
    VIP_BOOLEAN           EnableRdmaRead;
} VIP_VI_ATTRIBUTES;

typedef struct {
    VIP_PROTECTION_HANDLE Ptag;
    VIP_BOOLEAN           EnableRdmaWrite;
    VIP_BOOLEAN           EnableRdmaRead;
} VIP_MEM_ATTRIBUTES;

/* ---- descriptors ---- */
typedef union {
    VIP_UINT64 AddressBits;
    VIP_PVOID  Address;
} VIP_PVOID64;

typedef struct {
    VIP_PVOID64    Next;
    VIP_MEM_HANDLE NextHandle;
    VIP_UINT16     SegCount;
    VIP_UINT16     Control;
    VIP_UINT32     Reserved;
    VIP_UINT32     ImmediateData;
    VIP_UINT32     Length;
    VIP_UINT32     Status;
} VIP_CONTROL_SEGMENT;

typedef struct {
    VIP_PVOID64    Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32     Reserved;
} VIP_ADDRESS_SEGMENT;

typedef struct {
    VIP_PVOID64    Data;
    VIP_MEM_HANDLE Handle;
    VIP_UINT32     Length;
} VIP_DATA_SEGMENT;

typedef union {
    VIP_ADDRESS_SEGMENT Remote;
    VIP_DATA_SEGMENT    Local;
} VIP_DESCRIPTOR_SEGMENT;

/* Further segments follow DS[1] in memory. For RDMA, DS[0] is the remote
 * address segment and DS[1..] the local data segments; SegCount counts all. */
typedef struct _VIP_DESCRIPTOR {
    VIP_CONTROL_SEGMENT    CS;
    VIP_DESCRIPTOR_SEGMENT DS[2];
} __attribute__((aligned(VIP_DESCRIPTOR_ALIGNMENT))) VIP_DESCRIPTOR;

#define VIP_CONTROL_OP_SENDRECV  0x0
#define VIP_CONTROL_OP_RDMAWRITE 0x1
#define VIP_CONTROL_OP_RDMAREAD  0x2
#define VIP_CONTROL_OP_RESERVED  0x3
#define VIP_CONTROL_OP_MASK      0x3
#define VIP_CONTROL_IMMEDIATE    0x4
#define VIP_CONTROL_QFENCE       0x8
#define VIP_CONTROL_RESERVED     0xFFF0

#define VIP_STATUS_DONE               0x00000001
#define VIP_STATUS_FORMAT_ERROR       0x00000002
#define VIP_STATUS_PROTECTION_ERROR   0x00000004
#define VIP_STATUS_LENGTH_ERROR       0x00000008
#define VIP_STATUS_PARTIAL_ERROR      0x00000010
#define VIP_STATUS_DESC_FLUSHED_ERROR 0x00000020
#define VIP_STATUS_TRANSPORT_ERROR    0x00000040
#define VIP_STATUS_RDMA_PROT_ERROR    0x00000080
#define VIP_STATUS_REMOTE_DESC_ERROR  0x00000100
#define VIP_STATUS_ERROR_MASK         0x000001FE
#define VIP_STATUS_OP_SEND            0x00000000
#define VIP_STATUS_OP_RECEIVE         0x00010000
#define VIP_STATUS_OP_RDMA_WRITE      0x00020000
#define VIP_STATUS_OP_REMOTE_RDMA_WRITE 0x00030000
#define VIP_STATUS_OP_RDMA_READ       0x00040000
#define VIP_STATUS_OP_MASK            0x00070000
#define VIP_STATUS_IMMEDIATE          0x00080000
#define VIP_STATUS_RESERVED           0xFFF0FE00

/* ---- states and errors ---- */
typedef enum {
    VIP_STATE_IDLE,
    VIP_STATE_CONNECTED,
    VIP_STATE_CONNECT_PENDING,
    VIP_STATE_ERROR
} VIP_VI_STATE;

typedef enum {
    VIP_ERROR_POST_DESC,
    VIP_ERROR_CONN_LOST,
    VIP_ERROR_RECVQ_EMPTY,
    VIP_ERROR_VI_OVERRUN,
    VIP_ERROR_RDMAW_PROT,
    VIP_ERROR_RDMAW_DATA,
    VIP_ERROR_RDMAW_ABORT,
    VIP_ERROR_RDMAR_PROT,
    VIP_ERROR_COMP_PROT,
    VIP_ERROR_RDMA_TRANSPORT,
    VIP_ERROR_CATASTROPHIC
} VIP_ERROR_CODE;

typedef enum {
    VIP_RESOURCE_NIC,
    VIP_RESOURCE_VI,
    VIP_RESOURCE_CQ,
    VIP_RESOURCE_DESCRIPTOR
} VIP_RESOURCE_CODE;

typedef struct {
    VIP_NIC_HANDLE    NicHandle;
    VIP_VI_HANDLE     ViHandle;
    VIP_CQ_HANDLE     CQHandle;
    VIP_DESCRIPTOR   *DescriptorPtr;
    VIP_ULONG         OpCode;
    VIP_RESOURCE_CODE ResourceCode;
    VIP_ERROR_CODE    ErrorCode;
} VIP_ERROR_DESCRIPTOR;

#define VIP_SMI_AUTODISCOVERY 1
typedef struct {
    VIP_ULONG         NumberOfHops;
    VIP_NET_ADDRESS **ADAddrArray;
    VIP_ULONG         NumAdAddrs;
} VIP_AUTODISCOVERY_LIST;

/* ---- the 41 functions ---- */
VIP_RETURN VipOpenNic(const VIP_CHAR *DeviceName, VIP_NIC_HANDLE *NicHandle);
VIP_RETURN VipCloseNic(VIP_NIC_HANDLE NicHandle);
VIP_RETURN VipQueryNic(VIP_NIC_HANDLE NicHandle, VIP_NIC_ATTRIBUTES *Attrs);

VIP_RETURN VipCreateVi(VIP_NIC_HANDLE NicHandle, VIP_VI_ATTRIBUTES *ViAttribs,
                       VIP_CQ_HANDLE SendCQHandle, VIP_CQ_HANDLE RecvCQHandle, VIP_VI_HANDLE *ViHandle);
VIP_RETURN VipDestroyVi(VIP_VI_HANDLE ViHandle);
VIP_RETURN VipQueryVi(VIP_VI_HANDLE ViHandle, VIP_VI_STATE *State, VIP_VI_ATTRIBUTES *Attrs,
                      VIP_BOOLEAN *SendQueueEmpty, VIP_BOOLEAN *RecvQueueEmpty);
VIP_RETURN VipSetViAttributes(VIP_VI_HANDLE ViHandle, VIP_VI_ATTRIBUTES *Attrs);

VIP_RETURN VipConnectWait(VIP_NIC_HANDLE NicHandle, VIP_NET_ADDRESS *LocalAddr, VIP_ULONG Timeout,
                          VIP_NET_ADDRESS *RemoteAddr, VIP_VI_ATTRIBUTES *RemoteViAttribs,
                          VIP_CONN_HANDLE *ConnHandle);
VIP_RETURN VipConnectAccept(VIP_CONN_HANDLE ConnHandle, VIP_VI_HANDLE ViHandle);
VIP_RETURN VipConnectReject(VIP_CONN_HANDLE ConnHandle);
VIP_RETURN VipConnectRequest(VIP_VI_HANDLE ViHandle, VIP_NET_ADDRESS *LocalAddr, VIP_NET_ADDRESS *RemoteAddr,
                             VIP_ULONG Timeout, VIP_VI_ATTRIBUTES *RemoteViAttribs);
VIP_RETURN VipDisconnect(VIP_VI_HANDLE ViHandle);

VIP_RETURN VipConnectPeerRequest(VIP_VI_HANDLE ViHandle, VIP_NET_ADDRESS *LocalAddr,
                                 VIP_NET_ADDRESS *RemoteAddr, VIP_ULONG Timeout);
VIP_RETURN VipConnectPeerDone(VIP_VI_HANDLE ViHandle, VIP_VI_ATTRIBUTES *RemoteViAttribs);
VIP_RETURN VipConnectPeerWait(VIP_VI_HANDLE ViHandle, VIP_VI_ATTRIBUTES *RemoteViAttribs);

VIP_RETURN VipCreatePtag(VIP_NIC_HANDLE NicHandle, VIP_PROTECTION_HANDLE *Ptag);
VIP_RETURN VipDestroyPtag(VIP_NIC_HANDLE NicHandle, VIP_PROTECTION_HANDLE Ptag);

VIP_RETURN VipRegisterMem(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress, VIP_ULONG Length,
                          VIP_MEM_ATTRIBUTES *MemAttribs, VIP_MEM_HANDLE *MemHandle);
VIP_RETURN VipDeregisterMem(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress, VIP_MEM_HANDLE MemHandle);
VIP_RETURN VipQueryMem(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress, VIP_MEM_HANDLE MemHandle,
                       VIP_MEM_ATTRIBUTES *MemAttribs);
VIP_RETURN VipSetMemAttributes(VIP_NIC_HANDLE NicHandle, VIP_PVOID VirtualAddress, VIP_MEM_HANDLE MemHandle,
                               VIP_MEM_ATTRIBUTES *MemAttribs);

VIP_RETURN VipPostSend(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR *DescriptorPtr, VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipSendDone(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipSendWait(VIP_VI_HANDLE ViHandle, VIP_ULONG Timeout, VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipSendNotify(VIP_VI_HANDLE ViHandle, VIP_PVOID Context,
                         void (*Handler)(VIP_PVOID Context, VIP_NIC_HANDLE NicHandle, VIP_VI_HANDLE ViHandle,
                                         VIP_DESCRIPTOR *DescriptorPtr));
VIP_RETURN VipPostRecv(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR *DescriptorPtr, VIP_MEM_HANDLE MemoryHandle);
VIP_RETURN VipRecvDone(VIP_VI_HANDLE ViHandle, VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipRecvWait(VIP_VI_HANDLE ViHandle, VIP_ULONG Timeout, VIP_DESCRIPTOR **DescriptorPtr);
VIP_RETURN VipRecvNotify(VIP_VI_HANDLE ViHandle, VIP_PVOID Context,
                         void (*Handler)(VIP_PVOID Context, VIP_NIC_HANDLE NicHandle, VIP_VI_HANDLE ViHandle,
                                         VIP_DESCRIPTOR *DescriptorPtr));

VIP_RETURN VipCreateCQ(VIP_NIC_HANDLE NicHandle, VIP_ULONG EntryCount, VIP_CQ_HANDLE *CQHandle);
VIP_RETURN VipDestroyCQ(VIP_CQ_HANDLE CQHandle);
VIP_RETURN VipResizeCQ(VIP_CQ_HANDLE CQHandle, VIP_ULONG EntryCount);
VIP_RETURN VipCQDone(VIP_CQ_HANDLE CQHandle, VIP_VI_HANDLE *ViHandle, VIP_BOOLEAN *RecvQueue);
VIP_RETURN VipCQWait(VIP_CQ_HANDLE CQHandle, VIP_ULONG Timeout, VIP_VI_HANDLE *ViHandle, VIP_BOOLEAN *RecvQueue);
VIP_RETURN VipCQNotify(VIP_CQ_HANDLE CqHandle, VIP_PVOID Context,
                       void (*Handler)(VIP_PVOID Context, VIP_NIC_HANDLE NicHandle, VIP_VI_HANDLE ViHandle,
                                       VIP_BOOLEAN RecvQueue));

VIP_RETURN VipQuerySystemManagementInfo(VIP_NIC_HANDLE NicHandle, VIP_ULONG InfoType, VIP_PVOID SysManInfo);
VIP_RETURN VipErrorCallback(VIP_NIC_HANDLE NicHandle, VIP_PVOID Context,
                            void (*ErrorHandler)(VIP_PVOID Context, VIP_ERROR_DESCRIPTOR *ErrorDesc));

VIP_RETURN VipNSInit(VIP_NIC_HANDLE NicHandle, VIP_PVOID NSInitInfo);
VIP_RETURN VipNSGetHostByName(VIP_NIC_HANDLE NicHandle, VIP_CHAR *Name, VIP_NET_ADDRESS *HostAddress,
                              VIP_ULONG NameIndex);
VIP_RETURN VipNSGetHostByAddr(VIP_NIC_HANDLE NicHandle, VIP_NET_ADDRESS *HostAddress, VIP_CHAR *Name,
                              VIP_ULONG *NameLength);
VIP_RETURN VipNSShutdown(VIP_NIC_HANDLE NicHandle);

#ifdef __cplusplus
}
#endif

#endif /* VIPL_H */
