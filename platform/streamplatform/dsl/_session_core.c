/* The per-record path of SessionWindowAggregate (count / reduce / aggregate per session), in C.
 *
 * `Core.process(record)` does exactly what `SessionWindowAggregate.process` (and its
 * `_emit_final`) does in session_aggregate.py, with what it calls of KeyedWindowAggregation
 * (`_key_windows`, `_put`, the record cache's `put`) in aggregate.py: those are the reference,
 * read them first. The state stays in the Python objects (the record cache's OrderedDict of
 * entries, its index of a key's windows and its byte count, the kept stream time, store time
 * and emitted-to time); the store is read and written only where Python reads and writes it:
 * the key's windows through the store's transaction (`range`, in the same call as
 * `_key_windows`), the rest through the aggregation's Python helpers (`_closed_windows`, and
 * the cache's `put` and `evict_over_budget`, which end in `_store`). What C saves is the
 * interpreter's work per record around those objects: building the keys, merging the store's
 * sessions with the cache's, sorting them, the merge loop, the cache's bookkeeping.
 *
 * The OrderedDict is read with PyDict_GetItemWithError (its items live in the dict it
 * extends) and written only through PyObject_SetItem and its move_to_end, which keep its order.
 *
 * Timestamps are int64 in Kafka; sums and differences of them (a timestamp plus the gap, stream
 * time minus gap and grace, store time minus the retention) are taken in 128 bits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define CORES_WINDOW_NAMES
#include "_cores.h"


static PyObject *str_transaction, *str_range, *str_closed_windows, *struct_error, *str_get;

#define KEYED_PREFIX 'k'
#define PREFIX_HEAD 5 /* b"k" + the key's length, 4 bytes big-endian, then the key */
#define SUFFIX 16     /* a session's suffix: its end, then its start, 8 bytes big-endian each */
#define LATEST LLONG_MAX /* aggregate._LATEST: the upper bound of a key's sessions */

/* What memory holds per session a core keeps between records (`kept`), in bytes: its store
 * key, its slot in its key's dict, and that dict and the key's prefix shared by the key's
 * sessions (one or two a key). An estimate, as the record cache's _ENTRY_BYTES. */
#define KNOWN_SESSION_BYTES 400

typedef struct {
    PyObject_HEAD
    PyObject *aggregation, *cache, *entries, *by_prefix, *store, *stream_time, *store_time;
    PyObject *emitted_to, *task, *key_serialize, *key_deserialize, *result_deserialize;
    PyObject *initializer, *aggregator, *merger, *forward, *record_type, *windowed_type;
    PyObject *window_type, *result_serialize;
    /* Where a closed session's count is written directly (sink_append None: forwarded). */
    PyObject *sink_topic, *sink_append, *sink_sources_append, *producer_type, *no_source;
    /* A key's sessions as _key_windows sees them (the cache's over the store's), kept between
     * records so that the store is read once per key: prefix -> {store key: result}. Every
     * write of a session goes through `put`, which keeps it up to date. Only immutable results
     * are kept (a stored result is read as a fresh copy; a kept one is handed out again), and
     * within the budget (_cores.h, KeptWindows). */
    KeptWindows kept;
    /* On window close, without a cache: the sessions not emitted yet, by end (_cores.h). */
    PendingWindows pending;
    /* On window close, without a cache: the writes of kept keys' sessions held back from the
     * store's transaction until the commit (_cores.h, HeldWrites). */
    HeldWrites held;
    PyObject *transaction; /* the store's writing transaction, while a record is processed */
    long long gap, grace, retention, max_bytes, entry_bytes;
    int string_keys, count, emit_final, long_results;
} Core;

/* self.dropped_records += 1 (a Python int: no bound). */
static int
count_dropped(Core *self)
{
    PyObject *dropped = PyObject_GetAttr(self->aggregation, str_dropped_records);
    if (dropped == NULL)
        return -1;
    PyObject *more = PyNumber_Add(dropped, one);
    Py_DECREF(dropped);
    if (more == NULL)
        return -1;
    int failed = PyObject_SetAttr(self->aggregation, str_dropped_records, more);
    Py_DECREF(more);
    return failed;
}

/* `self.key_serde.serialize(key) or b""` (a new reference). */
static PyObject *
key_bytes(Core *self, PyObject *key)
{
    PyObject *data;
    if (self->string_keys && PyUnicode_CheckExact(key))
        data = PyUnicode_AsUTF8String(key);
    else
        data = PyObject_CallOneArg(self->key_serialize, key);
    if (data == NULL)
        return NULL;
    if (data == Py_None || (PyBytes_Check(data) && PyBytes_GET_SIZE(data) == 0)) {
        Py_DECREF(data);
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    if (!PyBytes_Check(data)) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_TypeError, "the key serde did not give bytes");
        return NULL;
    }
    return data;
}

