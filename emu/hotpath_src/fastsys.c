/* Counting-only probe hits without entering Python: the one syscall hook and the one interrupt hook.
 *
 * A FastSys object sits in front of the Python syscall and interrupt callbacks (emu/cpu/hooks.py). For a hit
 * on a probe whose every consumer only counts, with nothing in Python watching (emu/kernel/uprobes/
 * fastpath.py decides, and opens the gate), it does what the kernel's fast path leaves observable
 * and returns; anything else goes to the Python callback unchanged, by its C address.
 *
 * - sys_uprobe (spec 2.1): when no consumer changes pt_regs, the round trip writes back what it read.
 *   What remains is the hit, the saved words read from the stack, and the design's exit: SYSRET into
 *   the trampoline (rax 0, rcx = ip, r11 = flags; steps 13-16), or straight to the instruction after
 *   the site with the saved registers and rsp restored (IRET, or SYSRET, which also sets rcx and r11).
 * - INT3 on a probed NOP that is not optimized (spec 4.2, branch_xol_ops with offs 0): ip += length.
 * - uretprobes that only count: the entry's prepare_uretprobe (spec 5.1: hijack the return address,
 *   push a return instance, here on a stack of this object's) and sys_uretprobe (spec 2.2 with 5.2)
 *   for the instances pushed here. Python's own pending instances lie below them: the ones here move
 *   to Python (take_returns) before Python handles anything, and whatever needs Python's (a chain or
 *   a clean-up reaching them) is Python's to do.
 *
 * - With the verifiers on (emu/hotpath/edges.py), a hit the site hook opened a transaction for is
 *   still handled here when the verdict can be reached in C: a NOP-class site of a counting-only probe,
 *   no record of the transaction in Python. The front then does what the tracker's kernel-side
 *   observers would: it notes the hit's path and exit in the control block (Python adopts them if it
 *   ever judges the hit), and either arms the transaction for the trampoline's ret (the 'trampoline'
 *   exit, once Python has found that ret) or settles it at once as the kernel returns (IRET, SYSRET,
 *   INT3). A hit that does not settle goes to Python's after-syscall or after-interrupt observers,
 *   which judge it as if Python had handled it.
 *
 * - Every kernel entry, handled here or in Python, is first charged to the process's instruction counter
 *   when Python has given it one (set_clock: the virtual clock counts the kernel's time, icount.c).
 *
 * The tables (probe addresses, each consumer's counters, trampoline pages, slots) are Python's to
 * keep: any change anywhere bumps one generation number, and a FastSys whose tables are of an older
 * generation hands every hit to Python until Python has rebuilt them.
 */
#include "verify.h"

#include <stdlib.h>
#include <string.h>

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

static uint64_t generation = 1;

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
    int ids[REG_IDS];
    /* the design's Handler (designs.py); handler_nr < 0: no sys_uprobe */
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

