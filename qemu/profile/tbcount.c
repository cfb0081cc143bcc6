/* A QEMU TCG plugin: how many guest instructions each translated block ran.
 *
 * At translation it files the block (guest virtual address, instruction
 * count) in a table and asks QEMU to add 1 to the block's counter each time
 * it runs (an inline add: no call per block). At exit it writes one line per
 * block that ran, "vaddr-hex insns execs", to $TBCOUNT_OUT (default
 * /tmp/tbcount.txt). qemu/profile/symbolize.py turns that into instructions
 * per function of a guest binary. Counters are not atomic: two vCPUs running
 * one block at once may lose an increment (a count, not a proof).
 *
 * Written against QEMU's plugin API version 1 (QEMU 7.2, Debian 12); the
 * few declarations it needs are below, so no QEMU headers are needed:
 *   gcc -O2 -shared -fPIC -o tbcount.so tbcount.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*udata_cb)(qemu_plugin_id_t id, void *userdata);
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb cb);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
extern uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr, uint64_t imm);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, udata_cb cb, void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* Open addressing, never resized: 4 Mi blocks is far more than a guest
 * boot and a benchmark translate. */
#define SLOTS (1u << 22)
struct block { uint64_t vaddr, insns, execs; };
static struct block *table;
static volatile int table_lock;

static struct block *file_block(uint64_t vaddr, uint64_t insns) {
    uint64_t h = (vaddr * 0x9E3779B97F4A7C15ull ^ insns) >> 40;
    for (;; h++) {
        struct block *b = &table[h & (SLOTS - 1)];
        if (b->vaddr == vaddr && b->insns == insns)
            return b;
        if (b->vaddr == 0) {
            b->vaddr = vaddr;
            b->insns = insns;
            return b;
        }
    }
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    uint64_t vaddr = qemu_plugin_tb_vaddr(tb), insns = qemu_plugin_tb_n_insns(tb);
    while (__sync_lock_test_and_set(&table_lock, 1))
        ;
    struct block *b = file_block(vaddr ? vaddr : 1, insns);
    __sync_lock_release(&table_lock);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->execs, 1);
}

static void write_counts(qemu_plugin_id_t id, void *unused) {
    (void)id, (void)unused;
    const char *path = getenv("TBCOUNT_OUT") ? getenv("TBCOUNT_OUT") : "/tmp/tbcount.txt";
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return;
    }
    for (size_t i = 0; i < SLOTS; i++)
        if (table[i].execs)
            fprintf(f, "%lx %lu %lu\n", (unsigned long)table[i].vaddr, (unsigned long)table[i].insns, (unsigned long)table[i].execs);
    fclose(f);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info, (void)argc, (void)argv;
    table = calloc(SLOTS, sizeof *table);
    if (!table)
        return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, write_counts, NULL);
    return 0;
}
