/* The per-record path of SlidingWindowAggregate (count / reduce / aggregate over
 * SlidingWindows), in C.
 *
 * `Core.process(record)` does exactly what `SlidingWindowAggregate.process` does in
 * sliding_aggregate.py (with `_process`, `_process_early`, `_create_windows`, `_update`,
 * `_put`, `_emit_final`, and `KeyedWindowAggregation._key_windows` of aggregate.py), which is
 * the reference: read it first. The state stays in the Python objects (the record cache's
 * OrderedDict of entries, its index of a key's windows and its byte count, the kept stream,
 * store and emitted-to times, the dropped-records counter); what goes to the store goes through
 * the store's transaction (`range`, as `_key_windows` reads it) and the aggregation's Python
 * helpers (`_closed_windows`, and the cache's `put` without a cache and `evict_over_budget`),
 * so the store is touched only where Python touches it, in the same order. What C saves is the
 * interpreter's work per record around those objects: the walk over a key's windows, the scan
 * of its cached windows, the windows' keys and the aggregator's calls. One exception, on
 * window close with a count's results: a kept key's updates wait in memory until the commit
 * (see "Write-back" below), and the committed store and the output are the reference's.
 *
 * Every step that Python code can observe (the initializer's and the aggregator's calls, the
 * cache's writes, evictions and forwards, the counters) happens in the reference's order, so
 * that a record whose aggregator raises leaves the same half-done state behind as there.
 *
 * The OrderedDict is read with PyDict_GetItemWithError (its items live in the dict it
 * extends) and written only through PyObject_SetItem and its move_to_end, which keep its order.
 *
 * Timestamps are int64 in Kafka; sums and differences of them are taken in 128 bits. A window
 * time written into a store key that does not fit in int64 raises what Python's struct raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define CORES_WINDOW_NAMES
#include "_cores.h"


static PyObject *str_entries, *str_by_prefix, *str_transaction, *str_range, *str_closed_windows,
    *str_pack, *str_unpack_from, *str_get;
/* struct.Struct(">q"), as aggregate.py's _TIMESTAMP: it raises what Python raises for a time
 * that does not fit, or a store value too short to hold one. */
static PyObject *timestamp_struct;

/* What memory holds per window kept between records (`kept`), in bytes: its start, timestamp
 * and result reference (24), its share of its key's array as it grows (up to half again), and
 * its result, an int past the small ones for a count (32). Per key kept: its slot in the
 * dict, its prefix (a bytes of its key's length + 5) and the capsule and array heads. An
 * estimate, as the record cache's _ENTRY_BYTES. */
#define KEPT_WINDOW_BYTES 64
#define KEPT_KEY_BYTES 240
#define KEYED_PREFIX 'k'
#define PREFIX_HEAD 5 /* b"k" + the key's length, 4 bytes big-endian */

typedef struct {
    PyObject_HEAD
    PyObject *aggregation, *cache, *entries, *by_prefix, *store, *stream_time, *store_time,
        *emitted_to, *task;
    PyObject *key_serialize, *key_deserialize, *result_deserialize, *initializer, *aggregator;
    PyObject *forward, *record_type, *windowed_type, *window_type, *result_serialize;
    /* Where a closed window's count is written directly (sink_append None: forwarded). */
    PyObject *sink_topic, *sink_append, *sink_sources_append, *producer_type, *no_source;
    /* On window close, without a cache: the windows not emitted yet, by start (_cores.h). */
    PendingWindows pending;
    /* A key's windows as _key_windows sees them (the cache's over the store's), kept between
     * records so that the store is read once per key: prefix -> a capsule of its windows in
     * a C array (KeyWindows). Every write of a window goes through `put`, which keeps it up
     * to date. Only immutable results are kept, within the budget (_cores.h, KeptWindows). */
    KeptWindows kept;
    PyObject *transaction; /* the store's writing transaction, while a record is processed */
    long long difference, grace, retention, max_bytes, entry_bytes;
    int string_keys, count, time_first, emit_final, long_results;
    /* On window close, without a cache, with int64 results (a count's): a kept key's window
     * writes stay in its kept windows (marked dirty) until the commit, or until its kept
     * windows leave memory (see keep_write). */
    int write_back;
    int has_dirty; /* some kept window may be dirty (0: none is, write_back_all has nothing) */
} Core;

/* What one record's path shares. */
typedef struct {
    PyObject *record, *key, *value, *timestamp_object;
    PyObject *prefix; /* keyed_prefix(key bytes) */
    long long timestamp;
    wide close; /* stream time - grace: a window ending before it has closed */
} Step;

/* A window found for the record: (result, timestamp), references borrowed from the list
 * `key_windows` gave, or held by the caller. `result` NULL: none. */
typedef struct {
    PyObject *result, *latest;
    long long latest_time;
} Found;

static int
count_dropped(Core *self)
{
    long long dropped;
    if (int_attr(self->aggregation, str_dropped_records, &dropped) < 0)
        return -1;
    return set_int_attr(self->aggregation, str_dropped_records, (wide)dropped + 1);
}

/* `_TIMESTAMP.unpack_from(data, offset)[0]` where `data` is too short: its struct.error. */
static int
raise_short(PyObject *data, Py_ssize_t offset)
{
    PyObject *at = PyLong_FromSsize_t(offset);
    if (at == NULL)
        return -1;
    PyObject *out = PyObject_CallMethodObjArgs(timestamp_struct, str_unpack_from, data, at, NULL);
    Py_DECREF(at);
    Py_XDECREF(out);
    if (out != NULL)
        PyErr_SetString(PyExc_ValueError, "a time in the store is too short");
    return -1;
}

/* The int64 at `offset` of the bytes `data`, as `_TIMESTAMP.unpack_from(data, offset)[0]`. */
static int
unpack_at(PyObject *data, Py_ssize_t offset, long long *out)
{
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "a store key or value is not bytes");
        return -1;
    }
    if (PyBytes_GET_SIZE(data) < offset + 8)
        return raise_short(data, offset);
    *out = int64_at(PyBytes_AS_STRING(data) + offset);
    return 0;
}

/* `prefix + _TIMESTAMP.pack(time)` (a new reference): a window's store key, or a bound. */
static PyObject *
prefixed(PyObject *prefix, wide time)
{
    if (time < LLONG_MIN || time > LLONG_MAX) { /* struct says what is wrong */
        PyObject *number = wide_number(time);
        if (number == NULL)
            return NULL;
        PyObject *out = PyObject_CallMethodOneArg(timestamp_struct, str_pack, number);
        Py_DECREF(number);
        Py_XDECREF(out);
        if (out != NULL)
            PyErr_SetString(PyExc_OverflowError, "window time out of the int64 range");
        return NULL;
    }
    Py_ssize_t length = PyBytes_GET_SIZE(prefix);
    PyObject *out = PyBytes_FromStringAndSize(NULL, length + 8);
    if (out == NULL)
        return NULL;
    memcpy(PyBytes_AS_STRING(out), PyBytes_AS_STRING(prefix), length);
    int64_into(PyBytes_AS_STRING(out) + length, (long long)time);
    return out;
}