/* keyed_prefix(key): b"k" + len(key) (4 bytes, big-endian) + key. */
static PyObject *
keyed_prefix(PyObject *key)
{
    Py_ssize_t length = PyBytes_GET_SIZE(key);
    if ((unsigned long long)length > 0xffffffffULL) { /* int.to_bytes(4) refuses it too */
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, PREFIX_HEAD + length);
    if (out == NULL)
        return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    bytes[0] = KEYED_PREFIX;
    for (int i = 0; i < 4; i++)
        bytes[1 + i] = (unsigned char)(((unsigned long long)length >> (8 * (3 - i))) & 0xff);
    memcpy(bytes + PREFIX_HEAD, PyBytes_AS_STRING(key), length);
    return out;
}

/* prefix + pack(first) (+ pack(second) when `two`). */
static PyObject *
with_times(PyObject *prefix, long long first, long long second, int two)
{
    Py_ssize_t length = PyBytes_GET_SIZE(prefix);
    PyObject *out = PyBytes_FromStringAndSize(NULL, length + (two ? 16 : 8));
    if (out == NULL)
        return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(bytes, PyBytes_AS_STRING(prefix), length);
    int64_into((char *)bytes + length, first);
    if (two)
        int64_into((char *)bytes + length + 8, second);
    return out;
}

/* `data` as bytes holding `length` bytes from `at`: else struct's error, as unpack_from
 * raises. */
static int
check_holds(PyObject *data, Py_ssize_t at, Py_ssize_t length)
{
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "a session's key is not bytes");
        return -1;
    }
    if (PyBytes_GET_SIZE(data) < at + length) {
        PyErr_Format(struct_error, "unpack_from requires a buffer of at least %zd bytes",
                     at + length);
        return -1;
    }
    return 0;
}

/* _TIMESTAMP.unpack_from(data, at)[0]. */
static int
time_at(PyObject *data, Py_ssize_t at, long long *time)
{
    if (check_holds(data, at, 8) < 0)
        return -1;
    *time = int64_at(PyBytes_AS_STRING(data) + at);
    return 0;
}

/* _session(data, at): the session whose end, then start, are at `at` in `data`. */
static int
session_at(PyObject *data, Py_ssize_t at, long long *start, long long *end)
{
    if (check_holds(data, at, SUFFIX) < 0)
        return -1;
    const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(data) + at;
    *end = int64_at((const char *)bytes);
    *start = int64_at((const char *)bytes + 8);
    return 0;
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

/* Window(start, end). */
static PyObject *
window_of(Core *self, long long start, long long end)
{
    PyObject *low = PyLong_FromLongLong(start), *high = PyLong_FromLongLong(end);
    PyObject *window = NULL;
    if (low != NULL && high != NULL)
        window = frozen(self->window_type, str_start, low, str_end, high);
    Py_XDECREF(low);
    Py_XDECREF(high);
    return window;
}

/* Every held write into the store's transaction (see _cores.h, held_release). */
static int
release_held(Core *self, long long below)
{
    return held_release(&self->held, self->store, str_transaction, str_put, below);
}

/* The kept sessions dropped (all, or over the budget: see _cores.h), the held writes first
 * into the transaction: reads of a key not kept go to the store. */
static int
forget_kept(Core *self, int over_budget)
{
    int failed = release_held(self, LLONG_MIN);
    if (over_budget)
        kept_over_budget(&self->kept);
    else
        kept_forget(&self->kept);
    return failed;
}

/* _key_windows(prefix, low, _LATEST) as read from the cache and the store, `low` already
 * bounded below by what is still seen: the key's sessions ending at or after `low`, the
 * cache's over the store's. Gives their store keys in order (a new list) and store key ->
 * result in *found (a new dict); a None result (a deleted session) is left in, for the caller
 * to skip, as the reference's list leaves it out. */
static PyObject *
stored_windows(Core *self, PyObject *prefix, wide low, PyObject **found)
{
    *found = NULL;
    PyObject *out = NULL, *transaction = NULL, *iterator = NULL, *bounds[3] = {NULL};
    PyObject *items = PyDict_New(), *pair = NULL, *cached = NULL;
    if (items == NULL)
        return NULL;
    transaction = transaction_of(self->store, &self->transaction, str_transaction);
    if (transaction == NULL)
        goto done;
    bounds[0] = transaction;
    bounds[1] = with_times(prefix, (long long)low, 0, 0);
    bounds[2] = with_times(prefix, LATEST, 0, 0);
    if (bounds[1] == NULL || bounds[2] == NULL)
        goto done;
    PyObject *range = PyObject_VectorcallMethod(str_range, bounds, 3, NULL);
    if (range == NULL)
        goto done;
    iterator = PyObject_GetIter(range);
    Py_DECREF(range);
    if (iterator == NULL)
        goto done;
    while ((pair = PyIter_Next(iterator)) != NULL) {
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
            || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "the store's range did not give (key, bytes)");
            goto done;
        }
        PyObject *raw = PyTuple_GET_ITEM(pair, 1);
        Py_ssize_t length = PyBytes_GET_SIZE(raw);
        /* deserialize(raw[8:]), then the timestamp read (unused here, but its error is not) */
        PyObject *data = PyBytes_FromStringAndSize(
            length > 8 ? PyBytes_AS_STRING(raw) + 8 : NULL, length > 8 ? length - 8 : 0);
        if (data == NULL)
            goto done;
        PyObject *result = PyObject_CallOneArg(self->result_deserialize, data);
        Py_DECREF(data);
        if (result == NULL)
            goto done;
        if (length < 8) {
            Py_DECREF(result);
            PyErr_SetString(struct_error, "unpack_from requires a buffer of at least 8 bytes");
            goto done;
        }
        int failed = PyDict_SetItem(items, PyTuple_GET_ITEM(pair, 0), result);
        Py_DECREF(result);
        if (failed < 0)
            goto done;
        Py_CLEAR(pair);
    }
    if (PyErr_Occurred())
        goto done;
    Py_CLEAR(iterator);
    /* the cache's windows of the key (cache.by_prefix) in [low, LATEST) over the store's */
    cached = PyDict_GetItemWithError(self->by_prefix, prefix);
    if (cached == NULL && PyErr_Occurred())
        goto done;
    if (cached != NULL) {
        Py_INCREF(cached);
        iterator = PyObject_GetIter(cached);
        if (iterator == NULL)
            goto done;
        Py_ssize_t at = PyBytes_GET_SIZE(prefix);
        PyObject *store_key;
        while ((store_key = PyIter_Next(iterator)) != NULL) {
            long long end;
            if (time_at(store_key, at, &end) < 0) {
                Py_DECREF(store_key);
                goto done;
            }
            if ((wide)end >= low && end < LATEST) {
                PyObject *entry = PyDict_GetItemWithError(self->entries, store_key);
                if (entry == NULL) {
                    if (!PyErr_Occurred())
                        PyErr_SetObject(PyExc_KeyError, store_key);
                    Py_DECREF(store_key);
                    goto done;
                }
                if (!PyList_Check(entry) || PyList_GET_SIZE(entry) < 2) {
                    Py_DECREF(store_key);
                    PyErr_SetString(PyExc_TypeError, "a record cache entry is not a list");
                    goto done;
                }
                int failed = PyDict_SetItem(items, store_key, PyList_GET_ITEM(entry, 0));
                Py_DECREF(store_key);
                if (failed < 0)
                    goto done;
            }
            else
                Py_DECREF(store_key);
        }
        if (PyErr_Occurred())
            goto done;
    }
    out = PyDict_Keys(items);
    if (out != NULL && PyList_Sort(out) < 0) /* by end, then start */
        Py_CLEAR(out);
