/* The per-record path of one side of a stream-stream join (StreamStreamJoinSide), in C.
 *
 * `Core.process(record)` does exactly what `StreamStreamJoinSide.process` (with
 * `_WindowSide.fetch` / `put`, `_OuterRecords.add` / `remove` and `_emit_closed`) does in
 * stream_join.py, which is the reference: read it first. The state stays in the Python objects
 * both sides of the join share (the two `_WindowSide`s, the `_OuterRecords`, their
 * `KeptStreamTime`s and hints); the stores are read and written through their transactions'
 * own `get` / `put` / `delete` / `prefix`, taken once as the Python side takes its transaction
 * once, so the store sees the same calls in the same order. A segment's expiry goes through
 * `_WindowSide._drop_expired_segments` itself. What C saves is the interpreter's work per
 * record around those calls: the store keys and packed records, the parse of a fetched
 * segment, the serdes of the common cases, the joiner's call and the forward.
 *
 * Store layout (stream_join.py): a side's store holds b"w" + segment (8 bytes, big-endian) +
 * key -> (timestamp 8 bytes, value length 4 bytes, value)s in arrival order; the outer store
 * b"o" + timestamp (8 bytes) + side (1 byte) + key -> (value length 4 bytes, value)s.
 *
 * Timestamps are int64 in Kafka; their sums and differences with the windows (which may be
 * negative on one side) are taken in 128 bits, so no pair of int64 values can overflow them,
 * as Python's ints cannot. A timestamp outside int64 is refused (OverflowError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_cores.h"


static PyObject *str_time, *str_min_time, *str_next_drop_at, *str_drop_expired,
    *str_dropped_records, *outer_prefix_bytes;

#define RECORD_PREFIX 'w'
#define OUTER_PREFIX 'o'
#define LEFT_SIDE 1 /* at one timestamp the right side (0) sorts first, as in Kafka Streams */
#define RIGHT_SIDE 0
#define WINDOW_KEY_HEAD 9  /* b"w" + segment */
#define OUTER_KEY_HEAD 10  /* b"o" + timestamp + side */
#define RECORD_HEAD 12     /* a stored record: timestamp, value length */

/* How a serde's work is done: by calling it, or (the built-in bytes and string serdes) in C,
 * with the same result. */
enum serde_kind { SERDE_CALL = 0, SERDE_BYTES = 1, SERDE_STRING = 2 };

typedef struct {
    PyObject_HEAD
    /* The processor (its dropped_records), this side's and the other side's _WindowSide,
     * the _OuterRecords (None for an inner join) and their kept times. */
    PyObject *processor, *own, *outer, *own_observed, *others_observed, *stream_time;
    /* The stores' transactions' methods. */
    PyObject *own_get, *own_put, *others_get, *outer_get, *outer_put, *outer_delete,
        *outer_prefix;
    PyObject *key_serialize, *key_deserialize, *value_serialize, *other_deserialize,
        *left_deserialize, *right_deserialize, *joiner, *forward, *record_type;
    long long join_before, join_after, before, after, grace, retention, segment;
    int is_left, outer_side, key_kind, value_kind, other_kind, left_kind, right_kind;
} Core;

/* One fetched record of the other side: its timestamp and where its value is in `raw` (a
 * borrowed reference: the caller holds the raw segments). */
typedef struct {
    long long timestamp;
    PyObject *raw;
    Py_ssize_t offset, length, order;
} Partner;

/* owner.time (a KeptStreamTime's) as an int64. */
static int
time_of(PyObject *kept, long long *out)
{
    PyObject *value = PyObject_GetAttr(kept, str_time);
    if (value == NULL)
        return -1;
    int failed = as_int64(value, out);
    Py_DECREF(value);
    return failed;
}

/* Python's a // b for b > 0. */
static wide
floor_div(wide a, wide b)
{
    wide quotient = a / b;
    return (a % b != 0 && a < 0) ? quotient - 1 : quotient;
}

static void
pack_int64(unsigned char *bytes, long long number)
{
    unsigned long long value = (unsigned long long)number; /* two's complement, as ">q" */
    for (int i = 7; i >= 0; i--) {
        bytes[i] = (unsigned char)(value & 0xff);
        value >>= 8;
    }
}

