/* The per-record path of DeduplicationProcessor (KIP-655), in C.
 *
 * `Core.process(record)` and `Core.purge(horizon)` do exactly what `_DedupCore.process` and
 * `_DedupCore.purge` in dedup.py do for the case that runs in production: writes held until
 * the commit (READ_COMMITTED) and the runtime's own task (its stream time and current record
 * read directly, as `dsl.processor.EngineTask` declares them). dedup.py is the reference: read it first; every step below names the line
 * of Python it stands for. The state stays in Python objects (the entries and pending dicts,
 * the in-store set, the in-order deque and the expiry heap), shared with the processor, which
 * hands the pending writes to the store at the commit. `lookup` (None, or a callable the
 * processor sets once its entries no longer hold every stored id) answers a miss of `entries`
 * from the store. What C saves is the interpreter's
 * work per record around those objects: ~1.5 us of ~5 us per record in the bench's task.
 *
 * Timestamps and offsets are int64 in Kafka; the rule's differences are taken in 128 bits so
 * that no pair of int64 values can overflow them, as Python's ints cannot.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_cores.h"


static PyObject *str_stream_time, *str_current, *no_offset, *empty_bytes;

typedef struct {
    PyObject_HEAD
    PyObject *id_of, *forward, *task, *memory_key, *lookup;
    PyObject *entries, *pending, *in_store, *in_order, *expiry;
    PyObject *in_order_append, *in_order_popleft, *heappush, *heappop;
    long long interval, purge_slack, purge_after, pushed;
    long long forwarded, dropped, late, pending_entries, pending_bytes;
    int per_key;
} Core;

static long long
clamp(wide value)
{
    if (value > LLONG_MAX)
        return LLONG_MAX;
    if (value < LLONG_MIN)
        return LLONG_MIN;
    return (long long)value;
}

/* _held_size(key): characters of a str key + 2, of a (str, str) pair + 12, bytes' length. */
static Py_ssize_t
held_size(PyObject *key)
{
    if (PyUnicode_CheckExact(key))
        return PyUnicode_GET_LENGTH(key) + 2;
    if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) == 2) {
        Py_ssize_t first = PyObject_Length(PyTuple_GET_ITEM(key, 0));
        Py_ssize_t second = PyObject_Length(PyTuple_GET_ITEM(key, 1));
        if (first < 0 || second < 0)
            return -1;
        return first + second + 12;
    }
    return PyObject_Length(key);
}

/* The first item of an index item: its timestamp. */
static int
item_timestamp(PyObject *item, long long *out)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 3) {
        PyErr_SetString(PyExc_TypeError, "dedup index item is not a tuple");
        return -1;
    }
    return as_int64(PyTuple_GET_ITEM(item, 0), out);
}

/* One index item leaving: _expire's `if get(id_key) is entry: del entries[id_key]`, then
 * _purge's bookkeeping of the delete. */
static int
expire(Core *self, PyObject *key, PyObject *entry, long long *count, long long *nbytes)
{
    PyObject *current = PyDict_GetItemWithError(self->entries, key);
    if (current != entry)
        return current == NULL && PyErr_Occurred() ? -1 : 0;
    Py_INCREF(key);
    int result = -1;
    if (PyDict_DelItem(self->entries, key) < 0)
        goto done;
    Py_ssize_t size = held_size(key);
    if (size < 0)
        goto done;
    /* What the held writes counted for this id before: nothing, a delete or a put. */
    PyObject *before = PyDict_GetItemWithError(self->pending, key);
    if (before == NULL && PyErr_Occurred())
        goto done;
    int in_store = PySet_Contains(self->in_store, key);
    if (in_store < 0)
        goto done;
    if (in_store) {
        if (PyDict_SetItem(self->pending, key, Py_None) < 0)  /* a delete */
            goto done;
        if (before == NULL) {  /* a new held delete: its key */
            *count += 1;
            *nbytes += size;
        }
        else if (before != Py_None)  /* a held put becomes a delete: its entry goes */
            *nbytes -= 16;
    }
    else if (before != NULL) {  /* never handed over: nothing to delete */
        *count -= 1;
        *nbytes -= before == Py_None ? size : size + 16;
        if (PyDict_DelItem(self->pending, key) < 0)
            goto done;
    }
    result = 0;
done:
    Py_DECREF(key);
    return result;
}

