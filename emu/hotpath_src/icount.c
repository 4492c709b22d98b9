/* Instruction counting per translated block; emu/process/icount.py explains the scheme and is the Python side.
 *
 * icount_translated (UC_HOOK_EDGE_GENERATED: Unicorn calls it for each block it has just translated)
 * writes the block's instruction count into a table keyed by (address, size); icount_block
 * (UC_HOOK_BLOCK: before each block runs) looks the count up (the block counted last first: a loop
 * runs one block again and again) and adds it to the total, or, when the block would take the total
 * past stop_at, stops the CPU before the block's first instruction.
 *
 * The table is a fixed array of two-way buckets owned by Python. An entry is only ever replaced by
 * a newer translation of the same key, which lands in the same bucket, so a stale count cannot
 * survive a retranslation; a key pushed out of its bucket, or translated before the hooks were
 * added, is counted by the Python callback `decode` and put back.
 *
 * The counter is also the process's clock (emu/kernel/clock.py): `kernel` holds what its kernel entries
 * cost, in instruction-equivalents, charged by icount_charge from the syscall and interrupt front
 * (fastsys.c) once Python has set entry_cost. A timer's expiry is a point of `total + kernel` (alarm_at):
 * a kernel entry that reaches it stops the CPU after the entry (the signal comes on that return to user
 * mode); Python keeps stop_at at or below alarm_at - kernel, so the block hook stops user code before it.
 */
#include "hotpath.h"

/* A translated block as Unicorn reports it (unicorn.h's uc_tb). */
typedef struct uc_tb {
    uint64_t pc;
    uint16_t icount;
    uint16_t size;
} uc_tb;

struct icount_entry {
    uint64_t pc;
    uint32_t size;   /* 0: empty (no block is empty) */
    uint32_t icount;
};

typedef uint32_t (*icount_decode_fn)(uint64_t address, uint32_t size);

#define ICOUNT_FRONT_LOG2 10 /* FRONT_CAPACITY_LOG2 in emu/process/icount.py */
#define ICOUNT_FRONT (1 << ICOUNT_FRONT_LOG2)

/* The counter; emu/process/icount.py types its fields with ctypes and checks them against LAYOUTS. */
struct icount_state {
    uint64_t total;       /* instructions of the blocks let run */
    uint64_t stop_at;     /* stop before a block that would take total past this */
    uint64_t decoded;     /* blocks counted by `decode` */
    uint32_t stopped;     /* 1: this hook stopped the CPU (the next block crosses stop_at) */
    uint32_t shift;       /* 64 - log2(buckets) */
    struct icount_entry *table;  /* 2 entries a bucket */
    uc_emu_stop_fn emu_stop;
    icount_decode_fn decode;
    struct icount_entry last; /* the block counted last (a loop's next block is most often itself) */
    uint64_t kernel;      /* instruction-equivalents the kernel entries cost (icount_charge) */
    uint64_t entry_cost;  /* charged per kernel entry (0: entries are not charged) */
    uint64_t alarm_at;    /* total + kernel at which a timer expires (ICOUNT_NO_LIMIT: none armed) */
    uint32_t alarmed;     /* a kernel entry reached alarm_at: the CPU stops once it returns */
    uint32_t front_shift; /* 64 - log2(front slots in use), 64 - ICOUNT_FRONT_LOG2 at most */
    struct icount_entry front[ICOUNT_FRONT]; /* direct-mapped, in front of the table: a loop's blocks */
};

#define ICOUNT_NO_LIMIT UINT64_MAX

/* The front cache: 16 KB that stay in the host's L1 cache, where a lookup in the table (megabytes) is a
 * cache miss a block. A key has one slot in it and every translation of the key writes that slot,
 * so it can hold no stale count either. */
static struct icount_entry *icount_front(struct icount_state *state, uint64_t pc)
{
    return &state->front[(pc * 0x9E3779B97F4A7C15ull) >> state->front_shift];
}

static struct icount_entry *icount_bucket(const struct icount_state *state, uint64_t pc, uint32_t size)
{
    uint64_t hash = (pc ^ ((uint64_t)size << 52)) * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing */
    return &state->table[(hash >> state->shift) * 2];
}

