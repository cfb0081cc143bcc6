/* The checks the C test programs share: EXPECT an exact return code,
 * CHECK a condition (each failure printed and counted in `failures`), and
 * MUST for set-up steps whose failure makes the rest meaningless. */
#ifndef VIA_TESTS_CHECK_H
#define VIA_TESTS_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <vipl.h>

static int failures;

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        VIP_RETURN r_ = (call);                                                              \
        if (r_ != (want)) {                                                                  \
            fprintf(stderr, "%s:%d: %s gave %d, expected %s (%d)\n", __FILE__, __LINE__, #call, \
                    (int)r_, #want, (int)(want));                                            \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                \
        }                                                                              \
    } while (0)

#define MUST(call)                                                                      \
    do {                                                                                \
        VIP_RETURN r_ = (call);                                                         \
        if (r_ != VIP_SUCCESS) {                                                        \
            fprintf(stderr, "%s:%d: %s gave %d\n", __FILE__, __LINE__, #call, (int)r_); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#endif