static const pair *find_pair(const pair *table, Py_ssize_t n, uint64_t key)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (table[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && table[lo].key == key ? &table[lo] : NULL;
}

static const probe_entry *find_probe(const FastSys *f, uint64_t vaddr)
{
    Py_ssize_t lo = 0, hi = f->probe_count;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (f->probes[mid].vaddr < vaddr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < f->probe_count && f->probes[lo].vaddr == vaddr ? &f->probes[lo] : NULL;
}

static int in_trampoline(const FastSys *f, uint64_t ip)
{
    for (Py_ssize_t i = 0; i < f->page_count; i++)
        if (f->pages[i].key <= ip && ip < f->pages[i].value)
            return 1;
    return 0;
}

static void count_hit(FastSys *f, const probe_entry *probe, int path)
{
    for (uint32_t i = 0; i < probe->count; i++)
        f->counters[probe->first + i][path]++;
}

/* arch_uretprobe_is_alive (spec 5.1): RP_CHECK_CALL is sp < stack, CHAIN_CALL and RET are sp <= stack */
static int alive(uint64_t stack, uint64_t sp, int or_equal)
{
    return or_equal ? sp <= stack : sp < stack;
}

/* prepare_uretprobe (spec 5.1) for a probe whose return handlers only count; 0 (nothing done): Python's */
static int prepare_uretprobe(FastSys *f, const probe_entry *probe, uint64_t vaddr, uint64_t sp)
{
    uint64_t orig;
    if (f->xol == 0 || f->python_depth + (uint64_t)f->return_count >= MAX_URETPROBE_DEPTH)
        return 0; /* get_xol_area, or the nestedness limit's message: Python's */
    if (f->mem_read(f->uc, sp, &orig, 8) != 0)
        return 0;
    int chained = orig == f->xol, kept = f->return_count;
    while (kept > 0 && !alive(f->returns[kept - 1].stack, sp, chained))
        kept--; /* cleanup_return_instances: longjmp'd over, dropped without handlers */
    if (kept == 0 && f->python_depth && !alive(f->python_top_stack, sp, chained))
        return 0; /* the clean-up reaches Python's instances */
    if (chained && kept == 0)
        return 0; /* the real return address is in Python's chain, or the tail call warning */
    if (!chained && f->mem_write(f->uc, sp, &f->xol, 8) != 0)
        return 0;
    f->return_count = kept;
    return_instance *ri = &f->returns[f->return_count++];
    ri->func = vaddr, ri->stack = sp, ri->chained = (uint32_t)chained;
    ri->orig = chained ? f->returns[kept - 1].orig : orig;
    ri->probe = (uint32_t)(probe - f->probes);
    f->stats[ST_COPIED] += chained ? 8 : 16;
    return 1;
}

/* sys_uretprobe (spec 2.2, uprobe_handle_trampoline 5.2) for return instances pushed here, with the
 * 'trampoline' exit; 0: Python must handle it. rip is at the syscall. */
static int fast_uretprobe(FastSys *f, const uint64_t *v)
{
    uint64_t ip = v[REG_IP] + 2, flags = v[REG_FLAGS], sp = v[REG_SP];
    uint64_t words[MAX_SAVED];
    int n = f->ret_saved_count;
    if (f->return_count == 0 || f->xol == 0 || ip != f->xol + f->ret_syscall_return || flags & (FLAGS_TF | FLAGS_RF))
        return 0; /* step 2's SIGILL, Python's instances, or an IRET exit */
    if (f->mem_read(f->uc, sp, words, 8 * (size_t)n) != 0)
        return 0;
    uint64_t after = sp + 8 * (uint64_t)n; /* steps 3-4 */
    int first = f->return_count - 1;
    while (first > 0 && f->returns[first].chained)
        first--; /* the chain: every instance down to the first not chained */
    if (f->returns[first].chained && f->python_depth)
        return 0; /* the chain goes on into Python's instances */
    uint64_t below = first > 0 ? f->returns[first - 1].stack : f->python_top_stack;
    if ((first > 0 || f->python_depth) && !alive(below, after, 1))
        return 0; /* an invalid chain (longjmp): Python drops it and goes on */
    uint64_t orig = f->returns[f->return_count - 1].orig; /* regs->ip: the head's original return address */
    for (int i = f->return_count - 1; i >= first; i--) {
        const probe_entry *probe = &f->probes[f->returns[i].probe];
        f->stats[ST_RET_HITS]++;
        for (uint32_t j = 0; j < probe->ret_count; j++)
            f->counters[probe->ret_first + j][PATH_RETURN]++;
    }
    f->return_count = first;
    /* steps 8-12: the words go back, the last one (ax's slot) now the return address the trampoline's
     * ret pops; SYSRET into the trampoline with rcx = ip, r11 = flags, the other words restored */
    if (f->mem_write(f->uc, sp + 8 * (uint64_t)(n - 1), &orig, 8) != 0)
        return 0; /* not reached: the words were just read there */
    int ids[MAX_SAVED + 2];
    uint64_t values[MAX_SAVED + 2];
    void *ptrs[MAX_SAVED + 2];
    int k = 0;
    for (int i = 0; i < n; i++)
        ids[k] = f->ret_saved_ids[i], values[k++] = words[i];
    ids[k] = f->ids[REG_CX], values[k++] = ip;
    ids[k] = f->ids[REG_R11], values[k++] = flags;
    for (int i = 0; i < k; i++)
        ptrs[i] = &values[i];
    f->reg_write_batch(f->uc, ids, ptrs, k);
    f->stats[ST_URETPROBE_CALLS]++;
    f->stats[ST_COPIED] += 16 * (uint64_t)n;
    f->stats[ST_EXIT_SYSRET]++;
    return 1;
}

/* What the verifiers need of a hit at a probe site: nothing (no transaction open), the front's part of
 * the open one (a NOP-class site, a transaction Python has no record of), or Python. */
enum { WATCH_NONE, WATCH_OPEN, WATCH_PYTHON };

static int watch_of(const FastSys *f, const probe_entry *probe, uint64_t vaddr)
{
    const struct edges *e = f->verifier;
    if (e == NULL || e->state == EDGES_IDLE)
        return WATCH_NONE;
    if (e->state != EDGES_OPEN || e->seq == e->python_seq || e->site != vaddr || probe->nop_next == 0)
        return WATCH_PYTHON;
    return WATCH_OPEN;
}

/* The kernel part of the open transaction's hit is done here: what the tracker's observers would note. */
static void note_kernel_part(FastSys *f, int path, int exit)
{
    struct edges *e = f->verifier;
    e->kernel_seq = e->seq, e->kernel_path = (uint64_t)path, e->kernel_exit = (uint64_t)exit;
}

/* The kernel returns to user mode at rip + rip_advance: the watched hit settles, or Python judges it. */
static void settle_or_judge_syscall(FastSys *f, uc_engine *uc, const probe_entry *probe)
{
    if (!edges_settle_at_return(uc, f->verifier, 2, probe->nop_next) && f->python_after_syscall != NULL)
        f->python_after_syscall(uc, NULL);
}

/* sys_uprobe on the counting-only path; 0: Python must handle this syscall. rip is at the syscall. */
static int fast_uprobe(FastSys *f, const uint64_t *v)
{
    uint64_t ip = v[REG_IP] + 2, flags = v[REG_FLAGS], sp = v[REG_SP], vaddr = 0;
    uint64_t words[MAX_SAVED + 1];
    int count = f->saved_count + (f->by_slot ? 0 : 1); /* + the call's return address (2.1 step 2) */
    if (f->by_slot) {
        const pair *slot = find_pair(f->slots, f->slot_count, ip - f->syscall_return);
        if (slot == NULL)
            return 0;
        vaddr = slot->value;
    } else if (!in_trampoline(f, ip)) {
        return 0; /* step 1: -ENXIO, Python's to say */
    }
    if (f->mem_read(f->uc, sp + f->saved_offset, words, 8 * (size_t)count) != 0)
        return 0; /* step 2: SIGILL, Python's to raise */
    if (!f->by_slot)
        vaddr = words[f->saved_count] - f->branch_end;
    const probe_entry *probe = find_probe(f, vaddr);
    if (probe == NULL)
        return 0;
    /* pt_regs as consumers see them: rsp past the trampoline's frame, at the return address (5.1) */
    uint64_t regs_sp = sp + f->saved_offset + 8 * (uint64_t)count + f->sp_skip;
    int watch = watch_of(f, probe, vaddr);
    if (watch == WATCH_PYTHON || (watch == WATCH_OPEN && f->exit_kind == EXIT_TRAMPOLINE && probe->arm_ret == 0))
        return 0;
    if (watch == WATCH_OPEN && probe->returns && regs_sp != STATE_RSP(f->verifier->start))
        return 0; /* the return-address hijack lands elsewhere than the interrupted rsp: the memory check's */
    if (probe->returns && !prepare_uretprobe(f, probe, vaddr, regs_sp))
        return 0;
    count_hit(f, probe, f->path);
    if (watch == WATCH_OPEN)
        note_kernel_part(f, f->path, f->exit_kind == EXIT_IRET ? EDGES_EXIT_IRET : EDGES_EXIT_SYSRET);
    f->stats[ST_UPROBE_CALLS]++;
    if (!f->by_slot)
        f->stats[ST_MMAP_LOCKS]++; /* the trampoline's VMA lookup (Uprobes.in_trampoline) */
    if (f->exit_kind == EXIT_TRAMPOLINE) {
        /* steps 10-16: the words go back unchanged, SYSRET into the trampoline, whose pops restore them */
        int ids[3] = {f->ids[REG_AX], f->ids[REG_CX], f->ids[REG_R11]};
        uint64_t values[3] = {0, ip, flags};
        void *ptrs[3] = {&values[0], &values[1], &values[2]};
        f->stats[ST_COPIED] += 16 * (uint64_t)count;
        f->stats[ST_EXIT_SYSRET]++;
        f->reg_write_batch(f->uc, ids, ptrs, 3);
        if (watch == WATCH_OPEN)
            edges_arm(f->verifier, probe->arm_ret, probe->arm_popped, probe->nop_next);
        return 1;
    }
    /* IRET or SYSRET straight past the site: syscall's own rcx and r11 first, then the restored words,
     * rsp, rip (Unicorn adds 2 once this hook returns), and for SYSRET its rcx and r11 last */
    int ids[MAX_SAVED + 6];
    uint64_t values[MAX_SAVED + 6];
    void *ptrs[MAX_SAVED + 6];
    uint64_t next_ip = vaddr + f->patch_length;
    int n = 0;
    ids[n] = f->ids[REG_CX], values[n++] = ip;
    ids[n] = f->ids[REG_R11], values[n++] = flags;
    for (int i = 0; i < f->saved_count; i++)
        ids[n] = f->saved_ids[i], values[n++] = words[i];
    ids[n] = f->ids[REG_SP], values[n++] = regs_sp;
    ids[n] = f->ids[REG_IP], values[n++] = next_ip - 2;
    if (f->exit_kind == EXIT_SYSRET) {
        ids[n] = f->ids[REG_CX], values[n++] = next_ip;
        ids[n] = f->ids[REG_R11], values[n++] = flags;
    }
    for (int i = 0; i < n; i++)
        ptrs[i] = &values[i];
    f->stats[ST_COPIED] += 8 * (uint64_t)count;
    f->stats[f->exit_kind == EXIT_IRET ? ST_EXIT_IRET : ST_EXIT_SYSRET]++;
    f->reg_write_batch(f->uc, ids, ptrs, n);
    if (watch == WATCH_OPEN)
        settle_or_judge_syscall(f, f->uc, probe);
    return 1;
}

static int usable(const FastSys *f)
{
    return f->open && f->generation == generation;
}

static void on_syscall(uc_engine *uc, void *user_data)
{
    FastSys *f = user_data;
    if (f->clock != NULL)
        icount_charge(f->clock, uc);
    if (usable(f) && (f->handler_nr >= 0 || f->ret_nr >= 0)) {
        uint64_t v[4];
        int ids[4] = {f->ids[REG_AX], f->ids[REG_IP], f->ids[REG_FLAGS], f->ids[REG_SP]};
        void *ptrs[4] = {&v[0], &v[1], &v[2], &v[3]};
        f->reg_read_batch(uc, ids, ptrs, 4);
        if (f->handler_nr >= 0 && v[REG_AX] == (uint64_t)f->handler_nr && fast_uprobe(f, v))
            return;
        if (f->ret_nr >= 0 && v[REG_AX] == (uint64_t)f->ret_nr && fast_uretprobe(f, v))
            return;
    }
    f->python_syscall(uc, NULL);
}

static void on_interrupt(uc_engine *uc, uint32_t intno, void *user_data)
{
    FastSys *f = user_data;
    if (f->clock != NULL)
        icount_charge(f->clock, uc);
    if (intno == 3 && usable(f)) {
        uint64_t rip;
        f->reg_read(uc, f->ids[REG_IP], &rip);
        const probe_entry *probe = find_probe(f, rip - 1); /* #BP reports the address after the int3 */
        int watch = probe != NULL && probe->int3_length ? watch_of(f, probe, rip - 1) : WATCH_PYTHON;
        if (watch != WATCH_PYTHON) {
            count_hit(f, probe, PATH_INT3);
            f->stats[ST_TRAPS]++;
            f->stats[ST_EMULATED]++;
            rip = rip - 1 + probe->int3_length; /* spec 4.2: a NOP's emulation is ip += length */
            /* the batch call, as Cpu.resume_at says: uc_reg_write from an interrupt hook would leave
             * Unicorn reading stale pcs in memory hooks and faults for the rest of the run */
            int rip_id = f->ids[REG_IP];
            void *rip_ptr = &rip;
            f->reg_write_batch(uc, &rip_id, &rip_ptr, 1);
            if (watch == WATCH_OPEN) {
                note_kernel_part(f, PATH_INT3, EDGES_EXIT_NONE);
                if (!edges_settle_at_return(uc, f->verifier, 0, probe->nop_next) && f->python_after_interrupt != NULL)
                    f->python_after_interrupt(uc, intno, NULL);
            }
            return;
        }
    }
    f->python_interrupt(uc, intno, NULL);
}

/* ------------------------------------------------------------------ the Python side */

static void *address_of(PyObject *value)
{
    return PyLong_AsVoidPtr(value);
}

static int fastsys_init(FastSys *self, PyObject *args, PyObject *kwds)
{
    PyObject *uc, *functions, *ids;
    if (!PyArg_ParseTuple(args, "OO!O!", &uc, &PyTuple_Type, &functions, &PyTuple_Type, &ids))
        return -1;
    if (PyTuple_GET_SIZE(functions) != 5 || PyTuple_GET_SIZE(ids) != REG_IDS) {
        PyErr_SetString(PyExc_ValueError, "FastSys: 5 function addresses and 6 register ids");
        return -1;
    }
    self->uc = address_of(uc);
    self->reg_read_batch = (uc_reg_read_batch_fn)address_of(PyTuple_GET_ITEM(functions, 0));
    self->reg_write_batch = (uc_reg_write_batch_fn)address_of(PyTuple_GET_ITEM(functions, 1));
    self->reg_read = (uc_reg_read_fn)address_of(PyTuple_GET_ITEM(functions, 2));
    self->mem_read = (uc_mem_read_fn)address_of(PyTuple_GET_ITEM(functions, 3));
    self->mem_write = (uc_mem_write_fn)address_of(PyTuple_GET_ITEM(functions, 4));
    for (int i = 0; i < REG_IDS; i++)
        self->ids[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(ids, i));
    self->handler_nr = -1;
    self->ret_nr = -1;
    self->generation = 0;
    return PyErr_Occurred() ? -1 : 0;
}

static void fastsys_dealloc(FastSys *self)
{
    free(self->probes);
    free(self->counters);
    free(self->pages);
    free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* set_fallback(syscall, interrupt, after_syscall, after_interrupt): the Python callbacks' addresses (0: leave
 * as it is); a hook is added only once its fallback is set */
static PyObject *fastsys_set_fallback(FastSys *self, PyObject *args)
{
    PyObject *given[4];
    void *address[4];
    if (!PyArg_ParseTuple(args, "OOOO", &given[0], &given[1], &given[2], &given[3]))
        return NULL;
    for (int i = 0; i < 4; i++)
        address[i] = address_of(given[i]);
    if (PyErr_Occurred())
        return NULL;
    if (address[0] != NULL)
        self->python_syscall = (hook_syscall_fn)address[0];
    if (address[1] != NULL)
        self->python_interrupt = (hook_intr_fn)address[1];
    if (address[2] != NULL)
        self->python_after_syscall = (hook_syscall_fn)address[2];
    if (address[3] != NULL)
        self->python_after_interrupt = (hook_intr_fn)address[3];
    Py_RETURN_NONE;
}

/* set_verifier(block): the verifiers' control block (0: none) */
static PyObject *fastsys_set_verifier(FastSys *self, PyObject *arg)
{
    void *block = address_of(arg);
    if (PyErr_Occurred())
        return NULL;
    self->verifier = block;
    Py_RETURN_NONE;
}

static PyObject *fastsys_set_handler(FastSys *self, PyObject *args)
{
    long long nr;
    int by_slot, exit_kind, path;
    PyObject *saved;
    unsigned long long offset, sp_skip, branch_end, length, syscall_return;
    if (!PyArg_ParseTuple(args, "LiiiO!KKKKK", &nr, &by_slot, &exit_kind, &path, &PyTuple_Type, &saved, &offset,
                          &sp_skip, &branch_end, &length, &syscall_return))
        return NULL;
    if (PyTuple_GET_SIZE(saved) > MAX_SAVED) {
        PyErr_SetString(PyExc_ValueError, "FastSys: too many saved registers");
        return NULL;
    }
    self->saved_count = (int)PyTuple_GET_SIZE(saved);
    for (int i = 0; i < self->saved_count; i++)
        self->saved_ids[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(saved, i));
    self->handler_nr = nr, self->by_slot = by_slot, self->exit_kind = exit_kind, self->path = path;
    self->saved_offset = offset, self->sp_skip = sp_skip, self->branch_end = branch_end;
    self->patch_length = length, self->syscall_return = syscall_return;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static int pair_order(const void *a, const void *b)
{
    uint64_t x = ((const pair *)a)->key, y = ((const pair *)b)->key;
    return x < y ? -1 : x > y;
}

static int read_pairs(PyObject *list, pair **out, Py_ssize_t *count)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    pair *table = calloc(n > 0 ? (size_t)n : 1, sizeof(pair));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "KK", &table[i].key, &table[i].value)) {
            free(table);
            return -1;
        }
    }
    qsort(table, (size_t)n, sizeof(pair), pair_order);
    free(*out);
    *out = table;
    *count = n;
    return 0;
}

