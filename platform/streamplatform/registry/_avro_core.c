/* A compiled Avro reader: Avro binary bodies into Python values, in bulk, in C.
 *
 * `Reader(program)` takes the program avro_program.py builds from fastavro's parsed writer
 * schema (a nested tuple; its docstring describes it) and turns it, once, into a tree of C
 * nodes. `Reader.read_all(datas, offset=5, prefix=None)` reads each of `datas` (bytes, or None
 * for a tombstone, which stays None) from `offset` on and returns the list of values: exactly
 * what `fastavro.schemaless_reader(BytesIO(data[offset:]), writer_schema, None)` returns for
 * each (dicts in field order, str, bytes, int, float, bool, None, lists, dicts for maps, enum
 * symbols, fixed as bytes, logical types by fastavro's own conversions). fastavro is the
 * reference: what it does per value, this does for a whole chunk without the interpreter's
 * work per field.
 *
 * Strict where fastavro is lenient, so that the caller can fall back: a value that is
 * truncated, has bytes left after its body, is not longer than `offset`, or holds anything
 * odd (a varint beyond 64 bits, a negative length, an enum or union index out of range, which
 * fastavro would take from the end of the list) raises ValueError; invalid UTF-8 raises
 * UnicodeDecodeError, as fastavro does. The serde then reads the chunk record by record with
 * fastavro, which gives each record what it gives today (its value, or its error at its
 * record). `prefix`: bytes every value must start with (the magic byte and the schema id);
 * a value that does not makes `read_all` return None (another schema's value: the caller
 * reads the chunk by schema id).
 *
 * The commonest logical types, when fastavro's own conversion is registered for them, are
 * converted here, to the same objects (avro_program.NATIVE_LOGICAL): timestamp-millis and
 * -micros (an aware datetime in UTC: fastavro's `epoch + timedelta(...)`), their local-
 * forms (naive) and date (`date.fromordinal(days + DAYS_SHIFT)`). A time out of datetime's
 * range (years 1 to 9999), where fastavro raises, raises ValueError.
 *
 * Every read is bounds-checked against the value's end. Recursion is bounded by the program's
 * depth (avro_program.MAX_DEPTH, checked again here when compiling).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 100
/* An array or map block of items that take no bytes (nulls, empty records) may claim any
 * count without running out of input; beyond this, fastavro reads it. */
#define MAX_EMPTY_ITEMS (1 << 20)

enum Op {
    OP_NULL, OP_BOOLEAN, OP_INT, OP_LONG, OP_FLOAT, OP_DOUBLE, OP_BYTES, OP_STRING,
    OP_RECORD, OP_ENUM, OP_ARRAY, OP_MAP, OP_UNION, OP_FIXED, OP_LOGICAL,
    OP_TIMESTAMP_MILLIS, OP_TIMESTAMP_MICROS, OP_LOCAL_TIMESTAMP_MILLIS,
    OP_LOCAL_TIMESTAMP_MICROS, OP_DATE
};

static const char *const OP_NAMES[] = {
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    "record", "enum", "array", "map", "union", "fixed", "logical",
    "timestamp-millis", "timestamp-micros", "local-timestamp-millis",
    "local-timestamp-micros", "date",
};
#define OP_COUNT ((int)(sizeof(OP_NAMES) / sizeof(OP_NAMES[0])))

typedef struct Node {
    enum Op op;
    Py_ssize_t count;        /* fields, symbols, branches; bytes of a fixed */
    PyObject **names;        /* record: field names; enum: symbols (owned) */
    struct Node **children;  /* record: fields; union: branches; array, map, logical: [0] */
    PyObject *convert;       /* logical: fastavro's conversion (owned) */
    PyObject *schema;        /* logical: its schema node, passed to convert (owned) */
    int empty;               /* whether a value can take no bytes at all */
} Node;