static long long
unpack_int64(const unsigned char *bytes)
{
    unsigned long long value = 0;
    for (int i = 0; i < 8; i++)
        value = (value << 8) | bytes[i];
    return (long long)value;
}

static void
pack_uint32(unsigned char *bytes, Py_ssize_t number)
{
    unsigned long value = (unsigned long)number;
    for (int i = 3; i >= 0; i--) {
        bytes[i] = (unsigned char)(value & 0xff);
        value >>= 8;
    }
}

static Py_ssize_t
unpack_uint32(const unsigned char *bytes)
{
    return (Py_ssize_t)(((unsigned long)bytes[0] << 24) | ((unsigned long)bytes[1] << 16)
                        | ((unsigned long)bytes[2] << 8) | (unsigned long)bytes[3]);
}

/* `serialize(value) or b""` (a new reference), `kind` saying how. */
static PyObject *
serialized(PyObject *serialize, int kind, PyObject *value)
{
    PyObject *data;
    if (kind == SERDE_STRING && PyUnicode_CheckExact(value))
        data = PyUnicode_AsUTF8String(value); /* value.encode() */
    else if (kind == SERDE_BYTES && PyBytes_CheckExact(value)) {
        Py_INCREF(value); /* bytes(value) is value itself */
        data = value;
    }
    else
        data = PyObject_CallOneArg(serialize, value);
    if (data == NULL)
        return NULL;
    if (data == Py_None || (PyBytes_Check(data) && PyBytes_GET_SIZE(data) == 0)) {
        Py_DECREF(data);
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    if (!PyBytes_Check(data)) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_TypeError, "a serde did not give bytes");
        return NULL;
    }
    return data;
}

/* deserialize(bytes of `length` at `bytes`) (a new reference), `kind` saying how. */
static PyObject *
deserialized(PyObject *deserialize, int kind, const char *bytes, Py_ssize_t length)
{
    if (kind == SERDE_STRING) {
        PyObject *text = PyUnicode_DecodeUTF8(bytes, length, NULL);
        if (text != NULL || !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return text;
        PyErr_Clear(); /* the serde says what is wrong with it */
    }
    PyObject *data = PyBytes_FromStringAndSize(bytes, length);
    if (data == NULL || kind == SERDE_BYTES) /* bytes(data) is data itself */
        return data;
    PyObject *out = PyObject_CallOneArg(deserialize, data);
    Py_DECREF(data);
    return out;
}

/* b"w" + segment (8 bytes, big-endian) + key: a side's store key. */
static PyObject *
window_key(long long segment, PyObject *key)
{
    Py_ssize_t length = PyBytes_GET_SIZE(key);
    PyObject *out = PyBytes_FromStringAndSize(NULL, WINDOW_KEY_HEAD + length);
    if (out == NULL)
        return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    bytes[0] = RECORD_PREFIX;
    pack_int64(bytes + 1, segment);
    memcpy(bytes + WINDOW_KEY_HEAD, PyBytes_AS_STRING(key), length);
    return out;
}

/* b"o" + timestamp (8 bytes, big-endian) + side + key: _OuterRecords.store_key. */
static PyObject *
outer_key(long long timestamp, int side, PyObject *key)
{
    Py_ssize_t length = PyBytes_GET_SIZE(key);
    PyObject *out = PyBytes_FromStringAndSize(NULL, OUTER_KEY_HEAD + length);
    if (out == NULL)
        return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    bytes[0] = OUTER_PREFIX;
    pack_int64(bytes + 1, timestamp);
    bytes[9] = (unsigned char)side;
    memcpy(bytes + OUTER_KEY_HEAD, PyBytes_AS_STRING(key), length);
    return out;
}

/* A method of a transaction called with its arguments; 0, or -1 on an error. */
static int
call_done(PyObject *method, PyObject *const *args, size_t nargs)
{
    PyObject *done = PyObject_Vectorcall(method, args, nargs, NULL);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* transaction.get(store_key) (a new reference: bytes or None). */
static PyObject *
store_get(PyObject *get, PyObject *store_key)
{
    PyObject *raw = PyObject_CallOneArg(get, store_key);
    if (raw != NULL && raw != Py_None && !PyBytes_Check(raw)) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_TypeError, "a store gave a value that is not bytes");
        return NULL;
    }
    return raw;
}

