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

/* A min-heap of int64 times in C memory: the window ends (or starts) a core wrote, so that it
 * can tell, without a scan of the store, that no window closed since the last final results. */
typedef struct {
    long long *items;
    Py_ssize_t size, capacity;
} TimeHeap;

static CORES_UNUSED int
heap_push(TimeHeap *heap, long long time)
{
    if (heap->size == heap->capacity) {
        Py_ssize_t capacity = heap->capacity ? heap->capacity * 2 : 1024;
        long long *items = PyMem_Realloc(heap->items, capacity * sizeof(long long));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        heap->items = items;
        heap->capacity = capacity;
    }
    Py_ssize_t at = heap->size++;
    while (at > 0 && heap->items[(at - 1) / 2] > time) {
        heap->items[at] = heap->items[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    heap->items[at] = time;
    return 0;
}

/* The smallest time out (the heap must not be empty). */
static CORES_UNUSED long long
heap_pop(TimeHeap *heap)
{
    long long top = heap->items[0], last = heap->items[--heap->size];
    Py_ssize_t at = 0;
    for (;;) {
        Py_ssize_t child = 2 * at + 1;
        if (child >= heap->size)
            break;
        if (child + 1 < heap->size && heap->items[child + 1] < heap->items[child])
            child++;
        if (heap->items[child] >= last)
            break;
        heap->items[at] = heap->items[child];
        at = child;
    }
    if (heap->size > 0)
        heap->items[at] = last;
    return top;
}

static CORES_UNUSED void
heap_free(TimeHeap *heap)
{
    PyMem_Free(heap->items);
    heap->items = NULL;
    heap->size = heap->capacity = 0;
}

/* counts[time] += by (a dict of Python ints; a count reaching 0 leaves it). */
static CORES_UNUSED int
count_time(PyObject *counts, long long time, long by)
{
    PyObject *key = PyLong_FromLongLong(time);
    if (key == NULL)
        return -1;
    PyObject *held = PyDict_GetItemWithError(counts, key);
    long count = held == NULL ? 0 : PyLong_AsLong(held);
    int failed = (held == NULL && PyErr_Occurred()) || (count == -1 && PyErr_Occurred());
    if (!failed) {
        count += by;
        if (count > 0) {
            PyObject *number = PyLong_FromLong(count);
            failed = number == NULL || PyDict_SetItem(counts, key, number) < 0;
            Py_XDECREF(number);
        }
        else if (held != NULL)
            failed = PyDict_DelItem(counts, key) < 0;
    }
    Py_DECREF(key);
    return failed ? -1 : 0;
}

/* Takes every time <= ``upper`` out of the heap and of ``counts``: 1 when one of them was
 * still counted (a window there may have closed), 0 when none, -1 on error. */
static CORES_UNUSED int
heap_take_upto(TimeHeap *heap, PyObject *counts, long long upper)
{
    int found = 0;
    while (heap->size > 0 && heap->items[0] <= upper) {
        long long time = heap_pop(heap);
        PyObject *key = PyLong_FromLongLong(time);
        if (key == NULL)
            return -1;
        PyObject *held = PyDict_GetItemWithError(counts, key);
        if (held != NULL) {
            found = 1;
            if (PyDict_DelItem(counts, key) < 0) {
                Py_DECREF(key);
                return -1;
            }
        }
        Py_DECREF(key);
        if (held == NULL && PyErr_Occurred())
            return -1;
    }
    return found;
}

/* A result a core may keep between records and hand out again: of a type whose value no
 * aggregator can change in place (a count's int, a str, bytes, a float, a bool, None). */
static CORES_UNUSED int
immutable_result(PyObject *result)
{
    return result == Py_None || PyLong_CheckExact(result) || PyUnicode_CheckExact(result)
           || PyBytes_CheckExact(result) || PyFloat_CheckExact(result) || PyBool_Check(result);
}

/* result_serde.serialize(result): Serdes.long()'s 8 bytes in C for an int64 (``long_results``),
 * else the serde's call (a new reference; None for a deleted result). */
static CORES_UNUSED PyObject *
serialize_result(PyObject *serialize, int long_results, PyObject *result)
{
    if (long_results && PyLong_CheckExact(result)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(result, &overflow);
        if (!overflow && !(value == -1 && PyErr_Occurred())) {
            unsigned char bytes[8];
            unsigned long long number = (unsigned long long)value;
            for (int i = 7; i >= 0; i--, number >>= 8)
                bytes[i] = (unsigned char)(number & 0xff);
            return PyBytes_FromStringAndSize((const char *)bytes, 8);
        }
        PyErr_Clear(); /* the serde raises its own error */
    }
    return PyObject_CallOneArg(serialize, result);
}

#endif