static void
node_free(Node *node)
{
    if (node == NULL)
        return;
    if (node->names != NULL) {
        for (Py_ssize_t i = 0; i < node->count; i++)
            Py_XDECREF(node->names[i]);
        PyMem_Free(node->names);
    }
    if (node->children != NULL) {
        Py_ssize_t children = node->op == OP_RECORD || node->op == OP_UNION ? node->count : 1;
        for (Py_ssize_t i = 0; i < children; i++)
            node_free(node->children[i]);
        PyMem_Free(node->children);
    }
    Py_XDECREF(node->convert);
    Py_XDECREF(node->schema);
    PyMem_Free(node);
}

/* Compiling a program ------------------------------------------------------------------- */

static Node *compile_node(PyObject *program, int depth);

static int
bad_program(const char *why)
{
    PyErr_Format(PyExc_ValueError, "not an Avro reader program: %s", why);
    return -1;
}

static Node *
new_node(enum Op op)
{
    Node *node = PyMem_Calloc(1, sizeof(Node));
    if (node == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    node->op = op;
    return node;
}

/* `node->children`: `count` nodes compiled from the items of tuple `programs`. */
static int
compile_children(Node *node, PyObject *programs, Py_ssize_t count, int depth)
{
    node->children = PyMem_Calloc(count > 0 ? count : 1, sizeof(Node *));
    if (node->children == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        node->children[i] = compile_node(PyTuple_GET_ITEM(programs, i), depth + 1);
        if (node->children[i] == NULL)
            return -1;
    }
    return 0;
}

/* `node->names`: the `count` str items of tuple `strings`. */
static int
keep_names(Node *node, PyObject *strings)
{
    node->names = PyMem_Calloc(node->count > 0 ? node->count : 1, sizeof(PyObject *));
    if (node->names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < node->count; i++) {
        PyObject *name = PyTuple_GET_ITEM(strings, i);
        if (!PyUnicode_CheckExact(name))
            return bad_program("names and symbols must be str");
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name); /* field names: dict keys, hashed once */
        node->names[i] = name;
    }
    return 0;
}

static Node *
compile_node(PyObject *program, int depth)
{
    if (depth > MAX_DEPTH) {
        bad_program("nested too deep");
        return NULL;
    }
    if (!PyTuple_Check(program) || PyTuple_GET_SIZE(program) < 1
        || !PyUnicode_Check(PyTuple_GET_ITEM(program, 0))) {
        bad_program("a node is a tuple (kind, ...)");
        return NULL;
    }
    const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(program, 0));
    if (kind == NULL)
        return NULL;
    int op = 0;
    while (op < OP_COUNT && strcmp(OP_NAMES[op], kind) != 0)
        op++;
    if (op == OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "not an Avro reader program: unknown kind %s", kind);
        return NULL;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(program);
    Node *node = new_node((enum Op)op);
    if (node == NULL)
        return NULL;
    PyObject *a = size > 1 ? PyTuple_GET_ITEM(program, 1) : NULL;
    PyObject *b = size > 2 ? PyTuple_GET_ITEM(program, 2) : NULL;
    switch (node->op) {
    case OP_NULL:
        node->empty = 1;
        /* fall through */
    case OP_BOOLEAN: case OP_INT: case OP_LONG: case OP_FLOAT: case OP_DOUBLE:
    case OP_BYTES: case OP_STRING: case OP_TIMESTAMP_MILLIS: case OP_TIMESTAMP_MICROS:
    case OP_LOCAL_TIMESTAMP_MILLIS: case OP_LOCAL_TIMESTAMP_MICROS: case OP_DATE:
        if (size != 1)
            goto bad;
        break;
    case OP_RECORD:
        if (size != 3 || !PyTuple_Check(a) || !PyTuple_Check(b)
            || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b))
            goto bad;
        node->count = PyTuple_GET_SIZE(a);
        if (keep_names(node, a) < 0 || compile_children(node, b, node->count, depth) < 0)
            goto fail;
        node->empty = 1;
        for (Py_ssize_t i = 0; i < node->count; i++)
            node->empty &= node->children[i]->empty;
        break;
    case OP_ENUM:
        if (size != 2 || !PyTuple_Check(a))
            goto bad;
        node->count = PyTuple_GET_SIZE(a);
        if (keep_names(node, a) < 0)
            goto fail;
        break;
    case OP_UNION:
        if (size != 2 || !PyTuple_Check(a))
            goto bad;
        node->count = PyTuple_GET_SIZE(a);
        if (compile_children(node, a, node->count, depth) < 0)
            goto fail;
        break;
    case OP_ARRAY: case OP_MAP:
        if (size != 2)
            goto bad;
        node->children = PyMem_Calloc(1, sizeof(Node *));
        if (node->children == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        node->children[0] = compile_node(a, depth + 1);
        if (node->children[0] == NULL)
            goto fail;
        break;
    case OP_FIXED:
        if (size != 2 || !PyLong_Check(a))
            goto bad;
        node->count = PyLong_AsSsize_t(a);
        if (node->count == -1 && PyErr_Occurred())
            goto fail;
        if (node->count < 0)
            goto bad;
        node->empty = node->count == 0;
        break;
    case OP_LOGICAL:
        if (size != 4 || !PyCallable_Check(b))
            goto bad;
        node->convert = Py_NewRef(b);
        node->schema = Py_NewRef(PyTuple_GET_ITEM(program, 3));
        node->children = PyMem_Calloc(1, sizeof(Node *));
        if (node->children == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        node->children[0] = compile_node(a, depth + 1);
        if (node->children[0] == NULL)
            goto fail;
        node->empty = node->children[0]->empty;
        break;
    }
    return node;
bad:
    PyErr_Format(PyExc_ValueError, "not an Avro reader program: a malformed %s node", kind);
fail:
    node_free(node);
    return NULL;
}

