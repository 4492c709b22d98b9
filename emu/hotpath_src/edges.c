/* The edges of a probe hit: the site hook, the ret hook and the tests Python calls as the kernel
 * returns to user mode (emu/hotpath/edges.py says what each one checks and why). Anything
 * they cannot settle goes to the Python hooks with Unicorn's own arguments.
 */
#include <string.h>

#include "verify.h"

static uc_err read_state(uc_engine *uc, const struct edges *e, uint64_t pointers)
{
    return AS_FN(uc_reg_read_batch_fn, e->reg_read_batch)(uc, AS_PTR(int, e->ids), AS_PTR(void *, pointers),
                                                         (int)e->nregs);
}

static uc_err read_memory(uc_engine *uc, const struct edges *e, uint64_t address, uint64_t into, size_t size)
{
    return AS_FN(uc_mem_read_fn, e->mem_read)(uc, address, AS_PTR(void, into), size);
}

static struct write_log *log_of(const struct edges *e)
{
    return AS_PTR(struct write_log, e->log);
}

/* The transaction is settled: no verdict needed, the window closes. */
static void settle(struct edges *e)
{
    e->state = EDGES_IDLE;
    e->finished++;
    log_of(e)->open = 0;
}

/* No store landed outside the red zone and the scratch, every store was seen and control stayed in
 * the watched code (else the memory or the resume check needs Python). */
static int nothing_outside(const struct edges *e)
{
    const struct write_log *log = log_of(e);
    return log->outside == 0 && log->unseen == 0 && log->left_pc == 0;
}

/* ---------------------------------------------------------------- the state at the two edges
 *
 * With whole-CPU snapshots, the site hook saves the CPU (one copy) and reads rip and rsp; the other
 * registers go into the start buffer only if Python asks for them (fill_start). Two snapshots are
 * compared on the bytes that hold registers (emu/cpu/snapshots.py finds them; rip and rsp, read
 * from where a snapshot holds them, are compared apart, and rflags is read from each): equal bytes
 * mean every register reads the same. Unequal bytes need not mean a difference, so they fall back
 * to reading and comparing every register.
 */

/* A snapshot of the CPU now into context, with its rip and rsp into a state buffer. */
static void save_snapshot(uc_engine *uc, const struct edges *e, uint64_t context, uint64_t state)
{
    AS_FN(uc_context_save_fn, e->ctx_save)(uc, AS_PTR(void, context));
    memcpy(AS_PTR(uint8_t, state), AS_PTR(uint8_t, context) + e->ctx_rip, 8);
    memcpy(AS_PTR(uint8_t, state) + 8, AS_PTR(uint8_t, context) + e->ctx_rsp, 8);
}

/* The snapshot of the CPU now into ctx_end, or the registers into the end buffer; rip and rsp are
 * in the end buffer either way. */
static void read_end_state(uc_engine *uc, struct edges *e)
{
    if (e->ctx_start == 0)
        read_state(uc, e, e->end_ptrs);
    else
        save_snapshot(uc, e, e->ctx_end, e->end);
}

static void fill_start(struct edges *e)
{
    if (e->start_full)
        return;
    AS_FN(uc_context_reg_read_batch_fn, e->ctx_reg_read_batch)(AS_PTR(void, e->ctx_start), AS_PTR(int, e->ids),
                                                               AS_PTR(void *, e->start_ptrs), (int)e->nregs);
    e->start_full = 1;
}

/* a and b are equal under each (word index, mask) pair of pairs[0 .. 2n): the words that hold registers. */
static int same_under_masks(const uint64_t *a, const uint64_t *b, const uint64_t *pairs, uint64_t n)
{
    uint64_t differ = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t word = pairs[2 * i];
        differ |= (a[word] ^ b[word]) & pairs[2 * i + 1];
    }
    return differ == 0;
}

static uint64_t snapshot_flags(const struct edges *e, uint64_t context)
{
    uint64_t flags = 0;
    AS_FN(uc_context_reg_fn, e->ctx_reg_read)(AS_PTR(void, context), (int)e->flags_id, &flags);
    return flags;
}