/* _DedupCore.purge(horizon). */
static int
purge(Core *self, wide horizon)
{
    long long count = 0, nbytes = 0, timestamp;
    int result = -1;
    self->purge_after = clamp(horizon + self->purge_slack);
    for (;;) {
        Py_ssize_t size = PyObject_Length(self->in_order);
        if (size < 0)
            goto done;
        if (size == 0)
            break;
        PyObject *head = PySequence_GetItem(self->in_order, 0);
        if (head == NULL)
            goto done;
        int failed = item_timestamp(head, &timestamp);
        Py_DECREF(head);
        if (failed)
            goto done;
        if ((wide)timestamp >= horizon)
            break;
        PyObject *item = PyObject_CallNoArgs(self->in_order_popleft);
        if (item == NULL)
            goto done;
        failed = expire(self, PyTuple_GET_ITEM(item, 1), PyTuple_GET_ITEM(item, 2), &count,
                        &nbytes);
        Py_DECREF(item);
        if (failed)
            goto done;
    }
    while (PyList_GET_SIZE(self->expiry) > 0) {
        PyObject *head = PyList_GET_ITEM(self->expiry, 0);
        if (!PyTuple_Check(head) || PyTuple_GET_SIZE(head) != 4) {
            PyErr_SetString(PyExc_TypeError, "dedup expiry heap item is not a 4-tuple");
            goto done;
        }
        if (as_int64(PyTuple_GET_ITEM(head, 0), &timestamp) < 0)
            goto done;
        if ((wide)timestamp >= horizon)
            break;
        PyObject *item = PyObject_CallOneArg(self->heappop, self->expiry);
        if (item == NULL)
            goto done;
        int failed = expire(self, PyTuple_GET_ITEM(item, 2), PyTuple_GET_ITEM(item, 3), &count,
                            &nbytes);
        Py_DECREF(item);
        if (failed)
            goto done;
    }
    result = 0;
done:
    self->pending_entries += count;  /* what left before a failure, as in Python */
    self->pending_bytes += nbytes;
    return result;
}

