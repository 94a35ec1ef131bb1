/* The per-record path of one side of a KTable-KTable join (TableJoinSide), in C.
 *
 * `Core.process(record)` does exactly what `TableJoinSide.process` does in table_join.py, which
 * is the reference: read it first. It runs for a side that is neither versioned nor windowed
 * (table_join.py keeps those in Python); the join's store is read and written through its
 * transaction's own `get` / `put` / `delete`, in the same order, with the same serdes and the
 * same joiner calls. What C saves is the interpreter's work per update around those calls: the
 * store keys and values, the timestamps, the choice of what goes on and the forward.
 *
 * Store layout (table_join.py): b"l" / b"r" + the key's bytes -> the side's last timestamp
 * (8 bytes, big-endian) + its value's bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_cores.h"


static PyObject *str_transaction, *str_get, *str_put, *str_delete, *str_dropped_records, *one;

#define INNER 0
#define LEFT_JOIN 1
#define OUTER 2

typedef struct {
    PyObject_HEAD
    PyObject *processor, *store, *key_serialize, *own_serialize, *other_deserialize, *joiner;
    PyObject *forward, *record_type, *pack, *unpack_from;
    int kind, left, drops_unchanged;
    char side, other;
} Core;

#define REFERENCES(X)                                                                          \
    X(processor) X(store) X(key_serialize) X(own_serialize) X(other_deserialize) X(joiner)    \
    X(forward) X(record_type) X(pack) X(unpack_from)

/* processor.dropped_records += 1 (a Python int: no bound). */
static int
count_dropped(Core *self)
{
    PyObject *count = PyObject_GetAttr(self->processor, str_dropped_records);
    if (count == NULL)
        return -1;
    PyObject *more = PyNumber_Add(count, one);
    Py_DECREF(count);
    if (more == NULL)
        return -1;
    int failed = PyObject_SetAttr(self->processor, str_dropped_records, more);
    Py_DECREF(more);
    return failed;
}

/* `prefix` (one byte) + `data` (bytes), a new bytes object. */
static PyObject *
prefixed(char prefix, PyObject *data)
{
    Py_ssize_t length = PyBytes_GET_SIZE(data);
    PyObject *key = PyBytes_FromStringAndSize(NULL, 1 + length);
    if (key == NULL)
        return NULL;
    PyBytes_AS_STRING(key)[0] = prefix;
    memcpy(PyBytes_AS_STRING(key) + 1, PyBytes_AS_STRING(data), length);
    return key;
}

/* transaction.<name>(*args) (a new reference). */
static PyObject *
call(PyObject *transaction, PyObject *name, PyObject *first, PyObject *second)
{
    PyObject *args[3] = {transaction, first, second};
    return PyObject_VectorcallMethod(name, args, second == NULL ? 2 : 3, NULL);
}

/* _TIMESTAMP.pack(timestamp) + data, the stored value of this side's update: the timestamp's
 * 8 bytes in C when it is an int64, else struct's own call (and its error). */
static PyObject *
stored_value(Core *self, PyObject *timestamp, PyObject *data)
{
    PyObject *packed;
    long long time;
    int overflow = 0;
    if (PyLong_CheckExact(timestamp)
        && !((time = PyLong_AsLongLongAndOverflow(timestamp, &overflow)) == -1
             && PyErr_Occurred())
        && !overflow) {
        Py_ssize_t length = PyBytes_GET_SIZE(data);
        PyObject *value = PyBytes_FromStringAndSize(NULL, 8 + length);
        if (value != NULL) {
            int64_into(PyBytes_AS_STRING(value), time);
            memcpy(PyBytes_AS_STRING(value) + 8, PyBytes_AS_STRING(data), length);
        }
        return value;
    }
    PyErr_Clear();
    if ((packed = PyObject_CallOneArg(self->pack, timestamp)) == NULL)
        return NULL;
    PyObject *value = PyNumber_Add(packed, data);
    Py_DECREF(packed);
    return value;
}

/* joiner(key, own, other) with the left side's value first. */
static PyObject *
joined(Core *self, PyObject *key, PyObject *own, PyObject *other)
{
    PyObject *args[3] = {key, self->left ? own : other, self->left ? other : own};
    return PyObject_Vectorcall(self->joiner, args, 3, NULL);
}