/* ctx_end holds the registers ctx_start does, rip and rsp apart: the same rflags (read: the emulator
 * keeps flags lazily, in more than one form) and equal under the masks of the ctx_nwords words
 * that hold registers. */
static int same_snapshots(struct edges *e)
{
    if (!e->start_flags_read) {
        e->start_flags = snapshot_flags(e, e->ctx_start);
        e->start_flags_read = 1;
    }
    if (snapshot_flags(e, e->ctx_end) != e->start_flags)
        return 0;
    return same_under_masks(AS_PTR(uint64_t, e->ctx_start), AS_PTR(uint64_t, e->ctx_end),
                            AS_PTR(uint64_t, e->ctx_words), e->ctx_nwords);
}

/* Every register but rip and rsp, rflags exactly and the extended state, is as the site hook found
 * it (read_end_state has run). */
static int registers_as_at_start(uc_engine *uc, struct edges *e)
{
    if (e->ctx_start != 0) {
        if (same_snapshots(e))
            return 1;
        fill_start(e);
        read_state(uc, e, e->end_ptrs);
    }
    return memcmp(AS_PTR(uint8_t, e->start) + e->kept, AS_PTR(uint8_t, e->end) + e->kept,
                  e->state_bytes - e->kept) == 0;
}

/* The red zone as at the start: the site hook's copy, or at a site that copies it lazily, the write
 * log's (taken before the first guest store into it). None taken: no guest store reached it, and the
 * kernel wrote none into it either, if Python never took the hit over (a kernel write there makes
 * Python take it: emu/verify/tracker.py, _on_kernel_write). A red zone unlike the start's may still
 * repeat a hit Python judged (repeats.c). */
static int redzone_as_at_start(uc_engine *uc, struct edges *e)
{
    const struct write_log *log = log_of(e);
    const void *start = NULL;
    if (e->start_redzone_status == REDZONE_LAZY) {
        if (!log->taken)
            return e->python_seq != e->seq;
        start = log->status == 0 ? log->snapshot : NULL;
    } else if (e->start_redzone_status == 0) {
        start = AS_PTR(void, e->start_redzone);
    }
    if (start == NULL || read_memory(uc, e, STATE_RSP(e->start) - log->length, e->redzone, log->length))
        return 0;
    watch_complete_from(uc, log_of(e), AS_PTR(uint8_t, e->redzone)); /* the evidence repeats.c compares */
    return memcmp(start, AS_PTR(void, e->redzone), log->length) == 0 || repeats_judged_hit(uc, e, start);
}

/* Every register but rip and rsp as at the start, no store outside, and the red zone as at the start. */
static int same_as_start(uc_engine *uc, struct edges *e)
{
    return nothing_outside(e) && registers_as_at_start(uc, e) && redzone_as_at_start(uc, e);
}

/* At a probe site: user data is the site's record (the block, the site's hit count, its flags). */
static void edges_site_hook(uc_engine *uc, uint64_t address, uint32_t size, void *user_data)
{
    uint64_t *record = user_data;
    struct edges *e = AS_PTR(struct edges, record[0]);
    if (e->state != EDGES_IDLE) {
        AS_FN(hook_code_fn, e->py_site)(uc, address, size, e);
        return;
    }
    e->hit = ++record[1];
    if (e->ctx_start != 0) {
        save_snapshot(uc, e, e->ctx_start, e->start);
        e->start_full = 0, e->start_flags_read = 0;
    } else {
        read_state(uc, e, e->start_ptrs);
        e->start_full = 1;
    }
    struct write_log *log = log_of(e);
    uint64_t base = STATE_RSP(e->start) - log->length;
    if (record[2] & SITE_LAZY_REDZONE) {
        e->start_redzone_status = REDZONE_LAZY;
        log->taken = 0; /* the log copies the red zone before the first store into it */
    } else {
        uc_err status = read_memory(uc, e, base, e->start_redzone, log->length);
        e->start_redzone_status = (uint64_t)status;
        log->taken = status == 0; /* the log copies the red zone itself only where this read failed */
    }
    e->site = address;
    e->seq++;
    e->state = EDGES_OPEN;
    log->count = log->pending = 0;
    log->base = base;
    log->status = 0;
    log->outside = log->unseen = log->unseen_pc = log->left_pc = log->left_to = log->branch_pc = 0;
    log->open = 1;
    struct store_watch *w = AS_PTR(struct store_watch, e->watch);
    if (w != NULL)
        watch_instruction(uc, w, address, size); /* the site's own stores: a call's return address */
}