/* set_tables(probes, pages, slots): probes = [(vaddr, int3_length, (counter address, ...), returns,
 * (return counter address, ...), nop_next, arm_ret, arm_popped), ...],
 * pages = [(begin, end), ...], slots = [(slot, vaddr), ...]; the tables become current. */
static PyObject *fastsys_set_tables(FastSys *self, PyObject *args)
{
    PyObject *probes, *pages, *slots;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &probes, &PyList_Type, &pages, &PyList_Type, &slots))
        return NULL;
    if (self->return_count) {
        PyErr_SetString(PyExc_RuntimeError, "FastSys.set_tables: take_returns first (they index the old table)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(probes), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(probes, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 8 || !PyTuple_Check(PyTuple_GET_ITEM(item, 2)) ||
            !PyTuple_Check(PyTuple_GET_ITEM(item, 4))) {
            PyErr_SetString(PyExc_TypeError,
                            "FastSys.set_tables: (vaddr, int3_length, counters, returns, ret counters, nop_next, "
                            "arm_ret, arm_popped) tuples");
            return NULL;
        }
        total += PyTuple_GET_SIZE(PyTuple_GET_ITEM(item, 2)) + PyTuple_GET_SIZE(PyTuple_GET_ITEM(item, 4));
    }
    probe_entry *table = calloc(n > 0 ? (size_t)n : 1, sizeof(probe_entry));
    uint64_t **counters = calloc(total > 0 ? (size_t)total : 1, sizeof(uint64_t *));
    if (table == NULL || counters == NULL) {
        free(table);
        free(counters);
        return PyErr_NoMemory();
    }
    Py_ssize_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(probes, i), *addresses = PyTuple_GET_ITEM(item, 2);
        PyObject *ret_addresses = PyTuple_GET_ITEM(item, 4);
        table[i].vaddr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
        table[i].int3_length = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(item, 1));
        table[i].returns = (uint32_t)PyObject_IsTrue(PyTuple_GET_ITEM(item, 3));
        table[i].first = (uint32_t)used;
        table[i].count = (uint32_t)PyTuple_GET_SIZE(addresses);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(addresses); j++)
            counters[used++] = address_of(PyTuple_GET_ITEM(addresses, j));
        table[i].ret_first = (uint32_t)used;
        table[i].ret_count = (uint32_t)PyTuple_GET_SIZE(ret_addresses);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ret_addresses); j++)
            counters[used++] = address_of(PyTuple_GET_ITEM(ret_addresses, j));
        table[i].nop_next = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 5));
        table[i].arm_ret = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 6));
        table[i].arm_popped = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 7));
    }
    if (PyErr_Occurred() || read_pairs(pages, &self->pages, &self->page_count) < 0 ||
        read_pairs(slots, &self->slots, &self->slot_count) < 0) {
        free(table);
        free(counters);
        self->generation = 0;
        return NULL;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        if (table[i - 1].vaddr >= table[i].vaddr) {
            free(table);
            free(counters);
            self->generation = 0;
            PyErr_SetString(PyExc_ValueError, "FastSys.set_tables: probes sorted by address, once each");
            return NULL;
        }
    }
    free(self->probes);
    free(self->counters);
    self->probes = table, self->counters = counters, self->probe_count = n;
    self->generation = generation;
    Py_RETURN_NONE;
}

