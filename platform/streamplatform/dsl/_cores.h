/* What the C cores (_dedup_core.c, _window_core.c, _session_core.c, _sliding_core.c,
 * _join_core.c) share: Kafka's int64 times read from and written to their Python objects, the
 * 128-bit sums and differences of them, and a store transaction's put in its common case. Included by each core, after Python.h; every
 * function is static, so each core has its own copy and no symbol is exported. */
#ifndef STREAMPLATFORM_CORES_H
#define STREAMPLATFORM_CORES_H

#include <limits.h>

typedef __int128 wide;

#define CORES_UNUSED __attribute__((unused))

/* In a module init: `variable` = the interned str `text`, or return NULL. */
#define CORES_INTERN(variable, text)                                                           \
    if ((variable = PyUnicode_InternFromString(text)) == NULL)                                 \
        return NULL;

#ifdef CORES_WINDOW_NAMES
/* The windowed cores' (time, session, sliding) shared names: the aggregation's, the record
 * cache's and the task's attributes and methods they read, and constants; made by
 * window_names() in the module init. */
static PyObject *str_time, *str_current, *str_bytes, *str_dropped_records, *str_key, *str_window,
    *str_start, *str_end, *str_max_bytes, *str_entry_bytes, *str_put, *str_evict,
    *str_move_to_end, *empty_tuple, *one;
static CORES_UNUSED PyObject *zero;

static int
window_names(void)
{
    const struct { PyObject **variable; const char *text; } names[] = {
        {&str_time, "time"}, {&str_current, "current"}, {&str_bytes, "bytes"},
        {&str_dropped_records, "dropped_records"}, {&str_key, "key"}, {&str_window, "window"},
        {&str_start, "start"}, {&str_end, "end"}, {&str_max_bytes, "max_bytes"},
        {&str_entry_bytes, "_ENTRY_BYTES"}, {&str_put, "put"},
        {&str_evict, "evict_over_budget"}, {&str_move_to_end, "move_to_end"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].variable = PyUnicode_InternFromString(names[i].text)) == NULL)
            return -1;
    empty_tuple = PyTuple_New(0);
    one = PyLong_FromLong(1);
    zero = PyLong_FromLong(0);
    return empty_tuple == NULL || one == NULL || zero == NULL ? -1 : 0;
}
#endif

/* The end of every core's module init: `type` readied and added to the module `definition`
 * makes as "Core". A new reference, or NULL. */
