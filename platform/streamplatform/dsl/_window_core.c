/* The per-record path of WindowedAggregate (count / reduce / aggregate per TimeWindows), in C.
 *
 * `Core.process(record)` and `Core.close_windows(record, close)` do exactly what
 * `WindowedAggregate.process` and `_close_windows` do in window_aggregate.py, which is the
 * reference: read it first. The state stays in the Python objects (the record cache's
 * OrderedDict of entries and its byte count, the kept stream time and stored-to time, the
 * aggregation's closing bounds); what goes to the store goes through the aggregation's Python
 * helpers (`_read`, `_stored_windows`, `_delete_stored`, and the cache's `put` and
 * `evict_over_budget`), so the store's transaction is touched only where Python touches it.
 * What C saves is the interpreter's work per record around those objects.
 *
 * The OrderedDict is read with PyDict_GetItemWithError (its items live in the dict it
 * extends) and written only through PyObject_SetItem/DelItem, which keep its order.
 *
 * Timestamps are int64 in Kafka; sums and differences of them are taken in 128 bits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define CORES_WINDOW_NAMES
#include "_cores.h"


static PyObject *str_next_end, *str_closed_to, *str_gone_below, *str_pending_close, *str_read,
    *str_stored_windows, *str_delete_stored, *str_forward_update;

#define WINDOW_PREFIX 'w'
#define STORE_KEY_HEAD 9 /* b"w" + the window start, 8 bytes big-endian */

typedef struct {
    PyObject_HEAD
    PyObject *aggregation, *cache, *entries, *stream_time, *stored_to, *task;
    PyObject *key_serialize, *key_deserialize, *initializer, *aggregator, *forward;
    PyObject *record_type, *windowed_type, *window_type;
    /* Where a closed window's count is written directly (sink_append None: forwarded). */
    PyObject *sink_topic, *sink_append, *sink_sources_append, *producer_type, *no_source;
    long long size, advance, grace, max_bytes, entry_bytes;
    int string_keys, count, emit_final;
    /* The int of the last window start given to the cache: consecutive records mostly fall
     * in the same windows, so one object serves them (NULL: none yet). */
    PyObject *last_start;
    long long last_start_value;
} Core;

/* Python's a // b for b > 0. */
static wide
floor_div(wide a, wide b)
{
    wide quotient = a / b;
    return (a % b != 0 && a < 0) ? quotient - 1 : quotient;
}

static int
count_dropped(Core *self)
{
    long long dropped;
    if (int_attr(self->aggregation, str_dropped_records, &dropped) < 0)
        return -1;
    return set_int_attr(self->aggregation, str_dropped_records, (wide)dropped + 1);
}

/* `self.key_serde.serialize(key) or b""` (a new reference). */
static PyObject *
key_bytes(Core *self, PyObject *key)
{
    PyObject *data = PyObject_CallOneArg(self->key_serialize, key);
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

/* b"w" + start (8 bytes, big-endian) + the key's `length` bytes at `key`. */
static PyObject *
store_key_at(long long start, const char *key, Py_ssize_t length)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, STORE_KEY_HEAD + length);
    if (out == NULL)
        return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    unsigned long long value = (unsigned long long)start;
    bytes[0] = WINDOW_PREFIX;
    for (int i = 8; i >= 1; i--) {
        bytes[i] = (unsigned char)(value & 0xff);
        value >>= 8;
    }
    memcpy(bytes + STORE_KEY_HEAD, key, length);
    return out;
}

