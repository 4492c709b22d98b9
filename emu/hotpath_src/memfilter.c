/* The address filter in front of a Python memory hook (emu/hotpath/mem_filter.py is the Python side
 * and says what it is for).
 *
 * A memory hook over the whole address space calls its callback on every load or store the program
 * makes. When the callback cares about a few bytes only (the read-back watch: red-zone bytes a probe
 * hit changed), entering Python for each access costs ten times the run. This hook stands in front:
 * it calls the Python callback only for an access that overlaps one of the ranges the table holds,
 * or for every access while the table has overflowed. An empty table costs one comparison.
 */
#include <stdbool.h>

#include "hotpath.h"

enum { UC_MEM_WRITE = 17 }; /* unicorn.h's uc_mem_type */

typedef bool (*python_mem_fn)(uc_engine *uc, int type, uint64_t address, int size, int64_t value, void *user_data);

/* The table; emu/hotpath/mem_filter.py reads and writes it as 64-bit words, where LAYOUTS says they are. */
struct mem_filter {
    uint64_t count;          /* ranges in use */
    uint64_t capacity;       /* ranges the table holds */
    uint64_t everything;     /* nonzero: every access goes to Python (more ranges than the table holds) */
    uint64_t read_callback;  /* the Python callbacks (ctypes), for a load and for a store */
    uint64_t write_callback;
    uint64_t passed;         /* accesses handed to Python */
    uint64_t ranges[];       /* [start, end) pairs */
};

static bool overlaps(const struct mem_filter *f, uint64_t address, uint64_t size)
{
    for (uint64_t i = 0; i < f->count; i++)
        if (f->ranges[2 * i] < address + size && address < f->ranges[2 * i + 1])
            return true;
    return false;
}

static bool memfilter_hook(uc_engine *uc, int type, uint64_t address, int size, int64_t value, void *user_data)
{
    struct mem_filter *f = user_data;
    if (!f->everything && (f->count == 0 || !overlaps(f, address, (uint64_t)size)))
        return true;
    f->passed++;
    uint64_t callback = type == UC_MEM_WRITE ? f->write_callback : f->read_callback;
    return ((python_mem_fn)(uintptr_t)callback)(uc, type, address, size, value, NULL);
}

#define MEM_FILTER_FIELDS(X) X(count) X(capacity) X(everything) X(read_callback) X(write_callback) X(passed) X(ranges)
#define MEM_FILTER_OFFSET(field) offsetof(struct mem_filter, field),

int hotpath_add_memfilter(PyObject *module)
{
    if (HOTPATH_ADD_LAYOUT(module, "mem_filter", struct mem_filter, MEM_FILTER_FIELDS, MEM_FILTER_OFFSET) < 0)
        return -1;
    return hotpath_add_address(module, "memfilter_hook", (void *)memfilter_hook);
}