/* transaction.put(store_key, packed if old is None else old + packed), `packed` being `head`
 * (its `head_length` bytes) + `value`. */
static int
store_append(PyObject *get, PyObject *put, PyObject *store_key, const unsigned char *head,
             Py_ssize_t head_length, PyObject *value)
{
    PyObject *old = store_get(get, store_key);
    if (old == NULL)
        return -1;
    Py_ssize_t old_length = old == Py_None ? 0 : PyBytes_GET_SIZE(old);
    Py_ssize_t length = PyBytes_GET_SIZE(value);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, old_length + head_length + length);
    if (packed == NULL) {
        Py_DECREF(old);
        return -1;
    }
    char *bytes = PyBytes_AS_STRING(packed);
    if (old_length > 0)
        memcpy(bytes, PyBytes_AS_STRING(old), old_length);
    memcpy(bytes + old_length, head, head_length);
    memcpy(bytes + old_length + head_length, PyBytes_AS_STRING(value), length);
    Py_DECREF(old);
    PyObject *args[2] = {store_key, packed};
    int failed = call_done(put, args, 2);
    Py_DECREF(packed);
    return failed;
}

/* A value's length as the stores pack it (">I"): struct refuses more, and so does this. */
static int
check_length(PyObject *value)
{
    if ((unsigned long long)PyBytes_GET_SIZE(value) > 0xffffffffULL) {
        PyErr_SetString(PyExc_OverflowError, "a value of 4 GiB or more cannot be stored");
        return -1;
    }
    return 0;
}

/* self.dropped_records += 1 (the processor's counter). */
static int
count_dropped(Core *self)
{
    PyObject *count = PyObject_GetAttr(self->processor, str_dropped_records);
    if (count == NULL)
        return -1;
    PyObject *one = PyLong_FromLong(1);
    PyObject *more = one == NULL ? NULL : PyNumber_Add(count, one);
    Py_DECREF(count);
    Py_XDECREF(one);
    if (more == NULL)
        return -1;
    int failed = PyObject_SetAttr(self->processor, str_dropped_records, more);
    Py_DECREF(more);
    return failed;
}

/* StreamStreamJoinSide._joined(key, this, other): the joiner gets the left value first. */
static PyObject *
joined_of(Core *self, PyObject *key, PyObject *this, PyObject *other)
{
    PyObject *args[3] = {key, self->is_left ? this : other, self->is_left ? other : this};
    return PyObject_Vectorcall(self->joiner, args, 3, NULL);
}

