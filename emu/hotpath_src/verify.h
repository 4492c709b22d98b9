/* The verifiers' control blocks, shared by writelog.c and edges.c (emu/hotpath/write_log.py,
 * store_watch.py and edges.py lay them out from Python: every field is a 64-bit word, pointers included, so
 * that Python reads and writes them through one memoryview of words).
 */
#ifndef UPROBE_EMU_VERIFY_H
#define UPROBE_EMU_VERIFY_H

#include "hotpath.h"

/* One logged store: (pc, address, size, the value it stored, the bytes an outside store overwrites). */
struct log_entry {
    uint64_t pc, address, size;
    int64_t value;
    uint64_t old;
};

/* The write log (emu/hotpath/write_log.py). */
struct write_log {
    uint64_t count;     /* stores seen since the log started (it counts on past the capacity) */
    uint64_t capacity;  /* entries the buffer holds */
    uint64_t base;      /* the red zone's lowest address */
    uint64_t length;    /* the red zone's length (the snapshot's) */
    uint64_t mem_read;  /* uc_mem_read_fn */
    uint64_t taken;     /* the snapshot is taken (or not wanted) */
    uint64_t status;    /* what uc_mem_read returned for the snapshot (0: read) */
    uint64_t outside;   /* stores that landed neither in the red zone nor in the scratch below it */
    uint64_t open;      /* a transaction is open: the watch logs (else it returns at once) */
    uint64_t scratch;   /* bytes below the red zone a design may store into without an entry */
    uint64_t pending;   /* entries from here on have their value still to read (their store has not run yet) */
    uint64_t unseen;    /* instructions whose stores the watch could not follow (emu/cpu/memops.py) */
    uint64_t unseen_pc; /* ... the first of them */
    uint64_t left_pc, left_to; /* the first transfer out of the watched code before the resume (0: none) */
    uint64_t branch_pc, branch_to, branch_next; /* a conditional branch out: taken unless branch_next runs
                                                   next (when the log is read, it was taken) */
    uint8_t snapshot[128]; /* the red zone before the first store into it (length bytes of it) */
    struct log_entry entries[];
};

/* The store watch (emu/hotpath/store_watch.py): a code hook over the code a hit runs that logs
 * each instruction's stores from formulas decoded once (emu/cpu/memops.py). */
struct watch_op {
    uint64_t base, index, scale, disp, size, segment, flags; /* registers by Unicorn id, 0: none */
};
enum { WATCH_OP_REP = 1, WATCH_OP_ADDR32 = 2 };
enum { WATCH_OPS = 3 }; /* up to two stores, then an indirect branch's memory operand */
struct watch_record {
    uint64_t pc;     /* 0: an empty slot (Python empties the slots of code that changes) */
    uint64_t length;
    uint64_t flags;  /* WATCH_KNOWN, WATCH_CONDITIONAL */
    uint64_t transfer; /* WATCH_T_* */
    uint64_t target;   /* DIRECT: the address; INDIRECT_REG: the register's id */
    uint64_t nstores;
    struct watch_op ops[WATCH_OPS];
    uint64_t pad[5];
};
enum { WATCH_KNOWN = 1, WATCH_CONDITIONAL = 2 };
enum { WATCH_T_NONE, WATCH_T_DIRECT, WATCH_T_REG, WATCH_T_MEM, WATCH_T_RETURN, WATCH_T_KERNEL };
enum { WATCH_RANGE_NO_EXITS = 1 }; /* a range whose transfers the kernel answers for (the out-of-line step) */
struct store_watch {
    uint64_t log;        /* struct write_log * */
    uint64_t reg_read, mem_read; /* uc_reg_read_fn, uc_mem_read_fn */
    uint64_t decode;     /* hook_code_fn: Python fills the record of an instruction the table lacks */
    uint64_t table, shift; /* struct watch_record *, 1 << (64 - shift) slots */
    uint64_t nranges, ranges; /* (start, end, flags) of the code watched */
    uint64_t decoded;    /* records Python filled */
    uint64_t rcx;        /* UC_X86_REG_RCX: a rep store's count */
};

/* In writelog.c, for edges.c: one instruction about to run, at a site or in the watched code. */
void watch_instruction(uc_engine *uc, struct store_watch *w, uint64_t address, uint32_t size);
/* ... and the values of the stores logged so far, read now that they have run: those in the red zone
 * from window (its bytes now; NULL: read them). */
void watch_complete(uc_engine *uc, struct write_log *log);
void watch_complete_from(uc_engine *uc, struct write_log *log, const uint8_t *window);