static CORES_UNUSED PyObject *
core_module(PyModuleDef *definition, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0)
        return NULL;
    PyObject *module = PyModule_Create(definition);
    if (module == NULL)
        return NULL;
    Py_INCREF(type);
    if (PyModule_AddObject(module, "Core", (PyObject *)type) < 0) {
        Py_DECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

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

/* The big-endian int64 at `bytes`. */
static CORES_UNUSED long long
int64_at(const char *bytes)
{
    unsigned long long value = 0;
    for (int i = 0; i < 8; i++)
        value = (value << 8) | (unsigned char)bytes[i];
    return (long long)value;
}

/* `value` as 8 bytes at `bytes`, big-endian two's complement (struct's ">q"). */
static CORES_UNUSED void
int64_into(char *bytes, long long value)
{
    unsigned long long number = (unsigned long long)value;
    for (int i = 7; i >= 0; i--, number >>= 8)
        bytes[i] = (char)(number & 0xff);
}

/* result_serde.deserialize(bytes[:length]): Serdes.long()'s int in C for 8 bytes
 * (`long_results`), else the serde's call. A new reference. */
static CORES_UNUSED PyObject *
deserialize_result(PyObject *deserialize, int long_results, const char *bytes, Py_ssize_t length)
{
    if (long_results && length == 8)
        return PyLong_FromLongLong(int64_at(bytes));
    PyObject *data = PyBytes_FromStringAndSize(bytes, length);
    if (data == NULL)
        return NULL;
    PyObject *result = PyObject_CallOneArg(deserialize, data);
    Py_DECREF(data);
    return result;
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

/* A key's windows kept between records by a core (prefix -> its windows as the store and the
 * cache give them), at most `budget` bytes of them as the core counts them (`count` windows):
 * over it all are dropped, and the KEPT_FORGETS-th time keeping them is off for good (the
 * keys' windows outgrow the budget, and reading them back costs more than it saves).
 * `by_key` NULL: off. */
#define KEPT_FORGETS 4

typedef struct {
    PyObject *by_key;
    long long budget, count, forgets;
} KeptWindows;

static CORES_UNUSED int
kept_init(KeptWindows *kept, long long budget)
{
    Py_CLEAR(kept->by_key);
    kept->budget = budget;
    kept->count = kept->forgets = 0;
    return budget > 0 && (kept->by_key = PyDict_New()) == NULL ? -1 : 0;
}

/* Every kept window dropped (over the budget, or after a write that failed half-way). */
static CORES_UNUSED void
kept_forget(KeptWindows *kept)
{
    if (kept->by_key != NULL)
        PyDict_Clear(kept->by_key);
    kept->count = 0;
}

/* Over the budget: every kept window dropped, and keeping them off the KEPT_FORGETS-th time. */
static CORES_UNUSED void
kept_over_budget(KeptWindows *kept)
{
    kept_forget(kept);
    if (++kept->forgets >= KEPT_FORGETS)
        Py_CLEAR(kept->by_key);
}

/* Writes to the store held back from its transaction until the commit, by a core on window
 * close without a cache, where each write used to go to the transaction at once (Kafka
 * Streams' store there has no cache either): a session merged away, or a window created and
 * expired within one commit, then never reaches the transaction, its changelog or RocksDB.
 * `writes`: store key -> (value or None for a deletion, time-index key, fresh), `fresh` when
 * the store's transaction did not have the window before it was held. NULL: off.
 *
 * Only the core reads what it holds: it holds a key's windows only while it keeps that key's
 * windows (KeptWindows, which then answer every read of them) and its windows not emitted
 * (PendingWindows, whose results are read through `held_get`), and it writes everything held
 * to the transaction (`held_release`) before either drops them, before memory passes the
 * budget, and at every commit (the aggregation's flush, before the expiry scan). */
#define HELD_WRITE_BYTES 240 /* a held write: its dict slot, its 3-tuple, value and index key */

typedef struct {
    PyObject *writes;
} HeldWrites;

static CORES_UNUSED int
held_init(HeldWrites *held, int on)
{
    Py_CLEAR(held->writes);
    return on && (held->writes = PyDict_New()) == NULL ? -1 : 0;
}

static CORES_UNUSED Py_ssize_t
held_writes_count(HeldWrites *held)
{
    return held->writes == NULL ? 0 : PyDict_GET_SIZE(held->writes);
}

/* transaction.put(key, value) for a store's transaction, by name `put_name`.
 *
 * state/transaction.py's KeyValueTransaction.put and Overlay.put are the reference; their
 * common case (an open transaction that stages its writes, bytes, a key that is not the one
 * it just read as absent, no fresh key to unstage for a delete) is done here on the same
 * attributes, without the two Python frames: a window store on window close stages about ten
 * writes a record. Anything else, and any other object, calls `put_name`.
 * tests/dsl/test_transaction_put.py holds the two ways to the same transaction. */
static PyObject *kv_transaction_type, *overlay_type, *kv_store_type, *str_apply_each_write,
    *str_closed, *str_missed, *str_fresh, *str_data, *str_writes, *str_num_bytes, *str_sorted,
    *str_added, *str_writer;
static CORES_UNUSED int transaction_put_ready; /* 0: not tried yet, 1: ready, -1: no fast path */

static CORES_UNUSED int
transaction_put_prepare(void)
{
    const struct { PyObject **variable; const char *text; } names[] = {
        {&str_apply_each_write, "_apply_each_write"}, {&str_closed, "_closed"},
        {&str_missed, "_missed"}, {&str_fresh, "_fresh"}, {&str_data, "_data"},
        {&str_writes, "writes"}, {&str_num_bytes, "num_bytes"}, {&str_sorted, "_sorted"},
        {&str_added, "_added"}, {&str_writer, "_writer"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].variable = PyUnicode_InternFromString(names[i].text)) == NULL)
            return -1;
    PyObject *transactions = PyImport_ImportModule("streamplatform.state.transaction");
    PyObject *overlays = transactions == NULL ? NULL
                                              : PyImport_ImportModule("streamplatform.state.overlay");
    PyObject *stores = overlays == NULL
                           ? NULL
                           : PyImport_ImportModule("streamplatform.state.transactional");
    if (stores != NULL) {
        kv_transaction_type = PyObject_GetAttrString(transactions, "KeyValueTransaction");
        overlay_type = PyObject_GetAttrString(overlays, "Overlay");
        kv_store_type = PyObject_GetAttrString(stores, "TransactionalKeyValueStore");
    }
    Py_XDECREF(transactions);
    Py_XDECREF(overlays);
    Py_XDECREF(stores);
    return kv_transaction_type != NULL && overlay_type != NULL && kv_store_type != NULL ? 0 : -1;
}

/* store.transaction (a new reference), looked up once per record into `*held` (which the core
 * clears after each record): a property finding the store's writing transaction, which no
 * call within a record replaces. For a TransactionalKeyValueStore (not a subclass) whose
 * writing transaction is open, that transaction is taken as the property would give it
 * (StoreBase._writing_transaction) without its two Python frames: a few per record. */
static CORES_UNUSED PyObject *
transaction_of(PyObject *store, PyObject **held, PyObject *name)
{
    if (*held != NULL) {
        Py_INCREF(*held);
        return *held;
    }
    if (transaction_put_ready == 0)
        transaction_put_ready = transaction_put_prepare() == 0 ? 1 : -1;
    if (transaction_put_ready < 0)
        PyErr_Clear(); /* no fast path */
    else if ((PyObject *)Py_TYPE(store) == kv_store_type) {
        PyObject *writer = PyObject_GetAttr(store, str_writer);
        if (writer == NULL)
            return NULL;
        if ((PyObject *)Py_TYPE(writer) == kv_transaction_type) {
            PyObject *closed = PyObject_GetAttr(writer, str_closed);
            if (closed == NULL) {
                Py_DECREF(writer);
                return NULL;
            }
            int open = closed == Py_False;
            Py_DECREF(closed);
            if (open) {
                *held = writer;
                Py_INCREF(writer);
                return writer;
            }
        }
        Py_DECREF(writer);
    }
    if ((*held = PyObject_GetAttr(store, name)) == NULL)
        return NULL;
    Py_INCREF(*held);
    return *held;
}

/* 1: staged here (`*replaced` then says whether the key was staged with a value before); 0:
 * not the common case (nothing changed); -1: an error. */
static CORES_UNUSED int
transaction_put_here(PyObject *transaction, PyObject *key, PyObject *value, int *replaced)
{
    PyObject *apply = NULL, *closed = NULL, *missed = NULL, *fresh = NULL, *overlay = NULL,
             *writes = NULL, *num_bytes = NULL, *sorted = NULL, *added = NULL, *total = NULL;
    int done = -1;
    if ((apply = PyObject_GetAttr(transaction, str_apply_each_write)) == NULL
        || (closed = PyObject_GetAttr(transaction, str_closed)) == NULL)
        goto out;
    done = 0;
    if (apply != Py_False || closed != Py_False)
        goto out;
    done = -1;
    if (value == Py_None) {
        if ((fresh = PyObject_GetAttr(transaction, str_fresh)) == NULL)
            goto out;
        done = 0;
        if (!PySet_CheckExact(fresh) || PySet_GET_SIZE(fresh) != 0)
            goto out;
    }
    else {
        if ((missed = PyObject_GetAttr(transaction, str_missed)) == NULL)
            goto out;
        done = 0;
        if (missed == key)
            goto out;
    }
    done = -1;
    if ((overlay = PyObject_GetAttr(transaction, str_data)) == NULL)
        goto out;
    done = 0;
    if ((PyObject *)Py_TYPE(overlay) != overlay_type)
        goto out;
    done = -1;
    if ((writes = PyObject_GetAttr(overlay, str_writes)) == NULL)
        goto out;
    done = 0;
    if (!PyDict_CheckExact(writes))
        goto out;
    done = -1;
    if ((num_bytes = PyObject_GetAttr(overlay, str_num_bytes)) == NULL)
        goto out;
    PyObject *old = PyDict_GetItemWithError(writes, key); /* borrowed */
    if (old == NULL && PyErr_Occurred())
        goto out;
    Py_ssize_t value_size = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
    Py_ssize_t change;
    if (old == NULL) {
        change = PyBytes_GET_SIZE(key) + value_size;
        if ((sorted = PyObject_GetAttr(overlay, str_sorted)) == NULL)
            goto out;
        if (sorted != Py_None && (added = PyObject_GetAttr(overlay, str_added)) == NULL)
            goto out;
    }
    else {
        change = value_size - (old == Py_None ? 0 : PyBytes_Size(old));
        if (PyErr_Occurred())
            goto out;
    }
    PyObject *delta = PyLong_FromSsize_t(change);
    if (delta == NULL)
        goto out;
    total = PyNumber_Add(num_bytes, delta);
    Py_DECREF(delta);
    if (total == NULL || PyObject_SetAttr(overlay, str_num_bytes, total) < 0)
        goto out;
    if (added != NULL && PyList_Append(added, key) < 0)
        goto out;
    if (PyDict_SetItem(writes, key, value) < 0)
        goto out;
    *replaced = old != NULL && old != Py_None;
    done = 1;
out:
    Py_XDECREF(apply);
    Py_XDECREF(closed);
    Py_XDECREF(missed);
    Py_XDECREF(fresh);
    Py_XDECREF(overlay);
    Py_XDECREF(writes);
    Py_XDECREF(num_bytes);
    Py_XDECREF(sorted);
    Py_XDECREF(added);
    Py_XDECREF(total);
    return done;
}

/* transaction_put, and `*replaced` set when `key` was staged with a value (not a deletion)
 * before the put, as far as the common case saw: 0 when it did not look (a put through
 * `put_name`). */
static CORES_UNUSED int
transaction_put_replacing(PyObject *transaction, PyObject *put_name, PyObject *key,
                          PyObject *value, int *replaced)
{
    *replaced = 0;
    if (transaction_put_ready == 0)
        transaction_put_ready = transaction_put_prepare() == 0 ? 1 : -1;
    if (transaction_put_ready < 0)
        PyErr_Clear(); /* no fast path: every put through put_name */
    else if ((PyObject *)Py_TYPE(transaction) == kv_transaction_type && PyBytes_CheckExact(key)
             && (value == Py_None || PyBytes_CheckExact(value))) {
        int done = transaction_put_here(transaction, key, value, replaced);
        if (done != 0)
            return done < 0 ? -1 : 0;
    }
    PyObject *args[3] = {transaction, key, value};
    PyObject *written = PyObject_VectorcallMethod(put_name, args, 3, NULL);
    if (written == NULL)
        return -1;
    Py_DECREF(written);
    return 0;
}

static CORES_UNUSED int
transaction_put(PyObject *transaction, PyObject *put_name, PyObject *key, PyObject *value)
{
    int replaced;
    return transaction_put_replacing(transaction, put_name, key, value, &replaced);
}

/* transaction_put as a module function, `transaction_put(transaction, key, value)`, for the
 * tests that hold it to KeyValueTransaction.put (CORES_MODULE_METHODS in a core's module). */
static CORES_UNUSED PyObject *
transaction_put_function(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static PyObject *put_name;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "transaction_put(transaction, key, value)");
        return NULL;
    }
    if (put_name == NULL && (put_name = PyUnicode_InternFromString("put")) == NULL)
        return NULL;
    if (transaction_put(args[0], put_name, args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

#define CORES_MODULE_METHODS                                                                   \
    static PyMethodDef module_methods[] = {                                                    \
        {"transaction_put", (PyCFunction)(void (*)(void))transaction_put_function,             \
         METH_FASTCALL, "transaction.put(key, value), its common case in C (tests)."},          \
        {NULL},                                                                                \
    };

/* The window at `store_key` written as `value` (bytes with the timestamp first, or None) with
 * its time-index key `index`; `fresh`: the transaction does not have it (used when it is not
 * held yet). A fresh window's deletion holds nothing: there is nothing to delete. */
static CORES_UNUSED int
held_put(HeldWrites *held, PyObject *store_key, PyObject *value, PyObject *index, int fresh)
{
    PyObject *old = PyDict_GetItemWithError(held->writes, store_key);
    if (old == NULL && PyErr_Occurred())
        return -1;
    if (old != NULL)
        fresh = PyTuple_GET_ITEM(old, 2) == Py_True;
    if (fresh && value == Py_None)
        return old == NULL ? 0 : PyDict_DelItem(held->writes, store_key);
    PyObject *write = PyTuple_Pack(3, value, index, fresh ? Py_True : Py_False);
    if (write == NULL)
        return -1;
    int failed = PyDict_SetItem(held->writes, store_key, write);
    Py_DECREF(write);
    return failed;
}

/* What the transaction would give for `store_key` after the held writes (`held` NULL: none):
 * *value (a new reference, None for a deletion) and 1 when it is held, else 0. */
static CORES_UNUSED int
held_get(HeldWrites *held, PyObject *store_key, PyObject **value)
{
    *value = NULL;
    if (held == NULL || held->writes == NULL)
        return 0;
    PyObject *write = PyDict_GetItemWithError(held->writes, store_key);
    if (write == NULL)
        return PyErr_Occurred() ? -1 : 0;
    *value = Py_NewRef(PyTuple_GET_ITEM(write, 0));
    return 1;
}

/* Every held write into `store`'s transaction (a window's value and its time-index key),
 * but fresh windows whose time (in the index key, after its b"t") is below `below`: the
 * expiry at this commit would delete them again (LLONG_MIN: none left out). A write leaves
 * memory once in the transaction, so after a failure the rest are still held. */
static CORES_UNUSED int
held_release(HeldWrites *held, PyObject *store, PyObject *transaction_name, PyObject *put_name,
             long long below)
{
    if (held_writes_count(held) == 0)
        return 0;
    PyObject *transaction = PyObject_GetAttr(store, transaction_name);
    PyObject *keys = transaction == NULL ? NULL : PyDict_Keys(held->writes);
    PyObject *empty = keys == NULL ? NULL : PyBytes_FromStringAndSize(NULL, 0);
    int failed = empty == NULL ? -1 : 0;
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(keys); i++) {
        PyObject *store_key = PyList_GET_ITEM(keys, i);
        PyObject *write = PyDict_GetItemWithError(held->writes, store_key);
        if (write == NULL) {
            failed = -1;
            break;
        }
        PyObject *value = PyTuple_GET_ITEM(write, 0), *index = PyTuple_GET_ITEM(write, 1);
        int expired = PyTuple_GET_ITEM(write, 2) == Py_True && below != LLONG_MIN
                      && int64_at(PyBytes_AS_STRING(index) + 1) < below;
        if (!expired) {
            if (transaction_put(transaction, put_name, store_key, value) < 0
                || transaction_put(transaction, put_name, index,
                                   value == Py_None ? Py_None : empty) < 0) {
                failed = -1; /* a write not (wholly) in the transaction: keep it held */
                break;
            }
        }
        failed = PyDict_DelItem(held->writes, store_key);
    }
    Py_XDECREF(transaction);
    Py_XDECREF(keys);
    Py_XDECREF(empty);
    return failed;
}

/* The windows a core on window close (without a cache) has not emitted yet, kept in memory so
 * that a record's final results need no scan of the store's time index: each window's key in
 * that index (b"t" + its time, 8 bytes big-endian, + the rest of its suffix + the key's
 * bytes), in a min-heap by its time. They are read from the store once (`pending_read`), then
 * every window the core writes is added; `pending_closed` takes those up to a time out and
 * reads their results as `_closed_windows` does. Over `limit` windows memory drops them all
 * and they are read again before the next record; a store that alone holds more than half of
 * `limit` turns this off (state PENDING_OFF), and the core scans the store as before. */
#define PENDING_UNREAD 0
#define PENDING_READ 1
#define PENDING_OFF (-1)
/* What memory holds per window held, in bytes: its heap item, its slot in `held`, its key. */
#define PENDING_WINDOW_BYTES 160

typedef struct {
    long long time;
    PyObject *key;
} PendingItem;

typedef struct {
    PendingItem *items;
    Py_ssize_t size, capacity, limit;
    PyObject *held; /* the keys in the heap: each once */
    int state;
} PendingWindows;

/* Every window dropped from memory (to be read again, or for good when `state` says so). */
static CORES_UNUSED void
pending_drop(PendingWindows *pending, int state)
{
    for (Py_ssize_t i = 0; i < pending->size; i++)
        Py_DECREF(pending->items[i].key);
    pending->size = 0;
    if (pending->held != NULL)
        PySet_Clear(pending->held);
    pending->state = state;
}

static CORES_UNUSED int
pending_init(PendingWindows *pending, long long memory_bytes)
{
    pending_drop(pending, PENDING_OFF); /* an __init__ called again */
    pending->limit = memory_bytes > 0 ? (Py_ssize_t)(memory_bytes / PENDING_WINDOW_BYTES) : 0;
    pending->state = pending->limit > 0 ? PENDING_UNREAD : PENDING_OFF;
    pending->size = 0;
    Py_XSETREF(pending->held, PySet_New(NULL));
    return pending->held == NULL ? -1 : 0;
}

static CORES_UNUSED void
pending_free(PendingWindows *pending)
{
    pending_drop(pending, PENDING_OFF);
    Py_CLEAR(pending->held);
    PyMem_Free(pending->items);
    pending->items = NULL;
    pending->capacity = 0;
}

/* The window whose time-index key is `key` (its time `time`) written: held until emitted. */
static CORES_UNUSED int
pending_add(PendingWindows *pending, long long time, PyObject *key)
{
    if (pending->state != PENDING_READ)
        return 0;
    int held = PySet_Contains(pending->held, key);
    if (held != 0)
        return held < 0 ? -1 : 0;
    if (pending->size >= pending->limit) {
        pending_drop(pending, PENDING_UNREAD); /* read again before the next record */
        return 0;
    }
    if (pending->size == pending->capacity) {
        Py_ssize_t capacity = pending->capacity ? pending->capacity * 2 : 1024;
        PendingItem *items = PyMem_Realloc(pending->items, capacity * sizeof(PendingItem));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        pending->items = items;
        pending->capacity = capacity;
    }
    if (PySet_Add(pending->held, key) < 0)
        return -1;
    Py_INCREF(key);
    Py_ssize_t at = pending->size++;
    while (at > 0 && pending->items[(at - 1) / 2].time > time) {
        pending->items[at] = pending->items[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    pending->items[at].time = time;
    pending->items[at].key = key;
    return 0;
}

/* The window whose time-index key is `key` deleted: not emitted, and not read back for it. Its
 * heap item stays until its time comes (pending_closed then skips it). */
static CORES_UNUSED int
pending_forget(PendingWindows *pending, PyObject *key)
{
    return pending->state == PENDING_READ && PySet_Discard(pending->held, key) < 0 ? -1 : 0;
}

/* The earliest window out of the heap (not empty); its key's reference goes to the caller. */
static CORES_UNUSED PendingItem
pending_pop(PendingWindows *pending)
{
    PendingItem top = pending->items[0], last = pending->items[--pending->size];
    Py_ssize_t at = 0;
    for (;;) {
        Py_ssize_t child = 2 * at + 1;
        if (child >= pending->size)
            break;
        if (child + 1 < pending->size && pending->items[child + 1].time < pending->items[child].time)
            child++;
        if (pending->items[child].time >= last.time)
            break;
        pending->items[at] = pending->items[child];
        at = child;
    }
    if (pending->size > 0)
        pending->items[at] = last;
    return top;
}


/* Every window in the store's time index from time `low` on (PENDING_READ), or none when more
 * than half the limit are there (PENDING_OFF). `transaction`: the store's. */
static CORES_UNUSED int
pending_read(PendingWindows *pending, PyObject *transaction, PyObject *range_name, long long low)
{
    pending_drop(pending, PENDING_READ);
    PyObject *bounds[3] = {transaction, PyBytes_FromStringAndSize(NULL, 9),
                           PyBytes_FromStringAndSize("u", 1)};
    PyObject *range = NULL, *iterator = NULL, *pair = NULL;
    int failed = -1;
    if (bounds[1] == NULL || bounds[2] == NULL)
        goto done;
    char *bytes = PyBytes_AS_STRING(bounds[1]);
    bytes[0] = 't';
    int64_into(bytes + 1, low);
    if ((range = PyObject_VectorcallMethod(range_name, bounds, 3, NULL)) == NULL
        || (iterator = PyObject_GetIter(range)) == NULL)
        goto done;
    while ((pair = PyIter_Next(iterator)) != NULL) {
        PyObject *key = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2
                            ? PyTuple_GET_ITEM(pair, 0) : NULL;
        if (key == NULL || !PyBytes_Check(key) || PyBytes_GET_SIZE(key) < 9) {
            PyErr_SetString(PyExc_TypeError, "the store's time index holds a bad key");
            goto done;
        }
        if (pending->size * 2 >= pending->limit) { /* too many for memory: scan the store */
            pending_drop(pending, PENDING_OFF);
            break;
        }
        if (pending_add(pending, int64_at(PyBytes_AS_STRING(key) + 1), key) < 0)
            goto done;
        Py_CLEAR(pair);
    }
    if (!PyErr_Occurred())
        failed = 0;
done:
    Py_XDECREF(bounds[1]);
    Py_XDECREF(bounds[2]);
    Py_XDECREF(range);
    Py_XDECREF(iterator);
    Py_XDECREF(pair);
    if (failed)
        pending_drop(pending, PENDING_UNREAD);
    return failed;
}

/* A window's result as a core knows it without the store: `store_key` (its key's prefix the
 * first `prefix_length` bytes) -> 1 with *result (a new reference) and *timestamp, 0 when the
 * window is gone, 2 when the core does not know (the store's transaction does), -1 on error. */
typedef int (*KnownWindow)(void *owner, PyObject *store_key, Py_ssize_t prefix_length,
                           PyObject **result, long long *timestamp);

/* One window pending_closed_each found closed, handed over in time-index order: its key's
 * bytes, its suffix (the window's time, then `tail` more bytes), its result (borrowed) and
 * the result's timestamp. 0, or -1 with an exception. */
typedef int (*ClosedWindow)(void *owner, const char *key, Py_ssize_t key_length,
                            const char *suffix, Py_ssize_t suffix_length, PyObject *result,
                            long long time);

/* A window pending_closed_each has read: its time-index key (borrowed from the sorted list),
 * its result (a reference of its own) and the result's timestamp. */
typedef struct {
    PyObject *time_key, *result;
    long long time;
} ClosedFound;

/* KeyedWindowAggregation._closed_windows(low, high) from the windows held: those with time
 * in [low, high], in time-index order, read through `known` (NULL: none), the held writes,
 * then the store's transaction (a window deleted since is left out); those up to `high` leave
 * memory. `tail`: the suffix's bytes after the time (8 for sessions, 0 for sliding windows).
 *
 * Every window is read before the first goes to `each`, as `_closed_windows` returns its whole
 * list first: a failure to read one forwards none (and memory must read the store again), a
 * failure of `each` stops there. No tuple or bytes object per window. 0, or -1. */
static CORES_UNUSED int
pending_closed_each(PendingWindows *pending, HeldWrites *held, KnownWindow known, void *owner,
                    PyObject *transaction, PyObject *get_name, PyObject *deserialize,
                    int long_results, long long low, long long high, Py_ssize_t tail,
                    ClosedWindow each, void *each_owner)
{
    PyObject *keys = PyList_New(0);
    ClosedFound *found = NULL;
    Py_ssize_t count = 0, i;
    if (keys == NULL)
        return -1;
    while (pending->size > 0 && pending->items[0].time <= high) {
        PendingItem item = pending_pop(pending);
        /* not in `held`: the window was deleted since (pending_forget) */
        int is_held = PySet_Discard(pending->held, item.key);
        int failed = is_held < 0 || (is_held && item.time >= low && PyList_Append(keys, item.key) < 0);
        Py_DECREF(item.key);
        if (failed)
            goto read_failed;
    }
    if (PyList_Sort(keys) < 0)
        goto read_failed;
    if (PyList_GET_SIZE(keys) > 0
        && (found = PyMem_Malloc(PyList_GET_SIZE(keys) * sizeof(ClosedFound))) == NULL) {
        PyErr_NoMemory();
        goto read_failed;
    }
    Py_ssize_t suffix = 8 + tail;
    for (i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *time_key = PyList_GET_ITEM(keys, i);
        const char *bytes = PyBytes_AS_STRING(time_key);
        Py_ssize_t length = PyBytes_GET_SIZE(time_key) - 1 - suffix;
        if (length < 0) {
            PyErr_SetString(PyExc_ValueError, "a time index key is too short");
            goto read_failed;
        }
        /* the store key: b"k" + the key's length (4 bytes) + the key + the suffix */
        PyObject *store_key = PyBytes_FromStringAndSize(NULL, 5 + length + suffix);
        if (store_key == NULL)
            goto read_failed;
        char *to = PyBytes_AS_STRING(store_key);
        to[0] = 'k';
        for (int j = 0; j < 4; j++)
            to[1 + j] = (char)(((unsigned long long)length >> (8 * (3 - j))) & 0xff);
        memcpy(to + 5, bytes + 1 + suffix, length);
        memcpy(to + 5 + length, bytes + 1, suffix);
        PyObject *result = NULL;
        long long time = 0;
        int state = known == NULL ? 2 : known(owner, store_key, 5 + length, &result, &time);
        if (state == 2) { /* not known: from the held writes, else the store's transaction */
            PyObject *raw;
            int is_held = held_get(held, store_key, &raw);
            if (is_held == 0) {
                PyObject *args[2] = {transaction, store_key};
                raw = PyObject_VectorcallMethod(get_name, args, 2, NULL);
            }
            state = is_held < 0 || raw == NULL ? -1 : raw == Py_None ? 0 : 1;
            if (state == 1 && (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) < 8)) {
                PyErr_SetString(PyExc_ValueError, "a stored window's value is too short");
                state = -1;
            }
            else if (state == 1) {
                time = int64_at(PyBytes_AS_STRING(raw));
                result = deserialize_result(deserialize, long_results, PyBytes_AS_STRING(raw) + 8,
                                            PyBytes_GET_SIZE(raw) - 8);
                state = result == NULL ? -1 : 1;
            }
            Py_XDECREF(raw);
        }
        Py_DECREF(store_key);
        if (state < 0)
            goto read_failed;
        if (state == 0)
            continue; /* deleted since */
        found[count].time_key = time_key;
        found[count].result = result;
        found[count].time = time;
        count++;
    }
    int failed = 0;
    for (i = 0; i < count; i++) {
        const char *bytes = PyBytes_AS_STRING(found[i].time_key);
        Py_ssize_t length = PyBytes_GET_SIZE(found[i].time_key) - 1 - suffix;
        if (failed == 0)
            failed = each(each_owner, bytes + 1 + suffix, length, bytes + 1, suffix,
                          found[i].result, found[i].time);
        Py_DECREF(found[i].result);
    }
    PyMem_Free(found);
    Py_DECREF(keys);
    return failed;
read_failed:
    for (i = 0; i < count; i++)
        Py_DECREF(found[i].result);
    PyMem_Free(found);
    Py_DECREF(keys);
    /* windows taken out and not emitted: what memory holds is no longer every window */
    pending_drop(pending, PENDING_UNREAD);
    return -1;
}

/* ClosedWindow for pending_closed: a (key bytes, suffix, result, timestamp) tuple appended to
 * the list `owner`. */
static CORES_UNUSED int
closed_window_tuple(void *owner, const char *key, Py_ssize_t key_length, const char *suffix,
                    Py_ssize_t suffix_length, PyObject *result, long long time)
{
    PyObject *timestamp = PyLong_FromLongLong(time);
    PyObject *key_bytes = PyBytes_FromStringAndSize(key, key_length);
    PyObject *suffix_bytes = PyBytes_FromStringAndSize(suffix, suffix_length);
    PyObject *closed = timestamp == NULL || key_bytes == NULL || suffix_bytes == NULL
                           ? NULL : PyTuple_Pack(4, key_bytes, suffix_bytes, result, timestamp);
    Py_XDECREF(timestamp);
    Py_XDECREF(key_bytes);
    Py_XDECREF(suffix_bytes);
    int appended = closed == NULL ? -1 : PyList_Append((PyObject *)owner, closed);
    Py_XDECREF(closed);
    return appended;
}

/* pending_closed_each's windows as a new list of (key bytes, suffix, result, timestamp), as
 * `_closed_windows` returns them. */
static CORES_UNUSED PyObject *
pending_closed(PendingWindows *pending, HeldWrites *held, KnownWindow known, void *owner,
               PyObject *transaction, PyObject *get_name, PyObject *deserialize,
               int long_results, long long low, long long high, Py_ssize_t tail)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (pending_closed_each(pending, held, known, owner, transaction, get_name, deserialize,
                            long_results, low, high, tail, closed_window_tuple, out) < 0) {
        Py_DECREF(out);
        pending_drop(pending, PENDING_UNREAD);
        return NULL;
    }
    return out;
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
            char bytes[8];
            int64_into(bytes, value);
            return PyBytes_FromStringAndSize(bytes, 8);
        }
        PyErr_Clear(); /* the serde raises its own error */
    }
    return PyObject_CallOneArg(serialize, result);
}

