/* The counting-only front's shared declarations: fastsys.c handles the hits, fastsys_type.c is the
 * FastSys object Python makes and feeds (its tables, its statistics). */
#ifndef UPROBE_EMU_FASTSYS_H
#define UPROBE_EMU_FASTSYS_H

#include "verify.h"

#define MAX_SAVED 17
#define MAX_URETPROBE_DEPTH 64 /* include/linux/uprobes.h */
#define FLAGS_TF 0x100
#define FLAGS_RF 0x10000

enum { PATH_INT3, PATH_CALL, PATH_JMP, PATH_RETURN }; /* consumers.NATIVE_PATHS, then ret_hits */
enum { EXIT_TRAMPOLINE, EXIT_IRET, EXIT_SYSRET };
enum { REG_AX, REG_IP, REG_FLAGS, REG_SP, REG_CX, REG_R11, REG_IDS };
/* what the Python side folds into its statistics (take_stats order) */
enum { ST_UPROBE_CALLS, ST_MMAP_LOCKS, ST_COPIED, ST_EXIT_SYSRET, ST_EXIT_IRET, ST_TRAPS, ST_EMULATED,
       ST_URETPROBE_CALLS, ST_RET_HITS, ST_COUNT };

typedef struct {
    uint64_t key;
    uint64_t value;
} pair;

typedef struct {
    uint64_t vaddr;
    uint32_t first, count; /* counters[first .. first + count) */
    uint32_t int3_length;  /* nonzero: an INT3 hit here emulates a NOP of this length */
    uint32_t returns;      /* some consumer has a (counting) return handler: a return instance per hit */
    uint32_t ret_first, ret_count; /* the enabled ones among them: counters[ret_first ..] */
    uint64_t nop_next;     /* a NOP-class site the verifiers watch: where its hit resumes (0: not one) */
    uint64_t arm_ret, arm_popped; /* the trampoline ret its transaction may be armed for, and its pops */
} probe_entry;

typedef struct {
    uint64_t func, stack, orig;
    uint32_t chained, probe; /* probe: index in the table it was pushed with */
} return_instance;

typedef struct {
    PyObject_HEAD
    uc_engine *uc;
    uc_reg_read_batch_fn reg_read_batch;
    uc_reg_write_batch_fn reg_write_batch;
    uc_reg_read_fn reg_read;
    uc_mem_read_fn mem_read;
    uc_mem_write_fn mem_write;
    hook_syscall_fn python_syscall;
    hook_intr_fn python_interrupt;
    hook_syscall_fn python_after_syscall; /* only Python's after-observers, for a hit that did not settle */
    hook_intr_fn python_after_interrupt;
    struct edges *verifier; /* the verifiers' control block (NULL: none watches) */
    struct icount_state *clock; /* charged for each kernel entry (NULL: the clock does not count) */
    int open;               /* nothing in Python needs to see a hit */
    uint64_t generation;    /* of the tables below */
    const uint64_t *latest; /* the tables' generation now (emu/kernel/uprobes/generation.py; NULL: not told) */
    int ids[REG_IDS];
    /* the design's Handler (emu/designs/); handler_nr < 0: no sys_uprobe */
    long long handler_nr;
    int by_slot, exit_kind, path, saved_count;
    int saved_ids[MAX_SAVED];
    uint64_t saved_offset, sp_skip, branch_end, patch_length, syscall_return;
    probe_entry *probes;  /* sorted by vaddr */
    Py_ssize_t probe_count;
    uint64_t **counters;
    pair *pages;          /* trampoline pages: [key, value) */
    Py_ssize_t page_count;
    pair *slots;          /* slot address -> probe address, sorted */
    Py_ssize_t slot_count;
    /* uretprobes: the XOL page (0: none yet), the design's ReturnTrampoline; ret_nr < 0: not here */
    uint64_t xol, ret_syscall_return;
    long long ret_nr;
    int ret_saved_count;
    int ret_saved_ids[MAX_SAVED];
    uint64_t python_depth, python_top_stack; /* Python's pending instances, under these */
    return_instance returns[MAX_URETPROBE_DEPTH];
    int return_count;
    uint64_t stats[ST_COUNT];
} FastSys;

void fastsys_on_syscall(uc_engine *uc, void *user_data);
void fastsys_on_interrupt(uc_engine *uc, uint32_t intno, void *user_data);

#endif
