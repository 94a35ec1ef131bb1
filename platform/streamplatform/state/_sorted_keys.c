/* A transaction's staged keys in order, in C: overlay.SortedKeys is the reference.
 *
 * The same structure as the reference (a list of sorted chunks of bytes keys, each chunk's
 * largest key in `lasts`), the same operations and results. What C saves is the interpreter's
 * work around each insertion and range read: a windowed aggregation on window close, a
 * session or sliding aggregation and a stream-stream join stage several keys and read one
 * key's range per record, so the staged keys are put into place and read in range hundreds of
 * thousands of times a batch.
 *
 * Keys compare as Python compares bytes (memcmp, then the shorter first); only bytes are
 * accepted (the transaction checks its keys before they get here).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    PyObject *chunks; /* list of lists of bytes, each sorted, together in order */
    PyObject *lasts;  /* list of bytes: each chunk's largest key */
    Py_ssize_t chunk; /* a chunk splits in two above twice this */
} SortedKeys;

static int
compare(PyObject *a, PyObject *b)
{
    Py_ssize_t la = PyBytes_GET_SIZE(a), lb = PyBytes_GET_SIZE(b);
    int c = memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)(la < lb ? la : lb));
    if (c != 0)
        return c;
    return (la > lb) - (la < lb);
}