/* What KeyedWindowAggregation._write does on window close, without a cache (where nothing
 * is forwarded on update): `result` under `store_key` with `timestamp`, and the window's key
 * in the time index (b"t" + the window's suffix, `suffix` bytes from `prefix_length` in the
 * store key: its time, then the rest, + the key's bytes), both in `transaction`; a None
 * result (as serialized) deletes both; with `hold`, both are held back instead (`held`,
 * `fresh` as held_put takes it; `transaction` may then be NULL; without `hold`, `held` may
 * be NULL). The window is then held among those not emitted yet (`pending`, by its time;
 * NULL: it is there already). */
static CORES_UNUSED int
write_through(PyObject *transaction, PyObject *put_name, PyObject *store_key,
              Py_ssize_t prefix_length, Py_ssize_t suffix, PyObject *serialize, int long_results,
              PyObject *result, long long timestamp, PendingWindows *pending, HeldWrites *held,
              int hold, int fresh)
{
    if (!PyBytes_Check(store_key) || PyBytes_GET_SIZE(store_key) < prefix_length + suffix
        || prefix_length < 5) {
        PyErr_SetString(PyExc_ValueError, "a window's store key is too short");
        return -1;
    }
    PyObject *data = serialize_result(serialize, long_results, result);
    if (data == NULL)
        return -1;
    if (data != Py_None && !PyBytes_Check(data)) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_TypeError, "the result serde did not give bytes");
        return -1;
    }
    PyObject *value = Py_None, *index_value = Py_None, *index = NULL;
    int failed = -1;
    if (data != Py_None) {
        Py_ssize_t length = PyBytes_GET_SIZE(data);
        if ((value = PyBytes_FromStringAndSize(NULL, 8 + length)) == NULL
            || (index_value = PyBytes_FromStringAndSize(NULL, 0)) == NULL)
            goto done;
        int64_into(PyBytes_AS_STRING(value), timestamp);
        memcpy(PyBytes_AS_STRING(value) + 8, PyBytes_AS_STRING(data), length);
    }
    else {
        Py_INCREF(value);
        Py_INCREF(index_value);
    }
    const char *key = PyBytes_AS_STRING(store_key);
    Py_ssize_t key_length = prefix_length - 5; /* after b"k" and the 4-byte length */
    if ((index = PyBytes_FromStringAndSize(NULL, 1 + suffix + key_length)) == NULL)
        goto done;
    char *bytes = PyBytes_AS_STRING(index);
    bytes[0] = 't';
    memcpy(bytes + 1, key + prefix_length, suffix);
    memcpy(bytes + 1 + suffix, key + 5, key_length);
    if (hold) {
        if (held_put(held, store_key, value, index, fresh) < 0)
            goto done;
    }
    else {
        /* A window staged with a value has its time-index key staged with b"" beside it (the
         * two are put and deleted together), so putting b"" there again would leave the
         * transaction as it is: most of a sliding window's updates within a commit. */
        int replaced;
        if (transaction_put_replacing(transaction, put_name, store_key, value, &replaced) < 0
            || (!(replaced && value != Py_None)
                && transaction_put(transaction, put_name, index, index_value) < 0))
            goto done;
    }
    failed = pending == NULL ? 0
             : data != Py_None ? pending_add(pending, int64_at(key + prefix_length), index)
                               : pending_forget(pending, index);