/* At a trampoline's ret: user data is the block. */
static void edges_ret_hook(uc_engine *uc, uint64_t address, uint32_t size, void *user_data)
{
    struct edges *e = user_data;
    if (e->state == EDGES_IDLE)
        return;
    if (e->state == EDGES_ARMED) {
        if (address != e->ret_pc) {
            e->state = EDGES_OPEN; /* not the ret it was armed for: Python judges */
        } else {
            read_end_state(uc, e);
            uint64_t rsp = STATE_RSP(e->end);
            if (rsp + e->popped == STATE_RSP(e->start) && read_memory(uc, e, rsp, (uint64_t)(uintptr_t)&e->word, 8) == 0
                && e->word == e->next && same_as_start(uc, e)) {
                settle(e);
                return;
            }
            e->state = EDGES_OPEN;
        }
    }
    AS_FN(hook_code_fn, e->py_ret)(uc, address, size, e);
}

/* The arguments of the functions Python calls: four unsigned 64-bit ints. */
static int unsigned_args(PyObject *const *args, Py_ssize_t nargs, uint64_t *out, Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", want, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        out[i] = PyLong_AsUnsignedLongLongMask(args[i]);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

#define ENGINE(word) AS_PTR(uc_engine, word)

int edges_settle_at_return(uc_engine *uc, struct edges *e, uint64_t rip_advance, uint64_t resume)
{
    read_end_state(uc, e);
    int ok = STATE_RIP(e->end) + rip_advance == resume && STATE_RSP(e->end) == STATE_RSP(e->start) &&
             same_as_start(uc, e);
    if (ok)
        settle(e);
    return ok;
}

void edges_arm(struct edges *e, uint64_t ret_pc, uint64_t popped, uint64_t resume)
{
    e->ret_pc = ret_pc, e->popped = popped, e->next = resume, e->state = EDGES_ARMED;
}

/* settle_return(uc, block, rip_advance, resume) -> bool: the kernel returns to user mode at
 * rip + rip_advance; settled if that is resume, rsp is back and everything is as the site hook found it. */
static PyObject *edges_settle_return(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t a[4];
    if (unsigned_args(args, nargs, a, 4) < 0)
        return NULL;
    return PyBool_FromLong(edges_settle_at_return(ENGINE(a[0]), AS_PTR(struct edges, a[1]), a[2], a[3]));
}

/* One test of a comparison: length bytes at a must equal those at b (a zero length ends the list). */
struct comparison_op {
    uint64_t a, b, length;
};

/* settle_compared(uc, block, red-zone base, ops) -> bool: the red zone at base into its buffer,
 * then each test of the list at ops. */
static PyObject *edges_settle_compared(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t a[4];
    if (unsigned_args(args, nargs, a, 4) < 0)
        return NULL;
    uc_engine *uc = ENGINE(a[0]);
    struct edges *e = AS_PTR(struct edges, a[1]);
    fill_start(e); /* the comparison's spans read the start buffer */
    watch_complete(uc, log_of(e));
    read_state(uc, e, e->end_ptrs);
    int ok = nothing_outside(e) && read_memory(uc, e, a[2], e->redzone, log_of(e)->length) == 0;
    for (const struct comparison_op *op = AS_PTR(struct comparison_op, a[3]); ok && op->length; op++)
        ok = memcmp(AS_PTR(void, op->a), AS_PTR(void, op->b), op->length) == 0;
    if (ok)
        settle(e);
    return PyBool_FromLong(ok);
}

/* read_end(uc, block, red-zone base) -> the status of the red zone's read (0: read): the state into
 * the end buffer and the red zone into its buffer, for a transaction that ends in Python. */
static PyObject *edges_read_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t a[3];
    if (unsigned_args(args, nargs, a, 3) < 0)
        return NULL;
    uc_engine *uc = ENGINE(a[0]);
    struct edges *e = AS_PTR(struct edges, a[1]);
    read_state(uc, e, e->end_ptrs);
    return PyLong_FromLong((long)read_memory(uc, e, a[2], e->redzone, log_of(e)->length));
}