/* forward(Record(key, value, timestamp, headers)); steals `value` (NULL: an error). */
static int
forward_new(Core *self, PyObject *key, PyObject *value, PyObject *timestamp, PyObject *headers)
{
    if (value == NULL)
        return -1;
    /* A Record made as tuple.__new__(Record, items) makes it (tuple's subtype_new: the
     * type's tp_alloc, then the items): Record adds nothing to the tuple but its type. */
    PyTypeObject *type = (PyTypeObject *)self->record_type;
    PyObject *out = type->tp_alloc(type, 4);
    if (out == NULL) {
        Py_DECREF(value);
        return -1;
    }
    Py_INCREF(key);
    Py_INCREF(timestamp);
    Py_INCREF(headers);
    PyTuple_SET_ITEM(out, 0, key);
    PyTuple_SET_ITEM(out, 1, value);
    PyTuple_SET_ITEM(out, 2, timestamp);
    PyTuple_SET_ITEM(out, 3, headers);
    PyObject *done = PyObject_CallOneArg(self->forward, out);
    Py_DECREF(out);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* The other side's records that a record joins, as _WindowSide.fetch gives them. */
typedef struct {
    Partner *items;
    Py_ssize_t count, capacity;
    Partner local[16]; /* most records have a partner or two: no allocation for them */
} Partners;

static int
partners_add(Partners *partners, Partner partner)
{
    if (partners->count == partners->capacity) {
        Py_ssize_t capacity = partners->capacity * 2;
        Partner *items = PyMem_Malloc(capacity * sizeof(Partner));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(items, partners->items, partners->count * sizeof(Partner));
        if (partners->items != partners->local)
            PyMem_Free(partners->items);
        partners->items = items;
        partners->capacity = capacity;
    }
    partners->items[partners->count++] = partner;
    return 0;
}

/* By timestamp, then arrival: Python's stable sort by timestamp. */
static int
by_time(const void *a, const void *b)
{
    const Partner *one = a, *two = b;
    if (one->timestamp != two->timestamp)
        return one->timestamp < two->timestamp ? -1 : 1;
    return one->order < two->order ? -1 : one->order > two->order;
}

/* _WindowSide.fetch(key, time_from, time_to) of the other side: the records of `key` with
 * timestamps in [time_from, time_to] that are not expired, in time order (arrival order
 * within one timestamp), into `partners`; the segments read are held in `raws`. */
static int
fetch(Core *self, PyObject *key, wide time_from, wide time_to, PyObject *raws,
      Partners *partners)
{
    long long observed;
    if (time_of(self->others_observed, &observed) < 0)
        return -1;
    wide live_from = (wide)observed - self->retention + 1;
    if (live_from > time_from)
        time_from = live_from;
    /* Nothing later than the latest timestamp put is stored: the segments after it are not
     * looked up. */
    if (observed < time_to)
        time_to = observed;
    if (time_to < time_from)
        return 0;
    wide last = floor_div(time_to, self->segment);
    for (wide segment = floor_div(time_from, self->segment); segment <= last; segment++) {
        PyObject *store_key = window_key((long long)segment, key);
        if (store_key == NULL)
            return -1;
        PyObject *raw = store_get(self->others_get, store_key);
        Py_DECREF(store_key);
        if (raw == NULL)
            return -1;
        if (raw == Py_None) {
            Py_DECREF(raw);
            continue;
        }
        int held = PyList_Append(raws, raw);
        Py_DECREF(raw); /* the list holds it */
        if (held < 0)
            return -1;
        const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(raw);
        Py_ssize_t position = 0, size = PyBytes_GET_SIZE(raw), first = partners->count;
        while (position < size) {
            if (size - position < RECORD_HEAD) {
                PyErr_SetString(PyExc_ValueError, "a join store's segment is truncated");
                return -1;
            }
            long long timestamp = unpack_int64(bytes + position);
            Py_ssize_t length = unpack_uint32(bytes + position + 8);
            position += RECORD_HEAD;
            if (size - position < length) {
                PyErr_SetString(PyExc_ValueError, "a join store's segment is truncated");
                return -1;
            }
            if (time_from <= timestamp && timestamp <= time_to) {
                Partner partner = {timestamp, raw, position, length, partners->count};
                if (partners_add(partners, partner) < 0)
                    return -1;
            }
            position += length;
        }
        if (partners->count - first > 1)
            qsort(partners->items + first, partners->count - first, sizeof(Partner), by_time);
    }
    return 0;
}

/* _WindowSide.put(key, timestamp, value) of this side. */
static int
own_put(Core *self, PyObject *key, long long timestamp, PyObject *timestamp_object,
        PyObject *value)
{
    long long observed;
    if (time_of(self->own_observed, &observed) < 0)
        return -1;
    if (timestamp > observed) {
        if (PyObject_SetAttr(self->own_observed, str_time, timestamp_object) < 0)
            return -1;
        wide next_drop_at;
        if (wide_attr(self->own, str_next_drop_at, &next_drop_at) < 0)
            return -1;
        if (timestamp >= next_drop_at) {
            PyObject *done = PyObject_CallMethodNoArgs(self->own, str_drop_expired);
            if (done == NULL)
                return -1;
            Py_DECREF(done);
        }
    }
    else if (timestamp <= (wide)observed - self->retention)
        return 0; /* already expired: no fetch could see it */
    if (check_length(value) < 0)
        return -1;
    PyObject *store_key = window_key((long long)floor_div(timestamp, self->segment), key);
    if (store_key == NULL)
        return -1;
    unsigned char head[RECORD_HEAD];
    pack_int64(head, timestamp);
    pack_uint32(head + 8, PyBytes_GET_SIZE(value));
    int failed = store_append(self->own_get, self->own_put, store_key, head, RECORD_HEAD, value);
    Py_DECREF(store_key);
    return failed;
}

/* _OuterRecords.add(timestamp, side, key, value). */
static int
outer_add(Core *self, long long timestamp, PyObject *timestamp_object, int side, PyObject *key,
          PyObject *value)
{
    if (check_length(value) < 0)
        return -1;
    PyObject *store_key = outer_key(timestamp, side, key);
    if (store_key == NULL)
        return -1;
    unsigned char head[4];
    pack_uint32(head, PyBytes_GET_SIZE(value));
    int failed = store_append(self->outer_get, self->outer_put, store_key, head, 4, value);
    Py_DECREF(store_key);
    if (failed)
        return -1;
    /* min_time = timestamp if min_time is None else min(min_time, timestamp) */
    PyObject *min_time = PyObject_GetAttr(self->outer, str_min_time);
    if (min_time == NULL)
        return -1;
    int lower = 1;
    if (min_time != Py_None)
        lower = PyObject_RichCompareBool(timestamp_object, min_time, Py_LT);
    Py_DECREF(min_time);
    if (lower < 0)
        return -1;
    return lower ? PyObject_SetAttr(self->outer, str_min_time, timestamp_object) : 0;
}

/* _OuterRecords.remove(timestamp, side, key): a waiting record found its partner. */
static int
outer_remove(Core *self, long long timestamp, int side, PyObject *key)
{
    PyObject *store_key = outer_key(timestamp, side, key);
    if (store_key == NULL)
        return -1;
    PyObject *raw = store_get(self->outer_get, store_key);
    int failed = raw == NULL;
    if (raw != NULL && raw != Py_None)
        failed = call_done(self->outer_delete, &store_key, 1);
    Py_XDECREF(raw);
    Py_DECREF(store_key);
    return failed ? -1 : 0;
}

/* StreamStreamJoinSide._emit_closed(record): forward, with None, the waiting records whose
 * windows have closed. */
static int
emit_closed(Core *self, PyObject *record)
{
    long long stream_time;
    if (time_of(self->stream_time, &stream_time) < 0)
        return -1;
    PyObject *min_time = PyObject_GetAttr(self->outer, str_min_time);
    if (min_time == NULL)
        return -1;
    if (min_time != Py_None) {
        int overflow;
        long long earliest = PyLong_AsLongLongAndOverflow(min_time, &overflow);
        Py_DECREF(min_time);
        if (earliest == -1 && PyErr_Occurred())
            return -1;
        if (overflow == 0 && (wide)earliest + self->join_after + self->grace >= stream_time)
            return 0; /* nothing waiting can have closed yet */
        if (overflow > 0)
            return 0;
    }
    else
        Py_DECREF(min_time);
    if (PyObject_SetAttr(self->outer, str_min_time, Py_None) < 0)
        return -1;
    int left_open = 0, right_open = 0, failed = -1;
    PyObject *emitted = PyList_New(0), *scan = NULL, *iterator = NULL, *item = NULL;
    PyObject *timestamp_object = NULL, *key_value = NULL;
    if (emitted == NULL)
        return -1;
    scan = PyObject_CallOneArg(self->outer_prefix, outer_prefix_bytes);
    if (scan == NULL || (iterator = PyObject_GetIter(scan)) == NULL)
        goto done;
    /* One step per waiting record (several may share a store key), as Kafka Streams
     * iterates its list-valued store: the hint ends at the record it stopped at. */
    while ((item = PyIter_Next(iterator)) != NULL) {
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2
            || !PyBytes_Check(PyTuple_GET_ITEM(item, 0))
            || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))
            || PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 0)) < OUTER_KEY_HEAD) {
            PyErr_SetString(PyExc_TypeError, "the outer store gave an unexpected entry");
            goto done;
        }
        PyObject *store_key = PyTuple_GET_ITEM(item, 0), *raw = PyTuple_GET_ITEM(item, 1);
        const unsigned char *head = (const unsigned char *)PyBytes_AS_STRING(store_key);
        long long timestamp = unpack_int64(head + 1);
        int left = head[9] == LEFT_SIDE;
        const char *bytes = PyBytes_AS_STRING(raw);
        Py_ssize_t position = 0, size = PyBytes_GET_SIZE(raw);
        Py_CLEAR(timestamp_object);
        Py_CLEAR(key_value);
        if ((timestamp_object = PyLong_FromLongLong(timestamp)) == NULL)
            goto done;
        while (position < size) {
            if (size - position < 4) {
                PyErr_SetString(PyExc_ValueError, "an outer store entry is truncated");
                goto done;
            }
            Py_ssize_t length = unpack_uint32((const unsigned char *)bytes + position);
            position += 4;
            if (size - position < length) {
                PyErr_SetString(PyExc_ValueError, "an outer store entry is truncated");
                goto done;
            }
            position += length;
            if (PyObject_SetAttr(self->outer, str_min_time, timestamp_object) < 0)
                goto done;
            if (left_open && right_open)
                goto finished;
            /* A left record waits for right records up to `after` later, a right one for
             * left records up to `before` later. */
            wide look = left ? self->after : self->before;
            if ((wide)timestamp + look + self->grace >= stream_time) {
                if (left)
                    left_open = 1;
                else
                    right_open = 1;
                continue;
            }
            Py_CLEAR(key_value); /* deserialized per record, as the reference does */
            key_value = deserialized(self->key_deserialize, self->key_kind,
                                     (const char *)head + OUTER_KEY_HEAD,
                                     PyBytes_GET_SIZE(store_key) - OUTER_KEY_HEAD);
            if (key_value == NULL)
                goto done;
            PyObject *value = deserialized(left ? self->left_deserialize : self->right_deserialize,
                                           left ? self->left_kind : self->right_kind,
                                           bytes + position - length, length);
            if (value == NULL)
                goto done;
            PyObject *args[3] = {key_value, left ? value : Py_None, left ? Py_None : value};
            PyObject *joined = PyObject_Vectorcall(self->joiner, args, 3, NULL);
            Py_DECREF(value);
            if (forward_new(self, key_value, joined, timestamp_object,
                            PyTuple_GET_ITEM(record, 3)) < 0)
                goto done;
            Py_ssize_t count = PyList_GET_SIZE(emitted);
            int same = 0;
            if (count > 0) {
                same = PyObject_RichCompareBool(PyList_GET_ITEM(emitted, count - 1), store_key,
                                                Py_EQ);
                if (same < 0)
                    goto done;
            }
            if (!same && PyList_Append(emitted, store_key) < 0)
                goto done;
        }
        Py_CLEAR(item);
    }
    if (PyErr_Occurred())
        goto done;
