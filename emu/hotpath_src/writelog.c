/* The write log and the store watch that fills it (emu/hotpath/write_log.py and
 * emu/hotpath/store_watch.py say what they record and why).
 *
 * The watch is a code hook over the code a probe hit runs (the kernel's trampoline pages and the
 * patched sites) and nothing else: before each instruction there it computes the instruction's
 * stores from formulas decoded once per instruction (emu/cpu/memops.py) and logs the bytes each is
 * about to overwrite. What a store wrote is read when the log is read (watch_complete), or before
 * another store lands over it. No memory hook exists, so every load and store outside a hit stays
 * on Unicorn's fast path.
 */
#include <string.h>

#include "verify.h"

enum { CHUNK = 8 }; /* a log entry holds up to 8 bytes, as Unicorn reports a store */

static struct log_entry *next_entry(struct write_log *log)
{
    return log->count < log->capacity ? &log->entries[log->count] : NULL;
}

static void left(struct write_log *log, uint64_t pc, uint64_t to)
{
    if (!log->left_pc)
        log->left_pc = pc, log->left_to = to;
}

void watch_complete_from(uc_engine *uc, struct write_log *log, const uint8_t *window)
{
    uint8_t read[sizeof log->snapshot];
    if (log->branch_pc) { /* no watched instruction ran after the conditional branch out: it was taken */
        left(log, log->branch_pc, log->branch_to);
        log->branch_pc = 0;
    }
    uint64_t last = log->count < log->capacity ? log->count : log->capacity;
    for (uint64_t i = log->pending; i < last; i++) {
        struct log_entry *entry = &log->entries[i];
        uint64_t value = 0, offset = entry->address - log->base;
        if (offset < log->length && entry->size <= log->length - offset) {
            if (window == NULL)
                window = AS_FN(uc_mem_read_fn, log->mem_read)(uc, log->base, read, log->length) ? NULL : read;
            if (window != NULL) {
                memcpy(&value, window + offset, (size_t)entry->size);
                entry->value = (int64_t)value;
                continue;
            }
        }
        AS_FN(uc_mem_read_fn, log->mem_read)(uc, entry->address, &value, (size_t)entry->size);
        entry->value = (int64_t)value;
    }
    log->pending = log->count;
}

void watch_complete(uc_engine *uc, struct write_log *log)
{
    watch_complete_from(uc, log, NULL);
}

/* A store is about to land where one not yet read landed: read that one first. */
static void complete_if_overlapping(uc_engine *uc, struct write_log *log, uint64_t address, uint64_t size)
{
    uint64_t last = log->count < log->capacity ? log->count : log->capacity;
    for (uint64_t i = log->pending; i < last; i++) {
        const struct log_entry *entry = &log->entries[i];
        if (entry->address < address + size && address < entry->address + entry->size) {
            watch_complete(uc, log);
            return;
        }
    }
}

/* A store outside the red zone and the scratch below it: logged with the bytes it overwrites (it
 * has not landed yet), and counted. */
static void log_outside(uc_engine *uc, struct write_log *log, uint64_t pc, uint64_t address, uint64_t size)
{
    log->outside++;
    struct log_entry *entry = next_entry(log);
    if (entry != NULL) {
        entry->old = 0;
        AS_FN(uc_mem_read_fn, log->mem_read)(uc, address, &entry->old, (size_t)size);
        *entry = (struct log_entry){pc, address, size, 0, entry->old};
    }
    log->count++;
}

/* A store into the red zone: the red zone is copied before the first one lands. */
static void log_redzone(uc_engine *uc, struct write_log *log, uint64_t pc, uint64_t address, uint64_t size)
{
    if (!log->taken) {
        log->taken = 1;
        log->status = (uint64_t)AS_FN(uc_mem_read_fn, log->mem_read)(uc, log->base, log->snapshot, log->length);
    }
    struct log_entry *entry = next_entry(log);
    if (entry != NULL)
        *entry = (struct log_entry){pc, address, size, 0, 0};
    log->count++;
}

/* One store of up to CHUNK bytes, sorted as emu/hotpath/write_log.py's classify sorts it. */
static void log_store(uc_engine *uc, struct write_log *log, uint64_t pc, uint64_t address, uint64_t size)
{
    complete_if_overlapping(uc, log, address, size);
    uint64_t base = log->base, end = address + size;
    if (end < address) /* past the top of the address space: outside */
        log_outside(uc, log, pc, address, size);
    else if (end <= base) { /* below the red zone: the scratch, or outside */
        if (base >= log->scratch && address < base - log->scratch)
            log_outside(uc, log, pc, address, size);
    } else if (address >= base + log->length)
        log_outside(uc, log, pc, address, size);
    else
        log_redzone(uc, log, pc, address, size);
}