static PyObject *
Core_purge(Core *self, PyObject *horizon)
{
    long long value;
    if (as_int64(horizon, &value) < 0)
        return NULL;
    if (purge(self, value) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The id's in-memory key (a new reference), or NULL with *identity_none set when the id is
 * None, or NULL with an exception. */
static PyObject *
id_key_of(Core *self, PyObject *key, PyObject *value, int *identity_none)
{
    *identity_none = 0;
    if (self->per_key && key == Py_None) {
        *identity_none = 1;
        return NULL;
    }
    PyObject *args[2] = {key, value};
    PyObject *identity = PyObject_Vectorcall(self->id_of, args, 2, NULL);
    if (identity == NULL)
        return NULL;
    if (identity == Py_None) {
        Py_DECREF(identity);
        *identity_none = 1;
        return NULL;
    }
    PyObject *id_key;
    if (self->per_key) {
        PyObject *pair = PyTuple_Pack(2, key, identity);
        if (pair == NULL || (PyUnicode_CheckExact(key) && PyUnicode_CheckExact(identity)))
            id_key = pair;  /* (str key, str id): the pair itself */
        else {
            id_key = PyObject_CallOneArg(self->memory_key, pair);
            Py_DECREF(pair);
        }
    }
    else if (PyUnicode_CheckExact(identity)) {
        Py_INCREF(identity);
        id_key = identity;
    }
    else
        id_key = PyObject_CallOneArg(self->memory_key, identity);
    Py_DECREF(identity);
    return id_key;
}

/* self.forwarded += 1; self._forward(record): None, or NULL with the exception. */
static PyObject *
forward(Core *self, PyObject *record)
{
    self->forwarded += 1;
    PyObject *result = PyObject_CallOneArg(self->forward, record);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* _DedupCore.process(record), buffered, with the runtime's task. */
static PyObject *
Core_process(Core *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 3) {
        PyErr_SetString(PyExc_TypeError, "a record is a (key, value, timestamp, headers) tuple");
        return NULL;
    }
    PyObject *timestamp_object = PyTuple_GET_ITEM(record, 2);
    int identity_none;
    PyObject *id_key = id_key_of(self, PyTuple_GET_ITEM(record, 0), PyTuple_GET_ITEM(record, 1),
                                 &identity_none);
    if (id_key == NULL)
        return identity_none ? forward(self, record) : NULL;

    PyObject *offset_object = NULL, *entry = NULL, *item = NULL, *result = NULL;
    PyObject *looked_up = NULL;
    long long stream_time, timestamp, offset = 0, entry_timestamp, entry_offset;
    int has_offset = 0;
    PyObject *number = PyObject_GetAttr(self->task, str_stream_time);
    if (number == NULL)
        goto done;
    int failed = as_int64(number, &stream_time);
    Py_DECREF(number);
    if (failed)
        goto done;
    PyObject *current = PyObject_GetAttr(self->task, str_current);
    if (current == NULL)
        goto done;
    if (current != Py_None) {  /* offset = None if current is None else current[2] */
        offset_object = PySequence_GetItem(current, 2);
        Py_DECREF(current);
        if (offset_object == NULL)
            goto done;
        if (offset_object != Py_None) {
            if (as_int64(offset_object, &offset) < 0)
                goto done;
            has_offset = 1;
        }
    }
    else
        Py_DECREF(current);
    if (as_int64(timestamp_object, &timestamp) < 0)
        goto done;

    PyObject *stored = PyDict_GetItemWithError(self->entries, id_key);
    if (stored == NULL && PyErr_Occurred())
        goto done;
    if (stored == NULL && self->lookup != NULL && self->lookup != Py_None) {
        /* stored = lookup(id_key) if lookup is not None and stored is None */
        looked_up = PyObject_CallOneArg(self->lookup, id_key);
        if (looked_up == NULL)
            goto done;
        if (looked_up != Py_None)
            stored = looked_up;
    }
    if (stored != NULL) {
        if (!PyTuple_Check(stored) || PyTuple_GET_SIZE(stored) != 2) {
            PyErr_SetString(PyExc_TypeError, "dedup entry is not a (timestamp, offset) pair");
            goto done;
        }
        if (as_int64(PyTuple_GET_ITEM(stored, 0), &entry_timestamp) < 0
            || as_int64(PyTuple_GET_ITEM(stored, 1), &entry_offset) < 0)
            goto done;
        if (!((wide)stream_time - entry_timestamp > self->interval
              || (wide)entry_timestamp - timestamp > self->interval
              || (has_offset && offset == entry_offset))) {
            self->dropped += 1;
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    wide horizon = (wide)stream_time - self->interval;
    if ((wide)timestamp >= horizon) {
        entry = PyTuple_Pack(2, timestamp_object, has_offset ? offset_object : no_offset);
        if (entry == NULL || PyDict_SetItem(self->entries, id_key, entry) < 0)
            goto done;
        /* What the held writes counted for this id before: nothing, a delete or a put. */
        PyObject *before = PyDict_GetItemWithError(self->pending, id_key);
        if (before == NULL && PyErr_Occurred())
            goto done;
        int held_before = before != NULL, delete_before = before == Py_None;
        if (PyDict_SetItem(self->pending, id_key, entry) < 0)
            goto done;
        if (!held_before) {  /* a new held write: its key and the entry's 16 bytes */
            Py_ssize_t size = held_size(id_key);
            if (size < 0)
                goto done;
            self->pending_entries += 1;
            self->pending_bytes += size + 16;
        }
        else if (delete_before)  /* a held delete becomes a put again */
            self->pending_bytes += 16;
        /* if not in_order or timestamp >= in_order[-1][0]: in_order.append(...) */
        int in_order = 1;
        Py_ssize_t length = PyObject_Length(self->in_order);
        if (length < 0)
            goto done;
        if (length > 0) {
            long long last_timestamp;
            PyObject *last = PySequence_GetItem(self->in_order, length - 1);
            if (last == NULL)
                goto done;
            failed = item_timestamp(last, &last_timestamp);
            Py_DECREF(last);
            if (failed)
                goto done;
            in_order = timestamp >= last_timestamp;
        }
        if (in_order) {
            item = PyTuple_Pack(3, timestamp_object, id_key, entry);
            if (item == NULL)
                goto done;
            PyObject *appended = PyObject_CallOneArg(self->in_order_append, item);
            if (appended == NULL)
                goto done;
            Py_DECREF(appended);
        }
        else {  /* heapq.heappush(expiry, (timestamp, next(pushed), id_key, entry)) */
            PyObject *n = PyLong_FromLongLong(self->pushed++);
            if (n == NULL)
                goto done;
            item = PyTuple_Pack(4, timestamp_object, n, id_key, entry);
            Py_DECREF(n);
            if (item == NULL)
                goto done;
            PyObject *args[2] = {self->expiry, item};
            PyObject *pushed = PyObject_Vectorcall(self->heappush, args, 2, NULL);
            if (pushed == NULL)
                goto done;
            Py_DECREF(pushed);
        }
    }
    else
        self->late += 1;
    result = forward(self, record);
    if (result != NULL && horizon > self->purge_after && purge(self, horizon) < 0)
        Py_CLEAR(result);
done:
    Py_DECREF(id_key);
    Py_XDECREF(offset_object);
    Py_XDECREF(entry);
    Py_XDECREF(item);
    Py_XDECREF(looked_up);
    return result;
}

static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"interval", "purge_slack", "purge_after", "id_of", "per_key",
                            "forward", "task", "memory_key", "entries", "in_order",
                            "in_store", NULL};
    PyObject *id_of, *forward, *task, *memory_key, *entries, *in_order, *in_store;
    long long interval, purge_slack, purge_after;
    int per_key;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLLOpOOOO!OO!", names, &interval,
                                     &purge_slack, &purge_after, &id_of, &per_key, &forward,
                                     &task, &memory_key, &PyDict_Type, &entries, &in_order,
                                     &PySet_Type, &in_store))
        return -1;
    PyObject *heapq = PyImport_ImportModule("heapq");
    if (heapq == NULL)
        return -1;
    Py_XSETREF(self->heappush, PyObject_GetAttrString(heapq, "heappush"));
    Py_XSETREF(self->heappop, PyObject_GetAttrString(heapq, "heappop"));
    Py_DECREF(heapq);
    Py_XSETREF(self->in_order_append, PyObject_GetAttrString(in_order, "append"));
    Py_XSETREF(self->in_order_popleft, PyObject_GetAttrString(in_order, "popleft"));
    Py_XSETREF(self->pending, PyDict_New());
    Py_XSETREF(self->expiry, PyList_New(0));
    if (self->heappush == NULL || self->heappop == NULL || self->in_order_append == NULL
        || self->in_order_popleft == NULL || self->pending == NULL || self->expiry == NULL)
        return -1;
    Py_INCREF(id_of);
    Py_XSETREF(self->id_of, id_of);
    Py_INCREF(forward);
    Py_XSETREF(self->forward, forward);
    Py_INCREF(task);
    Py_XSETREF(self->task, task);
    Py_INCREF(memory_key);
    Py_XSETREF(self->memory_key, memory_key);
    Py_INCREF(entries);
    Py_XSETREF(self->entries, entries);
    Py_INCREF(in_order);
    Py_XSETREF(self->in_order, in_order);
    Py_INCREF(in_store);
    Py_XSETREF(self->in_store, in_store);
    Py_INCREF(Py_None);
    Py_XSETREF(self->lookup, Py_None);
    self->interval = interval;
    self->purge_slack = purge_slack;
    self->purge_after = purge_after;
    self->per_key = per_key;
    self->pushed = self->forwarded = self->dropped = self->late = 0;
    self->pending_entries = self->pending_bytes = 0;
    return 0;
}

