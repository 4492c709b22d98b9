/* Hits that repeat a judged one (emu/hotpath/repeats.py says when that proves the same verdict). */
#include <stddef.h>
#include <string.h>

#include "verify.h"

/* The evidence of the open hit into ev, without its code; 0 if it has none C can compare (Python has
 * its own record of the hit, the kernel part ran in Python, or the log holds too many stores). */
static int fill_evidence(const struct edges *e, const void *before, struct evidence *ev)
{
    const struct write_log *log = AS_PTR(struct write_log, e->log);
    if (log->count > REPEAT_ENTRIES || e->python_seq == e->seq || e->kernel_seq != e->seq)
        return 0;
    ev->site = e->site, ev->kernel_path = e->kernel_path, ev->kernel_exit = e->kernel_exit;
    ev->count = log->count;
    memcpy(ev->before, before, sizeof ev->before);
    memcpy(ev->after, AS_PTR(void, e->redzone), sizeof ev->after);
    for (uint64_t i = 0; i < log->count; i++) {
        const struct log_entry *store = &log->entries[i];
        uint64_t *entry = ev->entries[i];
        entry[0] = store->pc, entry[1] = store->address - log->base, entry[2] = store->size;
        entry[3] = (uint64_t)store->value;
    }
    return 1;
}

/* The code at each entry's pc into ev (0: some of it is unmapped). */
static int fill_code(uc_engine *uc, const struct edges *e, struct evidence *ev)
{
    memset(ev->code, 0, sizeof ev->code);
    for (uint64_t i = 0; i < ev->count; i++)
        if (AS_FN(uc_mem_read_fn, e->mem_read)(uc, ev->entries[i][0], ev->code[i], CODE_BYTES) != 0)
            return 0;
    return 1;
}

static int same_evidence(const struct evidence *a, const struct evidence *b)
{
    size_t head = offsetof(struct evidence, entries) + a->count * sizeof a->entries[0];
    return memcmp(a, b, head) == 0 && memcmp(a->code, b->code, a->count * CODE_BYTES) == 0;
}

/* A site's memo slot: the top bits of its address, hashed. */
static uint64_t slot_of(uint64_t site)
{
    return (site * 0x9E3779B97F4A7C15ull) >> (64 - REPEAT_SLOT_BITS);
}

int repeats_judged_hit(uc_engine *uc, struct edges *e, const void *before)
{
    struct repeats *r = AS_PTR(struct repeats, e->repeats);
    if (r == NULL)
        return 0;
    r->candidate_seq = 0;
    struct evidence *ev = &r->candidate;
    if (!fill_evidence(e, before, ev) || !fill_code(uc, e, ev))
        return 0;
    uint64_t slot = slot_of(e->site);
    if (r->armed[slot] && r->count < r->capacity && same_evidence(ev, &r->memo[slot])) {
        r->hits[2 * r->count] = slot, r->hits[2 * r->count + 1] = e->hit;
        r->count++;
        return 1;
    }
    r->candidate_seq = e->seq, r->candidate_slot = slot;
    return 0;
}