finished:
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(emitted); i++) {
        PyObject *store_key = PyList_GET_ITEM(emitted, i);
        if (call_done(self->outer_delete, &store_key, 1) < 0)
            goto done;
    }
    failed = 0;
done:
    Py_XDECREF(item);
    Py_XDECREF(timestamp_object);
    Py_XDECREF(key_value);
    Py_XDECREF(iterator);
    Py_XDECREF(scan);
    Py_DECREF(emitted);
    return failed;
}

/* What follows the fetch in StreamStreamJoinSide.process: each partner joined and forwarded,
 * then this side's record waits (outer) or goes on alone, and is stored. */
static int
join_and_store(Core *self, PyObject *record, long long timestamp, wide time_to,
               PyObject *key_data, Partners *partners)
{
    PyObject *key = PyTuple_GET_ITEM(record, 0), *value = PyTuple_GET_ITEM(record, 1);
    PyObject *timestamp_object = PyTuple_GET_ITEM(record, 2);
    PyObject *headers = PyTuple_GET_ITEM(record, 3);
    int other_side = self->is_left ? RIGHT_SIDE : LEFT_SIDE;
    for (Py_ssize_t i = 0; i < partners->count; i++) {
        Partner *partner = &partners->items[i];
        if (self->outer != Py_None && outer_remove(self, partner->timestamp, other_side,
                                                   key_data) < 0)
            return -1;
        PyObject *other = deserialized(self->other_deserialize, self->other_kind,
                                       PyBytes_AS_STRING(partner->raw) + partner->offset,
                                       partner->length);
        if (other == NULL)
            return -1;
        PyObject *joined = joined_of(self, key, value, other);
        Py_DECREF(other);
        if (joined == NULL)
            return -1;
        /* the joined record's timestamp is the later of the two */
        PyObject *later;
        if (timestamp >= partner->timestamp) {
            Py_INCREF(timestamp_object);
            later = timestamp_object;
        }
        else if ((later = PyLong_FromLongLong(partner->timestamp)) == NULL) {
            Py_DECREF(joined);
            return -1;
        }
        int failed = forward_new(self, key, joined, later, headers);
        Py_DECREF(later);
        if (failed)
            return -1;
    }
    PyObject *value_data = serialized(self->value_serialize, self->value_kind, value);
    if (value_data == NULL)
        return -1;
    int failed = 0;
    if (self->outer_side && partners->count == 0) {
        long long stream_time = 0;
        if (self->stream_time != Py_None && time_of(self->stream_time, &stream_time) < 0)
            failed = -1;
        else if (self->outer == Py_None || time_to < stream_time) /* past its window: alone */
            failed = forward_new(self, key, joined_of(self, key, value, Py_None),
                                 timestamp_object, headers);
        else
            failed = outer_add(self, timestamp, timestamp_object,
                               self->is_left ? LEFT_SIDE : RIGHT_SIDE, key_data, value_data);
    }
    if (!failed)
        failed = own_put(self, key_data, timestamp, timestamp_object, value_data);
    Py_DECREF(value_data);
    return failed;
}