/* Dates and times ----------------------------------------------------------------------- */

/* datetime's range in days from 1970-01-01: 0001-01-01 to 9999-12-31. */
#define MIN_DAY (-719162LL)
#define MAX_DAY (2932896LL)
#define US_PER_DAY (86400LL * 1000000LL)

/* The civil date of `days` from 1970-01-01 (Howard Hinnant's civil_from_days). */
static void
civil_from_days(int64_t days, int *year, int *month, int *day)
{
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    int64_t of_era = days - era * 146097;                                           /* [0, 146096] */
    int64_t year_of_era = (of_era - of_era / 1460 + of_era / 36524 - of_era / 146096) / 365;
    int64_t of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    int64_t shifted_month = (5 * of_year + 2) / 153; /* March is 0 */
    *day = (int)(of_year - (153 * shifted_month + 2) / 5 + 1);
    *month = (int)(shifted_month < 10 ? shifted_month + 3 : shifted_month - 9);
    *year = (int)(year_of_era + era * 400 + (*month <= 2));
}

static PyObject *
out_of_range(void)
{
    PyErr_SetString(PyExc_ValueError, "a date or time out of datetime's range");
    return NULL;
}

/* 1970-01-01T00:00 plus `amount` microseconds (`unit` 1) or milliseconds (1000), with
 * `tz` (timezone.utc, or None: naive). */
static PyObject *
datetime_of(int64_t amount, int64_t unit, PyObject *tz)
{
    /* Checked in days first, so that amount * unit cannot overflow. */
    int64_t per_day = US_PER_DAY / unit;
    int64_t days = amount / per_day - (amount % per_day < 0);
    if (days < MIN_DAY || days > MAX_DAY)
        return out_of_range();
    int64_t us = (amount - days * per_day) * unit; /* [0, US_PER_DAY) */
    int year, month, day;
    civil_from_days(days, &year, &month, &day);
    int64_t seconds = us / 1000000;
    return PyDateTimeAPI->DateTime_FromDateAndTime(
        year, month, day, (int)(seconds / 3600), (int)(seconds / 60 % 60), (int)(seconds % 60),
        (int)(us % 1000000), tz, PyDateTimeAPI->DateTimeType);
}