/* b"w" + start (8 bytes, big-endian) + key (bytes). */
static PyObject *
store_key_of(long long start, PyObject *key)
{
    return store_key_at(start, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
}

static long long
start_of(PyObject *store_key)
{
    const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(store_key);
    unsigned long long value = 0;
    for (int i = 1; i <= 8; i++)
        value = (value << 8) | bytes[i];
    return (long long)value;
}

/* _updated(record, old): the new result and its timestamp (new references in *result and
 * *timestamp). `old_result`/`old_timestamp` NULL: the window's first record. */
static int
updated(Core *self, PyObject *key, PyObject *value, PyObject *timestamp, PyObject *old_result,
        PyObject *old_timestamp, PyObject **result, PyObject **result_timestamp)
{
    if (old_result == NULL) {
        if (self->count)
            *result = PyLong_FromLong(1); /* count_one(key, value, zero()) */
        else if (self->initializer == Py_None) {
            Py_INCREF(value);
            *result = value; /* a reduce: the first value is the first result */
        }
        else {
            PyObject *initial = PyObject_CallNoArgs(self->initializer);
            if (initial == NULL)
                return -1;
            PyObject *args[3] = {key, value, initial};
            *result = PyObject_Vectorcall(self->aggregator, args, 3, NULL);
            Py_DECREF(initial);
        }
        if (*result == NULL)
            return -1;
        Py_INCREF(timestamp);
        *result_timestamp = timestamp;
        return 0;
    }
    if (self->count)
        *result = PyNumber_Add(old_result, one);
    else {
        PyObject *args[3] = {key, value, old_result};
        *result = PyObject_Vectorcall(self->aggregator, args, 3, NULL);
    }
    if (*result == NULL)
        return -1;
    /* max(record.timestamp, old[1]): the first of two equal ones */
    int later = PyObject_RichCompareBool(old_timestamp, timestamp, Py_GT);
    if (later < 0) {
        Py_CLEAR(*result);
        return -1;
    }
    *result_timestamp = later ? old_timestamp : timestamp;
    Py_INCREF(*result_timestamp);
    return 0;
}

/* ResultCache.put(store_key, result, timestamp, forwarded, start) with a cache of its own
 * (max_bytes > 0); `start` is the window start as an int object. */
static int
cache_put(Core *self, PyObject *store_key, PyObject *result, PyObject *timestamp,
          PyObject *forwarded, PyObject *start)
{
    PyObject *source;
    if (self->task == Py_None) {
        Py_INCREF(Py_None);
        source = Py_None;
    }
    /* The task's current record: dsl.processor.EngineTask.current. */
    else if ((source = PyObject_GetAttr(self->task, str_current)) == NULL)
        return -1;
    PyObject *items[6] = {result, timestamp, forwarded, start, Py_True, source};
    PyObject *entry = PyDict_GetItemWithError(self->entries, store_key);
    if (entry != NULL) { /* rewritten in place, and last: the order is the write order */
        Py_INCREF(entry);
        PyObject *moved = PyObject_CallMethodOneArg(self->entries, str_move_to_end, store_key);
        int failed = moved == NULL || !PyList_Check(entry) || PyList_GET_SIZE(entry) != 6;
        Py_XDECREF(moved);
        if (!failed) {
            for (int i = 0; i < 6; i++) {
                if (PyList_GET_ITEM(entry, i) == items[i])
                    continue; /* the same object (the window's start, None, True) */
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
    return add_cache_entry(self->cache, self->entries, store_key, items, self->entry_bytes,
                           self->max_bytes, str_bytes, str_evict);
}

/* One window of the record: the loop body of WindowedAggregate.process. */
static int
aggregate_into(Core *self, PyObject *key, PyObject *value, PyObject *timestamp,
               const char *key_data, Py_ssize_t key_length, long long start, PyObject *forwarded)
{
    PyObject *store_key = store_key_at(start, key_data, key_length);
    if (store_key == NULL)
        return -1;
    PyObject *old = NULL, *old_result = NULL, *old_timestamp = NULL;
    PyObject *result = NULL, *result_timestamp = NULL, *start_object = NULL;
    PyObject *held_result = NULL, *held_timestamp = NULL;
    int failed = -1;
    PyObject *entry = PyDict_GetItemWithError(self->entries, store_key);
    if (entry != NULL) {
        if (!PyList_Check(entry) || PyList_GET_SIZE(entry) < 2) {
            PyErr_SetString(PyExc_TypeError, "a record cache entry is not a list");
            goto done;
        }
        old_result = PyList_GET_ITEM(entry, 0);
        old_timestamp = PyList_GET_ITEM(entry, 1);
        /* held: the aggregator may run Python code that changes or drops the entry (a count
         * runs none, and holds the two without a tuple) */
        if (self->count) {
            held_result = Py_NewRef(old_result);
            held_timestamp = Py_NewRef(old_timestamp);
        }
        else {
            old = PyTuple_Pack(2, old_result, old_timestamp);
            if (old == NULL)
                goto done;
            old_result = PyTuple_GET_ITEM(old, 0);
            old_timestamp = PyTuple_GET_ITEM(old, 1);
        }
    }
    else if (PyErr_Occurred())
        goto done;
    else {
        long long stored_to;
        if (int_attr(self->stored_to, str_time, &stored_to) < 0)
            goto done;
        if (start <= stored_to) { /* it may be in the store */
            old = PyObject_CallMethodOneArg(self->aggregation, str_read, store_key);
            if (old == NULL)
                goto done;
            if (old == Py_None)
                Py_CLEAR(old);
            else if (!PyTuple_Check(old) || PyTuple_GET_SIZE(old) != 2) {
                PyErr_SetString(PyExc_TypeError, "_read did not give (result, timestamp)");
                goto done;
            }
            else {
                old_result = PyTuple_GET_ITEM(old, 0);
                old_timestamp = PyTuple_GET_ITEM(old, 1);
            }
        }
    }
    if (updated(self, key, value, timestamp, old_result, old_timestamp, &result,
                &result_timestamp) < 0)
        goto done;
    if (self->last_start == NULL || self->last_start_value != start) {
        PyObject *made = PyLong_FromLongLong(start);
        if (made == NULL)
            goto done;
        Py_XSETREF(self->last_start, made);
        self->last_start_value = start;
    }
    start_object = Py_NewRef(self->last_start);
    if (self->max_bytes > 0)
        failed = cache_put(self, store_key, result, result_timestamp, forwarded, start_object);
    else {
        PyObject *args[6] = {self->cache, store_key, result, result_timestamp, forwarded,
                             start_object};
        PyObject *done = PyObject_VectorcallMethod(str_put, args,
                                                   6, NULL);
        failed = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
done:
    Py_DECREF(store_key);
    Py_XDECREF(old);
    Py_XDECREF(result);
    Py_XDECREF(result_timestamp);
    Py_XDECREF(start_object);
    Py_XDECREF(held_result);
    Py_XDECREF(held_timestamp);
    return failed;
}

static PyObject *close_windows(Core *self, PyObject *record, wide close);

/* WindowedAggregate.process(record). */
static PyObject *
Core_process(Core *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4) {
        PyErr_SetString(PyExc_TypeError, "process takes a Record");
        return NULL;
    }
    PyObject *key = PyTuple_GET_ITEM(record, 0), *value = PyTuple_GET_ITEM(record, 1);
    PyObject *timestamp_object = PyTuple_GET_ITEM(record, 2);
    if (key == Py_None) {
        if (count_dropped(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    long long timestamp, stream_time;
    wide next_end;
    if (as_int64(timestamp_object, &timestamp) < 0
        || int_attr(self->stream_time, str_time, &stream_time) < 0)
        return NULL;
    if (timestamp > stream_time) {
        if (PyObject_SetAttr(self->stream_time, str_time, timestamp_object) < 0)
            return NULL;
        stream_time = timestamp;
    }
    wide close = (wide)stream_time - self->grace;
    /* A str key's UTF-8 bytes are read where the str keeps them (an ASCII str's are its
     * data): no bytes object per record. Any other key goes through its serde. */
    PyObject *key_data = NULL;
    const char *key_chars;
    Py_ssize_t key_length;
    if (self->string_keys && PyUnicode_CheckExact(key)) {
        if ((key_chars = PyUnicode_AsUTF8AndSize(key, &key_length)) == NULL)
            return NULL;
    }
    else if ((key_data = key_bytes(self, key)) == NULL)
        return NULL;
    else {
        key_chars = PyBytes_AS_STRING(key_data);
        key_length = PyBytes_GET_SIZE(key_data);
    }
    PyObject *forwarded = self->emit_final ? Py_None : record; /* on close: nothing on update */
    wide first = (wide)timestamp - self->size + self->advance;
    first = (first > 0 ? first : 0) / self->advance * self->advance;
    for (wide start = first; start <= timestamp; start += self->advance) {
        if (start + self->size <= close) { /* its window has closed: too late */
            if (count_dropped(self) < 0)
                goto failed;
            continue;
        }
        if (aggregate_into(self, key, value, timestamp_object, key_chars, key_length,
                           (long long)start, forwarded) < 0)
            goto failed;
    }
    Py_XDECREF(key_data);
    if (wide_attr(self->aggregation, str_next_end, &next_end) < 0)
        return NULL;
    if (close >= next_end) {
        if (self->emit_final)
            return close_windows(self, record, close);
        /* their last updates go on at the flush, in their order (Kafka Streams') */
        if (set_int_attr(self->aggregation, str_pending_close, close) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
failed:
    Py_XDECREF(key_data);
    return NULL;
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

/* The key of a closed window's result: Windowed(key, Window(start, start + size)). */
static PyObject *
windowed_key(Core *self, PyObject *store_key, long long start)
{
    const char *bytes = PyBytes_AS_STRING(store_key) + STORE_KEY_HEAD;
    Py_ssize_t length = PyBytes_GET_SIZE(store_key) - STORE_KEY_HEAD;
    PyObject *key = NULL;
    if (self->string_keys) {
        key = PyUnicode_DecodeUTF8(bytes, length, NULL);
        if (key == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            PyErr_Clear(); /* the serde says what is wrong with it */
    }
    if (key == NULL) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *data = PyBytes_FromStringAndSize(bytes, length);
        if (data == NULL)
            return NULL;
        key = PyObject_CallOneArg(self->key_deserialize, data);
        Py_DECREF(data);
        if (key == NULL)
            return NULL;
    }
    PyObject *window = NULL, *windowed = NULL;
    PyObject *low = PyLong_FromLongLong(start);
    PyObject *high = wide_number((wide)start + self->size);
    if (low != NULL && high != NULL)
        window = frozen(self->window_type, str_start, low, str_end, high);
    if (window != NULL)
        windowed = frozen(self->windowed_type, str_key, key, str_window, window);
    Py_XDECREF(low);
    Py_XDECREF(high);
    Py_XDECREF(window);
    Py_DECREF(key);
    return windowed;
}

/* record._replace(key=key, value=result, timestamp=timestamp), forwarded. */
static int
forward_final(Core *self, PyObject *record, PyObject *key, PyObject *result,
              PyObject *timestamp)
{
    PyObject *items = PyTuple_Pack(4, key, result, timestamp, PyTuple_GET_ITEM(record, 3));
    if (items == NULL)
        return -1;
    PyObject *args = PyTuple_Pack(1, items);
    Py_DECREF(items);
    if (args == NULL)
        return -1;
    PyObject *out = PyTuple_Type.tp_new((PyTypeObject *)self->record_type, args, NULL);
    Py_DECREF(args);
    if (out == NULL)
        return -1;
    PyObject *done = PyObject_CallOneArg(self->forward, out);
    Py_DECREF(out);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* The sink's delivery function for a closed window's final result (direct_write_count): 1
 * when written, 0 when this result is not a count that fits (the caller forwards it), -1 on
 * an error. */
static int
write_final(Core *self, PyObject *record, PyObject *store_key, PyObject *result,
            PyObject *timestamp)
{
    DirectSink sink = {self->task, self->sink_topic, self->sink_append,
                       self->sink_sources_append, self->producer_type, self->no_source};
    const char *bytes = PyBytes_AS_STRING(store_key); /* b"w" + start + key */
    return direct_write_count(&sink, bytes + STORE_KEY_HEAD,
                              PyBytes_GET_SIZE(store_key) - STORE_KEY_HEAD, bytes + 1, 8,
                              result, timestamp, PyTuple_GET_ITEM(record, 3));
}

/* The cached windows starting before `high_key` leave the cache into `closed`; an update not
 * forwarded yet goes on first. */
static int
take_cached(Core *self, PyObject *high_key, PyObject *closed)
{
    PyObject *keys = PyList_New(0);
    if (keys == NULL)
        return -1;
    int failed = -1;
    const char *high = PyBytes_AS_STRING(high_key);
    Py_ssize_t high_length = PyBytes_GET_SIZE(high_key);
    PyObject *iterator = PyObject_GetIter(self->entries), *store_key;
    if (iterator == NULL)
        goto done;
    while ((store_key = PyIter_Next(iterator)) != NULL) {
        int below;
        if (PyBytes_CheckExact(store_key)) {
            Py_ssize_t length = PyBytes_GET_SIZE(store_key);
            const char *bytes = PyBytes_AS_STRING(store_key);
            int order = memcmp(bytes, high, length < high_length ? length : high_length);
            below = (order < 0 || (order == 0 && length < high_length))
                    && length > 0 && bytes[0] == WINDOW_PREFIX;
        }
        else
            below = 0;
        if (below && PyList_Append(keys, store_key) < 0) {
            Py_DECREF(store_key);
            Py_DECREF(iterator);
            goto done;
        }
        Py_DECREF(store_key);
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred())
        goto done;
    long long held;
    if (int_attr(self->cache, str_bytes, &held) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        store_key = PyList_GET_ITEM(keys, i);
        PyObject *entry = PyDict_GetItemWithError(self->entries, store_key);
        if (entry == NULL) {
            if (PyErr_Occurred())
                goto store_bytes;
            continue;
        }
        Py_INCREF(entry);
        if (PyObject_DelItem(self->entries, store_key) < 0) {
            Py_DECREF(entry);
            goto store_bytes;
        }
        held -= PyBytes_GET_SIZE(store_key) + self->entry_bytes;
        if (!PyList_Check(entry) || PyList_GET_SIZE(entry) < 5) {
            Py_DECREF(entry);
            PyErr_SetString(PyExc_TypeError, "a record cache entry is not a list");
            goto store_bytes;
        }
        PyObject *update = PyList_GET_ITEM(entry, 2);
        int dirty = PyObject_IsTrue(PyList_GET_ITEM(entry, 4));
        if (dirty < 0) {
            Py_DECREF(entry);
            goto store_bytes;
        }
        if (dirty && update != Py_None) { /* an update not forwarded yet */
            PyObject *args[5] = {self->aggregation, update, PyList_GET_ITEM(entry, 3),
                                 PyList_GET_ITEM(entry, 0), PyList_GET_ITEM(entry, 1)};
            PyObject *done = PyObject_VectorcallMethod(
                str_forward_update, args, 5, NULL);
            if (done == NULL) {
                Py_DECREF(entry);
                goto store_bytes;
            }
            Py_DECREF(done);
        }
        PyObject *pair = PyTuple_Pack(2, PyList_GET_ITEM(entry, 0), PyList_GET_ITEM(entry, 1));
        Py_DECREF(entry);
        if (pair == NULL)
            goto store_bytes;
        int set = PyDict_SetItem(closed, store_key, pair);
        Py_DECREF(pair);
        if (set < 0)
            goto store_bytes;
    }
    failed = 0;
store_bytes:
    if (set_int_attr(self->cache, str_bytes, held) < 0)
        failed = -1;
done:
    Py_DECREF(keys);
    return failed;
}

/* WindowedAggregate._close_windows(record, close). */
static PyObject *
close_windows(Core *self, PyObject *record, wide close)
{
    long long low, stored_to;
    if (int_attr(self->aggregation, str_gone_below, &low) < 0
        || int_attr(self->stored_to, str_time, &stored_to) < 0)
        return NULL;
    wide high = close - self->size + 1;
    wide closed_next = floor_div(close - self->size, self->advance) + 1;
    wide next_end = (closed_next > 0 ? closed_next : 0) * self->advance + self->size;
    if (high < LLONG_MIN || high > LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "window time out of the int64 range");
        return NULL;
    }
    if (set_int_attr(self->aggregation, str_closed_to, close) < 0
        || set_int_attr(self->aggregation, str_next_end, next_end) < 0
        || set_int_attr(self->aggregation, str_gone_below, high > low ? high : low) < 0)
        return NULL;
    PyObject *closed, *high_key = NULL, *keys = NULL, *stored = NULL;
    PyObject *out = NULL;
    if (low <= stored_to) {
        PyObject *args[3] = {self->aggregation, PyLong_FromLongLong(low),
                             PyLong_FromLongLong((long long)high)};
        if (args[1] == NULL || args[2] == NULL) {
            Py_XDECREF(args[1]);
            Py_XDECREF(args[2]);
            return NULL;
        }
        closed = PyObject_VectorcallMethod(str_stored_windows, args,
                                           3, NULL);
        Py_DECREF(args[1]);
        Py_DECREF(args[2]);
        if (closed != NULL && !PyDict_Check(closed)) {
            Py_DECREF(closed);
            PyErr_SetString(PyExc_TypeError, "_stored_windows did not give a dict");
            return NULL;
        }
    }
    else
        closed = PyDict_New();
    if (closed == NULL)
        return NULL;
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty == NULL)
        goto done;
    high_key = store_key_of((long long)high, empty);
    Py_DECREF(empty);
    if (high_key == NULL || take_cached(self, high_key, closed) < 0)
        goto done;
    keys = PyDict_Keys(closed);
    stored = PyList_New(0);
    if (keys == NULL || stored == NULL || PyList_Sort(keys) < 0) /* by start, then key */
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *store_key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(store_key) || PyBytes_GET_SIZE(store_key) < STORE_KEY_HEAD) {
            PyErr_SetString(PyExc_TypeError, "a window's store key is not bytes");
            goto done;
        }
        long long start = start_of(store_key);
        if (record != Py_None) {
            PyObject *pair = PyDict_GetItemWithError(closed, store_key);
            if (pair == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_KeyError, "a closed window went missing");
                goto done;
            }
            Py_INCREF(pair);
            int written = write_final(self, record, store_key, PyTuple_GET_ITEM(pair, 0),
                                      PyTuple_GET_ITEM(pair, 1));
            int failed = written < 0;
            if (written == 0) {
                PyObject *windowed = windowed_key(self, store_key, start);
                failed = windowed == NULL
                         || forward_final(self, record, windowed, PyTuple_GET_ITEM(pair, 0),
                                          PyTuple_GET_ITEM(pair, 1)) < 0;
                Py_XDECREF(windowed);
            }
            Py_DECREF(pair);
            if (failed)
                goto done;
        }
        if (start <= stored_to && PyList_Append(stored, store_key) < 0)
            goto done; /* else it was never written to the store */
    }
    out = PyObject_CallMethodOneArg(self->aggregation, str_delete_stored, stored);
done:
    Py_DECREF(closed);
    Py_XDECREF(high_key);
    Py_XDECREF(keys);
    Py_XDECREF(stored);
    return out;
}

static PyObject *
Core_close_windows(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long close;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "close_windows takes (record, close)");
        return NULL;
    }
    if (args[0] != Py_None && (!PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) < 4)) {
        PyErr_SetString(PyExc_TypeError, "close_windows takes a Record or None");
        return NULL;
    }
    if (as_int64(args[1], &close) < 0)
        return NULL;
    return close_windows(self, args[0], close);
}

#define REFERENCES(X)                                                                          \
    X(aggregation) X(cache) X(entries) X(stream_time) X(stored_to) X(task) X(key_serialize)    \
    X(key_deserialize) X(initializer) X(aggregator) X(forward) X(record_type)                  \
    X(windowed_type) X(window_type) X(sink_topic) X(sink_append) X(sink_sources_append)       \
    X(producer_type) X(no_source)

static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {
        "aggregation", "cache", "stream_time", "stored_to", "task", "key_serialize",
        "key_deserialize", "string_keys", "initializer", "aggregator", "count", "size",
        "advance", "grace", "emit_final", "forward", "record_type", "windowed_type",
        "window_type", "sink_topic", "sink_append", "sink_sources_append", "producer_type",
        "no_source", NULL};
    PyObject *aggregation, *cache, *stream_time, *stored_to, *task, *key_serialize,
        *key_deserialize, *initializer, *aggregator, *forward, *record_type, *windowed_type,
        *window_type, *sink_topic, *sink_append, *sink_sources_append, *producer_type,
        *no_source;
    long long size, advance, grace;
    int string_keys, count, emit_final;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$OOOOOOOpOOpLLLpOO!O!O!OOOO!O", names, &aggregation, &cache,
            &stream_time, &stored_to, &task, &key_serialize, &key_deserialize, &string_keys,
            &initializer, &aggregator, &count, &size, &advance, &grace, &emit_final, &forward,
            &PyType_Type, &record_type, &PyType_Type, &windowed_type, &PyType_Type,
            &window_type, &sink_topic, &sink_append, &sink_sources_append, &PyType_Type,
            &producer_type, &no_source))
        return -1;
    if (direct_sink_check(task, sink_append, sink_sources_append, producer_type) < 0)
        return -1;
    if (size <= 0 || advance <= 0 || advance > size || grace < 0) {
        PyErr_SetString(PyExc_ValueError, "windows need 0 < advance <= size and grace >= 0");
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        return -1;
    }
    PyObject *entries = PyObject_GetAttrString(cache, "entries");
    if (entries == NULL)
        return -1;
    if (!PyDict_Check(entries)) {
        Py_DECREF(entries);
        PyErr_SetString(PyExc_TypeError, "cache.entries must be an OrderedDict");
        return -1;
    }
    long long max_bytes, entry_bytes;
    if (int_attr(cache, str_max_bytes, &max_bytes) < 0
        || int_attr(cache, str_entry_bytes, &entry_bytes) < 0) {
        Py_DECREF(entries);
        return -1;
    }
#define TAKE(name)                                                                             \
    Py_INCREF(name);                                                                           \
    Py_XSETREF(self->name, name);
    REFERENCES(TAKE)
#undef TAKE
    Py_DECREF(entries); /* the reference getattr gave */
    self->size = size;
    self->advance = advance;
    self->grace = grace;
    self->max_bytes = max_bytes;
    self->entry_bytes = entry_bytes;
    self->string_keys = string_keys;
    self->count = count;
    self->emit_final = emit_final;
    return 0;
}