/* TableJoinSide.process(record), its side neither versioned nor windowed. */
static PyObject *
Core_process(Core *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4) {
        PyErr_SetString(PyExc_TypeError, "process takes a Record");
        return NULL;
    }
    PyObject *key = PyTuple_GET_ITEM(record, 0), *new = PyTuple_GET_ITEM(record, 1);
    PyObject *timestamp = PyTuple_GET_ITEM(record, 2);
    PyObject *raw_key = NULL, *transaction = NULL, *own_key = NULL, *previous = NULL;
    PyObject *done = NULL, *other_key = NULL, *raw_other = NULL, *other = NULL, *out = NULL;
    PyObject *value = NULL, *out_timestamp = NULL;
    raw_key = key == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(self->key_serialize, key);
    if (raw_key == NULL)
        return NULL;
    if (raw_key == Py_None) { /* Kafka Streams skips (and counts) a null key */
        Py_DECREF(raw_key);
        if (count_dropped(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (!PyBytes_Check(raw_key)) {
        PyErr_SetString(PyExc_TypeError, "the key serde did not give bytes");
        goto done;
    }
    if ((transaction = PyObject_GetAttr(self->store, str_transaction)) == NULL
        || (own_key = prefixed(self->side, raw_key)) == NULL
        || (previous = call(transaction, str_get, own_key, NULL)) == NULL)
        goto done;
    int had_value = previous != Py_None; /* this side's previous value */
    if (new == Py_None)
        done = call(transaction, str_delete, own_key, NULL);
    else {
        PyObject *data = PyObject_CallOneArg(self->own_serialize, new);
        if (data == NULL)
            goto done;
        int truthy = PyObject_IsTrue(data); /* `serialize(new) or b""` */
        if (truthy < 0) {
            Py_DECREF(data);
            goto done;
        }
        if (!truthy)
            Py_SETREF(data, PyBytes_FromStringAndSize(NULL, 0));
        if (data == NULL)
            goto done;
        if (!PyBytes_Check(data)) {
            Py_DECREF(data);
            PyErr_SetString(PyExc_TypeError, "the value serde did not give bytes");
            goto done;
        }
        PyObject *stored = stored_value(self, timestamp, data);
        Py_DECREF(data);
        if (stored == NULL)
            goto done;
        done = call(transaction, str_put, own_key, stored);
        Py_DECREF(stored);
    }
    if (done == NULL || (other_key = prefixed(self->other, raw_key)) == NULL
        || (raw_other = call(transaction, str_get, other_key, NULL)) == NULL)
        goto done;
    if (raw_other == Py_None) {
        other = Py_NewRef(Py_None);
        out_timestamp = Py_NewRef(timestamp);
    }
    else {
        if (!PyBytes_Check(raw_other) || PyBytes_GET_SIZE(raw_other) < 8) {
            /* struct's own error for a value too short */
            PyObject *unpacked = PyObject_CallOneArg(self->unpack_from, raw_other);
            Py_XDECREF(unpacked);
            if (unpacked != NULL)
                PyErr_SetString(PyExc_ValueError, "the join's store holds a bad value");
            goto done;
        }
        PyObject *data = PyBytes_FromStringAndSize(PyBytes_AS_STRING(raw_other) + 8,
                                                   PyBytes_GET_SIZE(raw_other) - 8);
        if (data == NULL)
            goto done;
        other = PyObject_CallOneArg(self->other_deserialize, data);
        Py_DECREF(data);
        if (other == NULL)
            goto done;
        /* max(record.timestamp, stored): the first of two equal ones */
        PyObject *stored = PyLong_FromLongLong(int64_at(PyBytes_AS_STRING(raw_other)));
        if (stored == NULL)
            goto done;
        int later = PyObject_RichCompareBool(stored, timestamp, Py_GT);
        if (later < 0) {
            Py_DECREF(stored);
            goto done;
        }
        out_timestamp = later ? stored : Py_NewRef(timestamp);
        if (!later)
            Py_DECREF(stored);
    }
    if (new == Py_None && !had_value && self->drops_unchanged) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    if (self->kind == INNER || (self->kind == LEFT_JOIN && !self->left)) {
        /* the inner join, and the right side of a left join: without the other side's value
         * the key is in no result, and nothing changes */
        if (other == Py_None) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        value = self->kind == INNER && new == Py_None ? Py_NewRef(Py_None)
                                                      : joined(self, key, new, other);
    }
    else { /* the left side of a left join, either side of an outer join */
        if (other == Py_None && new == Py_None && !had_value) {
            out = Py_NewRef(Py_None); /* in the result neither before nor after */
            goto done;
        }
        value = new == Py_None && (self->kind == LEFT_JOIN || other == Py_None)
                    ? Py_NewRef(Py_None)
                    : joined(self, key, new, other);
    }
    if (value == NULL)
        goto done;
    /* record._replace(value=value, timestamp=timestamp): a Record (a tuple type) */
    PyObject *fields = PyTuple_Pack(4, key, value, out_timestamp, PyTuple_GET_ITEM(record, 3));
    PyObject *fields_args = fields == NULL ? NULL : PyTuple_Pack(1, fields);
    Py_XDECREF(fields);
    PyObject *forwarded = fields_args == NULL
                              ? NULL
                              : PyTuple_Type.tp_new((PyTypeObject *)self->record_type,
                                                    fields_args, NULL);
    Py_XDECREF(fields_args);
    if (forwarded != NULL) {
        out = PyObject_CallOneArg(self->forward, forwarded);
        Py_DECREF(forwarded);
        if (out != NULL)
            Py_SETREF(out, Py_NewRef(Py_None));
    }
done:
    Py_XDECREF(raw_key);
    Py_XDECREF(transaction);
    Py_XDECREF(own_key);
    Py_XDECREF(previous);
    Py_XDECREF(done);
    Py_XDECREF(other_key);
    Py_XDECREF(raw_other);
    Py_XDECREF(other);
    Py_XDECREF(value);
    Py_XDECREF(out_timestamp);
    return out;
}

static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"processor", "store", "kind", "left", "key_serialize",
                            "own_serialize", "other_deserialize", "joiner", "drops_unchanged",
                            "forward", "record_type", "pack", "unpack_from", NULL};
    PyObject *processor, *store, *key_serialize, *own_serialize, *other_deserialize, *joiner;
    PyObject *forward, *record_type, *pack, *unpack_from;
    int kind, left, drops_unchanged;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOipOOOOpOO!OO", names, &processor, &store,
                                     &kind, &left, &key_serialize, &own_serialize,
                                     &other_deserialize, &joiner, &drops_unchanged, &forward,
                                     &PyType_Type, &record_type, &pack, &unpack_from))
        return -1;
    if (kind != INNER && kind != LEFT_JOIN && kind != OUTER) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (inner), 1 (left) or 2 (outer)");
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        return -1;
    }