/* Reading ------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *at, *end;
} Cursor;

static int
malformed(const char *why)
{
    PyErr_Format(PyExc_ValueError, "malformed Avro value: %s", why);
    return -1;
}

/* A zigzag varint of at most 10 bytes whose value fits in 64 bits. */
static int
read_long(Cursor *in, int64_t *out)
{
    uint64_t value = 0;
    for (int i = 0; i < 10; i++) {
        if (in->at >= in->end)
            return malformed("truncated");
        uint8_t byte = *in->at++;
        if (i == 9 && byte > 1)
            return malformed("a varint beyond 64 bits");
        value |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            *out = (int64_t)((value >> 1) ^ (~(value & 1) + 1));
            return 0;
        }
    }
    return malformed("a varint beyond 64 bits"); /* not reached: the 10th byte is <= 1 */
}

/* A length (of bytes, a string, a map key) that the rest of the value holds. */
static int
read_length(Cursor *in, Py_ssize_t *out)
{
    int64_t length;
    if (read_long(in, &length) < 0)
        return -1;
    if (length < 0)
        return malformed("a negative length");
    if (length > in->end - in->at)
        return malformed("truncated");
    *out = (Py_ssize_t)length;
    return 0;
}

static PyObject *
read_string(Cursor *in)
{
    Py_ssize_t length;
    if (read_length(in, &length) < 0)
        return NULL;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)in->at, length, NULL);
    in->at += length;
    return text;
}

/* The count of the next block of an array or map (0: the end); a negative count is
 * followed by the block's size in bytes, which fastavro skips as well. */
static int
read_block_count(Cursor *in, const Node *item, Py_ssize_t *out)
{
    int64_t count;
    if (read_long(in, &count) < 0)
        return -1;
    if (count < 0) {
        int64_t bytes;
        if (count == INT64_MIN)
            return malformed("a block count beyond 64 bits");
        count = -count;
        if (read_long(in, &bytes) < 0)
            return -1;
    }
    /* Each item takes a byte at least, unless it can take none. */
    if ((item == NULL || !item->empty) ? count > in->end - in->at : count > MAX_EMPTY_ITEMS)
        return malformed("a block count beyond the value's bytes");
    *out = (Py_ssize_t)count;
    return 0;
}

static PyObject *read_value(Cursor *in, const Node *node);

static PyObject *
read_record(Cursor *in, const Node *node)
{
    PyObject *record = PyDict_New();
    if (record == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < node->count; i++) {
        PyObject *value = read_value(in, node->children[i]);
        if (value == NULL || PyDict_SetItem(record, node->names[i], value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(record);
            return NULL;
        }
        Py_DECREF(value);
    }
    return record;
}

static PyObject *
read_array(Cursor *in, const Node *node)
{
    PyObject *items = PyList_New(0);
    if (items == NULL)
        return NULL;
    for (;;) {
        Py_ssize_t count;
        if (read_block_count(in, node->children[0], &count) < 0)
            goto fail;
        if (count == 0)
            return items;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = read_value(in, node->children[0]);
            if (item == NULL)
                goto fail;
            int failed = PyList_Append(items, item);
            Py_DECREF(item);
            if (failed < 0)
                goto fail;
        }
    }
fail:
    Py_DECREF(items);
    return NULL;
}

static PyObject *
read_map(Cursor *in, const Node *node)
{
    PyObject *map = PyDict_New();
    if (map == NULL)
        return NULL;
    for (;;) {
        Py_ssize_t count;
        if (read_block_count(in, NULL, &count) < 0) /* each key takes a byte at least */
            goto fail;
        if (count == 0)
            return map;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *key = read_string(in);
            if (key == NULL)
                goto fail;
            PyObject *value = read_value(in, node->children[0]);
            if (value == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            int failed = PyDict_SetItem(map, key, value); /* a repeated key: the last wins */
            Py_DECREF(key);
            Py_DECREF(value);
            if (failed < 0)
                goto fail;
        }
    }
fail:
    Py_DECREF(map);
    return NULL;
}