/* StreamStreamJoinSide.process(record). */
static PyObject *
Core_process(Core *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4) {
        PyErr_SetString(PyExc_TypeError, "process takes a Record");
        return NULL;
    }
    PyObject *key = PyTuple_GET_ITEM(record, 0), *value = PyTuple_GET_ITEM(record, 1);
    PyObject *timestamp_object = PyTuple_GET_ITEM(record, 2);
    long long timestamp, stream_time = 0;
    if (as_int64(timestamp_object, &timestamp) < 0)
        return NULL;
    int outer = self->outer != Py_None;
    if (outer) { /* the join's stream time */
        if (time_of(self->stream_time, &stream_time) < 0)
            return NULL;
        if (timestamp > stream_time) {
            if (PyObject_SetAttr(self->stream_time, str_time, timestamp_object) < 0)
                return NULL;
            stream_time = timestamp;
        }
    }
    if (key == Py_None || value == Py_None) {
        int failed;
        if (self->outer_side && key == Py_None && value != Py_None) /* goes on alone */
            failed = forward_new(self, key, joined_of(self, key, value, Py_None),
                                 timestamp_object, PyTuple_GET_ITEM(record, 3));
        else
            failed = count_dropped(self);
        if (failed)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *key_data = serialized(self->key_serialize, self->key_kind, key);
    if (key_data == NULL)
        return NULL;
    PyObject *raws = NULL;
    Partners partners = {.count = 0, .capacity = 16};
    partners.items = partners.local;
    int failed = -1;
    if (outer && timestamp == stream_time && emit_closed(self, record) < 0)
        goto done;
    wide time_from = (wide)timestamp - self->join_before;
    wide time_to = (wide)timestamp + self->join_after;
    if ((raws = PyList_New(0)) == NULL
        || fetch(self, key_data, time_from > 0 ? time_from : 0, time_to > 0 ? time_to : 0, raws,
                 &partners) < 0)
        goto done;
    failed = join_and_store(self, record, timestamp, time_to, key_data, &partners);
done:
    if (partners.items != partners.local)
        PyMem_Free(partners.items);
    Py_XDECREF(raws);
    Py_DECREF(key_data);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

#define REFERENCES(X)                                                                          \
    X(processor) X(own) X(outer) X(own_observed) X(others_observed) X(stream_time) X(own_get) \
    X(own_put) X(others_get) X(outer_get) X(outer_put) X(outer_delete) X(outer_prefix)        \
    X(key_serialize) X(key_deserialize) X(value_serialize) X(other_deserialize)               \
    X(left_deserialize) X(right_deserialize) X(joiner) X(forward) X(record_type)

static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {
        "processor", "own", "outer", "own_observed", "others_observed", "stream_time",
        "own_get", "own_put", "others_get", "outer_get", "outer_put", "outer_delete",
        "outer_prefix", "key_serialize", "key_deserialize", "value_serialize",
        "other_deserialize", "left_deserialize", "right_deserialize", "joiner", "forward",
        "record_type", "key_kind", "value_kind", "other_kind", "left_kind", "right_kind",
        "join_before", "join_after", "before", "after", "grace", "retention", "segment",
        "is_left", "outer_side", NULL};
    PyObject *processor, *own, *outer, *own_observed, *others_observed, *stream_time, *own_get,
        *own_put, *others_get, *outer_get, *outer_put, *outer_delete, *outer_prefix,
        *key_serialize, *key_deserialize, *value_serialize, *other_deserialize,
        *left_deserialize, *right_deserialize, *joiner, *forward, *record_type;
    int key_kind, value_kind, other_kind, left_kind, right_kind, is_left, outer_side;
    long long join_before, join_after, before, after, grace, retention, segment;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$OOOOOOOOOOOOOOOOOOOOOO!iiiiiLLLLLLLpp", names, &processor, &own,
            &outer, &own_observed, &others_observed, &stream_time, &own_get, &own_put,
            &others_get, &outer_get, &outer_put, &outer_delete, &outer_prefix, &key_serialize,
            &key_deserialize, &value_serialize, &other_deserialize, &left_deserialize,
            &right_deserialize, &joiner, &forward, &PyType_Type, &record_type, &key_kind,
            &value_kind, &other_kind, &left_kind, &right_kind, &join_before, &join_after,
            &before, &after, &grace, &retention, &segment, &is_left, &outer_side))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        return -1;
    }
    if (segment <= 0 || retention < 0 || grace < 0) {
        PyErr_SetString(PyExc_ValueError, "a join needs segment > 0, retention >= 0, grace >= 0");
        return -1;
    }
    int kinds[5] = {key_kind, value_kind, other_kind, left_kind, right_kind};
    for (int i = 0; i < 5; i++)
        if (kinds[i] < SERDE_CALL || kinds[i] > SERDE_STRING) {
            PyErr_SetString(PyExc_ValueError, "a serde kind is 0 (call), 1 (bytes), 2 (str)");
            return -1;
        }
    /* With the outer store, every one of its pieces is needed. */
    if (outer != Py_None
        && (stream_time == Py_None || outer_get == Py_None || outer_put == Py_None
            || outer_delete == Py_None || outer_prefix == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "an outer join needs its outer store's methods");
        return -1;
    }