#define TAKE(name)                                                                             \
    Py_INCREF(name);                                                                           \
    Py_XSETREF(self->name, name);
    REFERENCES(TAKE)
#undef TAKE
    self->kind = kind;
    self->left = left;
    self->drops_unchanged = drops_unchanged;
    self->side = left ? 'l' : 'r';
    self->other = left ? 'r' : 'l';
    return 0;
}

/* The processor refers to this object (its process), which refers back to it: the cycle
 * collector has to see these references. */
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
 * refuse to process rather than crash. */
static PyObject *
Core_process_checked(Core *self, PyObject *record)
{
    if (self->unpack_from == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core was not initialised");
        return NULL;
    }
    return Core_process(self, record);
}

static PyMethodDef Core_methods[] = {
    {"process", (PyCFunction)Core_process_checked, METH_O,
     "One update of this side's table into the join (TableJoinSide.process)."},
    {NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.dsl._table_join_core.Core",
    .tp_doc = "The per-record path of TableJoinSide (see table_join.py).",
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
    PyModuleDef_HEAD_INIT, "_table_join_core", "TableJoinSide's per-record path in C.", -1,
};

PyMODINIT_FUNC
PyInit__table_join_core(void)
{
    CORES_INTERN(str_transaction, "transaction")
    CORES_INTERN(str_get, "get")
    CORES_INTERN(str_put, "put")
    CORES_INTERN(str_delete, "delete")
    CORES_INTERN(str_dropped_records, "dropped_records")
    if ((one = PyLong_FromLong(1)) == NULL)
        return NULL;
    return core_module(&module, &CoreType);
}