/* The processor, its task and the forward function refer to one another and to this object:
 * the cycle collector has to see these references. */
static int
Core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(self->id_of);
    Py_VISIT(self->forward);
    Py_VISIT(self->task);
    Py_VISIT(self->memory_key);
    Py_VISIT(self->lookup);
    Py_VISIT(self->entries);
    Py_VISIT(self->pending);
    Py_VISIT(self->in_store);
    Py_VISIT(self->in_order);
    Py_VISIT(self->expiry);
    Py_VISIT(self->in_order_append);
    Py_VISIT(self->in_order_popleft);
    Py_VISIT(self->heappush);
    Py_VISIT(self->heappop);
    return 0;
}

/* `task` goes first: it is what the methods check, and any of the clears below may run
 * Python code (a deallocation) that reaches this object. */
static int
Core_clear(Core *self)
{
    Py_CLEAR(self->task);
    Py_CLEAR(self->id_of);
    Py_CLEAR(self->forward);
    Py_CLEAR(self->memory_key);
    Py_CLEAR(self->lookup);
    Py_CLEAR(self->entries);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->in_store);
    Py_CLEAR(self->in_order);
    Py_CLEAR(self->expiry);
    Py_CLEAR(self->in_order_append);
    Py_CLEAR(self->in_order_popleft);
    Py_CLEAR(self->heappush);
    Py_CLEAR(self->heappop);
    return 0;
}

