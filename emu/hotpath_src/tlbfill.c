/* The TLB-fill hook: each guest page enters Unicorn's TLB with the permissions of its mapping
 * (emu/cpu/pages.py is the Python side and says why).
 *
 * Unicorn runs in its virtual-TLB mode (UC_TLB_VIRTUAL); on every TLB miss it asks this hook for the
 * page's physical address (the same: guest memory is mapped 1:1) and its permissions. A data page
 * then has no EXEC bit, so Unicorn's TLB lets its stores take the fast path.
 *
 * A load or store the page does not allow (or to no page at all) is about to fault. The hook then
 * arms an invalid-access hook bounded to that one page and grants the access to the TLB, so that
 * Unicorn's own check of the mapping reports the fault, with its exact address and kind, to the
 * armed hook. No invalid-access hook covers the rest of the address space: one that did would keep
 * every store on the slow path (Unicorn never marks a TLB entry dirty where such a hook is installed).
 * A fetch is granted without arming: Unicorn also fills the TLB for a fetch to find the code of a
 * range it drops from its translation cache (uc_invalidate_tb: an unmap, mprotect's split, a flush,
 * the end address of every run), whatever the range holds, and a refusal there would leave its error
 * standing for the whole run. A fetch that does fault stops the run at its instruction, with no
 * hook told (emu/cpu/engine.py makes the fault from the CPU's state).
 *
 * `granted` counts grants over mapped pages only: such a TLB entry allows more than the page does
 * and must go before the next run. An entry over no page is harmless: mapping a page flushes the TLB.
 */
#include "hotpath.h"

enum { UC_MEM_READ = 16, UC_MEM_WRITE = 17, UC_MEM_FETCH = 18 }; /* unicorn.h's uc_mem_type */
enum { UC_PROT_READ = 1, UC_PROT_WRITE = 2, UC_PROT_EXEC = 4 };
/* UC_HOOK_MEM_{READ,WRITE,FETCH}_UNMAPPED | UC_HOOK_MEM_{READ,WRITE,FETCH}_PROT */
enum { HOOK_MEM_INVALID = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) };
enum { PAGE_MASK = 0xfff };
#define GROW_STEP_MAX (1u << 19) /* about 9 growths, to 128k entries (emu/cpu/pages.py reads it) */

struct uc_tlb_entry {
    uint64_t paddr;
    int perms; /* uc_prot */
};

typedef uc_err (*uc_hook_add_fn)(uc_engine *uc, size_t *hh, int type, void *callback, void *user_data,
                                 uint64_t begin, uint64_t end, ...);

struct page_range {
    uint64_t start, end, perms; /* [start, end), page-aligned; perms: uc_prot */
};

/* The table; emu/cpu/pages.py reads and writes it as 64-bit words, where LAYOUTS says they are. */
struct page_table {
    uint64_t count;          /* ranges in use, sorted by start, disjoint */
    uint64_t capacity;       /* ranges the buffer holds */
    uint64_t hook_add;       /* uc_hook_add */
    uint64_t fault_callback; /* the invalid-access callback armed on a page about to fault */
    uint64_t fault_data;     /* ... and its user data */
    uint64_t armed_count;    /* hooks armed and not yet removed by Python */
    uint64_t armed_capacity;
    uint64_t granted;        /* fills that let the TLB allow more than the page does since Python last looked */
    uint64_t fills;          /* TLB misses answered */
    uint64_t last;           /* the range found last (a miss is most often on the page of the one before) */
    uint64_t catch_all;      /* a hook over everything, armed when the armed list is full (0: none) */
    uint64_t arms;           /* hooks armed, ever */
    uint64_t ranges;         /* struct page_range *: Python moves the array when it grows */
    uint64_t ctl;            /* uc_ctl */
    uint64_t ctl_flush;      /* its control word for a TLB flush */
    uint64_t grow_at;        /* the fill count at which the TLB is flushed so that it may grow */
    uint64_t grow_step;      /* fills to the next such flush (doubling; 0: it grows no further) */
    uint64_t growths;        /* flushes made for growth */
    uint64_t armed[64];      /* (page, hook handle) pairs: 32 of them */
};

typedef uc_err (*uc_ctl_fn)(uc_engine *uc, int control, ...);

