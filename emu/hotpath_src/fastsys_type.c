/* The FastSys object: what Python hands the counting-only front (emu/kernel/uprobes/fastpath.py) and
 * reads back from it; fastsys.c handles the hits. */
#include "fastsys.h"

#include <stdlib.h>
#include <string.h>

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
    self->generation = self->latest ? *self->latest : 0;
    Py_RETURN_NONE;
}

/* set_clock(address): the instruction counter's state (emu/process/icount.py) each kernel entry is charged to; 0: none */
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

/* find_return(stack): (func, orig) of the return instance pushed here whose return address slot is at
 * stack, the newest first; None if there is none (the watch of returns asks, emu/verify/returns.py) */
static PyObject *fastsys_find_return(FastSys *self, PyObject *arg)
{
    uint64_t stack = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    for (int i = self->return_count - 1; i >= 0; i--) {
        const return_instance *ri = &self->returns[i];
        if (ri->stack == stack)
            return Py_BuildValue("(KK)", (unsigned long long)ri->func, (unsigned long long)ri->orig);
    }
    Py_RETURN_NONE;
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

static PyObject *fastsys_set_generation(FastSys *self, PyObject *address)
{
    self->latest = (const uint64_t *)address_of(address);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *fastsys_get_current(FastSys *self, void *closure)
{
    return PyBool_FromLong(self->latest && self->generation == *self->latest);
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
     "set_clock(state): the instruction counter each kernel entry is charged to (emu/process/icount.py; 0: none)"},
    {"set_generation", (PyCFunction)fastsys_set_generation, METH_O,
     "set_generation(address): the word that counts changes to the tables (emu/kernel/uprobes/generation.py)"},
    {"set_tables", (PyCFunction)fastsys_set_tables, METH_VARARGS,
     "set_tables(probes, trampoline pages, slots): the counting-only probes, current from now on"},
    {"set_uretprobe", (PyCFunction)fastsys_set_uretprobe, METH_VARARGS,
     "set_uretprobe(nr, saved ids, syscall_return): the design's sys_uretprobe ('trampoline' exit)"},
    {"set_python_returns", (PyCFunction)fastsys_set_python_returns, METH_VARARGS,
     "set_python_returns(xol, depth, top stack): the XOL page and Python's pending return instances"},
    {"take_returns", (PyCFunction)fastsys_take_returns, METH_NOARGS,
     "the return instances pushed here (func, stack, orig, chained, probe index), oldest first; cleared"},
    {"find_return", (PyCFunction)fastsys_find_return, METH_O,
     "find_return(stack): (func, orig) of the return instance pushed here with that return address slot, or None"},
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

#define FASTSYS_CONSTANTS(X) X(PATH_INT3) X(PATH_CALL) X(PATH_JMP) X(EXIT_TRAMPOLINE) X(EXIT_IRET) X(EXIT_SYSRET)    \
    X(REG_AX) X(REG_IP) X(REG_FLAGS) X(REG_SP) X(REG_CX) X(REG_R11) X(ST_UPROBE_CALLS) X(ST_MMAP_LOCKS) X(ST_COPIED) \
    X(ST_EXIT_SYSRET) X(ST_EXIT_IRET) X(ST_TRAPS) X(ST_EMULATED) X(ST_URETPROBE_CALLS) X(ST_RET_HITS)

int hotpath_add_fastsys(PyObject *module)
{
    if (HOTPATH_ADD_CONSTANTS(module, FASTSYS_CONSTANTS) < 0)
        return -1;
    if (PyType_Ready(&FastSysType) < 0 || PyModule_AddObjectRef(module, "FastSys", (PyObject *)&FastSysType) < 0)
        return -1;
    if (hotpath_add_address(module, "fastsys_syscall_hook", (void *)fastsys_on_syscall) < 0)
        return -1;
    return hotpath_add_address(module, "fastsys_interrupt_hook", (void *)fastsys_on_interrupt);
}