/* fill_start(block): the start buffer gets every register (from the site's snapshot, if it has only
 * rip and rsp), for Python to read. */
static PyObject *edges_fill_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t a[1];
    if (unsigned_args(args, nargs, a, 1) < 0)
        return NULL;
    fill_start(AS_PTR(struct edges, a[0]));
    Py_RETURN_NONE;
}

static PyMethodDef edges_functions[] = {
    {"edges_settle_return", (PyCFunction)(void (*)(void))edges_settle_return, METH_FASTCALL,
     "settle_return(uc, block, rip_advance, resume) -> bool"},
    {"edges_settle_compared", (PyCFunction)(void (*)(void))edges_settle_compared, METH_FASTCALL,
     "settle_compared(uc, block, base, ops) -> bool"},
    {"edges_fill_start", (PyCFunction)(void (*)(void))edges_fill_start, METH_FASTCALL, "fill_start(block)"},
    {"edges_read_end", (PyCFunction)(void (*)(void))edges_read_end, METH_FASTCALL,
     "read_end(uc, block, base) -> status of the red zone's read"},
    {NULL, NULL, 0, NULL},
};

#define EDGES_FIELDS(X) X(state) X(site) X(next) X(finished) X(reg_read_batch) X(mem_read) X(py_site) X(py_ret)  \
    X(log) X(nregs) X(ids) X(start_ptrs) X(end_ptrs) X(word) X(ret_pc) X(popped) X(start_redzone_status) X(seq) \
    X(start) X(end) X(redzone) X(start_redzone) X(state_bytes) X(kept) X(python_seq) X(kernel_seq)             \
    X(kernel_path) X(kernel_exit) X(ctx_save) X(ctx_reg_read) X(ctx_reg_read_batch) X(ctx_start) X(ctx_end)  \
    X(ctx_words) X(ctx_nwords) X(ctx_rip) X(ctx_rsp) X(start_full) X(start_flags_read) X(start_flags)         \
    X(flags_id) X(hit) X(repeats) X(watch)
#define REPEATS_FIELDS(X) X(candidate_seq) X(candidate_slot) X(count) X(capacity) X(armed) X(candidate) X(memo) X(hits)
#define EDGES_OFFSET(field) offsetof(struct edges, field),
#define REPEATS_OFFSET(field) offsetof(struct repeats, field),

#define EDGES_CONSTANTS(X) X(EDGES_EXIT_SYSRET) X(EDGES_EXIT_IRET) X(EDGES_EXIT_NONE) X(EDGES_IDLE) X(EDGES_OPEN) \
    X(EDGES_ARMED) X(SITE_LAZY_REDZONE) X(REDZONE_LAZY) X(REPEAT_SLOTS)

int hotpath_add_edges(PyObject *module)
{
    hook_code_fn site = edges_site_hook, ret = edges_ret_hook;
    if (HOTPATH_ADD_CONSTANTS(module, EDGES_CONSTANTS) < 0)
        return -1;
    if (HOTPATH_ADD_LAYOUT(module, "edges", struct edges, EDGES_FIELDS, EDGES_OFFSET) < 0 ||
        HOTPATH_ADD_LAYOUT(module, "repeats", struct repeats, REPEATS_FIELDS, REPEATS_OFFSET) < 0)
        return -1;
    if (PyModule_AddFunctions(module, edges_functions) < 0)
        return -1;
    if (hotpath_add_address(module, "edges_site_hook", (void *)site) < 0)
        return -1;
    return hotpath_add_address(module, "edges_ret_hook", (void *)ret);
}