static uint64_t page_perms(struct page_table *t, uint64_t address)
{
    const struct page_range *ranges = (const struct page_range *)(uintptr_t)t->ranges;
    uint64_t n = t->count, last = t->last;
    if (last < n && ranges[last].start <= address && address < ranges[last].end)
        return ranges[last].perms;
    uint64_t lo = 0, hi = n; /* the last range starting at or below address is lo - 1 */
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (ranges[mid].start <= address)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || address >= ranges[lo - 1].end)
        return 0;
    t->last = lo - 1;
    return ranges[lo - 1].perms;
}

/* The page at vaddr is about to fault: an invalid-access hook over it alone reports how. */
static void arm(uc_engine *uc, struct page_table *t, uint64_t vaddr)
{
    uint64_t pairs = t->armed_count;
    for (uint64_t i = 0; i < pairs; i++)
        if (t->armed[2 * i] == vaddr)
            return; /* armed already (a grant of another kind of access to the same page) */
    if (t->catch_all)
        return;
    size_t handle = 0;
    t->arms++;
    int room = 2 * pairs + 2 <= t->armed_capacity;
    uint64_t begin = room ? vaddr : 1, end = room ? vaddr + PAGE_MASK : 0; /* begin > end: everywhere */
    if (((uc_hook_add_fn)(uintptr_t)t->hook_add)(uc, &handle, HOOK_MEM_INVALID, (void *)(uintptr_t)t->fault_callback,
                                                 (void *)(uintptr_t)t->fault_data, begin, end) != 0)
        return;
    if (!room) {
        t->catch_all = handle;
        return;
    }
    t->armed[2 * pairs] = vaddr;
    t->armed[2 * pairs + 1] = handle;
    t->armed_count = pairs + 1;
}

/* Unicorn's TLB starts with 256 entries and changes size only when it is flushed (by use: doubled
 * past 70%). A program whose pages do not fit misses on and on (xz: 7.6 million fills, each of which
 * first rebuilds the CPU state from the translated block), so misses that go on flush it to let it
 * grow: after grow_step more fills, the step doubling each time up to a bound. */
static void grow(uc_engine *uc, struct page_table *t)
{
    if (!t->grow_step || t->fills < t->grow_at)
        return;
    ((uc_ctl_fn)(uintptr_t)t->ctl)(uc, (int)t->ctl_flush);
    t->growths++;
    t->grow_step = t->grow_step < GROW_STEP_MAX ? 2 * t->grow_step : 0;
    t->grow_at = t->fills + t->grow_step;
}

static int tlbfill_hook(uc_engine *uc, uint64_t vaddr, int type, struct uc_tlb_entry *result, void *user_data)
{
    struct page_table *t = user_data;
    uint64_t perms = page_perms(t, vaddr);
    uint64_t need = type == UC_MEM_WRITE ? UC_PROT_WRITE : type == UC_MEM_FETCH ? UC_PROT_EXEC : UC_PROT_READ;
    t->fills++;
    grow(uc, t);
    result->paddr = vaddr;
    if (!(perms & need)) {
        if (need != UC_PROT_EXEC)
            arm(uc, t, vaddr);
        if (perms)
            t->granted++;
        perms |= need;
    }
    result->perms = (int)perms;
    return 1;
}

#define PAGE_TABLE_FIELDS(X) X(count) X(capacity) X(hook_add) X(fault_callback) X(fault_data) X(armed_count) \
    X(armed_capacity) X(granted) X(fills) X(last) X(catch_all) X(arms) X(ranges) X(ctl) X(ctl_flush) X(grow_at) \
    X(grow_step) X(growths) X(armed)
#define PAGE_TABLE_OFFSET(field) offsetof(struct page_table, field),

int hotpath_add_tlbfill(PyObject *module)
{
#define TLBFILL_CONSTANTS(X) X(GROW_STEP_MAX)
    if (HOTPATH_ADD_LAYOUT(module, "page_table", struct page_table, PAGE_TABLE_FIELDS, PAGE_TABLE_OFFSET) < 0 ||
        HOTPATH_ADD_CONSTANTS(module, TLBFILL_CONSTANTS) < 0)
        return -1;
    return hotpath_add_address(module, "tlbfill_hook", (void *)tlbfill_hook);
}