/* The edges' control block (emu/hotpath/edges.py). */
struct edges {
    uint64_t state;       /* IDLE, OPEN or ARMED */
    uint64_t site;        /* the open transaction's site */
    uint64_t next;        /* the armed transaction's resume address */
    uint64_t finished;    /* transactions settled here */
    uint64_t reg_read_batch, mem_read; /* uc_reg_read_batch_fn, uc_mem_read_fn */
    uint64_t py_site, py_ret;          /* the Python site and ret hooks (hook_code_fn) */
    uint64_t log;         /* struct write_log * */
    uint64_t nregs, ids, start_ptrs, end_ptrs; /* the uc_reg_read_batch arguments for each buffer */
    uint64_t word;        /* a word read from guest memory */
    uint64_t ret_pc;      /* the ret the armed transaction leaves by */
    uint64_t popped;      /* the bytes it pops (8 + its immediate) */
    uint64_t start_redzone_status; /* what uc_mem_read returned for the red zone at the site (0: read) */
    uint64_t seq;         /* the number of the site hook's last transaction */
    uint64_t start, end, redzone, start_redzone; /* the buffers' addresses */
    uint64_t state_bytes; /* a state buffer's length */
    uint64_t kept;        /* from this offset on, a hit must leave the state as it was */
    uint64_t python_seq;  /* the transaction Python has its own record of (it judges that one) */
    uint64_t kernel_seq;  /* the last transaction whose kernel part the syscall front did (fastsys.c) */
    uint64_t kernel_path; /* ... the handler chain's path then (consumers.NATIVE_PATHS index) */
    uint64_t kernel_exit; /* ... and the exit it took (EDGES_EXIT_*) */
    /* Whole-CPU snapshots (uc_context_save) instead of register reads, where Python found them
     * faithful (emu/hotpath/edges.py: context_snapshots); ctx_start 0: read registers. */
    uint64_t ctx_save, ctx_reg_read, ctx_reg_read_batch; /* the uc_context_* functions */
    uint64_t ctx_start, ctx_end; /* uc_context *: the site's, and the one taken to compare with it */
    uint64_t ctx_words, ctx_nwords; /* (word index, mask) pairs: the words of a context that hold registers */
    uint64_t ctx_rip, ctx_rsp;   /* where a context holds rip and rsp */
    uint64_t start_full;         /* the start buffer holds every register (else rip and rsp only) */
    uint64_t start_flags_read;   /* start_flags holds ctx_start's rflags */
    uint64_t start_flags;
    uint64_t flags_id;           /* UC_X86_REG_EFLAGS */
    uint64_t hit;                /* the open transaction's number among its site's hits */
    uint64_t repeats;            /* struct repeats * (0: Python judges every hit C cannot settle) */
    uint64_t watch;              /* struct store_watch * */
};

/* A hit's evidence, when C could not settle it only because its red zone differs from the start:
 * what the red-zone check reads of it (emu/hotpath/repeats.py). */
enum { REPEAT_ENTRIES = 16, REDZONE_WORDS = 16, CODE_BYTES = 16 };
struct evidence {
    uint64_t site, kernel_path, kernel_exit, count; /* count: the log entries that follow */
    uint64_t before[REDZONE_WORDS], after[REDZONE_WORDS];
    uint64_t entries[REPEAT_ENTRIES][4]; /* pc, offset from the red zone's base, size, value */
    uint8_t code[REPEAT_ENTRIES][CODE_BYTES]; /* the code at each entry's pc (its writer's text) */
};

/* The verdicts Python gave hits, kept for the hits whose evidence repeats one (emu/hotpath/repeats.py):
 * one memo a slot, a site's slot chosen by its address. */
enum { REPEAT_SLOT_BITS = 4, REPEAT_SLOTS = 1 << REPEAT_SLOT_BITS };
struct repeats {
    uint64_t candidate_seq;  /* the transaction whose evidence candidate holds (0: none) */
    uint64_t candidate_slot; /* ... and its site's slot */
    uint64_t count;          /* hits repeated since Python last took them */
    uint64_t capacity;       /* hits the buffer holds */
    uint64_t armed[REPEAT_SLOTS]; /* the slot's memo holds the evidence of a hit Python judged */
    struct evidence candidate;
    struct evidence memo[REPEAT_SLOTS];
    uint64_t hits[];         /* (slot, hit number) of each repeated hit */
};

/* In repeats.c, for edges.c: the open hit left its red zone unlike before (REDZONE_WORDS words):
 * 1 if its evidence is the memo's (its number is kept for Python), else 0 (and it may be the candidate). */
int repeats_judged_hit(uc_engine *uc, struct edges *e, const void *before);

typedef uc_err (*uc_context_save_fn)(uc_engine *uc, void *context);
typedef uc_err (*uc_context_reg_fn)(void *context, int regid, void *value);
typedef uc_err (*uc_context_reg_read_batch_fn)(void *context, int *regs, void **vals, int count);

enum { EDGES_EXIT_SYSRET, EDGES_EXIT_IRET, EDGES_EXIT_NONE }; /* none: an INT3 handled in the kernel */

/* Both in edges.c, for fastsys.c: settle the open transaction if the kernel returns to user mode at
 * rip + rip_advance = resume with everything as the site hook found it (1: settled); arm the open
 * transaction for the ret at ret_pc, popping popped bytes, back to resume. */
int edges_settle_at_return(uc_engine *uc, struct edges *e, uint64_t rip_advance, uint64_t resume);
void edges_arm(struct edges *e, uint64_t ret_pc, uint64_t popped, uint64_t resume);

enum { EDGES_IDLE = 0, EDGES_OPEN = 1, EDGES_ARMED = 2 };

/* A site record's flag (emu/hotpath/edges.py, LAZY_REDZONE), and what start_redzone_status
 * then says: the red zone was not copied at the site (not a uc_err: Python finds no site copy). */
enum { SITE_LAZY_REDZONE = 1, REDZONE_LAZY = 0x10000 };

/* A state buffer begins with rip, then rsp (emu.cpu.STATE_REGS). */
#define STATE_RIP(buffer) (((const uint64_t *)(uintptr_t)(buffer))[0])
#define STATE_RSP(buffer) (((const uint64_t *)(uintptr_t)(buffer))[1])

#define AS_FN(type, word) ((type)(uintptr_t)(word))
#define AS_PTR(type, word) ((type *)(uintptr_t)(word))

#endif
