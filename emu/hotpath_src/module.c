/* The module emu._hotpath: each part of the hot path registers itself here. */
#include "hotpath.h"

#define HOTPATH_ABI 14 /* emu/hotpath/__init__.py refuses a module built for another interface */

static int add_dict(PyObject *module, const char *name)
{
    PyObject *dict = PyDict_New();
    int status = dict != NULL ? PyModule_AddObjectRef(module, name, dict) : -1;
    Py_XDECREF(dict);
    return status;
}

int hotpath_add_base(PyObject *module)
{
    if (add_dict(module, "LAYOUTS") < 0 || add_dict(module, "ENUMS") < 0)
        return -1;
    return PyModule_AddIntConstant(module, "ABI", HOTPATH_ABI);
}

int hotpath_add_constants(PyObject *module, const struct hotpath_constant *constants, size_t count)
{
    PyObject *enums = PyObject_GetAttrString(module, "ENUMS");
    int status = enums != NULL ? 0 : -1;
    for (size_t i = 0; status == 0 && i < count; i++) {
        PyObject *value = PyLong_FromLongLong(constants[i].value);
        status = value != NULL ? PyDict_SetItemString(enums, constants[i].name, value) : -1;
        Py_XDECREF(value);
    }
    Py_XDECREF(enums);
    return status;
}

int hotpath_add_layout(PyObject *module, const char *name, const char *const *fields, const size_t *offsets,
                       size_t count, size_t size)
{
    PyObject *layouts = PyObject_GetAttrString(module, "LAYOUTS");
    PyObject *layout = PyDict_New();
    int status = layouts != NULL && layout != NULL ? 0 : -1;
    for (size_t i = 0; status == 0 && i < count; i++) {
        PyObject *offset = PyLong_FromSize_t(offsets[i]);
        status = offset != NULL ? PyDict_SetItemString(layout, fields[i], offset) : -1;
        Py_XDECREF(offset);
    }
    if (status == 0) {
        PyObject *bytes = PyLong_FromSize_t(size);
        status = bytes != NULL ? PyDict_SetItemString(layout, "sizeof", bytes) : -1;
        Py_XDECREF(bytes);
    }
    if (status == 0)
        status = PyDict_SetItemString(layouts, name, layout);
    Py_XDECREF(layout);
    Py_XDECREF(layouts);
    return status;
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
