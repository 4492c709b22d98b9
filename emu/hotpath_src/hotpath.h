/* The C hot path's shared declarations.
 *
 * Unicorn's functions are reached through pointers handed over from Python (emu/hotpath/), so the
 * extension needs neither Unicorn's headers nor its library at build time. The signatures below are
 * those of Unicorn 2's public C API (unicorn.h); nothing here depends on a private structure.
 */
#ifndef UPROBE_EMU_HOTPATH_H
#define UPROBE_EMU_HOTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

typedef struct uc_struct uc_engine;      /* opaque */
typedef int uc_err;                      /* UC_ERR_OK is 0 */

/* Public API functions (unicorn.h) the hot path calls. */
typedef uc_err (*uc_reg_read_fn)(uc_engine *uc, int regid, void *value);
typedef uc_err (*uc_reg_read_batch_fn)(uc_engine *uc, int *regs, void **vals, int count);
typedef uc_err (*uc_reg_write_batch_fn)(uc_engine *uc, int *regs, void *const *vals, int count);
typedef uc_err (*uc_mem_read_fn)(uc_engine *uc, uint64_t address, void *bytes, size_t size);
typedef uc_err (*uc_mem_write_fn)(uc_engine *uc, uint64_t address, const void *bytes, size_t size);
typedef uc_err (*uc_emu_stop_fn)(uc_engine *uc);

/* Hook callback shapes (unicorn.h: uc_cb_hookcode_t, uc_cb_hookmem_t, uc_cb_insn_syscall_t, uc_cb_hookintr_t). */
typedef void (*hook_code_fn)(uc_engine *uc, uint64_t address, uint32_t size, void *user_data);
typedef int (*hook_mem_fn)(uc_engine *uc, int type, uint64_t address, int size, int64_t value, void *user_data);
typedef void (*hook_syscall_fn)(uc_engine *uc, void *user_data);
typedef void (*hook_intr_fn)(uc_engine *uc, uint32_t intno, void *user_data);

/* Each part of the hot path adds its functions and constants to the module (module.c calls them). */
int hotpath_add_base(PyObject *module);
int hotpath_add_icount(PyObject *module);   /* icount.c */
int hotpath_add_fastsys(PyObject *module);  /* fastsys.c */
int hotpath_add_writelog(PyObject *module); /* writelog.c */
int hotpath_add_edges(PyObject *module);    /* edges.c */
int hotpath_add_tlbfill(PyObject *module);  /* tlbfill.c */
int hotpath_add_memfilter(PyObject *module); /* memfilter.c */

/* The instruction counter (icount.c), which the syscall and interrupt front charges for each kernel entry. */
struct icount_state;
void icount_charge(struct icount_state *state, uc_engine *uc);

/* Helper for the parts: add a C function's address to the module as an int constant. */
static inline int hotpath_add_address(PyObject *module, const char *name, void *function)
{
    PyObject *value = PyLong_FromVoidPtr(function);
    if (value == NULL)
        return -1;
    int status = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return status;
}

/* Helper for the parts: export where the fields of a struct Python reads and writes lie (byte offsets,
 * and its size as "sizeof") into the module's LAYOUTS, so that Python takes them from here and the
 * struct is declared once (emu/hotpath/__init__.py, struct_layout). A part lists the fields with an
 * X-macro, FIELDS(X), and names a macro OFFSET(field) that expands to "offsetof(its struct, field),". */
#define HOTPATH_FIELD_NAME(field) #field,
int hotpath_add_layout(PyObject *module, const char *name, const char *const *fields, const size_t *offsets,
                       size_t count, size_t size);
/* ... and the values of enum constants Python encodes or decodes (the module's ENUMS, by name). */
struct hotpath_constant {
    const char *name;
    long long value;
};
#define HOTPATH_CONSTANT(name) {#name, name},
int hotpath_add_constants(PyObject *module, const struct hotpath_constant *constants, size_t count);
#define HOTPATH_ADD_CONSTANTS(module, NAMES)                                                              \
    hotpath_add_constants(module, (const struct hotpath_constant[]){NAMES(HOTPATH_CONSTANT)},           \
                          sizeof((const struct hotpath_constant[]){NAMES(HOTPATH_CONSTANT)}) /            \
                              sizeof(struct hotpath_constant))
#define HOTPATH_ADD_LAYOUT(module, name, type, FIELDS, OFFSET)                                           \
    hotpath_add_layout(module, name, (const char *const[]){FIELDS(HOTPATH_FIELD_NAME)},                \
                       (const size_t[]){FIELDS(OFFSET)},                                                 \
                       sizeof((const char *const[]){FIELDS(HOTPATH_FIELD_NAME)}) / sizeof(const char *), \
                       sizeof(type))

#endif