/* The values of the stores logged and not read yet: from `window` (the red zone as it is now, or
 * NULL: read here once if needed) for those in the red zone, from memory for the others. */
static uint64_t reg(uc_engine *uc, const struct store_watch *w, uint64_t id)
{
    uint64_t value = 0;
    if (id)
        AS_FN(uc_reg_read_fn, w->reg_read)(uc, (int)id, &value);
    return value;
}

/* The lowest address an operand touches, and its size (0: a rep store whose count is spent). */
static uint64_t operand(uc_engine *uc, const struct store_watch *w, const struct watch_op *op, uint64_t *size)
{
    uint64_t addr = op->disp + reg(uc, w, op->base) + reg(uc, w, op->index) * op->scale;
    if (op->flags & WATCH_OP_ADDR32)
        addr &= 0xffffffffu;
    addr += reg(uc, w, op->segment);
    *size = (op->flags & WATCH_OP_REP) && reg(uc, w, w->rcx) == 0 ? 0 : op->size;
    return addr;
}

static int watched(const struct store_watch *w, uint64_t address, uint64_t *flags)
{
    const uint64_t *r = AS_PTR(uint64_t, w->ranges);
    for (uint64_t i = 0; i < w->nranges; i++, r += 3)
        if (r[0] <= address && address < r[1]) {
            *flags = r[2];
            return 1;
        }
    return 0;
}

static struct watch_record *slot(const struct store_watch *w, uint64_t pc)
{
    return AS_PTR(struct watch_record, w->table) + ((pc * 0x9E3779B97F4A7C15ull) >> w->shift);
}

/* The record of the instruction at address, decoded by Python if the table lacks it (Python empties
 * the slots of code that changes: emu/hotpath/store_watch.py). */
static const struct watch_record *record(uc_engine *uc, struct store_watch *w, uint64_t address, uint32_t size)
{
    struct watch_record *r = slot(w, address);
    if (r->pc != address || r->length != size) {
        AS_FN(hook_code_fn, w->decode)(uc, address, size, w);
        w->decoded++;
        if (r->pc != address || r->length != size)
            return NULL;
    }
    return r;
}

static void check_transfer(uc_engine *uc, struct store_watch *w, const struct watch_record *r, uint64_t address)
{
    struct write_log *log = AS_PTR(struct write_log, w->log);
    uint64_t flags = 0, to = 0, size = 0;
    if (r->transfer == WATCH_T_DIRECT)
        to = r->target;
    else if (r->transfer == WATCH_T_REG)
        to = reg(uc, w, r->target);
    else if (r->transfer == WATCH_T_MEM)
        AS_FN(uc_mem_read_fn, w->mem_read)(uc, operand(uc, w, &r->ops[WATCH_OPS - 1], &size), &to, 8);
    else
        return; /* falls through, returns (the resume check judges where) or enters the kernel */
    if (watched(w, to, &flags))
        return;
    if (r->flags & WATCH_CONDITIONAL)
        log->branch_pc = address, log->branch_to = to, log->branch_next = address + r->length;
    else
        left(log, address, to);
}

void watch_instruction(uc_engine *uc, struct store_watch *w, uint64_t address, uint32_t size)
{
    struct write_log *log = AS_PTR(struct write_log, w->log);
    if (log->branch_pc) { /* the conditional branch before: taken if this is not the instruction after it */
        if (address != log->branch_next)
            left(log, log->branch_pc, log->branch_to);
        log->branch_pc = 0;
    }
    const struct watch_record *r = record(uc, w, address, size);
    if (r == NULL || !(r->flags & WATCH_KNOWN)) {
        if (!log->unseen++)
            log->unseen_pc = address;
        if (r == NULL)
            return;
    }
    for (uint64_t i = 0; i < r->nstores && i < WATCH_OPS - 1; i++) {
        uint64_t n = 0, at = operand(uc, w, &r->ops[i], &n);
        for (uint64_t done = 0; done < n; done += CHUNK)
            log_store(uc, log, address, at + done, n - done < CHUNK ? n - done : CHUNK);
    }
    uint64_t flags = 0;
    if (r->transfer != WATCH_T_NONE && !(watched(w, address, &flags) && (flags & WATCH_RANGE_NO_EXITS)))
        check_transfer(uc, w, r, address);
}