done:
    Py_DECREF(data);
    Py_XDECREF(value);
    Py_XDECREF(index_value);
    Py_XDECREF(index);
    return failed;
}

#ifdef CORES_WINDOW_NAMES
/* The sink a windowed core writes its closed windows' counts to itself, as the sink's
 * delivery function would (sink_writers.direct_sink): its only child is a sink of an external
 * topic with the windowed serde of the core's key serde and the long serde. `append` None:
 * there is none, the results are forwarded. References borrowed from the core. */
typedef struct {
    PyObject *task, *topic, *append, *sources_append, *producer_type, *no_source;
} DirectSink;

/* A core's __init__ check of its direct-sink arguments: 0, or -1 with the error set. */
static CORES_UNUSED int
direct_sink_check(PyObject *task, PyObject *append, PyObject *sources_append,
                  PyObject *producer_type)
{
    if (append != Py_None && (task == Py_None || sources_append == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "a direct sink needs the task and its sources list");
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)producer_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "producer_type must be a tuple type");
        return -1;
    }
    return 0;
}

/* What the sink's delivery function does for Record(Windowed(key, window), count, timestamp,
 * headers): the windowed key's bytes are the key's, then `window` (`window_length` bytes: a
 * time window's start, a session's end and start, each 8 bytes big-endian, as the stores'
 * keys hold them), the value is the count's 8 bytes big-endian. The sink's ProducerRecord
 * (partition None) and the record's source (task.current, or NO_SOURCE) are appended. 1 when
 * written, 0 when `result` is not an int64 (the caller forwards it), -1 on an error. */