/* The aggregation, its cache and the task refer to one another and to this object: the
 * cycle collector has to see these references. */
static int
Core_traverse(Core *self, visitproc visit, void *arg)
{
#define VISIT(name) Py_VISIT(self->name);
    REFERENCES(VISIT)
#undef VISIT
    return 0;
}

static int
Core_clear(Core *self)
{
#define CLEAR(name) Py_CLEAR(self->name);
    REFERENCES(CLEAR)
#undef CLEAR
    Py_CLEAR(self->last_start); /* an int: nothing for the collector to visit */
    return 0;
}

static void
Core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Core whose __init__ has not run (or failed), or was cleared, holds NULL references:
 * refuse its methods rather than crash. */
static int
check_ready(Core *self)
{
    if (self->window_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return -1;
    }
    return 0;
}

static PyObject *
Core_process_checked(Core *self, PyObject *record)
{
    return check_ready(self) < 0 ? NULL : Core_process(self, record);
}

static PyObject *
Core_close_windows_checked(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    return check_ready(self) < 0 ? NULL : Core_close_windows(self, args, nargs);
}

static PyMethodDef Core_methods[] = {
    {"process", (PyCFunction)Core_process_checked, METH_O,
     "One record into its windows (WindowedAggregate.process)."},
    {"close_windows", (PyCFunction)(void (*)(void))Core_close_windows_checked, METH_FASTCALL,
     "Windows ended by `close` leave; their final results go on (_close_windows)."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.dsl._window_core.Core",
    .tp_doc = "The per-record path of WindowedAggregate (see window_aggregate.py).",
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_window_core", "WindowedAggregate's per-record path in C.", -1,
};

PyMODINIT_FUNC
PyInit__window_core(void)
{
    if (window_names() < 0)
        return NULL;
    CORES_INTERN(str_next_end, "next_end")
    CORES_INTERN(str_closed_to, "closed_to")
    CORES_INTERN(str_gone_below, "gone_below")
    CORES_INTERN(str_pending_close, "pending_close")
    CORES_INTERN(str_read, "_read")
    CORES_INTERN(str_stored_windows, "_stored_windows")
    CORES_INTERN(str_delete_stored, "_delete_stored")
    CORES_INTERN(str_forward_update, "_forward")
    return core_module(&module, &CoreType);
}