/* `keyed_prefix(self.key_serde.serialize(key) or b"")` (a new reference). */
static PyObject *
key_prefix(Core *self, PyObject *key)
{
    PyObject *data;
    if (self->string_keys && PyUnicode_CheckExact(key))
        data = PyUnicode_AsUTF8String(key);
    else
        data = PyObject_CallOneArg(self->key_serialize, key);
    if (data == NULL)
        return NULL;
    Py_ssize_t length = 0;
    if (data != Py_None) {
        if (!PyBytes_Check(data)) { /* keyed_prefix takes bytes: len() and + */
            Py_DECREF(data);
            PyErr_SetString(PyExc_TypeError, "the key serde did not give bytes");
            return NULL;
        }
        length = PyBytes_GET_SIZE(data);
    }
    if ((unsigned long long)length > 0xffffffffULL) { /* len(key).to_bytes(4, "big") */
        Py_DECREF(data);
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, PREFIX_HEAD + length);
    if (out != NULL) {
        unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
        bytes[0] = KEYED_PREFIX;
        for (int i = 4; i >= 1; i--) {
            bytes[i] = (unsigned char)(length & 0xff);
            length >>= 8;
        }
        if (data != Py_None)
            memcpy(bytes + PREFIX_HEAD, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    }
    Py_DECREF(data);
    return out;
}

/* A frozen dataclass instance with these fields, as its __init__ would make it. */
static PyObject *
frozen(PyObject *type, PyObject *first_name, PyObject *first, PyObject *second_name,
       PyObject *second)
{
    PyObject *out = PyBaseObject_Type.tp_new((PyTypeObject *)type, empty_tuple, NULL);
    if (out == NULL)
        return NULL;
    if (PyObject_GenericSetAttr(out, first_name, first) < 0
        || PyObject_GenericSetAttr(out, second_name, second) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* Window(start, start + difference) (a new reference). */
static PyObject *
window_of(Core *self, long long start)
{
    PyObject *low = PyLong_FromLongLong(start);
    PyObject *high = wide_number((wide)start + self->difference), *out = NULL;
    if (low != NULL && high != NULL)
        out = frozen(self->window_type, str_start, low, str_end, high);
    Py_XDECREF(low);
    Py_XDECREF(high);
    return out;
}

/* `self.initializer()` as `_initial` calls it (a new reference): None for a reduce. */
static PyObject *
initial(Core *self)
{
    if (self->count) { /* zero() */
        Py_INCREF(zero);
        return zero;
    }
    if (self->initializer == Py_None)
        Py_RETURN_NONE;
    return PyObject_CallNoArgs(self->initializer);
}

/* A stored value, timestamp (8 bytes) + result: (deserialize(raw[8:]), timestamp), in that
 * order, as `_key_windows` reads it (a new reference). */
static PyObject *
stored_pair(Core *self, PyObject *raw)
{
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "a stored value is not bytes");
        return NULL;
    }
    Py_ssize_t length = PyBytes_GET_SIZE(raw);
    PyObject *result = deserialize_result(self->result_deserialize, self->long_results,
                                          PyBytes_AS_STRING(raw) + (length < 8 ? length : 8),
                                          length < 8 ? 0 : length - 8);
    if (result == NULL)
        return NULL;
    long long timestamp;
    PyObject *latest = NULL, *pair = NULL;
    if (unpack_at(raw, 0, &timestamp) == 0 && (latest = PyLong_FromLongLong(timestamp)) != NULL)
        pair = PyTuple_Pack(2, result, latest);
    Py_DECREF(result);
    Py_XDECREF(latest);
    return pair;
}

/* KeyedWindowAggregation._key_windows(prefix, low, high) as read from the cache and the
 * store, `low` already bounded below by what is still seen (and `high` above it): the key's
 * windows whose start is in [low, high), in time order, as a new list of (store key, result,
 * timestamp): the cache's over the store's, those whose result is None left out. */
static PyObject *
stored_windows(Core *self, PyObject *prefix, wide low, wide high)
{
    PyObject *low_key = NULL, *high_key = NULL, *transaction = NULL, *scan = NULL;
    PyObject *found = NULL, *keys = NULL, *out = NULL, *item = NULL, *members = NULL;
    if ((low_key = prefixed(prefix, low)) == NULL || (high_key = prefixed(prefix, high)) == NULL)
        goto done;
    if ((found = PyDict_New()) == NULL)
        goto done;
    if ((transaction = transaction_of(self->store, &self->transaction, str_transaction)) == NULL)
        goto done;
    PyObject *range = PyObject_CallMethodObjArgs(transaction, str_range, low_key, high_key, NULL);
    if (range == NULL)
        goto done;
    scan = PyObject_GetIter(range);
    Py_DECREF(range);
    if (scan == NULL)
        goto done;
    while ((item = PyIter_Next(scan)) != NULL) {
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "the store's range did not give (key, value)");
            goto done;
        }
        PyObject *pair = stored_pair(self, PyTuple_GET_ITEM(item, 1));
        if (pair == NULL)
            goto done;
        int set = PyDict_SetItem(found, PyTuple_GET_ITEM(item, 0), pair);
        Py_DECREF(pair);
        if (set < 0)
            goto done;
        Py_CLEAR(item);
    }
    if (PyErr_Occurred())
        goto done;
    /* the cache's windows of the key (its index, by_prefix), over the store's */
    PyObject *cached = PyDict_GetItemWithError(self->by_prefix, prefix);
    if (cached == NULL && PyErr_Occurred())
        goto done;
    if (cached != NULL) {
        Py_ssize_t at = PyBytes_GET_SIZE(prefix);
        if ((members = PyObject_GetIter(cached)) == NULL)
            goto done;
        while ((item = PyIter_Next(members)) != NULL) {
            long long start;
            if (unpack_at(item, at, &start) < 0)
                goto done;
            if (low <= start && start < high) {
                PyObject *entry = PyDict_GetItemWithError(self->entries, item);
                if (entry == NULL) {
                    if (!PyErr_Occurred())
                        PyErr_SetObject(PyExc_KeyError, item);
                    goto done;
                }
                if (!PyList_Check(entry) || PyList_GET_SIZE(entry) < 2) {
                    PyErr_SetString(PyExc_TypeError, "a record cache entry is not a list");
                    goto done;
                }
                PyObject *pair =
                    PyTuple_Pack(2, PyList_GET_ITEM(entry, 0), PyList_GET_ITEM(entry, 1));
                if (pair == NULL)
                    goto done;
                int set = PyDict_SetItem(found, item, pair);
                Py_DECREF(pair);
                if (set < 0)
                    goto done;
            }
            Py_CLEAR(item);
        }
        if (PyErr_Occurred())
            goto done;
    }
    if ((keys = PyDict_Keys(found)) == NULL || PyList_Sort(keys) < 0)
        goto done;
    if ((out = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *store_key = PyList_GET_ITEM(keys, i);
        PyObject *pair = PyDict_GetItemWithError(found, store_key); /* borrowed */
        if (pair == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "a window went missing");
            Py_CLEAR(out);
            goto done;
        }
        if (PyTuple_GET_ITEM(pair, 0) == Py_None)
            continue; /* a deleted window in the cache hides the store's */
        PyObject *window = PyTuple_Pack(3, store_key, PyTuple_GET_ITEM(pair, 0),
                                        PyTuple_GET_ITEM(pair, 1));
        int appended = window == NULL ? -1 : PyList_Append(out, window);
        Py_XDECREF(window);
        if (appended < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_XDECREF(low_key);
    Py_XDECREF(high_key);
    Py_XDECREF(transaction);
    Py_XDECREF(scan);
    Py_XDECREF(members);
    Py_XDECREF(item);
    Py_XDECREF(found);
    Py_XDECREF(keys);
    return out;
}

/* A key's kept windows, compact: by start (distinct, never negative), each with its result
 * (a strong reference to an immutable object) and its timestamp. Held in `kept.by_key` as a
 * capsule, which frees them when the key's windows leave. */
typedef struct {
    long long start : 63; /* never negative */
    /* written here only (write-back): the store's transaction has an older result or none */
    unsigned long long dirty : 1;
    long long latest;
    PyObject *result;
} KeptWindow;
_Static_assert(sizeof(KeptWindow) == 24, "a kept window is counted at 24 bytes of its array");

typedef struct {
    Py_ssize_t size, capacity;
    KeptWindow *items;
} KeyWindows;

#define KEY_WINDOWS_CAPSULE "streamplatform.dsl._sliding_core.KeyWindows"

static void
key_windows_free(PyObject *capsule)
{
    KeyWindows *windows = PyCapsule_GetPointer(capsule, KEY_WINDOWS_CAPSULE);
    if (windows == NULL)
        return;
    for (Py_ssize_t i = 0; i < windows->size; i++)
        Py_DECREF(windows->items[i].result);
    PyMem_Free(windows->items);
    PyMem_Free(windows);
}

/* The first index whose start is not below `start`. */
static Py_ssize_t
window_at(KeyWindows *windows, wide start)
{
    Py_ssize_t low = 0, high = windows->size;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if ((wide)windows->items[middle].start < start)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

/* Room for one more window. */
static int
key_windows_grow(KeyWindows *windows)
{
    if (windows->size < windows->capacity)
        return 0;
    Py_ssize_t capacity = windows->capacity + (windows->capacity >> 1) + 4;
    KeptWindow *items = PyMem_Realloc(windows->items, capacity * sizeof(KeptWindow));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    windows->items = items;
    windows->capacity = capacity;
    return 0;
}

/* Over the budget: the windows as the core counts them (KEPT_WINDOW_BYTES a window,
 * KEPT_KEY_BYTES a key). */
static int
kept_over(Core *self, long long windows)
{
    long long keys = self->kept.by_key == NULL ? 0 : PyDict_GET_SIZE(self->kept.by_key);
    return windows * KEPT_WINDOW_BYTES + keys * KEPT_KEY_BYTES > self->kept.budget;
}

/* Write-back. On window close the reference writes every update of a window to the store's
 * transaction at once (Kafka Streams' store there has no cache), about ten a record, and most
 * of a commit's windows are created, emitted and expired within it. Here a kept key's update
 * of an int64 result changes its kept window only and marks it dirty; the dirty windows go to
 * the transaction, each once, as the reference would have left it:
 * - at the commit (Core.write_held(below), the aggregation's flush before its expiry), but
 *   those below `below`, which the expiry would delete (and their older versions, staged or
 *   committed, it does delete: they are in its time index's range);
 * - before kept windows leave memory (the budget; a key whose result or timestamp is not kept
 *   this way), so that a key not kept is wholly in the store;
 * - before the store is read for what memory does not hold (the windows not emitted, read
 *   again after memory dropped them; the final results scanned from the store).
 * Nothing else reads the store during a record: the windows not emitted are looked up in the
 * kept windows first (known_window). An int64 result serializes in C, so that a write back
 * cannot fail where the reference's write succeeded. */

/* The kept window of the key `prefix` into the store's transaction (`transaction`), as
 * write_through would have put it; then clean. */
static int
write_kept(Core *self, PyObject *transaction, PyObject *prefix, KeptWindow *window)
{
    PyObject *store_key = prefixed(prefix, window->start);
    if (store_key == NULL)
        return -1;
    int failed = write_through(transaction, str_put, store_key, PyBytes_GET_SIZE(prefix), 8,
                               self->result_serialize, self->long_results, window->result,
                               window->latest, NULL, NULL, 0, 0);
    Py_DECREF(store_key);
    if (failed == 0)
        window->dirty = 0;
    return failed;
}

/* The dirty windows of the key `prefix` into the transaction, but those starting below
 * `below` (LLONG_MIN: none), which are only marked clean. */
static int
write_key_windows(Core *self, PyObject *transaction, PyObject *prefix, KeyWindows *windows,
                  long long below)
{
    for (Py_ssize_t i = 0; i < windows->size; i++) {
        KeptWindow *window = &windows->items[i];
        if (!window->dirty)
            continue;
        if (window->start < below)
            window->dirty = 0; /* the commit's expiry deletes it */
        else if (write_kept(self, transaction, prefix, window) < 0)
            return -1;
    }
    return 0;
}

/* Every dirty kept window into the store's transaction, as write_key_windows; with `below`
 * (not LLONG_MIN: the commit's), the windows starting below it also leave memory (no longer
 * seen). */
static int
write_back_all(Core *self, long long below)
{
    if (!self->write_back || self->kept.by_key == NULL || self->kept.count == 0
        || (below == LLONG_MIN && !self->has_dirty))
        return 0;
    PyObject *transaction = transaction_of(self->store, &self->transaction, str_transaction);
    if (transaction == NULL)
        return -1;
    Py_ssize_t position = 0;
    PyObject *prefix, *capsule;
    int failed = 0;
    while (!failed && PyDict_Next(self->kept.by_key, &position, &prefix, &capsule)) {
        KeyWindows *windows = PyCapsule_GetPointer(capsule, KEY_WINDOWS_CAPSULE);
        if (windows == NULL || write_key_windows(self, transaction, prefix, windows, below) < 0) {
            failed = -1;
            break;
        }
        Py_ssize_t gone = below == LLONG_MIN ? 0 : window_at(windows, below);
        for (Py_ssize_t i = 0; i < gone; i++)
            Py_DECREF(windows->items[i].result);
        if (gone > 0) {
            memmove(windows->items, windows->items + gone,
                    (windows->size - gone) * sizeof(KeptWindow));
            windows->size -= gone;
            self->kept.count -= gone;
        }
    }
    Py_DECREF(transaction);
    if (failed == 0)
        self->has_dirty = 0;
    return failed;
}

/* Over the budget: the dirty windows written back, then every kept window dropped. */
static int
drop_kept(Core *self)
{
    if (write_back_all(self, LLONG_MIN) < 0)
        return -1;
    kept_over_budget(&self->kept);
    return 0;
}

/* The kept windows of a key whose start is in [low, high), as stored_windows gives them
 * (a new list of (store key, result, timestamp), in time order); those no longer seen
 * (starting before `visible`) leave. */
static PyObject *
kept_windows(Core *self, KeyWindows *windows, PyObject *prefix, wide low, wide high,
             wide visible)
{
    Py_ssize_t gone = window_at(windows, visible);
    if (gone > 0) {
        for (Py_ssize_t i = 0; i < gone; i++)
            Py_DECREF(windows->items[i].result);
        memmove(windows->items, windows->items + gone,
                (windows->size - gone) * sizeof(KeptWindow));
        windows->size -= gone;
        self->kept.count -= gone;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = window_at(windows, low);
         i < windows->size && (wide)windows->items[i].start < high; i++) {
        KeptWindow *window = &windows->items[i];
        PyObject *store_key = prefixed(prefix, window->start);
        PyObject *latest = store_key == NULL ? NULL : PyLong_FromLongLong(window->latest);
        PyObject *item = latest == NULL ? NULL : PyTuple_Pack(3, store_key, window->result, latest);
        Py_XDECREF(store_key);
        Py_XDECREF(latest);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

/* The key's windows still seen (`every`, as stored_windows gives them, in time order) kept,
 * as a new capsule; NULL with no error set: one cannot be (a start below 0). */
static PyObject *
keep_windows(PyObject *every, Py_ssize_t at)
{
    Py_ssize_t size = PyList_GET_SIZE(every);
    KeyWindows *windows = PyMem_Calloc(1, sizeof(KeyWindows));
    if (windows == NULL)
        return PyErr_NoMemory();
    windows->capacity = size + 4;
    windows->items = PyMem_Malloc(windows->capacity * sizeof(KeptWindow));
    if (windows->items == NULL) {
        PyMem_Free(windows);
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(windows, KEY_WINDOWS_CAPSULE, key_windows_free);
    if (capsule == NULL) {
        PyMem_Free(windows->items);
        PyMem_Free(windows);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = PyList_GET_ITEM(every, i);
        long long start, latest;
        if (unpack_at(PyTuple_GET_ITEM(item, 0), at, &start) < 0
            || as_int64(PyTuple_GET_ITEM(item, 2), &latest) < 0) {
            Py_DECREF(capsule);
            return NULL;
        }
        if (start < 0 || (i > 0 && start <= windows->items[i - 1].start)) {
            Py_DECREF(capsule); /* not in the order kept windows take: read each time */
            return NULL;
        }
        PyObject *result = PyTuple_GET_ITEM(item, 1);
        Py_INCREF(result);
        windows->items[windows->size++] = (KeptWindow){start, 0, latest, result};
    }
    return capsule;
}

/* KeyedWindowAggregation._key_windows(prefix, low, high): the key's windows whose start is in
 * [low, high) and still seen (see stored_windows), from the kept ones when the key's are
 * kept; else read, and kept when their results cannot change in place. */
static PyObject *
key_windows(Core *self, PyObject *prefix, wide low, wide high)
{
    long long store_time;
    if (int_attr(self->store_time, str_time, &store_time) < 0)
        return NULL;
    /* _visible_from: store time - retention + 1 (+ 0 in the time-first store), at least 0 */
    wide visible = (wide)store_time - self->retention + (self->time_first ? 0 : 1);
    if (visible < 0)
        visible = 0;
    if (low < visible)
        low = visible;
    if (high <= low)
        return PyList_New(0);
    if (self->kept.by_key == NULL || high > LLONG_MAX) /* past int64: struct's error, as Python */
        return stored_windows(self, prefix, low, high);
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
    if (kept != NULL) {
        KeyWindows *windows = PyCapsule_GetPointer(kept, KEY_WINDOWS_CAPSULE);
        return windows == NULL ? NULL : kept_windows(self, windows, prefix, low, high, visible);
    }
    if (PyErr_Occurred())
        return NULL;
    if (visible >= LLONG_MAX)
        return stored_windows(self, prefix, low, high);
    PyObject *every = stored_windows(self, prefix, visible, LLONG_MAX); /* all still seen */
    if (every == NULL)
        return NULL;
    int keep = 1;
    for (Py_ssize_t i = 0; keep && i < PyList_GET_SIZE(every); i++)
        keep = immutable_result(PyTuple_GET_ITEM(PyList_GET_ITEM(every, i), 1));
    if (!keep) { /* results that could change in place: read anew each time */
        Py_DECREF(every);
        return stored_windows(self, prefix, low, high);
    }
    Py_ssize_t size = PyList_GET_SIZE(every);
    if (kept_over(self, self->kept.count + size + 1)) {
        if (drop_kept(self) < 0) {
            Py_DECREF(every);
            return NULL;
        }
        if (self->kept.by_key == NULL) {
            Py_DECREF(every);
            return stored_windows(self, prefix, low, high);
        }
    }
    PyObject *made = keep_windows(every, PyBytes_GET_SIZE(prefix));
    Py_DECREF(every);
    if (made == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return stored_windows(self, prefix, low, high);
    }
    if (PyDict_SetItem(self->kept.by_key, prefix, made) < 0) {
        Py_DECREF(made);
        return NULL;
    }
    KeyWindows *windows = PyCapsule_GetPointer(made, KEY_WINDOWS_CAPSULE);
    Py_DECREF(made); /* the dict holds it */
    self->kept.count += size;
    return kept_windows(self, windows, prefix, low, high, visible);
}

/* The kept window at `at` of `windows` (whose start is `start`, or the place it goes) gets
 * `result` and `latest`, marked `dirty` or not: 1 when it is new, 0 when it was there, -1 on
 * an error. */
static int
set_kept_window(Core *self, KeyWindows *windows, Py_ssize_t at, long long start,
                long long latest, PyObject *result, int dirty)
{
    if (at < windows->size && windows->items[at].start == start) {
        KeptWindow *window = &windows->items[at];
        Py_INCREF(result);
        Py_SETREF(window->result, result);
        window->latest = latest;
        window->dirty = dirty;
        self->has_dirty |= dirty;
        return 0;
    }
    if (key_windows_grow(windows) < 0)
        return -1;
    memmove(windows->items + at + 1, windows->items + at,
            (windows->size - at) * sizeof(KeptWindow));
    Py_INCREF(result);
    windows->items[at] = (KeptWindow){start, dirty, latest, result};
    windows->size++;
    self->kept.count++;
    self->has_dirty |= dirty;
    return 1;
}

/* After the write of the window starting at `start`: the kept windows of its key as the
 * write left them. */
static int
note_write(Core *self, PyObject *prefix, long long start, PyObject *result,
           PyObject *timestamp)
{
    if (self->kept.by_key == NULL)
        return 0;
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
    if (kept == NULL)
        return PyErr_Occurred() ? -1 : 0;
    KeyWindows *windows = PyCapsule_GetPointer(kept, KEY_WINDOWS_CAPSULE);
    if (windows == NULL)
        return -1;
    long long latest;
    if (!immutable_result(result) || start < 0 || as_int64(timestamp, &latest) < 0) {
        if (PyErr_Occurred()) /* not an int64 timestamp: read from the store as Python would */
            PyErr_Clear();
        self->kept.count -= windows->size; /* the key's are read from the store again */
        return PyDict_DelItem(self->kept.by_key, prefix);
    }
    Py_ssize_t at = window_at(windows, start);
    int held = at < windows->size && windows->items[at].start == start;
    if (result == Py_None) {
        if (held) {
            Py_DECREF(windows->items[at].result);
            memmove(windows->items + at, windows->items + at + 1,
                    (windows->size - at - 1) * sizeof(KeptWindow));
            windows->size--;
            self->kept.count--;
        }
    }
    else if (set_kept_window(self, windows, at, start, latest, result, 0) < 0)
        return -1;
    return kept_over(self, self->kept.count) ? drop_kept(self) : 0;
}

/* KeyedWindowCache.put(store_key, result, timestamp, forwarded, window) with a cache of its
 * own (max_bytes > 0): a new window is indexed under its key's prefix, then added last. */
static int
cache_put(Core *self, PyObject *prefix, PyObject *store_key, PyObject *result,
          PyObject *timestamp, PyObject *forwarded, PyObject *window)
{
    PyObject *source;
    if (self->task == Py_None) {
        Py_INCREF(Py_None);
        source = Py_None;
    }
    /* The task's current record: dsl.processor.EngineTask.current. */
    else if ((source = PyObject_GetAttr(self->task, str_current)) == NULL)
        return -1;
    PyObject *items[6] = {result, timestamp, forwarded, window, Py_True, source};
    PyObject *entry = PyDict_GetItemWithError(self->entries, store_key);
    if (entry != NULL) { /* rewritten in place, and last: the order is the write order */
        Py_INCREF(entry);
        PyObject *moved = PyObject_CallMethodOneArg(self->entries, str_move_to_end, store_key);
        int failed = moved == NULL || !PyList_Check(entry) || PyList_GET_SIZE(entry) != 6;
        Py_XDECREF(moved);
        if (!failed) {
            for (int i = 0; i < 6; i++) {
                Py_INCREF(items[i]);
                PyList_SetItem(entry, i, items[i]); /* steals; drops the old item */
            }
        }
        else if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a record cache entry is not a list of 6");
        Py_DECREF(entry);
        Py_DECREF(source);
        return failed ? -1 : 0;
    }
    int failed = -1;
    long long held;
    if (PyErr_Occurred())
        goto done;
    /* by_prefix.setdefault(_prefix_of(key), set()).add(key) */
    PyObject *keys = PyDict_GetItemWithError(self->by_prefix, prefix);
    if (keys == NULL) {
        if (PyErr_Occurred() || (keys = PySet_New(NULL)) == NULL)
            goto done;
        int set = PyDict_SetItem(self->by_prefix, prefix, keys);
        Py_DECREF(keys); /* the index holds it */
        if (set < 0)
            goto done;
    }
    if (PySet_Add(keys, store_key) < 0)
        goto done;
    if (int_attr(self->cache, str_bytes, &held) < 0)
        goto done;
    held += PyBytes_GET_SIZE(store_key) + self->entry_bytes;
    if (set_int_attr(self->cache, str_bytes, held) < 0)
        goto done;
    if ((entry = PyList_New(6)) == NULL)
        goto done;
    for (int i = 0; i < 6; i++) {
        Py_INCREF(items[i]);
        PyList_SET_ITEM(entry, i, items[i]); /* steals the reference */
    }
    int set = PyObject_SetItem(self->entries, store_key, entry);
    Py_DECREF(entry);
    if (set < 0)
        goto done;
    if (held > self->max_bytes) {
        PyObject *evicted = PyObject_CallMethodNoArgs(self->cache, str_evict);
        if (evicted == NULL)
            goto done;
        Py_DECREF(evicted);
    }
    failed = 0;
done:
    Py_DECREF(source);
    return failed;
}

/* On window close: the window to the store at once (write_through), nothing forwarded on
 * update. */
static int
write_through_now(Core *self, Step *step, PyObject *store_key, PyObject *result,
                  PyObject *timestamp)
{
    long long time;
    if (as_int64(timestamp, &time) < 0)
        return -1;
    PyObject *transaction = transaction_of(self->store, &self->transaction, str_transaction);
    if (transaction == NULL)
        return -1;
    int failed = write_through(transaction, str_put, store_key, PyBytes_GET_SIZE(step->prefix),
                               8, self->result_serialize, self->long_results, result, time,
                               &self->pending, NULL, 0, 0);
    Py_DECREF(transaction);
    return failed;
}

/* After a write of the key `prefix` that failed: its kept windows dropped (none is dirty:
 * keep_write wrote them back before the write), as what the store holds of it is not known
 * any more; the other keys' stay, dirty ones too. The write's error stays set. */
static void
forget_key(Core *self, PyObject *prefix)
{
    if (self->kept.by_key == NULL)
        return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
    KeyWindows *windows = kept == NULL ? NULL : PyCapsule_GetPointer(kept, KEY_WINDOWS_CAPSULE);
    Py_ssize_t size = windows == NULL ? 0 : windows->size;
    if (windows != NULL && PyDict_DelItem(self->kept.by_key, prefix) == 0)
        self->kept.count -= size;
    PyErr_Clear(); /* not the error to report: the write's */
    PyErr_Restore(type, value, traceback);
}

/* With write-back: the write of `result` (timestamp `timestamp`) into the window starting at
 * `start` of a kept key, into its kept windows only, the window dirty (1). 0: not written so,
 * for a key not kept, or a result or timestamp that is not an int64 (the key's dirty windows
 * are then written back first, and the write goes through). */
static int
keep_write(Core *self, Step *step, long long start, PyObject *result, PyObject *timestamp)
{
    /* With the windows not emitted no longer in memory, each record's final results are
     * scanned from the store (emit_final), which then has to hold every write: write through.
     * The switch (read_pending) wrote every dirty window back. */
    if (self->kept.by_key == NULL || self->pending.state == PENDING_OFF)
        return 0;
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, step->prefix);
    if (kept == NULL)
        return PyErr_Occurred() ? -1 : 0;
    KeyWindows *windows = PyCapsule_GetPointer(kept, KEY_WINDOWS_CAPSULE);
    if (windows == NULL)
        return -1;
    long long latest = 0;
    int overflow = 1;
    if (start >= 0 && PyLong_CheckExact(result) && PyLong_CheckExact(timestamp)) {
        long long value = PyLong_AsLongLongAndOverflow(result, &overflow);
        if (!overflow && value == -1 && PyErr_Occurred())
            return -1;
        if (!overflow && (latest = PyLong_AsLongLongAndOverflow(timestamp, &overflow)) == -1
            && PyErr_Occurred())
            return -1;
    }
    if (overflow) { /* through the store, as its kept windows first */
        PyObject *transaction = transaction_of(self->store, &self->transaction, str_transaction);
        if (transaction == NULL)
            return -1;
        int failed = write_key_windows(self, transaction, step->prefix, windows, LLONG_MIN);
        Py_DECREF(transaction);
        return failed;
    }
    int made = set_kept_window(self, windows, window_at(windows, start), start, latest, result, 1);
    if (made <= 0)
        return made < 0 ? -1 : 1;
    /* a new window: among those not emitted yet, by its time-index key (b"t" + its start +
     * the key's bytes), as write_through adds it */
    Py_ssize_t key_length = PyBytes_GET_SIZE(step->prefix) - PREFIX_HEAD;
    PyObject *index = PyBytes_FromStringAndSize(NULL, 9 + key_length);
    if (index == NULL)
        return -1;
    char *bytes = PyBytes_AS_STRING(index);
    bytes[0] = 't';
    int64_into(bytes + 1, start);
    memcpy(bytes + 9, PyBytes_AS_STRING(step->prefix) + PREFIX_HEAD, key_length);
    int failed = pending_add(&self->pending, start, index);
    Py_DECREF(index);
    if (failed == 0 && kept_over(self, self->kept.count))
        failed = drop_kept(self);
    return failed < 0 ? -1 : 1;
}

/* KnownWindow for pending_closed: a window of a kept key from its kept windows (its dirty
 * ones are not in the store yet). */
static int
known_window(void *owner, PyObject *store_key, Py_ssize_t prefix_length, PyObject **result,
             long long *timestamp)
{
    Core *self = owner;
    if (!self->write_back || self->kept.by_key == NULL)
        return 2;
    PyObject *prefix = PyBytes_FromStringAndSize(PyBytes_AS_STRING(store_key), prefix_length);
    if (prefix == NULL)
        return -1;
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
    Py_DECREF(prefix);
    if (kept == NULL)
        return PyErr_Occurred() ? -1 : 2;
    KeyWindows *windows = PyCapsule_GetPointer(kept, KEY_WINDOWS_CAPSULE);
    if (windows == NULL)
        return -1;
    long long start = int64_at(PyBytes_AS_STRING(store_key) + prefix_length);
    Py_ssize_t at = window_at(windows, start);
    if (at == windows->size || windows->items[at].start != start)
        return 0; /* the key's kept windows are all it has still seen */
    *result = Py_NewRef(windows->items[at].result);
    *timestamp = windows->items[at].latest;
    return 1;
}

/* KeyedWindowAggregation._put: the window starting at `start` gets `result` (its update
 * forwarded unless only final results are). */
static int
put(Core *self, Step *step, long long start, PyObject *result, PyObject *timestamp)
{
    /* Kafka Streams' store counts the window's time at every write reaching it: with a cache,
     * a deletion of a window the store never had does not. */
    if (result != Py_None || self->max_bytes <= 0) {
        long long store_time;
        if (int_attr(self->store_time, str_time, &store_time) < 0)
            return -1;
        if (start > store_time && set_int_attr(self->store_time, str_time, start) < 0)
            return -1;
    }
    if (self->write_back) {
        int kept = keep_write(self, step, start, result, timestamp);
        if (kept != 0)
            return kept < 0 ? -1 : 0;
    }
    PyObject *store_key = prefixed(step->prefix, start);
    if (store_key == NULL)
        return -1;
    PyObject *forwarded = self->emit_final ? Py_None : step->record, *window = NULL;
    int failed = -1;
    if (self->emit_final && self->max_bytes <= 0) /* on close: nothing forwarded on update */
        failed = write_through_now(self, step, store_key, result, timestamp);
    /* the cache keeps the window for the update it forwards later */
    else if ((window = window_of(self, start)) == NULL)
        ;
    else if (self->max_bytes > 0)
        failed = cache_put(self, step->prefix, store_key, result, timestamp, forwarded, window);
    else {
        PyObject *args[6] = {self->cache, store_key, result, timestamp, forwarded, window};
        PyObject *done = PyObject_VectorcallMethod(str_put, args, 6, NULL);
        failed = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    if (failed && self->write_back)
        forget_key(self, step->prefix); /* written back: see keep_write */
    else if (failed)
        kept_forget(&self->kept); /* what the store holds of the key is not known any more */
    else
        failed = note_write(self, step->prefix, start, result, timestamp);
    Py_DECREF(store_key);
    Py_XDECREF(window);
    return failed;
}

/* SlidingWindowAggregate._update: the record into the window starting at `start` (whose
 * result is `aggregate`, timestamp `old_timestamp`), unless the window has closed. */
static int
update(Core *self, Step *step, long long start, PyObject *aggregate, PyObject *old_timestamp)
{
    if ((wide)start + self->difference < step->close)
        return count_dropped(self);
    PyObject *result;
    if (aggregate == Py_None && self->initializer == Py_None) {
        Py_INCREF(step->value);
        result = step->value; /* a reduce's first value is its result */
    }
    else if (self->count)
        result = PyNumber_Add(aggregate, one); /* count_one */
    else {
        PyObject *args[3] = {step->key, step->value, aggregate};
        result = PyObject_Vectorcall(self->aggregator, args, 3, NULL);
    }
    if (result == NULL)
        return -1;
    PyObject *timestamp = step->timestamp_object;
    if (aggregate != Py_None) { /* max(record.timestamp, old[1]): the first of equal ones */
        int later = PyObject_RichCompareBool(old_timestamp, timestamp, Py_GT);
        if (later < 0) {
            Py_DECREF(result);
            return -1;
        }
        if (later)
            timestamp = old_timestamp;
    }
    int failed = put(self, step, start, result, timestamp);
    Py_DECREF(result);
    return failed;
}

/* _update with the record's own timestamp and a new initial result: a window made for it. */
static int
update_new(Core *self, Step *step, long long start)
{
    PyObject *made = initial(self);
    if (made == NULL)
        return -1;
    int failed = update(self, step, start, made, step->timestamp_object);
    Py_DECREF(made);
    return failed;
}

/* _create_right_window: the record's right window, with the records after it (`right`), made
 * even if it has closed. */
static int
create_right_window(Core *self, Step *step, Found *right)
{
    return put(self, step, step->timestamp + 1, right->result, right->latest);
}

/* One of the list `key_windows` gave: its start (from its store key) and its timestamp. */
static int
window_item(PyObject *windows, Py_ssize_t i, Py_ssize_t at, long long *start, Found *found)
{
    PyObject *item = PyList_GET_ITEM(windows, i);
    found->result = PyTuple_GET_ITEM(item, 1);
    found->latest = PyTuple_GET_ITEM(item, 2);
    if (unpack_at(PyTuple_GET_ITEM(item, 0), at, start) < 0)
        return -1;
    return as_int64(found->latest, &found->latest_time);
}

static int
seen(const long long *starts, Py_ssize_t count, long long start)
{
    for (Py_ssize_t i = 0; i < count; i++)
        if (starts[i] == start)
            return 1;
    return 0;
}

/* SlidingWindowAggregate._process and _create_windows: the key's windows from the record's
 * right window back to the first one ending before the record. */
static int
process_late(Core *self, Step *step)
{
    long long timestamp = step->timestamp;
    wide low = (wide)timestamp - 2 * (wide)self->difference;
    PyObject *windows = key_windows(self, step->prefix, low > 0 ? low : 0, (wide)timestamp + 2);
    if (windows == NULL)
        return -1;
    Py_ssize_t count = PyList_GET_SIZE(windows), seen_count = 0;
    long long *starts = PyMem_Malloc((count > 0 ? count : 1) * sizeof(long long));
    Found left = {NULL}, right = {NULL};
    int left_exists = 0, right_exists = 0, has_previous = 0, failed = -1;
    long long previous = 0; /* the timestamp of the key's previous record */
    Py_ssize_t at = PyBytes_GET_SIZE(step->prefix);
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = count - 1; i >= 0; i--) { /* latest first */
        long long start;
        Found window;
        if (window_item(windows, i, at, &start, &window) < 0)
            goto done;
        starts[seen_count++] = start;
        wide end = (wide)start + self->difference;
        if ((wide)start == (wide)timestamp + 1)
            right_exists = 1;
        else if (end > timestamp) {
            if (right.result == NULL)
                right = window;
            if (update(self, step, start, window.result, window.latest) < 0)
                goto done;
        }
        else if (end == timestamp) {
            left_exists = 1;
            if (update(self, step, start, window.result, window.latest) < 0)
                goto done;
            if (window.latest_time >= timestamp) {
                failed = 0; /* every window the record needs exists */
                goto done;
            }
            previous = window.latest_time;
            has_previous = 1;
        }
        else {
            left = window;
            previous = window.latest_time;
            has_previous = 1;
            break;
        }
    }
    /* _create_windows */
    if (has_previous) { /* the previous record's right window, if the record is in it */
        wide start = (wide)previous + 1; /* previous < timestamp: it fits */
        if (!seen(starts, seen_count, (long long)start)
            && start + self->difference >= timestamp
            && update_new(self, step, (long long)start) < 0)
            goto done;
    }
    if (!left_exists) {
        long long start = (long long)((wide)timestamp - self->difference); /* >= 0 here */
        if (left.result != NULL && has_previous
            && (wide)timestamp - self->difference <= previous) {
            if (update(self, step, start, left.result, step->timestamp_object) < 0)
                goto done;
        }
        else if (update_new(self, step, start) < 0)
            goto done;
    }
    if (!right_exists && right.result != NULL && right.latest_time > timestamp
        && create_right_window(self, step, &right) < 0)
        goto done;
    failed = 0;
done:
    PyMem_Free(starts);
    Py_DECREF(windows);
    return failed;
}

/* SlidingWindowAggregate._process_early: a record before the time difference goes into the
 * window [0, d], which holds every early record. */
static int
process_early(Core *self, Step *step)
{
    long long timestamp = step->timestamp;
    PyObject *windows = key_windows(self, step->prefix, 0, (wide)timestamp + 2);
    if (windows == NULL)
        return -1;
    Py_ssize_t count = PyList_GET_SIZE(windows), seen_count = 0;
    long long *starts = PyMem_Malloc((count > 0 ? count : 1) * sizeof(long long));
    PyObject *made = NULL; /* a new [0, d] window's initial result */
    Found combined = {NULL}, right = {NULL};
    int right_exists = 0, has_previous = 0, failed = -1;
    long long previous = 0;
    Py_ssize_t at = PyBytes_GET_SIZE(step->prefix);
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) { /* earliest first */
        long long start;
        Found window;
        if (window_item(windows, i, at, &start, &window) < 0)
            goto done;
        starts[seen_count++] = start;
        if (start == 0) {
            combined = window;
            if (window.latest_time < timestamp) {
                previous = window.latest_time;
                has_previous = 1;
            }
        }
        else if (start <= timestamp) {
            right = window;
            if (update(self, step, start, window.result, window.latest) < 0)
                goto done;
        }
        else
            right_exists = 1; /* starts at timestamp + 1 */
    }
    if (right.result == NULL && combined.result != NULL && combined.latest_time > timestamp)
        right = combined; /* holds only records after this one: its right window's */
    if (!right_exists && right.result != NULL && right.latest_time > timestamp
        && create_right_window(self, step, &right) < 0)
        goto done;
    if (has_previous && !seen(starts, seen_count, previous + 1) /* previous < timestamp */
        && update_new(self, step, previous + 1) < 0)
        goto done;
    if (combined.result == NULL) {
        if ((made = initial(self)) == NULL)
            goto done;
        combined.result = made;
        combined.latest = step->timestamp_object;
    }
    if (update(self, step, 0, combined.result, combined.latest) < 0)
        goto done;
    failed = 0;
done:
    PyMem_Free(starts);
    Py_XDECREF(made);
    Py_DECREF(windows);
    return failed;
}

/* The key of a window's final result, decoded from its bytes (a new reference). */
static PyObject *
decoded_key(Core *self, PyObject *data)
{
    if (self->string_keys && PyBytes_CheckExact(data)) {
        PyObject *key = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                                             NULL);
        if (key != NULL || !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return key;
        PyErr_Clear(); /* the serde says what is wrong with it */
    }
    return PyObject_CallOneArg(self->key_deserialize, data);
}

/* Record(Windowed(key, window), result, timestamp, headers), forwarded. */
static int
forward_final(Core *self, PyObject *record, PyObject *key, PyObject *window, PyObject *result,
              PyObject *timestamp)
{
    PyObject *windowed = frozen(self->windowed_type, str_key, key, str_window, window);
    if (windowed == NULL)
        return -1;
    /* Record(...) without its Python-level __new__: a NamedTuple is a tuple of its type */
    PyTypeObject *type = (PyTypeObject *)self->record_type;
    PyObject *out = type->tp_alloc(type, 4);
    if (out == NULL) {
        Py_DECREF(windowed);
        return -1;
    }
    PyTuple_SET_ITEM(out, 0, windowed);
    PyTuple_SET_ITEM(out, 1, Py_NewRef(result));
    PyTuple_SET_ITEM(out, 2, Py_NewRef(timestamp));
    PyTuple_SET_ITEM(out, 3, Py_NewRef(PyTuple_GET_ITEM(record, 3)));
    PyObject *done = PyObject_CallOneArg(self->forward, out);
    Py_DECREF(out);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* A closed window's count written to the sink directly (direct_write_count): 1 when written,
 * 0 when it goes on as a Record, -1 on an error. `window` is its start's 8 bytes. */
static int
write_final(Core *self, PyObject *record, const char *key_bytes, Py_ssize_t key_length,
            const char *window, PyObject *result, PyObject *timestamp)
{
    DirectSink sink = {self->task, self->sink_topic, self->sink_append,
                       self->sink_sources_append, self->producer_type, self->no_source};
    return direct_write_count(&sink, key_bytes, key_length, window, 8, result, timestamp,
                              PyTuple_GET_ITEM(record, 3));
}

/* One closed window of `_closed_windows`, (key bytes, suffix, result, timestamp): its final
 * result goes on keyed Windowed(key, Window(start, start + d)). */
static int
forward_closed(Core *self, PyObject *record, PyObject *closed)
{
    if (!PyTuple_Check(closed) || PyTuple_GET_SIZE(closed) != 4) {
        PyErr_SetString(PyExc_TypeError, "_closed_windows did not give 4-tuples");
        return -1;
    }
    PyObject *suffix = PyTuple_GET_ITEM(closed, 1);
    long long start;
    if (!PyBytes_Check(suffix) || PyBytes_GET_SIZE(suffix) != 8) { /* _TIMESTAMP.unpack */
        PyErr_SetString(PyExc_ValueError, "a sliding window's suffix is not 8 bytes");
        return -1;
    }
    if (unpack_at(suffix, 0, &start) < 0)
        return -1;
    PyObject *data = PyTuple_GET_ITEM(closed, 0);
    if (PyBytes_Check(data)) {
        int written = write_final(self, record, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                                  PyBytes_AS_STRING(suffix), PyTuple_GET_ITEM(closed, 2),
                                  PyTuple_GET_ITEM(closed, 3));
        if (written != 0)
            return written < 0 ? -1 : 0;
    }
    PyObject *window = window_of(self, start);
    if (window == NULL)
        return -1;
    PyObject *key = decoded_key(self, PyTuple_GET_ITEM(closed, 0));
    int failed = key == NULL ? -1
                             : forward_final(self, record, key, window,
                                             PyTuple_GET_ITEM(closed, 2),
                                             PyTuple_GET_ITEM(closed, 3));
    Py_XDECREF(key);
    Py_DECREF(window);
    return failed;
}

/* What emit_final's ClosedWindow needs: the core, and the record whose headers the final
 * results take. */
typedef struct {
    Core *self;
    PyObject *record;
} Emitting;

/* ClosedWindow for pending_closed_each: forward_closed of one window, without its tuple. */
static int
forward_closed_window(void *owner, const char *key_bytes, Py_ssize_t key_length,
                      const char *suffix, Py_ssize_t suffix_length, PyObject *result,
                      long long time)
{
    Emitting *emitting = owner;
    Core *self = emitting->self;
    if (suffix_length != 8) {
        PyErr_SetString(PyExc_ValueError, "a sliding window's suffix is not 8 bytes");
        return -1;
    }
    PyObject *timestamp = PyLong_FromLongLong(time);
    if (timestamp == NULL)
        return -1;
    int written = write_final(self, emitting->record, key_bytes, key_length, suffix, result,
                              timestamp);
    if (written != 0) {
        Py_DECREF(timestamp);
        return written < 0 ? -1 : 0;
    }
    PyObject *key = NULL, *window = NULL;
    int failed = -1;
    if (self->string_keys) { /* decoded_key without the bytes object */
        key = PyUnicode_DecodeUTF8(key_bytes, key_length, NULL);
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto done;
            PyErr_Clear(); /* the serde says what is wrong with it, below */
        }
    }
    if (key == NULL) {
        PyObject *data = PyBytes_FromStringAndSize(key_bytes, key_length);
        if (data == NULL)
            goto done;
        key = decoded_key(self, data);
        Py_DECREF(data);
        if (key == NULL)
            goto done;
    }
    if ((window = window_of(self, int64_at(suffix))) != NULL)
        failed = forward_final(self, emitting->record, key, window, result, timestamp);
done:
    Py_XDECREF(key);
    Py_XDECREF(window);
    Py_DECREF(timestamp);
    return failed;
}

/* SlidingWindowAggregate._emit_final: on window close, the windows that ended before `close`
 * since the last time go on, with their results' timestamps. */
static int
emit_final(Core *self, PyObject *record, wide close)
{
    wide emitted;
    if (wide_attr(self->emitted_to, str_time, &emitted) < 0)
        return -1;
    if (emitted != -1 && emitted >= close)
        return 0;
    wide upper = close - self->difference - 1; /* a window [start, start + d] ends before */
    if (upper < 0)
        return 0;
    wide lower = emitted == -1 ? 0 : emitted - self->difference;
    if (lower < 0)
        lower = 0;
    if (self->pending.state == PENDING_READ) { /* the windows held in memory */
        /* _closed_windows on the time-first store: from what is still seen */
        long long store_time;
        if (int_attr(self->store_time, str_time, &store_time) < 0)
            return -1;
        wide visible = (wide)store_time - self->retention + (self->time_first ? 0 : 1);
        wide from = visible > lower ? visible : lower;
        if (from <= upper) {
            PyObject *transaction = transaction_of(self->store, &self->transaction,
                                                   str_transaction);
            if (transaction == NULL)
                return -1;
            Emitting emitting = {self, record};
            int failed = pending_closed_each(&self->pending, NULL, known_window, self,
                                             transaction, str_get, self->result_deserialize,
                                             self->long_results, (long long)from,
                                             upper > LLONG_MAX ? LLONG_MAX : (long long)upper,
                                             0, forward_closed_window, &emitting);
            Py_DECREF(transaction);
            if (failed < 0)
                return -1;
        }
        return set_int_attr(self->emitted_to, str_time, close);
    }
    PyObject *low = wide_number(lower), *high = wide_number(upper), *closed = NULL;
    if (low == NULL || high == NULL)
        ;
    else if (write_back_all(self, LLONG_MIN) == 0) { /* the store has them all */
        PyObject *args[3] = {self->aggregation, low, high};
        closed = PyObject_VectorcallMethod(str_closed_windows, args, 3, NULL);
    }
    Py_XDECREF(low);
    Py_XDECREF(high);
    if (closed == NULL)
        return -1;
    int failed = 0;
    if (!PyList_Check(closed)) {
        PyErr_SetString(PyExc_TypeError, "_closed_windows did not give a list");
        failed = -1;
    }
    for (Py_ssize_t i = 0; failed == 0 && i < PyList_GET_SIZE(closed); i++)
        failed = forward_closed(self, record, PyList_GET_ITEM(closed, i)); /* the list holds it */
    if (failed == 0)
        failed = set_int_attr(self->emitted_to, str_time, close);
    Py_DECREF(closed);
    return failed;
}

/* On window close, without a cache: the windows in the store a scan for final results may
 * still find (from the time emitted to less the time difference) into memory, before a record
 * (the first, or the next after memory dropped them). */
static int
read_pending(Core *self)
{
    wide emitted;
    if (wide_attr(self->emitted_to, str_time, &emitted) < 0)
        return -1;
    wide lower = emitted == -1 ? 0 : emitted - self->difference;
    lower = lower < 0 ? 0 : lower > LLONG_MAX ? LLONG_MAX : lower;
    if (write_back_all(self, LLONG_MIN) < 0) /* what is read has to be in the store */
        return -1;
    PyObject *transaction = transaction_of(self->store, &self->transaction, str_transaction);
    if (transaction == NULL)
        return -1;
    int failed = pending_read(&self->pending, transaction, str_range, (long long)lower);
    Py_DECREF(transaction);
    return failed;
}

/* SlidingWindowAggregate.process(record). */
static PyObject *
Core_process(Core *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4) {
        PyErr_SetString(PyExc_TypeError, "process takes a Record");
        return NULL;
    }
    Step step = {record, PyTuple_GET_ITEM(record, 0), PyTuple_GET_ITEM(record, 1),
                 PyTuple_GET_ITEM(record, 2), NULL, 0, 0};
    if (self->pending.state == PENDING_UNREAD && read_pending(self) < 0)
        return NULL;
    if (step.key == Py_None || step.value == Py_None) {
        if (count_dropped(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    long long stream_time;
    if (as_int64(step.timestamp_object, &step.timestamp) < 0
        || int_attr(self->stream_time, str_time, &stream_time) < 0)
        return NULL;
    if (step.timestamp > stream_time) {
        if (PyObject_SetAttr(self->stream_time, str_time, step.timestamp_object) < 0)
            return NULL;
        stream_time = step.timestamp;
    }
    step.close = (wide)stream_time - self->grace;
    if ((wide)step.timestamp + self->difference < step.close) {
        if (count_dropped(self) < 0) /* even its left window has closed: too late */
            return NULL;
        Py_RETURN_NONE;
    }
    if ((step.prefix = key_prefix(self, step.key)) == NULL)
        return NULL;
    int failed;
    if (step.timestamp < self->difference)
        failed = process_early(self, &step); /* no final results looked for after it */
    else {
        failed = process_late(self, &step);
        if (failed == 0 && self->emit_final)
            failed = emit_final(self, record, step.close);
    }
    Py_DECREF(step.prefix);
    if (failed < 0)
        return NULL;
    Py_RETURN_NONE;
}

#define REFERENCES(X)                                                                          \
    X(aggregation) X(cache) X(entries) X(by_prefix) X(store) X(stream_time) X(store_time)     \
    X(emitted_to) X(task) X(key_serialize) X(key_deserialize) X(result_deserialize)            \
    X(initializer) X(aggregator) X(forward) X(record_type) X(windowed_type) X(window_type)     \
    X(result_serialize) X(sink_topic) X(sink_append) X(sink_sources_append) X(producer_type)   \
    X(no_source)

/* getattr(owner, name), which must be a dict (an OrderedDict is one): a new reference. */
static PyObject *
dict_attr(PyObject *owner, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value != NULL && !PyDict_Check(value)) {
        PyErr_Format(PyExc_TypeError, "cache.%U must be a dict", name);
        Py_CLEAR(value);
    }
    return value;
}

static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {
        "aggregation", "cache", "store", "stream_time", "store_time", "emitted_to", "task",
        "key_serialize", "key_deserialize", "string_keys", "result_deserialize", "initializer",
        "aggregator", "count", "difference", "grace", "retention", "time_first", "emit_final",
        "forward", "record_type", "windowed_type", "window_type", "result_serialize",
        "long_results", "memory_bytes", "sink_topic", "sink_append", "sink_sources_append",
        "producer_type", "no_source", NULL};
    PyObject *aggregation, *cache, *store, *stream_time, *store_time, *emitted_to, *task,
        *key_serialize, *key_deserialize, *result_deserialize, *initializer, *aggregator,
        *forward, *record_type, *windowed_type, *window_type, *result_serialize, *sink_topic,
        *sink_append, *sink_sources_append, *producer_type, *no_source;
    long long difference, grace, retention, memory_bytes;
    int string_keys, count, time_first, emit_final, long_results;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$OOOOOOOOOpOOOpLLLppOO!O!O!OpLOOOO!O", names, &aggregation, &cache, &store,
            &stream_time, &store_time, &emitted_to, &task, &key_serialize, &key_deserialize,
            &string_keys, &result_deserialize, &initializer, &aggregator, &count, &difference,
            &grace, &retention, &time_first, &emit_final, &forward, &PyType_Type, &record_type,
            &PyType_Type, &windowed_type, &PyType_Type, &window_type, &result_serialize,
            &long_results, &memory_bytes, &sink_topic, &sink_append, &sink_sources_append,
            &PyType_Type, &producer_type, &no_source))
        return -1;
    if (direct_sink_check(task, sink_append, sink_sources_append, producer_type) < 0)
        return -1;
    if (difference < 0 || grace < 0 || retention < 0) {
        PyErr_SetString(PyExc_ValueError, "sliding windows need difference, grace >= 0");
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        return -1;
    }
    long long max_bytes, entry_bytes;
    if (int_attr(cache, str_max_bytes, &max_bytes) < 0
        || int_attr(cache, str_entry_bytes, &entry_bytes) < 0)
        return -1;
    PyObject *entries = dict_attr(cache, str_entries);
    if (entries == NULL)
        return -1;
    PyObject *by_prefix = dict_attr(cache, str_by_prefix);
    if (by_prefix == NULL) {
        Py_DECREF(entries);
        return -1;
    }
#define TAKE(name)                                                                             \
    Py_INCREF(name);                                                                           \
    Py_XSETREF(self->name, name);
    REFERENCES(TAKE)
#undef TAKE
    Py_DECREF(entries); /* the references getattr gave */
    Py_DECREF(by_prefix);
    self->difference = difference;
    self->grace = grace;
    self->retention = retention;
    self->max_bytes = max_bytes;
    self->entry_bytes = entry_bytes;
    self->string_keys = string_keys;
    self->count = count;
    self->time_first = time_first;
    self->emit_final = emit_final;
    self->long_results = long_results;
    self->write_back = emit_final && max_bytes <= 0 && memory_bytes > 0 && long_results;
    self->has_dirty = 0;
    if (kept_init(&self->kept, memory_bytes) < 0)
        return -1;
    /* on window close the cache is off (KeyedWindowAggregation.init): windows go to the store
     * as written, and the ones not emitted are held in memory within the budget */
    return pending_init(&self->pending, emit_final && max_bytes <= 0 ? memory_bytes : 0);
}

/* The aggregation, its cache and the task refer to one another and to this object: the
 * cycle collector has to see these references. */
static int
Core_traverse(Core *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    REFERENCES(VISIT)
    VISIT(transaction)
    VISIT(kept.by_key)
#undef VISIT
    return 0;
}

static int
Core_clear(Core *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    REFERENCES(CLEAR)
    CLEAR(transaction)
    CLEAR(kept.by_key)
#undef CLEAR
    pending_drop(&self->pending, PENDING_OFF);
    return 0;
}

static void
Core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    pending_free(&self->pending);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Core whose __init__ has not run (or failed), or was cleared, holds NULL references:
 * refuse its methods rather than crash. */
static PyObject *
Core_process_checked(Core *self, PyObject *record)
{
    if (self->window_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return NULL;
    }
    PyObject *out = Core_process(self, record);
    Py_CLEAR(self->transaction);
    return out;
}

/* Core.write_held(below), at the commit (the aggregation's flush, before its expiry): the
 * dirty kept windows into the store's transaction, but those starting below `below` (store
 * time - retention: the expiry deletes them), which leave memory. */
static PyObject *
Core_write_held(Core *self, PyObject *below)
{
    if (!PyLong_Check(below)) {
        PyErr_SetString(PyExc_TypeError, "write_held takes an int");
        return NULL;
    }
    if (self->window_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return NULL;
    }
    int overflow;
    long long time = PyLong_AsLongLongAndOverflow(below, &overflow);
    if (time == -1 && PyErr_Occurred())
        return NULL;
    if (overflow)
        time = overflow < 0 ? LLONG_MIN + 1 : LLONG_MAX;
    int failed = write_back_all(self, time == LLONG_MIN ? LLONG_MIN + 1 : time);
    Py_CLEAR(self->transaction); /* the next record's may be another */
    if (failed < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Core_methods[] = {
    {"write_held", (PyCFunction)Core_write_held, METH_O,
     "The kept windows' writes held back into the store's transaction, before the commit's expiry."},
    {"process", (PyCFunction)Core_process_checked, METH_O,
     "One record into its sliding windows (SlidingWindowAggregate.process)."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.dsl._sliding_core.Core",
    .tp_doc = "The per-record path of SlidingWindowAggregate (see sliding_aggregate.py).",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
};

CORES_MODULE_METHODS

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sliding_core", "SlidingWindowAggregate's per-record path in C.",
    -1, module_methods,
};

PyMODINIT_FUNC
PyInit__sliding_core(void)
{
    if (window_names() < 0)
        return NULL;
    CORES_INTERN(str_entries, "entries")
    CORES_INTERN(str_by_prefix, "by_prefix")
    CORES_INTERN(str_transaction, "transaction")
    CORES_INTERN(str_range, "range")
    CORES_INTERN(str_closed_windows, "_closed_windows")
    CORES_INTERN(str_pack, "pack")
    CORES_INTERN(str_unpack_from, "unpack_from")
    CORES_INTERN(str_get, "get")
    PyObject *structs = PyImport_ImportModule("struct");
    if (structs == NULL)
        return NULL;
    timestamp_struct = PyObject_CallMethod(structs, "Struct", "s", ">q");
    Py_DECREF(structs);
    if (timestamp_struct == NULL)
        return NULL;
    return core_module(&module, &CoreType);
}