done:
    Py_XDECREF(pair);
    Py_XDECREF(iterator);
    Py_XDECREF(cached);
    Py_XDECREF(bounds[0]);
    Py_XDECREF(bounds[1]);
    Py_XDECREF(bounds[2]);
    if (out == NULL)
        Py_DECREF(items);
    else
        *found = items;
    return out;
}

/* The kept sessions of a key (`kept`, store key -> result) ending at or after `low` (and
 * before LATEST), as stored_windows gives them; those no longer seen (ending before
 * `visible`) leave `kept`. */
static PyObject *
kept_windows(Core *self, PyObject *prefix, PyObject *kept, wide low, wide visible,
             PyObject **found)
{
    *found = NULL;
    PyObject *items = PyDict_New(), *gone = PyList_New(0), *out = NULL;
    if (items == NULL || gone == NULL)
        goto done;
    Py_ssize_t at = PyBytes_GET_SIZE(prefix), position = 0;
    PyObject *store_key, *result;
    while (PyDict_Next(kept, &position, &store_key, &result)) {
        long long end;
        if (time_at(store_key, at, &end) < 0)
            goto done;
        if ((wide)end < visible) {
            if (PyList_Append(gone, store_key) < 0)
                goto done;
        }
        else if ((wide)end >= low && end < LATEST && PyDict_SetItem(items, store_key, result) < 0)
            goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(gone); i++) {
        if (PyDict_DelItem(kept, PyList_GET_ITEM(gone, i)) < 0)
            goto done;
        self->kept.count--;
    }
    out = PyDict_Keys(items);
    if (out != NULL && PyList_Sort(out) < 0) /* by end, then start */
        Py_CLEAR(out);
done:
    Py_XDECREF(gone);
    if (out == NULL)
        Py_XDECREF(items);
    else
        *found = items;
    return out;
}

/* Keep the key's sessions read from the store and the cache (`items`, from what is still
 * seen), unless one of their results could change in place; within the budget. */
static int
keep_sessions(Core *self, PyObject *prefix, PyObject *items)
{
    PyObject *kept = PyDict_New();
    if (kept == NULL)
        return -1;
    Py_ssize_t position = 0;
    PyObject *store_key, *result;
    while (PyDict_Next(items, &position, &store_key, &result)) {
        if (result == Py_None)
            continue; /* deleted */
        if (!immutable_result(result)) {
            Py_DECREF(kept);
            return 0;
        }
        if (PyDict_SetItem(kept, store_key, result) < 0) {
            Py_DECREF(kept);
            return -1;
        }
    }
    Py_ssize_t size = PyDict_Size(kept);
    if ((self->kept.count + size + 1) * KNOWN_SESSION_BYTES > self->kept.budget) {
        if (forget_kept(self, 1) < 0) {
            Py_DECREF(kept);
            return -1;
        }
        if (self->kept.by_key == NULL) {
            Py_DECREF(kept);
            return 0;
        }
    }
    int failed = PyDict_SetItem(self->kept.by_key, prefix, kept);
    Py_DECREF(kept);
    if (!failed)
        self->kept.count += size;
    return failed;
}