/* An index into a list of `count` (an enum's symbols, a union's branches). */
static int
read_index(Cursor *in, Py_ssize_t count, Py_ssize_t *out)
{
    int64_t index;
    if (read_long(in, &index) < 0)
        return -1;
    if (index < 0 || index >= count)
        return malformed("an index out of range");
    *out = (Py_ssize_t)index;
    return 0;
}

static PyObject *
read_value(Cursor *in, const Node *node)
{
    int64_t number;
    Py_ssize_t length;
    switch (node->op) {
    case OP_NULL:
        Py_RETURN_NONE;
    case OP_BOOLEAN:
        if (in->at >= in->end) {
            malformed("truncated");
            return NULL;
        }
        return PyBool_FromLong(*in->at++ != 0); /* fastavro: any byte but 0 is True */
    case OP_INT: /* fastavro reads an int as a long, whatever its size */
    case OP_LONG:
        if (read_long(in, &number) < 0)
            return NULL;
        return PyLong_FromLongLong(number);
    case OP_FLOAT: {
        if (in->end - in->at < 4) {
            malformed("truncated");
            return NULL;
        }
        uint32_t bits = (uint32_t)in->at[0] | (uint32_t)in->at[1] << 8
                        | (uint32_t)in->at[2] << 16 | (uint32_t)in->at[3] << 24;
        float value;
        memcpy(&value, &bits, sizeof value);
        in->at += 4;
        return PyFloat_FromDouble((double)value);
    }
    case OP_DOUBLE: {
        if (in->end - in->at < 8) {
            malformed("truncated");
            return NULL;
        }
        uint64_t bits = 0;
        for (int i = 7; i >= 0; i--)
            bits = bits << 8 | in->at[i];
        double value;
        memcpy(&value, &bits, sizeof value);
        in->at += 8;
        return PyFloat_FromDouble(value);
    }
    case OP_BYTES: {
        if (read_length(in, &length) < 0)
            return NULL;
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)in->at, length);
        in->at += length;
        return bytes;
    }
    case OP_STRING:
        return read_string(in);
    case OP_RECORD:
        return read_record(in, node);
    case OP_ENUM:
        if (read_index(in, node->count, &length) < 0)
            return NULL;
        return Py_NewRef(node->names[length]);
    case OP_ARRAY:
        return read_array(in, node);
    case OP_MAP:
        return read_map(in, node);
    case OP_UNION:
        if (read_index(in, node->count, &length) < 0)
            return NULL;
        return read_value(in, node->children[length]);
    case OP_FIXED: {
        if (in->end - in->at < node->count) {
            malformed("truncated");
            return NULL;
        }
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)in->at, node->count);
        in->at += node->count;
        return bytes;
    }
    case OP_TIMESTAMP_MILLIS: case OP_TIMESTAMP_MICROS:
    case OP_LOCAL_TIMESTAMP_MILLIS: case OP_LOCAL_TIMESTAMP_MICROS:
        if (read_long(in, &number) < 0)
            return NULL;
        return datetime_of(
            number,
            node->op == OP_TIMESTAMP_MILLIS || node->op == OP_LOCAL_TIMESTAMP_MILLIS ? 1000 : 1,
            node->op == OP_TIMESTAMP_MILLIS || node->op == OP_TIMESTAMP_MICROS
                ? PyDateTime_TimeZone_UTC : Py_None);
    case OP_DATE: {
        if (read_long(in, &number) < 0)
            return NULL;
        if (number < MIN_DAY || number > MAX_DAY)
            return out_of_range();
        int year, month, day;
        civil_from_days(number, &year, &month, &day);
        return PyDate_FromDate(year, month, day);
    }
    case OP_LOGICAL: {
        PyObject *base = read_value(in, node->children[0]);
        if (base == NULL)
            return NULL;
        PyObject *value = PyObject_CallFunctionObjArgs(node->convert, base, node->schema,
                                                       Py_None, NULL);
        Py_DECREF(base);
        return value;
    }
    }
    PyErr_SetString(PyExc_SystemError, "_avro_core: unknown node");
    return NULL;
}