/* The code hook over a watched range: user data is the watch. */
static void watch_hook(uc_engine *uc, uint64_t address, uint32_t size, void *user_data)
{
    struct store_watch *w = user_data;
    if (AS_PTR(struct write_log, w->log)->open)
        watch_instruction(uc, w, address, size);
}

static PyObject *ptr_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, uint64_t *out)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", want, nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        out[i] = PyLong_AsUnsignedLongLongMask(args[i]);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    return Py_None;
}

/* watch_instruction(uc, watch, address, size): what the hook does, for Python's site hook. */
static PyObject *py_watch_instruction(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t a[4];
    if (ptr_arg(args, nargs, 4, a) == NULL)
        return NULL;
    watch_instruction(AS_PTR(uc_engine, a[0]), AS_PTR(struct store_watch, a[1]), a[2], (uint32_t)a[3]);
    Py_RETURN_NONE;
}

/* watch_complete(uc, log): the logged stores' values, read now. */
static PyObject *py_watch_complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t a[2];
    if (ptr_arg(args, nargs, 2, a) == NULL)
        return NULL;
    watch_complete(AS_PTR(uc_engine, a[0]), AS_PTR(struct write_log, a[1]));
    Py_RETURN_NONE;
}

static PyMethodDef writelog_functions[] = {
    {"watch_instruction", (PyCFunction)(void (*)(void))py_watch_instruction, METH_FASTCALL,
     "watch_instruction(uc, watch, address, size)"},
    {"watch_complete", (PyCFunction)(void (*)(void))py_watch_complete, METH_FASTCALL, "watch_complete(uc, log)"},
    {NULL, NULL, 0, NULL},
};

#define WRITE_LOG_FIELDS(X) X(count) X(capacity) X(base) X(length) X(mem_read) X(taken) X(status) X(outside) \
    X(open) X(scratch) X(pending) X(unseen) X(unseen_pc) X(left_pc) X(left_to) X(branch_pc) X(branch_to)  \
    X(branch_next) X(snapshot) X(entries)
#define STORE_WATCH_FIELDS(X) X(log) X(reg_read) X(mem_read) X(decode) X(table) X(shift) X(nranges) X(ranges) \
    X(decoded) X(rcx)
#define WATCH_RECORD_FIELDS(X) X(pc) X(length) X(flags) X(transfer) X(target) X(nstores) X(ops) X(pad)
#define WATCH_OP_FIELDS(X) X(base) X(index) X(scale) X(disp) X(size) X(segment) X(flags)
#define WRITE_LOG_OFFSET(field) offsetof(struct write_log, field),
#define STORE_WATCH_OFFSET(field) offsetof(struct store_watch, field),
#define WATCH_RECORD_OFFSET(field) offsetof(struct watch_record, field),
#define WATCH_OP_OFFSET(field) offsetof(struct watch_op, field),

#define WATCH_CONSTANTS(X) X(WATCH_OP_REP) X(WATCH_OP_ADDR32) X(WATCH_OPS) X(WATCH_KNOWN) X(WATCH_CONDITIONAL) \
    X(WATCH_T_NONE) X(WATCH_T_DIRECT) X(WATCH_T_REG) X(WATCH_T_MEM) X(WATCH_T_RETURN) X(WATCH_T_KERNEL)         \
    X(WATCH_RANGE_NO_EXITS)

int hotpath_add_writelog(PyObject *module)
{
    hook_code_fn hook = watch_hook;
    if (HOTPATH_ADD_CONSTANTS(module, WATCH_CONSTANTS) < 0)
        return -1;
    if (HOTPATH_ADD_LAYOUT(module, "write_log", struct write_log, WRITE_LOG_FIELDS, WRITE_LOG_OFFSET) < 0 ||
        HOTPATH_ADD_LAYOUT(module, "store_watch", struct store_watch, STORE_WATCH_FIELDS, STORE_WATCH_OFFSET) < 0 ||
        HOTPATH_ADD_LAYOUT(module, "watch_record", struct watch_record, WATCH_RECORD_FIELDS, WATCH_RECORD_OFFSET) < 0 ||
        HOTPATH_ADD_LAYOUT(module, "watch_op", struct watch_op, WATCH_OP_FIELDS, WATCH_OP_OFFSET) < 0)
        return -1;
    if (PyModule_AddFunctions(module, writelog_functions) < 0)
        return -1;
    return hotpath_add_address(module, "watch_hook", (void *)hook);
}