/* _key_windows(prefix, low, _LATEST): the key's sessions ending at or after `low` and still
 * seen, the cache's over the store's (see stored_windows), from the kept ones when the key's
 * are kept. */
static PyObject *
key_windows(Core *self, PyObject *prefix, wide low, PyObject **found)
{
    *found = NULL;
    long long store_time;
    if (int_attr(self->store_time, str_time, &store_time) < 0)
        return NULL;
    /* _visible_from(): max(0, store time - retention + 1); sessions are not time-first */
    wide visible = (wide)store_time - self->retention + 1;
    if (visible < 0)
        visible = 0;
    if (visible > low)
        low = visible;
    if (low >= LATEST) /* high <= low: nothing */
        return PyList_New(0);
    if (self->kept.by_key == NULL)
        return stored_windows(self, prefix, low, found);
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
    if (kept != NULL)
        return kept_windows(self, prefix, kept, low, visible, found);
    if (PyErr_Occurred())
        return NULL;
    /* every session of the key still seen, kept, then those from `low` on */
    PyObject *every = NULL, *sessions = stored_windows(self, prefix, visible, &every);
    if (sessions == NULL)
        return NULL;
    Py_DECREF(sessions);
    PyObject *out = NULL;
    if (keep_sessions(self, prefix, every) == 0)
        out = kept_windows(self, prefix, every, low, visible, found);
    Py_DECREF(every);
    return out;
}

/* KeyedWindowCache.put(store_key, result, timestamp, forwarded, window) with a cache of its
 * own (max_bytes > 0): `prefix` is the key's, what _prefix_of(store_key) gives. */
static int
cache_put(Core *self, PyObject *store_key, PyObject *prefix, PyObject *result,
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
    if (PyErr_Occurred()) {
        Py_DECREF(source);
        return -1;
    }
    /* a new entry: in the key's index first (by_prefix.setdefault(prefix, set()).add(key)) */
    PyObject *keys = PyDict_GetItemWithError(self->by_prefix, prefix);
    if (keys != NULL)
        Py_INCREF(keys);
    else if (PyErr_Occurred() || (keys = PySet_New(NULL)) == NULL
             || PyDict_SetItem(self->by_prefix, prefix, keys) < 0) {
        Py_XDECREF(keys);
        Py_DECREF(source);
        return -1;
    }
    int indexed;
    if (PySet_Check(keys))
        indexed = PySet_Add(keys, store_key);
    else {
        PyErr_SetString(PyExc_TypeError, "the cache's by_prefix must hold sets");
        indexed = -1;
    }
    Py_DECREF(keys);
    if (indexed < 0) {
        Py_DECREF(source);
        return -1;
    }
    return add_cache_entry(self->cache, self->entries, store_key, items, self->entry_bytes,
                           self->max_bytes, str_bytes, str_evict);
}

/* After a session's write: the kept sessions of its key, and the ends of live sessions, as
 * the write left them. */
