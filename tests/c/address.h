/* A VIPL network address the C test programs build: a 6-byte MAC, then
 * the discriminator. */
#ifndef VIA_TESTS_ADDRESS_H
#define VIA_TESTS_ADDRESS_H
#include <string.h>
#include <vipl.h>

/* Writes into `room` (at least sizeof(VIP_NET_ADDRESS) + 6 + strlen(disc)
 * bytes) the address of `mac` with discriminator `disc`; returns it. */
static inline VIP_NET_ADDRESS *address(char *room, const unsigned char *mac, const char *disc) {
    VIP_NET_ADDRESS *a = (VIP_NET_ADDRESS *)room;
    a->HostAddressLen = 6;
    a->DiscriminatorLen = (VIP_UINT16)strlen(disc);
    memcpy(a->HostAddress, mac, 6);
    memcpy(a->HostAddress + 6, disc, strlen(disc));
    return a;
}

#endif