/* Reader -------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Node *root;
} Reader;

static int
Reader_init(Reader *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"program", NULL};
    PyObject *program;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Reader", keywords, &program))
        return -1;
    Node *root = compile_node(program, 0);
    if (root == NULL)
        return -1;
    node_free(self->root);
    self->root = root;
    return 0;
}

static void
Reader_dealloc(Reader *self)
{
    node_free(self->root);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Reader_read_all(Reader *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"datas", "offset", "prefix", NULL};
    PyObject *datas, *prefix = Py_None;
    Py_ssize_t offset = 5;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|nO:read_all", keywords, &PyList_Type,
                                     &datas, &offset, &prefix))
        return NULL;
    if (self->root == NULL) {
        PyErr_SetString(PyExc_ValueError, "Reader not initialized");
        return NULL;
    }
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "offset must be >= 0");
        return NULL;
    }
    if (prefix != Py_None && !PyBytes_CheckExact(prefix)) {
        PyErr_SetString(PyExc_TypeError, "prefix must be bytes or None");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(datas);
    PyObject *values = PyList_New(count);
    if (values == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* Only a logical type's conversion runs Python code, which could change the list:
         * its size is taken again each time. */
        if (i >= PyList_GET_SIZE(datas)) {
            PyErr_SetString(PyExc_RuntimeError, "datas changed while read");
            goto fail;
        }
        PyObject *data = PyList_GET_ITEM(datas, i);
        if (data == Py_None) {
            PyList_SET_ITEM(values, i, Py_NewRef(Py_None));
            continue;
        }
        if (!PyBytes_CheckExact(data)) {
            PyErr_Format(PyExc_TypeError, "value %zd: bytes or None, not %.100s", i,
                         Py_TYPE(data)->tp_name);
            goto fail;
        }
        const uint8_t *start = (const uint8_t *)PyBytes_AS_STRING(data);
        Py_ssize_t size = PyBytes_GET_SIZE(data);
        if (prefix != Py_None) {
            Py_ssize_t prefix_size = PyBytes_GET_SIZE(prefix);
            if (size < prefix_size || memcmp(start, PyBytes_AS_STRING(prefix), prefix_size)) {
                Py_DECREF(values);
                Py_RETURN_NONE; /* another schema's value */
            }
        }
        if (size <= offset) {
            PyErr_Format(PyExc_ValueError, "value %zd: no body after %zd bytes", i, offset);
            goto fail;
        }
        Cursor in = {start + offset, start + size};
        Py_INCREF(data); /* its bytes stay while read, whatever a conversion does */
        PyObject *value = read_value(&in, self->root);
        Py_DECREF(data);
        if (value == NULL)
            goto fail;
        PyList_SET_ITEM(values, i, value);
        if (in.at != in.end) {
            PyErr_Format(PyExc_ValueError, "value %zd: %zd bytes after its body", i,
                         (Py_ssize_t)(in.end - in.at));
            goto fail;
        }
    }
    return values;
fail:
    Py_DECREF(values);
    return NULL;
}

static PyMethodDef Reader_methods[] = {
    {"read_all", (PyCFunction)(void (*)(void))Reader_read_all, METH_VARARGS | METH_KEYWORDS,
     "read_all(datas, offset=5, prefix=None) -> list | None: the values of datas' Avro "
     "bodies (from offset on); None when a value does not start with prefix."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.registry._avro_core.Reader",
    .tp_doc = "Reader(program): a compiled Avro reader for one writer schema "
              "(registry/avro_program.py builds the program).",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_avro_core", "A compiled Avro reader, in C (see avro_program.py).",
    -1, NULL,
};

PyMODINIT_FUNC
PyInit__avro_core(void)
{
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddObjectRef(mod, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