static int
note_write(Core *self, PyObject *store_key, PyObject *prefix, long long end, PyObject *result)
{
    if (self->kept.by_key == NULL)
        return 0;
    PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
    if (kept == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t before = PyDict_Size(kept);
    int failed;
    if (result == Py_None) {
        int held = PyDict_Contains(kept, store_key);
        failed = held < 0 || (held && PyDict_DelItem(kept, store_key) < 0);
    }
    else if (immutable_result(result))
        failed = PyDict_SetItem(kept, store_key, result) < 0;
    else /* a result that could change in place: the key's are read from the store again */
        failed = release_held(self, LLONG_MIN) < 0
                 || PyDict_DelItem(self->kept.by_key, prefix) < 0;
    if (failed)
        return -1;
    self->kept.count += (result == Py_None || immutable_result(result))
                                ? PyDict_Size(kept) - before
                                : -before;
    if (self->kept.count * KNOWN_SESSION_BYTES > self->kept.budget)
        return forget_kept(self, 1);
    /* the held writes past what the budget leaves them: into the transaction */
    if (self->kept.count * KNOWN_SESSION_BYTES + held_writes_count(&self->held) * HELD_WRITE_BYTES
        > self->kept.budget)
        return release_held(self, LLONG_MIN);
    return 0;
}

static int put_session(Core *self, PyObject *store_key, PyObject *prefix, long long time,
                       PyObject *result, PyObject *record, long long start);

/* KeyedWindowAggregation._put(store_key, time, result, time, record, window): a session's
 * result (None: its deletion), with its end as its time and timestamp. */
static int
put(Core *self, PyObject *store_key, PyObject *prefix, long long time, PyObject *result,
    PyObject *record, long long start)
{
    if (put_session(self, store_key, prefix, time, result, record, start) < 0) {
        forget_kept(self, 0); /* what the store holds of the key is not known any more */
        return -1;
    }
    return note_write(self, store_key, prefix, time, result);
}

/* put(), the write itself. */
static int
put_session(Core *self, PyObject *store_key, PyObject *prefix, long long time, PyObject *result,
            PyObject *record, long long start)
{
    /* Kafka Streams' store counts the session's end at every write reaching it: with a
     * cache, a deletion of a session the store never had does not. */
    if (result != Py_None || self->max_bytes <= 0) {
        long long store_time;
        if (int_attr(self->store_time, str_time, &store_time) < 0)
            return -1;
        if (time > store_time && set_int_attr(self->store_time, str_time, time) < 0)
            return -1;
    }
    if (self->emit_final && self->max_bytes <= 0) { /* on close: no cache */
        /* Held back while the key's sessions are kept and those not emitted are in memory,
         * which then answer every read of it; else to the transaction at once. */
        int hold = 0, fresh = 0;
        if (self->held.writes != NULL && self->pending.state == PENDING_READ
            && self->kept.by_key != NULL && immutable_result(result)) {
            PyObject *kept = PyDict_GetItemWithError(self->kept.by_key, prefix);
            if (kept == NULL && PyErr_Occurred())
                return -1;
            if (kept != NULL) {
                int stored = PyDict_Contains(kept, store_key); /* kept: the store has it */
                if (stored < 0)
                    return -1;
                hold = 1;
                fresh = !stored;
            }
        }
        /* the transaction only to write it (a property call) */
        PyObject *transaction = hold ? NULL
                                     : transaction_of(self->store, &self->transaction,
                                                      str_transaction);
        if (!hold && transaction == NULL)
            return -1;
        int failed = write_through(transaction, str_put, store_key, PyBytes_GET_SIZE(prefix),
                                   SUFFIX, self->result_serialize, self->long_results, result,
                                   time, &self->pending, &self->held, hold, fresh);
        Py_XDECREF(transaction);
        return failed;
    }
    PyObject *forwarded = self->emit_final ? Py_None : record;
    PyObject *timestamp = PyLong_FromLongLong(time);
    PyObject *window = timestamp == NULL ? NULL : window_of(self, start, time);
    int failed = -1;
    if (window == NULL)
        goto done;
    if (self->max_bytes > 0)
        failed = cache_put(self, store_key, prefix, result, timestamp, forwarded, window);
    else {
        PyObject *args[6] = {self->cache, store_key, result, timestamp, forwarded, window};
        PyObject *done = PyObject_VectorcallMethod(str_put, args, 6, NULL);
        failed = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
done:
    Py_XDECREF(timestamp);
    Py_XDECREF(window);
    return failed;
}

/* The key of a closed session's result: Windowed(key_serde.deserialize(key), window). */
static PyObject *
windowed_key(Core *self, PyObject *key_data, long long start, long long end)
{
    PyObject *key = NULL;
    if (self->string_keys && PyBytes_CheckExact(key_data)) {
        key = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(key_data), PyBytes_GET_SIZE(key_data),
                                   NULL);
        if (key == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            PyErr_Clear(); /* the serde says what is wrong with it */
        else if (key == NULL)
            return NULL;
    }
    if (key == NULL && (key = PyObject_CallOneArg(self->key_deserialize, key_data)) == NULL)
        return NULL;
    PyObject *window = window_of(self, start, end), *windowed = NULL;
    if (window != NULL)
        windowed = frozen(self->windowed_type, str_key, key, str_window, window);
    Py_XDECREF(window);
    Py_DECREF(key);
    return windowed;
}

/* A closed session's count written to the sink directly (direct_write_count): 1 when
 * written, 0 when it goes on as a Record, -1 on an error. `suffix` holds its end and start. */
static int
write_final(Core *self, PyObject *record, PyObject *key_data, PyObject *suffix,
            PyObject *result, PyObject *timestamp)
{
    DirectSink sink = {self->task, self->sink_topic, self->sink_append,
                       self->sink_sources_append, self->producer_type, self->no_source};
    return direct_write_count(&sink, PyBytes_AS_STRING(key_data), PyBytes_GET_SIZE(key_data),
                              PyBytes_AS_STRING(suffix), SUFFIX, result, timestamp,
                              PyTuple_GET_ITEM(record, 3));
}

/* SessionWindowAggregate._emit_final(record, close): the sessions that ended before `close`
 * since the last time go on, each with its end as its timestamp. */
static int
emit_final(Core *self, PyObject *record, wide close)
{
    long long emitted;
    if (int_attr(self->emitted_to, str_time, &emitted) < 0)
        return -1;
    if (emitted != -1 && (wide)emitted >= close)
        return 0;
    wide upper = close - 1; /* a session [start, end] ends before close */
    long long lower = emitted > 0 ? emitted : 0;
    if (upper < 0 || upper < lower)
        return 0;
    /* here 1 <= close <= stream time: an int64 */
    PyObject *args[3] = {self->aggregation, PyLong_FromLongLong(lower),
                         PyLong_FromLongLong((long long)upper)};
    PyObject *closed = NULL, *iterator = NULL, *item = NULL;
    int failed = -1;
    if (args[1] == NULL || args[2] == NULL)
        goto done;
    if (self->pending.state == PENDING_READ && (self->pending.size == 0
                                                || self->pending.items[0].time > (long long)upper))
        closed = PyList_New(0); /* none held ends before close: no transaction to look up */
    else if (self->pending.state == PENDING_READ) { /* the sessions held in memory */
        PyObject *transaction = transaction_of(self->store, &self->transaction, str_transaction);
        if (transaction == NULL)
            goto done;
        closed = pending_closed(&self->pending, &self->held, NULL, NULL, transaction, str_get,
                                self->result_deserialize,
                                self->long_results, lower, (long long)upper, 8);
        Py_DECREF(transaction);
    }
    else if (release_held(self, LLONG_MIN) == 0) /* the store has them all */
        closed = PyObject_VectorcallMethod(str_closed_windows, args, 3, NULL);
    if (closed == NULL || (iterator = PyObject_GetIter(closed)) == NULL)
        goto done;
    while ((item = PyIter_Next(iterator)) != NULL) {
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "_closed_windows did not give 4-tuples");
            goto done;
        }
        long long end, start;
        PyObject *key_data = PyTuple_GET_ITEM(item, 0), *suffix = PyTuple_GET_ITEM(item, 1);
        if (session_at(suffix, 0, &start, &end) < 0)
            goto done;
        PyObject *timestamp = PyLong_FromLongLong(end);
        if (timestamp == NULL)
            goto done;
        if (PyBytes_Check(key_data)) {
            /* the session-windowed key: the key's bytes, then the end and the start, as the
             * suffix holds them */
            int written = write_final(self, record, key_data, suffix,
                                      PyTuple_GET_ITEM(item, 2), timestamp);
            if (written != 0) {
                Py_DECREF(timestamp);
                if (written < 0)
                    goto done;
                Py_CLEAR(item);
                continue;
            }
        }
        PyObject *windowed = windowed_key(self, key_data, start, end);
        PyObject *fields = windowed == NULL ? NULL
                                            : PyTuple_Pack(4, windowed, PyTuple_GET_ITEM(item, 2),
                                                           timestamp, PyTuple_GET_ITEM(record, 3));
        Py_XDECREF(windowed);
        Py_DECREF(timestamp);
        PyObject *fields_args = fields == NULL ? NULL : PyTuple_Pack(1, fields);
        Py_XDECREF(fields);
        /* record._replace(key=..., value=result, timestamp=end): a Record (a tuple type) */
        PyObject *out = fields_args == NULL ? NULL
                        : PyTuple_Type.tp_new((PyTypeObject *)self->record_type, fields_args,
                                              NULL);
        Py_XDECREF(fields_args);
        if (out == NULL)
            goto done;
        PyObject *forwarded = PyObject_CallOneArg(self->forward, out);
        Py_DECREF(out);
        if (forwarded == NULL)
            goto done;
        Py_DECREF(forwarded);
        Py_CLEAR(item);
    }
    if (PyErr_Occurred())
        goto done;
    failed = set_int_attr(self->emitted_to, str_time, (long long)close);
done:
    Py_XDECREF(args[1]);
    Py_XDECREF(args[2]);
    Py_XDECREF(closed);
    Py_XDECREF(iterator);
    Py_XDECREF(item);
    return failed;
}