/* The first index of `list` (sorted bytes) whose item is not below `key`. */
static Py_ssize_t
bisect_left(PyObject *list, PyObject *key)
{
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (compare(PyList_GET_ITEM(list, mid), key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int
check_key(const char *what, PyObject *key)
{
    if (PyBytes_Check(key))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", what, Py_TYPE(key)->tp_name);
    return -1;
}

static int
SortedKeys_init(SortedKeys *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"keys", "chunk", NULL};
    PyObject *keys;
    Py_ssize_t chunk;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!n", names, &PyList_Type, &keys, &chunk))
        return -1;
    if (chunk < 1) {
        PyErr_SetString(PyExc_ValueError, "chunk must be at least 1");
        return -1;
    }
    PyObject *chunks = PyList_New(0), *lasts = PyList_New(0);
    if (chunks == NULL || lasts == NULL)
        goto fail;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    for (Py_ssize_t at = 0; at < n; at += chunk) {
        PyObject *part = PyList_GetSlice(keys, at, at + chunk < n ? at + chunk : n);
        if (part == NULL)
            goto fail;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(part); i++) {
            if (check_key("key", PyList_GET_ITEM(part, i)) < 0) {
                Py_DECREF(part);
                goto fail;
            }
        }
        int failed = PyList_Append(chunks, part) < 0
                     || PyList_Append(lasts, PyList_GET_ITEM(part, PyList_GET_SIZE(part) - 1)) < 0;
        Py_DECREF(part);
        if (failed)
            goto fail;
    }
    Py_XSETREF(self->chunks, chunks);
    Py_XSETREF(self->lasts, lasts);
    self->chunk = chunk;
    return 0;
fail:
    Py_XDECREF(chunks);
    Py_XDECREF(lasts);
    return -1;
}

/* Put `key` (not yet here) into place. */
static int
insert_one(SortedKeys *self, PyObject *key)
{
    if (check_key("key", key) < 0)
        return -1;
    PyObject *chunks = self->chunks, *lasts = self->lasts;
    Py_ssize_t count = PyList_GET_SIZE(chunks);
    if (count == 0) {
        PyObject *chunk = PyList_New(1);
        if (chunk == NULL)
            return -1;
        Py_INCREF(key);
        PyList_SET_ITEM(chunk, 0, key);
        int failed = PyList_Append(chunks, chunk) < 0 || PyList_Append(lasts, key) < 0;
        Py_DECREF(chunk);
        return failed ? -1 : 0;
    }
    Py_ssize_t at = bisect_left(lasts, key);
    if (at == count) /* above every key: the last chunk grows */
        at -= 1;
    PyObject *chunk = PyList_GET_ITEM(chunks, at);
    if (PyList_Insert(chunk, bisect_left(chunk, key), key) < 0)
        return -1;
    Py_ssize_t size = PyList_GET_SIZE(chunk);
    PyObject *last = PyList_GET_ITEM(chunk, size - 1);
    Py_INCREF(last);
    PyList_SetItem(lasts, at, last); /* steals; cannot fail for a valid index */
    if (size > 2 * self->chunk) {
        PyObject *upper = PyList_GetSlice(chunk, self->chunk, size);
        if (upper == NULL)
            return -1;
        int failed = PyList_Insert(chunks, at + 1, upper) < 0
                     || PyList_SetSlice(chunk, self->chunk, size, NULL) < 0
                     || PyList_Insert(lasts, at, PyList_GET_ITEM(chunk, self->chunk - 1)) < 0;
        Py_DECREF(upper);
        if (failed)
            return -1;
    }
    return 0;
}

static PyObject *
SortedKeys_insert(SortedKeys *self, PyObject *key)
{
    if (insert_one(self, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
SortedKeys_insert_all(SortedKeys *self, PyObject *keys)
{
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "insert_all() takes a list of keys");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        if (insert_one(self, PyList_GET_ITEM(keys, i)) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
SortedKeys_remove(SortedKeys *self, PyObject *key)
{
    if (check_key("key", key) < 0)
        return NULL;
    PyObject *lasts = self->lasts;
    Py_ssize_t at = bisect_left(lasts, key);
    if (at == PyList_GET_SIZE(lasts))
        Py_RETURN_FALSE;
    PyObject *chunk = PyList_GET_ITEM(self->chunks, at);
    Py_ssize_t index = bisect_left(chunk, key);
    if (index == PyList_GET_SIZE(chunk) || compare(PyList_GET_ITEM(chunk, index), key) != 0)
        Py_RETURN_FALSE;
    if (PyList_SetSlice(chunk, index, index + 1, NULL) < 0)
        return NULL;
    Py_ssize_t size = PyList_GET_SIZE(chunk);
    if (size > 0) {
        PyObject *last = PyList_GET_ITEM(chunk, size - 1);
        Py_INCREF(last);
        PyList_SetItem(lasts, at, last);
    }
    else if (PyList_SetSlice(self->chunks, at, at + 1, NULL) < 0
             || PyList_SetSlice(lasts, at, at + 1, NULL) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* Appends to `out` the keys with start <= key < end in order, or (key, writes[key]) pairs when
 * `writes` is not NULL. */
static int
collect(SortedKeys *self, PyObject *start, PyObject *end, PyObject *writes, PyObject *out)
{
    if ((start != Py_None && check_key("start", start) < 0)
        || (end != Py_None && check_key("end", end) < 0))
        return -1;
    if (writes != NULL && !PyDict_Check(writes)) {
        PyErr_SetString(PyExc_TypeError, "writes must be a dict");
        return -1;
    }
    PyObject *chunks = self->chunks;
    Py_ssize_t count = PyList_GET_SIZE(chunks);
    Py_ssize_t at = start == Py_None ? 0 : bisect_left(self->lasts, start);
    for (; at < count; at++) {
        PyObject *chunk = PyList_GET_ITEM(chunks, at);
        Py_ssize_t size = PyList_GET_SIZE(chunk);
        Py_ssize_t low = start == Py_None ? 0 : bisect_left(chunk, start);
        start = Py_None; /* the chunks after this one are all above start */
        Py_ssize_t high = size;
        int last_chunk = end != Py_None && compare(PyList_GET_ITEM(chunk, size - 1), end) >= 0;
        if (last_chunk)
            high = bisect_left(chunk, end);
        for (Py_ssize_t i = low; i < high; i++) {
            PyObject *key = PyList_GET_ITEM(chunk, i);
            int failed;
            if (writes == NULL) {
                failed = PyList_Append(out, key) < 0;
            }
            else {
                PyObject *value = PyDict_GetItemWithError(writes, key); /* borrowed */
                if (value == NULL) {
                    if (!PyErr_Occurred())
                        PyErr_SetObject(PyExc_KeyError, key);
                    return -1;
                }
                PyObject *pair = PyTuple_Pack(2, key, value);
                if (pair == NULL)
                    return -1;
                failed = PyList_Append(out, pair) < 0;
                Py_DECREF(pair);
            }
            if (failed)
                return -1;
        }
        if (last_chunk)
            break;
    }
    return 0;
}

static PyObject *
SortedKeys_between(SortedKeys *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "between(start, end)");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || collect(self, args[0], args[1], NULL, out) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
SortedKeys_items_between(SortedKeys *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "items_between(start, end, writes)");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || collect(self, args[0], args[1], args[2], out) < 0) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

/* SortedKeys.remove_between: take out the keys with start <= key < end (None: that side
 * open) and return them in order, in one pass over the chunks they fill. */
static PyObject *
SortedKeys_remove_between(SortedKeys *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "remove_between(start, end)");
        return NULL;
    }
    PyObject *start = args[0], *end = args[1];
    if ((start != Py_None && check_key("start", start) < 0)
        || (end != Py_None && check_key("end", end) < 0))
        return NULL;
    PyObject *removed = PyList_New(0);
    if (removed == NULL)
        return NULL;
    PyObject *chunks = self->chunks, *lasts = self->lasts;
    Py_ssize_t at = start == Py_None ? 0 : bisect_left(lasts, start);
    while (at < PyList_GET_SIZE(chunks)) {
        PyObject *chunk = PyList_GET_ITEM(chunks, at);
        Py_ssize_t size = PyList_GET_SIZE(chunk);
        Py_ssize_t low = start == Py_None ? 0 : bisect_left(chunk, start);
        Py_ssize_t high = end == Py_None ? size : bisect_left(chunk, end);
        int ended = high < size; /* a key at or above end: the chunks after it keep theirs */
        if (high > low) {
            PyObject *part = PyList_GetSlice(chunk, low, high);
            int failed = part == NULL
                         || PyList_SetSlice(removed, PyList_GET_SIZE(removed),
                                            PyList_GET_SIZE(removed), part) < 0
                         || PyList_SetSlice(chunk, low, high, NULL) < 0;
            Py_XDECREF(part);
            if (failed) {
                Py_DECREF(removed);
                return NULL;
            }
        }
        size = PyList_GET_SIZE(chunk);
        if (size > 0) {
            PyObject *last = PyList_GET_ITEM(chunk, size - 1);
            Py_INCREF(last);
            PyList_SetItem(lasts, at, last); /* steals; drops the old last */
            at++;
        }
        else if (PyList_SetSlice(chunks, at, at + 1, NULL) < 0
                 || PyList_SetSlice(lasts, at, at + 1, NULL) < 0) {
            Py_DECREF(removed);
            return NULL;
        }
        if (ended)
            break;
    }
    return removed;
}

static int
SortedKeys_traverse(SortedKeys *self, visitproc visit, void *arg)
{
    Py_VISIT(self->chunks);
    Py_VISIT(self->lasts);
    return 0;
}

static int
SortedKeys_clear(SortedKeys *self)
{
    Py_CLEAR(self->chunks);
    Py_CLEAR(self->lasts);
    return 0;
}

static void
SortedKeys_dealloc(SortedKeys *self)
{
    PyObject_GC_UnTrack(self);
    SortedKeys_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
SortedKeys_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    SortedKeys *self = (SortedKeys *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->chunks = PyList_New(0);
    self->lasts = PyList_New(0);
    self->chunk = 1;
    if (self->chunks == NULL || self->lasts == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyMethodDef SortedKeys_methods[] = {
    {"insert", (PyCFunction)SortedKeys_insert, METH_O, "Put key (not yet here) into place."},
    {"insert_all", (PyCFunction)SortedKeys_insert_all, METH_O,
     "insert() each key of a list (none here yet, no repeats)."},
    {"remove", (PyCFunction)SortedKeys_remove, METH_O, "Take key out; False when not here."},
    {"between", (PyCFunction)(void (*)(void))SortedKeys_between, METH_FASTCALL,
     "The keys with start <= key < end, in order (None: that side open)."},
    {"items_between", (PyCFunction)(void (*)(void))SortedKeys_items_between, METH_FASTCALL,
     "(key, writes[key]) for the keys with start <= key < end, in order."},
    {"remove_between", (PyCFunction)(void (*)(void))SortedKeys_remove_between, METH_FASTCALL,
     "Take out the keys with start <= key < end and return them, in order."},
    {NULL},
};

static PyTypeObject SortedKeysType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "streamplatform.state._sorted_keys.SortedKeys",
    .tp_basicsize = sizeof(SortedKeys),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Keys in order, as sorted chunks (overlay.SortedKeys is the reference).",
    .tp_new = SortedKeys_new,
    .tp_init = (initproc)SortedKeys_init,
    .tp_dealloc = (destructor)SortedKeys_dealloc,
    .tp_traverse = (traverseproc)SortedKeys_traverse,
    .tp_clear = (inquiry)SortedKeys_clear,
    .tp_methods = SortedKeys_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_sorted_keys", "overlay.SortedKeys in C.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__sorted_keys(void)
{
    if (PyType_Ready(&SortedKeysType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&SortedKeysType);
    if (PyModule_AddObject(module, "SortedKeys", (PyObject *)&SortedKeysType) < 0) {
        Py_DECREF(&SortedKeysType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