/* set_clock(address): the instruction counter's state (emu/icount.py) each kernel entry is charged to; 0: none */
static PyObject *fastsys_set_clock(FastSys *self, PyObject *address)
{
    void *state = address_of(address);
    if (state == NULL && PyErr_Occurred())
        return NULL;
    self->clock = state;
    Py_RETURN_NONE;
}

/* set_uretprobe(nr, saved register ids, syscall_return): the design's ReturnTrampoline (nr < 0: none) */
static PyObject *fastsys_set_uretprobe(FastSys *self, PyObject *args)
{
    long long nr;
    PyObject *saved;
    unsigned long long syscall_return;
    if (!PyArg_ParseTuple(args, "LO!K", &nr, &PyTuple_Type, &saved, &syscall_return))
        return NULL;
    if (PyTuple_GET_SIZE(saved) > MAX_SAVED || PyTuple_GET_SIZE(saved) < 1) {
        PyErr_SetString(PyExc_ValueError, "FastSys: 1 to 17 saved registers");
        return NULL;
    }
    self->ret_saved_count = (int)PyTuple_GET_SIZE(saved);
    for (int i = 0; i < self->ret_saved_count; i++)
        self->ret_saved_ids[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(saved, i));
    self->ret_nr = nr, self->ret_syscall_return = syscall_return;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* set_python_returns(xol, depth, top stack): the XOL page (0: none) and Python's pending return instances */
static PyObject *fastsys_set_python_returns(FastSys *self, PyObject *args)
{
    unsigned long long xol, depth, top;
    if (!PyArg_ParseTuple(args, "KKK", &xol, &depth, &top))
        return NULL;
    self->xol = xol, self->python_depth = depth, self->python_top_stack = top;
    Py_RETURN_NONE;
}

/* take_returns(): the return instances pushed here, oldest first, as (func, stack, orig, chained, probe
 * index) tuples; none are left here */
static PyObject *fastsys_take_returns(FastSys *self, PyObject *unused)
{
    PyObject *out = PyList_New(self->return_count);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < self->return_count; i++) {
        const return_instance *ri = &self->returns[i];
        PyObject *item = Py_BuildValue("(KKKOI)", (unsigned long long)ri->func, (unsigned long long)ri->stack,
                                       (unsigned long long)ri->orig, ri->chained ? Py_True : Py_False, ri->probe);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    self->return_count = 0;
    return out;
}

static PyObject *fastsys_get_pending(FastSys *self, void *closure)
{
    return PyBool_FromLong(self->return_count > 0);
}

static PyObject *fastsys_take_stats(FastSys *self, PyObject *unused)
{
    PyObject *out = PyTuple_New(ST_COUNT);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < ST_COUNT; i++) {
        PyObject *value = PyLong_FromUnsignedLongLong(self->stats[i]);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, value);
        self->stats[i] = 0;
    }
    return out;
}