static void
Core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A Core whose __init__ has not run (or failed) holds NULL references: refuse its methods
 * rather than crash. */
static PyObject *
Core_process_checked(Core *self, PyObject *record)
{
    if (self->task == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return NULL;
    }
    return Core_process(self, record);
}

static PyObject *
Core_purge_checked(Core *self, PyObject *horizon)
{
    if (self->task == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return NULL;
    }
    return Core_purge(self, horizon);
}

static PyMethodDef Core_methods[] = {
    {"process", (PyCFunction)Core_process_checked, METH_O,
     "KIP-655's rule for one record: forward it, or count it as dropped."},
    {"purge", (PyCFunction)Core_purge_checked, METH_O,
     "Delete the entries older than the horizon; the next purge waits for the slack."},
    {NULL},
};

#define COUNTER(name) {#name, T_LONGLONG, offsetof(Core, name), 0, NULL}
#define SHARED(name) {#name, T_OBJECT, offsetof(Core, name), READONLY, NULL}
static PyMemberDef Core_members[] = {
    COUNTER(forwarded), COUNTER(dropped), COUNTER(late), COUNTER(pending_entries),
    COUNTER(pending_bytes), COUNTER(purge_after), SHARED(entries), SHARED(pending),
    SHARED(in_store), SHARED(in_order), SHARED(expiry),
    {"lookup", T_OBJECT, offsetof(Core, lookup), 0, NULL}, {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.dsl._dedup_core.Core",
    .tp_doc = "The buffered per-record path of DeduplicationProcessor (see dedup._DedupCore).",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
};

/* dedup_store.store_key(key) for the in-memory keys memory_key gives (a str, a pair of strs,
 * or the store key itself); a new reference. Anything else: `fallback(key)`. */
static PyObject *
store_key_of(PyObject *key, PyObject *fallback)
{
    if (PyBytes_CheckExact(key)) {
        Py_INCREF(key);
        return key;
    }
    if (PyUnicode_CheckExact(key)) { /* b"i" + b"s" + the str's UTF-8 */
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(key, &size);
        if (text == NULL)
            return NULL;
        PyObject *out = PyBytes_FromStringAndSize(NULL, size + 2);
        if (out == NULL)
            return NULL;
        char *at = PyBytes_AS_STRING(out);
        at[0] = 'i';
        at[1] = 's';
        memcpy(at + 2, text, size);
        return out;
    }
    if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) == 2
        && PyUnicode_CheckExact(PyTuple_GET_ITEM(key, 0))
        && PyUnicode_CheckExact(PyTuple_GET_ITEM(key, 1))) {
        /* b"i(" + size(first) + b"s" + first + size(second) + b"s" + second, a size being
         * 4 bytes big-endian counting the b"s" (identity.canonical_bytes) */
        Py_ssize_t first_size, second_size;
        const char *first = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(key, 0), &first_size);
        if (first == NULL)
            return NULL;
        const char *second = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(key, 1), &second_size);
        if (second == NULL)
            return NULL;
        if (first_size >= UINT32_MAX || second_size >= UINT32_MAX)
            return PyObject_CallOneArg(fallback, key); /* struct says what is wrong */
        PyObject *out = PyBytes_FromStringAndSize(NULL, 12 + first_size + second_size);
        if (out == NULL)
            return NULL;
        unsigned char *at = (unsigned char *)PyBytes_AS_STRING(out);
        *at++ = 'i';
        *at++ = '(';
        const char *parts[2] = {first, second};
        Py_ssize_t sizes[2] = {first_size, second_size};
        for (int i = 0; i < 2; i++) {
            unsigned long long counted = (unsigned long long)sizes[i] + 1;
            for (int shift = 24; shift >= 0; shift -= 8)
                *at++ = (unsigned char)((counted >> shift) & 0xff);
            *at++ = 's';
            memcpy(at, parts[i], sizes[i]);
            at += sizes[i];
        }
        return out;
    }
    return PyObject_CallOneArg(fallback, key);
}

