/* What the C cores (_dedup_core.c, _window_core.c, _session_core.c, _sliding_core.c,
 * _join_core.c) share: Kafka's int64 times read from and written to their Python objects, and
 * the 128-bit sums and differences of them. Included by each core, after Python.h; every
 * function is static, so each core has its own copy and no symbol is exported. */
#ifndef STREAMPLATFORM_CORES_H
#define STREAMPLATFORM_CORES_H

#include <limits.h>

typedef __int128 wide;

#define CORES_UNUSED __attribute__((unused))

/* ``number`` as an int64 (an OverflowError beyond it). */
static CORES_UNUSED int
as_int64(PyObject *number, long long *out)
{
    long long value = PyLong_AsLongLong(number);
    if (value == -1 && PyErr_Occurred())
        return -1;
    *out = value;
    return 0;
}

/* getattr(owner, name) as an int64. */
static CORES_UNUSED int
int_attr(PyObject *owner, PyObject *name, long long *out)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL)
        return -1;
    int failed = as_int64(value, out);
    Py_DECREF(value);
    return failed;
}

/* getattr(owner, name) as a 128-bit int: beyond int64, the nearest end (a bound compared to
 * int64 times, which Python keeps as a big int: a window's end past the last one, a close time
 * below int64). */
static CORES_UNUSED int
wide_attr(PyObject *owner, PyObject *name, wide *out)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL)
        return -1;
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    Py_DECREF(value);
    if (number == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? ((wide)LLONG_MAX) * 4 : overflow < 0 ? ((wide)LLONG_MIN) * 4 : number;
    return 0;
}

/* A Python int of any 128-bit value (a new reference). */
static CORES_UNUSED PyObject *
wide_number(wide value)
{
    if (value >= LLONG_MIN && value <= LLONG_MAX)
        return PyLong_FromLongLong((long long)value);
    PyObject *high = PyLong_FromLongLong((long long)(value >> 32));
    PyObject *low = PyLong_FromUnsignedLongLong((unsigned long long)(value & 0xffffffff));
    PyObject *shift = PyLong_FromLong(32), *shifted = NULL, *out = NULL;
    if (high != NULL && low != NULL && shift != NULL)
        shifted = PyNumber_Lshift(high, shift);
    if (shifted != NULL)
        out = PyNumber_Add(shifted, low);
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(shift);
    Py_XDECREF(shifted);
    return out;
}

/* setattr(owner, name, value) for a 128-bit value. */
static CORES_UNUSED int
set_int_attr(PyObject *owner, PyObject *name, wide value)
{
    PyObject *number = wide_number(value);
    if (number == NULL)
        return -1;
    int failed = PyObject_SetAttr(owner, name, number);
    Py_DECREF(number);
    return failed;
}

/* A new entry of a record cache (aggregate.py, ResultCache): the list ``items`` (six references; the
 * last, the source record, is taken over in every case) under ``store_key`` in ``entries``,
 * its bytes added to the cache's ``bytes_name`` count, then the cache's ``evict_name`` called
 * when the count is over ``max_bytes``: what the cache's put does for a key it does not hold. */
static CORES_UNUSED int
add_cache_entry(PyObject *cache, PyObject *entries, PyObject *store_key, PyObject *items[6],
                long long entry_bytes, long long max_bytes, PyObject *bytes_name,
                PyObject *evict_name)
{
    long long held;
    if (int_attr(cache, bytes_name, &held) < 0) {
        Py_DECREF(items[5]);
        return -1;
    }
    held += PyBytes_GET_SIZE(store_key) + entry_bytes;
    if (set_int_attr(cache, bytes_name, held) < 0) {
        Py_DECREF(items[5]);
        return -1;
    }
    PyObject *entry = PyList_New(6);
    if (entry == NULL) {
        Py_DECREF(items[5]);
        return -1;
    }
    for (int i = 0; i < 6; i++) {
        if (i != 5)
            Py_INCREF(items[i]);
        PyList_SET_ITEM(entry, i, items[i]); /* steals the reference */
    }
    int failed = PyObject_SetItem(entries, store_key, entry);
    Py_DECREF(entry);
    if (failed)
        return -1;
    if (held > max_bytes) {
        PyObject *done = PyObject_CallMethodNoArgs(cache, evict_name);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    return 0;
}

#endif