static CORES_UNUSED int
direct_write_count(const DirectSink *sink, const char *key, Py_ssize_t key_length,
                   const char *window, Py_ssize_t window_length, PyObject *result,
                   PyObject *timestamp, PyObject *headers)
{
    if (sink->append == Py_None || !PyLong_CheckExact(result))
        return 0;
    int overflow;
    long long count = PyLong_AsLongLongAndOverflow(result, &overflow);
    if (count == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        return 0;
    PyObject *key_bytes = PyBytes_FromStringAndSize(NULL, key_length + window_length);
    PyObject *value = PyBytes_FromStringAndSize(NULL, 8), *out = NULL, *current = NULL;
    int written = -1;
    if (key_bytes == NULL || value == NULL)
        goto done;
    memcpy(PyBytes_AS_STRING(key_bytes), key, key_length);
    memcpy(PyBytes_AS_STRING(key_bytes) + key_length, window, window_length);
    int64_into(PyBytes_AS_STRING(value), count);
    /* ProducerRecord(topic, key, value, timestamp, headers, None) without its __new__: a
     * NamedTuple is a tuple of its type */
    PyTypeObject *type = (PyTypeObject *)sink->producer_type;
    if ((out = type->tp_alloc(type, 6)) == NULL)
        goto done;
    PyTuple_SET_ITEM(out, 0, Py_NewRef(sink->topic));
    PyTuple_SET_ITEM(out, 1, Py_NewRef(key_bytes));
    PyTuple_SET_ITEM(out, 2, Py_NewRef(value));
    PyTuple_SET_ITEM(out, 3, Py_NewRef(timestamp));
    PyTuple_SET_ITEM(out, 4, Py_NewRef(headers));
    PyTuple_SET_ITEM(out, 5, Py_NewRef(Py_None));
    PyObject *appended = PyObject_CallOneArg(sink->append, out);
    if (appended == NULL)
        goto done;
    Py_DECREF(appended);
    if ((current = PyObject_GetAttr(sink->task, str_current)) == NULL)
        goto done;
    int present = PyObject_IsTrue(current);
    if (present < 0)
        goto done;
    appended = PyObject_CallOneArg(sink->sources_append, present ? current : sink->no_source);
    if (appended == NULL)
        goto done;
    Py_DECREF(appended);
    written = 1;
done:
    Py_XDECREF(key_bytes);
    Py_XDECREF(value);
    Py_XDECREF(out);
    Py_XDECREF(current);
    return written;
}
#endif

#endif