/* On window close, without a cache: the sessions in the store not yet emitted (ending at or
 * after the time emitted to) into memory, before a record (the first, or the next after
 * memory dropped them). */
static int
read_pending(Core *self)
{
    long long emitted;
    if (int_attr(self->emitted_to, str_time, &emitted) < 0 || release_held(self, LLONG_MIN) < 0)
        return -1;
    PyObject *transaction = transaction_of(self->store, &self->transaction, str_transaction);
    if (transaction == NULL)
        return -1;
    int failed = pending_read(&self->pending, transaction, str_range, emitted > 0 ? emitted : 0);
    Py_DECREF(transaction);
    return failed;
}

/* SessionWindowAggregate.process(record). */
static PyObject *
Core_process(Core *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4) {
        PyErr_SetString(PyExc_TypeError, "process takes a Record");
        return NULL;
    }
    PyObject *key = PyTuple_GET_ITEM(record, 0), *value = PyTuple_GET_ITEM(record, 1);
    PyObject *timestamp_object = PyTuple_GET_ITEM(record, 2);
    if (self->pending.state == PENDING_UNREAD && read_pending(self) < 0)
        return NULL;
    if (key == Py_None) {
        if (count_dropped(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    long long timestamp, stream_time;
    if (as_int64(timestamp_object, &timestamp) < 0
        || int_attr(self->stream_time, str_time, &stream_time) < 0)
        return NULL;
    if (timestamp > stream_time) {
        if (PyObject_SetAttr(self->stream_time, str_time, timestamp_object) < 0)
            return NULL;
        stream_time = timestamp;
    }
    wide close = (wide)stream_time - self->grace - self->gap;
    PyObject *key_data = key_bytes(self, key);
    if (key_data == NULL)
        return NULL;
    PyObject *prefix = keyed_prefix(key_data);
    Py_DECREF(key_data);
    if (prefix == NULL)
        return NULL;
    PyObject *aggregate, *found = NULL, *sessions = NULL, *merged = NULL, *store_key = NULL;
    PyObject *out = NULL;
    if (self->initializer == Py_None) { /* a reduce: no initial aggregate */
        Py_INCREF(Py_None);
        aggregate = Py_None;
    }
    else if (self->count) { /* zero() */
        Py_INCREF(zero);
        aggregate = zero;
    }
    else if ((aggregate = PyObject_CallNoArgs(self->initializer)) == NULL)
        goto done;
    sessions = key_windows(self, prefix, (wide)timestamp - self->gap, &found);
    merged = PyList_New(0); /* the store keys of the sessions merged */
    if (sessions == NULL || merged == NULL)
        goto done;
    Py_ssize_t at = PyBytes_GET_SIZE(prefix);
    long long start = timestamp, end = timestamp;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sessions); i++) {
        PyObject *session_key = PyList_GET_ITEM(sessions, i);
        PyObject *result = PyDict_GetItemWithError(found, session_key);
        if (result == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, session_key);
            goto done;
        }
        if (result == Py_None) /* deleted */
            continue;
        long long session_start, session_end;
        if (session_at(session_key, at, &session_start, &session_end) < 0)
            goto done;
        if ((wide)session_start > (wide)timestamp + self->gap)
            continue;
        if (PyList_Append(merged, session_key) < 0)
            goto done;
        PyObject *before = aggregate;
        if (self->count) /* grouped._add: one + two */
            aggregate = PyNumber_Add(before, result);
        else {
            Py_INCREF(result); /* held: the merger may run code that changes the cache */
            PyObject *args[3] = {key, before, result};
            aggregate = PyObject_Vectorcall(self->merger, args, 3, NULL);
            Py_DECREF(result);
        }
        Py_DECREF(before);
        if (aggregate == NULL)
            goto done;
        start = session_start < start ? session_start : start;
        end = session_end > end ? session_end : end;
    }
    if ((wide)end < close) { /* the session it would make has closed: too late */
        if (count_dropped(self) < 0)
            goto done;
    }
    else {
        if (start != timestamp || end != timestamp) {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(merged); i++) {
                PyObject *session_key = PyList_GET_ITEM(merged, i);
                long long session_start, session_end;
                if (session_at(session_key, at, &session_start, &session_end) < 0
                    || put(self, session_key, prefix, session_end, Py_None, record,
                           session_start) < 0)
                    goto done;
            }
        }
        PyObject *before = aggregate;
        if (aggregate == Py_None && self->initializer == Py_None) {
            Py_INCREF(value); /* a reduce's first value is its result */
            aggregate = value;
        }
        else if (self->count) /* count_one: count + 1 */
            aggregate = PyNumber_Add(before, one);
        else {
            PyObject *args[3] = {key, value, before};
            aggregate = PyObject_Vectorcall(self->aggregator, args, 3, NULL);
        }
        Py_DECREF(before);
        if (aggregate == NULL)
            goto done;
        store_key = with_times(prefix, end, start, 1);
        if (store_key == NULL || put(self, store_key, prefix, end, aggregate, record, start) < 0)
            goto done;
    }
    if (self->emit_final && emit_final(self, record, close) < 0)
        goto done;
    Py_INCREF(Py_None);
    out = Py_None;