static PyObject *fastsys_get_current(FastSys *self, void *closure)
{
    return PyBool_FromLong(self->generation == generation);
}

static PyObject *fastsys_get_open(FastSys *self, void *closure)
{
    return PyBool_FromLong(self->open);
}

static int fastsys_set_open(FastSys *self, PyObject *value, void *closure)
{
    int truth = value == NULL ? 0 : PyObject_IsTrue(value);
    if (truth < 0)
        return -1;
    self->open = truth;
    return 0;
}

static PyObject *fastsys_get_address(FastSys *self, void *closure)
{
    return PyLong_FromVoidPtr(self);
}

static PyMethodDef fastsys_methods[] = {
    {"set_fallback", (PyCFunction)fastsys_set_fallback, METH_VARARGS,
     "set_fallback(syscall, interrupt, after_syscall, after_interrupt): the Python callbacks for what is not "
     "handled here, and the after-observers alone for a watched hit that did not settle (0: unchanged)"},
    {"set_verifier", (PyCFunction)fastsys_set_verifier, METH_O,
     "set_verifier(block): the verifiers' control block (emu/hotpath/edges.py; 0: none)"},
    {"set_handler", (PyCFunction)fastsys_set_handler, METH_VARARGS,
     "set_handler(nr, by_slot, exit, path, saved ids, saved_offset, sp_skip, branch_end, patch length, "
     "syscall_return): the design's sys_uprobe"},
    {"set_clock", (PyCFunction)fastsys_set_clock, METH_O,
     "set_clock(state): the instruction counter each kernel entry is charged to (emu/icount.py; 0: none)"},
    {"set_tables", (PyCFunction)fastsys_set_tables, METH_VARARGS,
     "set_tables(probes, trampoline pages, slots): the counting-only probes, current from now on"},
    {"set_uretprobe", (PyCFunction)fastsys_set_uretprobe, METH_VARARGS,
     "set_uretprobe(nr, saved ids, syscall_return): the design's sys_uretprobe ('trampoline' exit)"},
    {"set_python_returns", (PyCFunction)fastsys_set_python_returns, METH_VARARGS,
     "set_python_returns(xol, depth, top stack): the XOL page and Python's pending return instances"},
    {"take_returns", (PyCFunction)fastsys_take_returns, METH_NOARGS,
     "the return instances pushed here (func, stack, orig, chained, probe index), oldest first; cleared"},
    {"take_stats", (PyCFunction)fastsys_take_stats, METH_NOARGS,
     "the statistics counted since the last call, zeroed: uprobe calls, mmap_locks, copied, sysret, iret, "
     "traps, emulated, uretprobe calls, ret_hits"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fastsys_getset[] = {
    {"open", (getter)fastsys_get_open, (setter)fastsys_set_open, "hits may be handled here", NULL},
    {"current", (getter)fastsys_get_current, NULL, "the tables are of the latest generation", NULL},
    {"pending", (getter)fastsys_get_pending, NULL, "return instances are pushed here (take_returns)", NULL},
    {"user_data", (getter)fastsys_get_address, NULL, "the hooks' user data (this object)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastSysType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emu._hotpath.FastSys",
    .tp_basicsize = sizeof(FastSys),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FastSys(uc, (reg_read_batch, reg_write_batch, reg_read, mem_read, mem_write), "
              "(rax, rip, rflags, rsp, rcx, r11 ids))",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fastsys_init,
    .tp_dealloc = (destructor)fastsys_dealloc,
    .tp_methods = fastsys_methods,
    .tp_getset = fastsys_getset,
};

static PyObject *fastsys_touch(PyObject *module, PyObject *unused)
{
    generation++;
    Py_RETURN_NONE;
}

static PyMethodDef module_functions[] = {
    {"fastsys_touch", fastsys_touch, METH_NOARGS, "a probe, consumer or site changed: every FastSys table is stale"},
    {NULL, NULL, 0, NULL},
};

int hotpath_add_fastsys(PyObject *module)
{
    if (PyType_Ready(&FastSysType) < 0 || PyModule_AddObjectRef(module, "FastSys", (PyObject *)&FastSysType) < 0)
        return -1;
    if (PyModule_AddFunctions(module, module_functions) < 0)
        return -1;
    if (hotpath_add_address(module, "fastsys_syscall_hook", (void *)on_syscall) < 0)
        return -1;
    return hotpath_add_address(module, "fastsys_interrupt_hook", (void *)on_interrupt);
}