static void icount_put(struct icount_state *state, uint64_t pc, uint32_t size, uint32_t icount)
{
    struct icount_entry *way = icount_bucket(state, pc, size);
    if (state->last.pc == pc && state->last.size == size)
        state->last.icount = icount; /* a new translation of the last block: its new count */
    *icount_front(state, pc) = (struct icount_entry){pc, size, icount};
    if (way[0].pc == pc && way[0].size == size) {
        way[0].icount = icount;
    } else if (way[1].pc == pc && way[1].size == size) {
        way[1].icount = icount;
    } else {
        way[1] = way[0]; /* the older entry is pushed out, if there are two */
        way[0] = (struct icount_entry){pc, size, icount};
    }
}

/* The count of the block at pc: from the front cache, the table, or decoded and put in both. */
static uint32_t icount_find(struct icount_state *state, uint64_t pc, uint32_t size)
{
    struct icount_entry *front = icount_front(state, pc);
    if (front->pc == pc && front->size == size)
        return front->icount;
    struct icount_entry *way = icount_bucket(state, pc, size);
    for (int i = 0; i < 2; i++)
        if (way[i].pc == pc && way[i].size == size) {
            *front = way[i];
            return front->icount;
        }
    uint32_t n = state->decode(pc, size);
    state->decoded++;
    icount_put(state, pc, size, n);
    return n;
}

static void icount_translated(uc_engine *uc, uc_tb *block, uc_tb *previous, void *user_data)
{
    if (block->size != 0)
        icount_put(user_data, block->pc, block->size, block->icount);
}

/* A block that is not the last one counted, or that would take the total past stop_at. */
static __attribute__((noinline)) void icount_block_slow(uc_engine *uc, uint64_t address, uint32_t size,
                                                        struct icount_state *state)
{
    if (state->last.pc != address || state->last.size != size)
        state->last = (struct icount_entry){address, size, icount_find(state, address, size)};
    if (state->total + state->last.icount > state->stop_at) {
        state->stopped = 1;
        state->emu_stop(uc);
        return;
    }
    state->total += state->last.icount;
}

/* The common case (the block counted last, well within stop_at) saves no register and calls nothing. */
static void icount_block(uc_engine *uc, uint64_t address, uint32_t size, void *user_data)
{
    struct icount_state *state = user_data;
    if (state->last.pc == address && state->last.size == size && state->total + state->last.icount <= state->stop_at) {
        state->total += state->last.icount;
        return;
    }
    icount_block_slow(uc, address, size, state);
}

/* One kernel entry (a syscall or an interrupt) of the counted process: its cost, and the stop if a timer
 * expires while the kernel runs it (the CPU stops once the entry has returned to user mode). */
void icount_charge(struct icount_state *state, uc_engine *uc)
{
    state->kernel += state->entry_cost;
    if (state->alarm_at == ICOUNT_NO_LIMIT)
        return;
    if (state->total + state->kernel >= state->alarm_at) {
        state->alarmed = 1;
        state->emu_stop(uc);
        return;
    }
    if (state->alarm_at - state->kernel < state->stop_at)
        state->stop_at = state->alarm_at - state->kernel; /* user code now reaches the expiry sooner */
}

#define ICOUNT_STATE_FIELDS(X) X(total) X(stop_at) X(decoded) X(stopped) X(shift) X(table) X(emu_stop) X(decode) \
    X(last) X(kernel) X(entry_cost) X(alarm_at) X(alarmed) X(front_shift) X(front)
#define ICOUNT_STATE_OFFSET(field) offsetof(struct icount_state, field),

int hotpath_add_icount(PyObject *module)
{
    if (HOTPATH_ADD_LAYOUT(module, "icount_state", struct icount_state, ICOUNT_STATE_FIELDS, ICOUNT_STATE_OFFSET) < 0)
        return -1;
    return hotpath_add_address(module, "icount_block", (void *)icount_block) < 0 ? -1
           : hotpath_add_address(module, "icount_translated", (void *)icount_translated);
}