done:
    Py_DECREF(prefix);
    Py_XDECREF(aggregate);
    Py_XDECREF(found);
    Py_XDECREF(sessions);
    Py_XDECREF(merged);
    Py_XDECREF(store_key);
    return out;
}

#define REFERENCES(X)                                                                          \
    X(aggregation) X(cache) X(entries) X(by_prefix) X(store) X(stream_time) X(store_time)      \
    X(emitted_to) X(task) X(key_serialize) X(key_deserialize) X(result_deserialize)           \
    X(initializer) X(aggregator) X(merger) X(forward) X(record_type) X(windowed_type)         \
    X(window_type) X(result_serialize) X(sink_topic) X(sink_append) X(sink_sources_append)    \
    X(producer_type) X(no_source)

static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {
        "aggregation", "cache", "store", "stream_time", "store_time", "emitted_to", "task",
        "key_serialize", "key_deserialize", "string_keys", "result_deserialize", "initializer",
        "aggregator", "merger", "count", "gap", "grace", "retention", "emit_final", "forward",
        "record_type", "windowed_type", "window_type", "result_serialize", "long_results",
        "memory_bytes", "sink_topic", "sink_append", "sink_sources_append", "producer_type",
        "no_source", NULL};
    PyObject *aggregation, *cache, *store, *stream_time, *store_time, *emitted_to, *task,
        *key_serialize, *key_deserialize, *result_deserialize, *initializer, *aggregator,
        *merger, *forward, *record_type, *windowed_type, *window_type, *result_serialize,
        *sink_topic, *sink_append, *sink_sources_append, *producer_type, *no_source;
    long long gap, grace, retention, memory_bytes;
    int string_keys, count, emit_final, long_results;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$OOOOOOOOOpOOOOpLLLpOO!O!O!OpLOOOO!O", names, &aggregation, &cache,
            &store, &stream_time, &store_time, &emitted_to, &task, &key_serialize,
            &key_deserialize, &string_keys, &result_deserialize, &initializer, &aggregator,
            &merger, &count, &gap, &grace, &retention, &emit_final, &forward, &PyType_Type,
            &record_type, &PyType_Type, &windowed_type, &PyType_Type, &window_type,
            &result_serialize, &long_results, &memory_bytes, &sink_topic, &sink_append,
            &sink_sources_append, &PyType_Type, &producer_type, &no_source))
        return -1;
    if (direct_sink_check(task, sink_append, sink_sources_append, producer_type) < 0)
        return -1;
    if (gap <= 0 || grace < 0 || retention < 0) {
        PyErr_SetString(PyExc_ValueError, "sessions need gap > 0, grace >= 0, retention >= 0");
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        return -1;
    }
    PyObject *entries = PyObject_GetAttrString(cache, "entries");
    PyObject *by_prefix = entries == NULL ? NULL : PyObject_GetAttrString(cache, "by_prefix");
    long long max_bytes, entry_bytes;
    int failed = by_prefix == NULL || int_attr(cache, str_max_bytes, &max_bytes) < 0
                 || int_attr(cache, str_entry_bytes, &entry_bytes) < 0;
    if (!failed && (!PyDict_Check(entries) || !PyDict_CheckExact(by_prefix))) {
        PyErr_SetString(PyExc_TypeError, "the cache must be a KeyedWindowCache");
        failed = 1;
    }
    if (failed) {
        Py_XDECREF(entries);
        Py_XDECREF(by_prefix);
        return -1;
    }
