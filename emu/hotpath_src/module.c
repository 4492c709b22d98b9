/* The module emu._hotpath: each part of the hot path registers itself here. */
#include "hotpath.h"

#define HOTPATH_ABI 11 /* emu/hotpath/__init__.py refuses a module built for another interface */

int hotpath_add_base(PyObject *module)
{
    return PyModule_AddIntConstant(module, "ABI", HOTPATH_ABI);
}

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "emu._hotpath",
    "The probe-hit hot path in C: Unicorn hooks and counters that run without entering Python.", -1, NULL,
};

PyMODINIT_FUNC PyInit__hotpath(void)
{
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL)
        return NULL;
    if (hotpath_add_base(module) < 0
        || hotpath_add_icount(module) < 0
        || hotpath_add_fastsys(module) < 0
        || hotpath_add_writelog(module) < 0
        || hotpath_add_edges(module) < 0
        || hotpath_add_tlbfill(module) < 0
        || hotpath_add_memfilter(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