/* (key, value) appended to `writes`; steals both references (NULL: failed already). */
static int
append_write(PyObject *writes, PyObject *key, PyObject *value)
{
    if (key == NULL || value == NULL) {
        Py_XDECREF(key);
        Py_XDECREF(value);
        return -1;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(key);
        Py_DECREF(value);
        return -1;
    }
    PyTuple_SET_ITEM(pair, 0, key);
    PyTuple_SET_ITEM(pair, 1, value);
    int failed = PyList_Append(writes, pair);
    Py_DECREF(pair);
    return failed;
}

/* dedup_store.handed_over(pending, in_store, store_key): the reference. */
static PyObject *
handed_over(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyAnySet_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "handed_over(pending: dict, in_store: set, store_key)");
        return NULL;
    }
    PyObject *pending = args[0], *in_store = args[1], *fallback = args[2];
    PyObject *writes = PyList_New(0);
    if (writes == NULL)
        return NULL;
    Py_ssize_t position = 0;
    PyObject *id_key, *entry;
    while (PyDict_Next(pending, &position, &id_key, &entry)) {
        PyObject *stored = store_key_of(id_key, fallback);
        if (stored == NULL)
            goto failed;
        if (entry == Py_None) {
            Py_INCREF(Py_None);
            if (append_write(writes, stored, Py_None) < 0 || PySet_Discard(in_store, id_key) < 0)
                goto failed;
            continue;
        }
        long long timestamp, offset;
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) {
            Py_DECREF(stored);
            PyErr_SetString(PyExc_TypeError, "a dedup entry is not a (timestamp, offset) tuple");
            goto failed;
        }
        if (as_int64(PyTuple_GET_ITEM(entry, 0), &timestamp) < 0
            || as_int64(PyTuple_GET_ITEM(entry, 1), &offset) < 0) {
            Py_DECREF(stored);
            goto failed;
        }
        /* pack_entry(timestamp, offset): ">qq" */
        PyObject *packed = PyBytes_FromStringAndSize(NULL, 16);
        if (packed != NULL) {
            int64_into(PyBytes_AS_STRING(packed), timestamp);
            int64_into(PyBytes_AS_STRING(packed) + 8, offset);
        }
        /* index_key(timestamp, stored): b"x" + (timestamp + 2**63) as ">Q" + stored[1:] */
        Py_ssize_t size = PyBytes_GET_SIZE(stored);
        PyObject *index = PyBytes_FromStringAndSize(NULL, 8 + size);
        if (index != NULL) {
            char *at = PyBytes_AS_STRING(index);
            at[0] = 'x';
            int64_into(at + 1, (long long)((unsigned long long)timestamp ^ (1ULL << 63)));
            memcpy(at + 9, PyBytes_AS_STRING(stored) + 1, size - 1);
        }
        if (append_write(writes, stored, packed) < 0) { /* stole both */
            Py_XDECREF(index);
            goto failed;
        }
        Py_INCREF(empty_bytes);
        if (append_write(writes, index, empty_bytes) < 0 || PySet_Add(in_store, id_key) < 0)
            goto failed;
    }
    return writes;
failed:
    Py_DECREF(writes);
    return NULL;
}

static PyMethodDef module_functions[] = {
    {"handed_over", (PyCFunction)(void (*)(void))handed_over, METH_FASTCALL,
     "The store writes of the held ones at a hand-over (dedup_store.handed_over)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dedup_core", "DeduplicationProcessor's per-record path in C.", -1, module_functions,
};

PyMODINIT_FUNC
PyInit__dedup_core(void)
{
    CORES_INTERN(str_stream_time, "stream_time")
    CORES_INTERN(str_current, "current")
    no_offset = PyLong_FromLong(-1);
    empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    if (no_offset == NULL || empty_bytes == NULL)
        return NULL;
    return core_module(&module, &CoreType);
}