#define TAKE(name)                                                                             \
    Py_INCREF(name);                                                                           \
    Py_XSETREF(self->name, name);
    REFERENCES(TAKE)
#undef TAKE
    self->key_kind = key_kind;
    self->value_kind = value_kind;
    self->other_kind = other_kind;
    self->left_kind = left_kind;
    self->right_kind = right_kind;
    self->join_before = join_before;
    self->join_after = join_after;
    self->before = before;
    self->after = after;
    self->grace = grace;
    self->retention = retention;
    self->segment = segment;
    self->is_left = is_left;
    self->outer_side = outer_side;
    return 0;
}

/* The processor, the join's state (through the stores' methods) and the task refer to one
 * another and to this object: the cycle collector has to see these references. */
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
static PyObject *
Core_process_checked(Core *self, PyObject *record)
{
    if (self->record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return NULL;
    }
    return Core_process(self, record);
}

static PyMethodDef Core_methods[] = {
    {"process", (PyCFunction)Core_process_checked, METH_O,
     "One record of this side joined and stored (StreamStreamJoinSide.process)."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.dsl._join_core.Core",
    .tp_doc = "The per-record path of one side of a stream-stream join (see stream_join.py).",
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
    PyModuleDef_HEAD_INIT, "_join_core", "A stream-stream join side's per-record path in C.", -1,
};

PyMODINIT_FUNC
PyInit__join_core(void)
{
    CORES_INTERN(str_time, "time")
    CORES_INTERN(str_min_time, "min_time")
    CORES_INTERN(str_next_drop_at, "next_drop_at")
    CORES_INTERN(str_drop_expired, "_drop_expired_segments")
    CORES_INTERN(str_dropped_records, "dropped_records")
    if ((outer_prefix_bytes = PyBytes_FromStringAndSize("o", 1)) == NULL)
        return NULL;
    return core_module(&module, &CoreType);
}