#define TAKE(name)                                                                             \
    Py_INCREF(name);                                                                           \
    Py_XSETREF(self->name, name);
    REFERENCES(TAKE)
#undef TAKE
    Py_DECREF(entries); /* the references getattr gave */
    Py_DECREF(by_prefix);
    self->gap = gap;
    self->grace = grace;
    self->retention = retention;
    self->max_bytes = max_bytes;
    self->entry_bytes = entry_bytes;
    self->string_keys = string_keys;
    self->count = count;
    self->emit_final = emit_final;
    self->long_results = long_results;
    if (kept_init(&self->kept, memory_bytes) < 0
        || held_init(&self->held, emit_final && max_bytes <= 0 && memory_bytes > 0) < 0)
        return -1;
    /* on window close the cache is off (KeyedWindowAggregation.init): sessions go to the
     * store as written, and the ones not emitted are held in memory within the budget */
    return pending_init(&self->pending, emit_final && max_bytes <= 0 ? memory_bytes : 0);
}

/* The aggregation, its cache and the task refer to one another and to this object: the
 * cycle collector has to see these references. */
static int
Core_traverse(Core *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    REFERENCES(VISIT)
    VISIT(kept.by_key)
    VISIT(held.writes)
    VISIT(transaction)
#undef VISIT
    return 0;
}

static int
Core_clear(Core *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    REFERENCES(CLEAR)
    CLEAR(kept.by_key)
    CLEAR(held.writes)
    CLEAR(transaction)
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
 * refuse to process rather than crash. */
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

/* Core.write_held(below): every write held back into the store's transaction, but those of
 * fresh sessions ending before `below`, which the expiry at this commit deletes. */
static PyObject *
Core_write_held(Core *self, PyObject *below)
{
    long long time = PyLong_AsLongLong(below);
    if (time == -1 && PyErr_Occurred())
        return NULL;
    if (release_held(self, time) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Core_methods[] = {
    {"process", (PyCFunction)Core_process_checked, METH_O,
     "One record into its key's session (SessionWindowAggregate.process)."},
    {"write_held", (PyCFunction)Core_write_held, METH_O,
     "The writes held back into the store's transaction, before the commit's expiry."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.dsl._session_core.Core",
    .tp_doc = "The per-record path of SessionWindowAggregate (see session_aggregate.py).",
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
    PyModuleDef_HEAD_INIT, "_session_core", "SessionWindowAggregate's per-record path in C.", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__session_core(void)
{
    if (window_names() < 0)
        return NULL;
    CORES_INTERN(str_transaction, "transaction")
    CORES_INTERN(str_range, "range")
    CORES_INTERN(str_closed_windows, "_closed_windows")
    CORES_INTERN(str_get, "get")
    PyObject *structs = PyImport_ImportModule("struct"); /* its error: what unpack_from raises */
    if (structs == NULL)
        return NULL;
    struct_error = PyObject_GetAttrString(structs, "error");
    Py_DECREF(structs);
    if (struct_error == NULL)
        return NULL;
    return core_module(&module, &CoreType);
}
