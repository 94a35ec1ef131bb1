/* A task's loop over its source records, and its sinks' delivery functions, in C
 * (runtime/task.py, runtime/sink_writers.py).
 *
 * `process_all(task, triples, checks, every)` does what `Task._process_all`, the Python
 * reference, does for `task._decoded(records)` (the `(record, key, value)` triples): for each
 * record in order, its route (`task._route(topic)`, once per topic and call), the consumed
 * offset of the partition it moves away from, `task.current`, the key and value decoded unless
 * they came decoded, the event time (`task._extracted`), a failure there to the
 * deserialization handler (`task._handle`), the stream time and the sums behind the lateness
 * and end-to-end latency metrics, the `Record` handed to each child (a failure there to the
 * processing handler, unless the child is a sink), stream-time punctuations, and every
 * `every` records the limit `checks` (True: stopped right after that record). At the end,
 * however it ends: the last partition's consumed offset, `task.records_in`, `task.current`
 * reset and the task's `timing` sums.
 *
 * What C saves is the interpreter's work per record around those calls: about a microsecond
 * of a record's few. The processors, sinks and handlers it calls are the same Python (or C)
 * callables the reference calls, in the same order, so the two behave alike;
 * tests/runtime/test_task_loop.py holds them to the same outputs, state and metrics.
 *
 * `Writer(...)`: a sink's delivery function, for the sinks of the common kind (below). Keys
 * and values of the serdes whose every case it knows (`key_format`, `value_format`: strings,
 * bytes, longs, and windowed keys of those) it serializes itself, as the serde would.
 *
 * `serialize(format, serialize, value, windowed_types)`: the Writer's serialization of one
 * value, for the tests that hold it to the serde.
 *
 * `configure(undecoded, consumed_record, record, streams_error, deserialization, processing,
 * stream_time)`: the Python objects it needs, given once by task.py at import.
 *
 * `decode_slice(...)`: a slice of source records decoded by the built-in string, bytes and
 * JSON serdes in one pass (source_records.decode_slice; below). `binary_buffers(...)` and
 * `int64_buffer(...)`: a task's output columns as Arrow buffers (rows.binary_column; below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../dsl/_cores.h"

static PyObject *undecoded, *consumed_record_type, *record_type, *streams_error,
    *deserialization, *processing, *stream_time_kind;
static PyObject *str_current, *str_stream_time, *str_route, *str_handle, *str_extracted,
    *str_punctuate, *str_punctuations, *str_consumed, *str_timing, *str_records_in, *str_name,
    *str_lateness_sum, *str_lateness_max, *str_timestamp_sum, *str_timestamp_min,
    *str_timestamped;

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(undecoded, consumed_record, record, streams_error, "
                        "deserialization, processing, stream_time)");
        return NULL;
    }
    PyObject **targets[] = {&undecoded, &consumed_record_type, &record_type, &streams_error,
                            &deserialization, &processing, &stream_time_kind};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*targets[i], args[i]);
    }
    Py_RETURN_NONE;
}

/* Record(key, value, timestamp, headers) without its Python-level __new__ (a NamedTuple is a
 * tuple of its own type). A new reference. */
static PyObject *
new_record(PyObject *key, PyObject *value, PyObject *timestamp, PyObject *headers)
{
    PyTypeObject *type = (PyTypeObject *)record_type;
    PyObject *record = type->tp_alloc(type, 4);
    if (record == NULL)
        return NULL;
    PyTuple_SET_ITEM(record, 0, Py_NewRef(key));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(value));
    PyTuple_SET_ITEM(record, 2, Py_NewRef(timestamp));
    PyTuple_SET_ITEM(record, 3, Py_NewRef(headers));
    return record;
}

/* The pending exception taken: a new reference to the exception object, with its traceback. */
static PyObject *
taken(void)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
}

/* The pending exception, when the reference's `except Exception as exception` would catch it
 * and its `except StreamsError: raise` would not re-raise it: taken (a new reference to the
 * exception object, with its traceback). NULL with the exception left pending otherwise. */
static PyObject *
caught(void)
{
    if (PyErr_ExceptionMatches(streams_error) || !PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    return taken();
}

/* task._handle(setting, node, record, exception): 0, or -1 with its exception. */
static int
handle(PyObject *task, PyObject *setting, PyObject *node, PyObject *record, PyObject *exception)
{
    PyObject *result = PyObject_CallMethodObjArgs(task, str_handle, setting, node, record,
                                                  exception, NULL);
    Py_DECREF(exception);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* The record's key and value decoded (new references in *key, *value, which hold the
 * triple's on entry) and its timestamp (a new reference): 0, or -1 with the exception. */
static int
decode(PyObject *task, PyObject *route, PyObject *record, PyObject **key, PyObject **value,
       PyObject **timestamp)
{
    if (*key == undecoded) {
        PyObject *key_of = PyTuple_GET_ITEM(route, 1), *value_of = PyTuple_GET_ITEM(route, 2);
        int contextual = PyObject_IsTrue(PyTuple_GET_ITEM(route, 3));
        if (contextual < 0)
            return -1;
        PyObject *headers = PyTuple_GET_ITEM(record, 6), *decoded_key, *decoded_value;
        decoded_key = contextual
            ? PyObject_CallFunctionObjArgs(key_of, PyTuple_GET_ITEM(record, 4), headers, NULL)
            : PyObject_CallOneArg(key_of, PyTuple_GET_ITEM(record, 4));
        if (decoded_key == NULL)
            return -1;
        Py_SETREF(*key, decoded_key);
        decoded_value =
            contextual
                ? PyObject_CallFunctionObjArgs(value_of, PyTuple_GET_ITEM(record, 5), headers, NULL)
                : PyObject_CallOneArg(value_of, PyTuple_GET_ITEM(record, 5));
        if (decoded_value == NULL)
            return -1;
        Py_SETREF(*value, decoded_value);
    }
    PyObject *extract = PyTuple_GET_ITEM(route, 5);
    if (extract == Py_None) {
        *timestamp = Py_NewRef(PyTuple_GET_ITEM(record, 3));
        return 0;
    }
    *timestamp = PyObject_CallMethodObjArgs(task, str_extracted, extract, record, *key, *value,
                                            NULL);
    return *timestamp == NULL ? -1 : 0;
}

/* `typed` to each child of the route: 0, or -1 with the exception to raise. */
static int
deliver(PyObject *task, PyObject *children, PyObject *typed)
{
    Py_ssize_t count = PyList_GET_SIZE(children);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(children, i);
        PyObject *result = PyObject_CallOneArg(PyTuple_GET_ITEM(entry, 0), typed);
        if (result != NULL) {
            Py_DECREF(result);
            continue;
        }
        PyObject *node = PyTuple_GET_ITEM(entry, 1);
        if (node == Py_None)  /* a sink: it handled what it could itself */
            return -1;
        PyObject *exception = caught();
        if (exception == NULL || handle(task, processing, node, typed, exception) < 0)
            return -1;
    }
    return 0;
}

/* The batch's sums behind the task's metrics, kept in C during the loop. */
typedef struct {
    wide lateness_sum, timestamp_sum;
    long long lateness_max, timestamp_min, timestamped, processed;
} Sums;

/* timing[name] = timing[name] + value, for a 128-bit value: 0, or -1. */
static int
add_to(PyObject *timing, PyObject *name, wide value)
{
    PyObject *before = PyDict_GetItemWithError(timing, name);
    if (before == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, name);
        return -1;
    }
    PyObject *added = wide_number(value), *sum = NULL;
    if (added != NULL)
        sum = PyNumber_Add(before, added);
    Py_XDECREF(added);
    if (sum == NULL)
        return -1;
    int failed = PyDict_SetItem(timing, name, sum);
    Py_DECREF(sum);
    return failed;
}

/* task.consumed[(record[0], record[1])] = record[2] + 1: the next offset to read of the
 * record's partition. 0, or -1. */
static int
write_consumed(PyObject *task, PyObject *record)
{
    PyObject *consumed = PyObject_GetAttr(task, str_consumed);
    PyObject *partition = PyTuple_Pack(2, PyTuple_GET_ITEM(record, 0), PyTuple_GET_ITEM(record, 1));
    PyObject *one = PyLong_FromLong(1), *next = NULL;
    if (consumed != NULL && partition != NULL && one != NULL)
        next = PyNumber_Add(PyTuple_GET_ITEM(record, 2), one);
    int failed = next == NULL || PyObject_SetItem(consumed, partition, next) < 0;
    Py_XDECREF(consumed);
    Py_XDECREF(partition);
    Py_XDECREF(one);
    Py_XDECREF(next);
    return failed ? -1 : 0;
}

/* The reference's `finally`: what the loop kept in C written to the task. 0, or -1. */
static int
finish(PyObject *task, PyObject *last, const Sums *sums)
{
    if (last != NULL && write_consumed(task, last) < 0)
        return -1;
    PyObject *records_in = PyObject_GetAttr(task, str_records_in);
    if (records_in == NULL)
        return -1;
    PyObject *processed = PyLong_FromLongLong(sums->processed), *total = NULL;
    if (processed != NULL)
        total = PyNumber_Add(records_in, processed);
    Py_DECREF(records_in);
    Py_XDECREF(processed);
    if (total == NULL)
        return -1;
    int failed = PyObject_SetAttr(task, str_records_in, total);
    Py_DECREF(total);
    if (failed || PyObject_SetAttr(task, str_current, Py_None) < 0)
        return -1;
    PyObject *timing = PyObject_GetAttr(task, str_timing);
    if (timing == NULL)
        return -1;
    failed = !PyDict_Check(timing);
    if (failed)
        PyErr_SetString(PyExc_TypeError, "task.timing must be a dict");
    failed = failed || add_to(timing, str_lateness_sum, sums->lateness_sum) < 0 ||
             add_to(timing, str_timestamp_sum, sums->timestamp_sum) < 0 ||
             add_to(timing, str_timestamped, sums->timestamped) < 0;
    if (!failed) {  /* timing["lateness_max_ms"] = max(timing["lateness_max_ms"], lateness_max) */
        PyObject *before = PyDict_GetItemWithError(timing, str_lateness_max);
        PyObject *lateness_max = PyLong_FromLongLong(sums->lateness_max);
        int larger = before == NULL || lateness_max == NULL
            ? -1 : PyObject_RichCompareBool(lateness_max, before, Py_GT);
        if (before == NULL && !PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, str_lateness_max);
        failed = larger < 0 ||
                 (larger && PyDict_SetItem(timing, str_lateness_max, lateness_max) < 0);
        Py_XDECREF(lateness_max);
    }
    if (!failed) {
        PyObject *timestamp_min = PyLong_FromLongLong(sums->timestamp_min);
        failed = timestamp_min == NULL ||
                 PyDict_SetItem(timing, str_timestamp_min, timestamp_min) < 0;
        Py_XDECREF(timestamp_min);
    }
    Py_DECREF(timing);
    return failed ? -1 : 0;
}

static PyObject *
process_all(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "process_all(task, triples, checks, every)");
        return NULL;
    }
    if (undecoded == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_task_loop.configure() was not called");
        return NULL;
    }
    PyObject *task = args[0];
    Py_ssize_t every = PyLong_AsSsize_t(args[3]);
    if (every == -1 && PyErr_Occurred())
        return NULL;
    if (every < 1)
        every = 1;
    PyObject *iterator = NULL, *checks = NULL, *routes = NULL, *punctuations = NULL, *timing;
    PyObject *last = NULL, *result = NULL;
    Sums sums = {0, 0, 0, 0, 0, 0};
    long long timestamp_min;
    /* What the loop needs before its first record; nothing to finish before that. */
    timing = PyObject_GetAttr(task, str_timing);
    if (timing == NULL)
        return NULL;
    PyObject *minimum = PyObject_GetItem(timing, str_timestamp_min);
    Py_DECREF(timing);
    if (minimum == NULL)
        return NULL;
    int bad_minimum = as_int64(minimum, &timestamp_min);
    Py_DECREF(minimum);
    if (bad_minimum < 0)
        return NULL;
    sums.timestamp_min = timestamp_min;
    iterator = PyObject_GetIter(args[1]);
    checks = PySequence_Fast(args[2], "checks must be a sequence");
    routes = PyDict_New();
    punctuations = PyObject_GetAttr(task, str_punctuations);
    if (iterator == NULL || checks == NULL || routes == NULL || punctuations == NULL)
        goto done;
    Py_ssize_t check_count = PySequence_Fast_GET_SIZE(checks), countdown = every;
    PyObject **check_items = PySequence_Fast_ITEMS(checks);
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        PyObject *record, *key, *value, *timestamp = NULL;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "process_all: not a (record, key, value) triple");
            Py_DECREF(item);
            goto done;
        }
        record = PyTuple_GET_ITEM(item, 0);
        key = Py_NewRef(PyTuple_GET_ITEM(item, 1));
        value = Py_NewRef(PyTuple_GET_ITEM(item, 2));
        Py_INCREF(record);
        Py_DECREF(item);
        int ok = 0;
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 7) {
            PyErr_SetString(PyExc_TypeError, "process_all: a record is a 7-tuple");
            goto record_done;
        }
        PyObject *topic = PyTuple_GET_ITEM(record, 0);
        PyObject *route = PyDict_GetItemWithError(routes, topic);
        if (route == NULL) {
            if (PyErr_Occurred())
                goto record_done;
            route = PyObject_CallMethodOneArg(task, str_route, topic);
            if (route == NULL)
                goto record_done;
            int failed = PyDict_SetItem(routes, topic, route);
            Py_DECREF(route);  /* the dict holds it */
            if (failed < 0)
                goto record_done;
            if (!PyTuple_Check(route) || PyTuple_GET_SIZE(route) != 6 ||
                !PyList_Check(PyTuple_GET_ITEM(route, 4))) {
                PyErr_SetString(PyExc_TypeError, "task._route: not a route");
                goto record_done;
            }
        }
        if (last != NULL) {
            int moved = PyObject_RichCompareBool(PyTuple_GET_ITEM(record, 1),
                                                 PyTuple_GET_ITEM(last, 1), Py_NE);
            if (moved == 0)
                moved = PyObject_RichCompareBool(topic, PyTuple_GET_ITEM(last, 0), Py_NE);
            if (moved < 0)
                goto record_done;
            if (moved && write_consumed(task, last) < 0)
                goto record_done;
        }
        Py_XSETREF(last, Py_NewRef(record));
        if (PyObject_SetAttr(task, str_current, record) < 0)
            goto record_done;
        sums.processed += 1;
        if (decode(task, route, record, &key, &value, &timestamp) < 0) {
            Py_CLEAR(timestamp);
            PyObject *exception = caught();
            if (exception == NULL)
                goto record_done;
            PyObject *raw = Py_IS_TYPE(record, (PyTypeObject *)consumed_record_type)
                ? Py_NewRef(record) : PyObject_Call(consumed_record_type, record, NULL);
            PyObject *source_name = raw == NULL
                ? NULL : PyObject_GetAttr(PyTuple_GET_ITEM(route, 0), str_name);
            if (source_name == NULL) {
                Py_XDECREF(raw);
                Py_DECREF(exception);
                goto record_done;
            }
            int failed = handle(task, deserialization, source_name, raw, exception);
            Py_DECREF(source_name);
            Py_DECREF(raw);
            if (failed)
                goto record_done;
        }
        else {
            long long time, stream_time;
            if (as_int64(timestamp, &time) < 0 || int_attr(task, str_stream_time, &stream_time) < 0)
                goto record_done;
            if (time > stream_time) {
                if (PyObject_SetAttr(task, str_stream_time, timestamp) < 0)
                    goto record_done;
            }
            else if (time < stream_time) {
                long long late = stream_time - time;
                sums.lateness_sum += late;
                if (late > sums.lateness_max)
                    sums.lateness_max = late;
            }
            if (time < sums.timestamp_min)
                sums.timestamp_min = time;
            sums.timestamp_sum += time;
            sums.timestamped += 1;
            PyObject *typed = new_record(key, value, timestamp, PyTuple_GET_ITEM(record, 6));
            if (typed == NULL)
                goto record_done;
            int failed = deliver(task, PyTuple_GET_ITEM(route, 4), typed);
            Py_DECREF(typed);
            if (failed)
                goto record_done;
            int scheduled = PyList_CheckExact(punctuations)
                ? PyList_GET_SIZE(punctuations) > 0 : PyObject_IsTrue(punctuations);
            if (scheduled < 0)
                goto record_done;
            if (scheduled) {
                PyObject *now = PyObject_GetAttr(task, str_stream_time), *fired = NULL;
                if (now != NULL)
                    fired = PyObject_CallMethodObjArgs(task, str_punctuate, stream_time_kind, now,
                                                       NULL);
                Py_XDECREF(now);
                if (fired == NULL)
                    goto record_done;
                Py_DECREF(fired);
            }
        }
        /* Python's signal handlers run between bytecodes, so the reference's loop raises a
         * handler's exception (KeyboardInterrupt) within a record or so; when every callable
         * of a record's path is C, only this asks for them. A no-op off the main thread. */
        if ((sums.processed & 1023) == 0 && PyErr_CheckSignals() < 0)
            goto record_done;
        if (check_count > 0 && --countdown == 0) {
            countdown = every;
            for (Py_ssize_t i = 0; i < check_count; i++) {
                PyObject *answer = PyObject_CallNoArgs(check_items[i]);
                if (answer == NULL)
                    goto record_done;
                int exceeded = PyObject_IsTrue(answer);
                Py_DECREF(answer);
                if (exceeded < 0)
                    goto record_done;
                if (exceeded) {
                    result = Py_NewRef(Py_True);
                    ok = 1;
                    goto record_done;
                }
            }
        }
        ok = 1;
    record_done:
        Py_DECREF(record);
        Py_DECREF(key);
        Py_DECREF(value);
        Py_XDECREF(timestamp);
        if (!ok || result != NULL)
            goto done;
    }
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_False);
done:;
    /* The reference's `finally`, with any exception of the loop kept pending over it. */
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    if (finish(task, last, &sums) < 0) {
        if (type != NULL)
            PyErr_Clear();  /* the loop's exception is the one to see */
        else
            Py_CLEAR(result);
    }
    if (type != NULL) {
        PyErr_Restore(type, error, traceback);
        Py_CLEAR(result);
    }
    Py_XDECREF(last);
    Py_XDECREF(iterator);
    Py_XDECREF(checks);
    Py_XDECREF(routes);
    Py_XDECREF(punctuations);
    return result;
}


/* The delivery function of a sink that writes to a topic of its own (no topic extractor, no
 * repartition partition, no serde that takes a context): sink_writers.sink_writer's `write`,
 * its reference. Called with a Record: its key and value serialized, or the source record's
 * bytes when the record is that record unchanged (its topic in `as_read`), a failure to
 * serialize to the production handler, then a ProducerRecord appended to `output` and the
 * source record (or `no_source`) to `sources`. */
typedef struct {
    PyObject_HEAD
    PyObject *task, *topic, *serialize_key, *serialize_value, *as_read, *output, *sources,
        *sink_name, *producer_record, *no_source, *production;
    PyObject *windowed_types; /* (Windowed, Window), for a windowed key format; else None */
    int key_format, value_format;
    vectorcallfunc vectorcall;
} Writer;

static PyObject *str_topic, *str_key, *str_window, *str_start, *str_end;

/* What a sink's serde is, when it is one whose every case the Writer knows
 * (sink_writers.serde_format gives the code; 0: any other serde, called). The low two bits
 * are the serde of a plain value, or of a windowed key's key; a windowed key's serde adds
 * FORMAT_TIME_WINDOWED (windows.TimeWindowedSerde: the key's bytes, then the window's start)
 * or FORMAT_SESSION_WINDOWED (windows.SessionWindowedSerde: the key's bytes, then the end,
 * then the start), 8 bytes each, big-endian. serdes.py and windows.py are the references. */
#define FORMAT_CALL 0
#define FORMAT_STRING 1
#define FORMAT_BYTES 2
#define FORMAT_LONG 3
#define FORMAT_PLAIN 3
#define FORMAT_TIME_WINDOWED 4
#define FORMAT_SESSION_WINDOWED 8

/* A plain value in `format`: 1 with *out (a new reference), 0 for a case left to the serde
 * (another type, a str that is no UTF-8, an int beyond 64 bits: the serde raises its own
 * error), -1 on a failure of memory. */
static int
plain_serialized(int format, PyObject *value, PyObject **out)
{
    if (value == Py_None) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (format == FORMAT_STRING && PyUnicode_CheckExact(value)) {
        if ((*out = PyUnicode_AsUTF8String(value)) != NULL)
            return 1;
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (format == FORMAT_BYTES && PyBytes_CheckExact(value)) {
        *out = Py_NewRef(value); /* bytes(value) of exact bytes is value */
        return 1;
    }
    if (format == FORMAT_LONG && PyLong_CheckExact(value)) { /* a bool is not exact */
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow)
            return 0;
        char bytes[8];
        int64_into(bytes, number);
        return (*out = PyBytes_FromStringAndSize(bytes, 8)) != NULL ? 1 : -1;
    }
    return 0;
}

/* getattr(owner, name) as an exact int within int64: 1 with *out, 0 when it is not one, -1 on
 * an error. */
static int
int64_field(PyObject *owner, PyObject *name, long long *out)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == NULL)
        return -1;
    int found = 0;
    if (PyLong_CheckExact(value)) {
        int overflow;
        *out = PyLong_AsLongLongAndOverflow(value, &overflow);
        found = !overflow;
    }
    Py_DECREF(value);
    return found;
}

/* A windowed key (Windowed(key, Window(start, end)), of exactly those types) in `format`:
 * as plain_serialized. */
static int
windowed_serialized(int format, PyObject *types, PyObject *value, PyObject **out)
{
    if (value == Py_None) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) != 2
        || (PyObject *)Py_TYPE(value) != PyTuple_GET_ITEM(types, 0))
        return 0;
    PyObject *key = NULL, *window = NULL, *key_bytes = NULL;
    long long start = 0, end = 0;
    int found = -1;
    if ((key = PyObject_GetAttr(value, str_key)) == NULL
        || (window = PyObject_GetAttr(value, str_window)) == NULL)
        goto done;
    found = 0;
    if ((PyObject *)Py_TYPE(window) != PyTuple_GET_ITEM(types, 1))
        goto done;
    if ((found = plain_serialized(format & FORMAT_PLAIN, key, &key_bytes)) != 1)
        goto done;
    if ((found = int64_field(window, str_start, &start)) != 1)
        goto done;
    int session = (format & FORMAT_SESSION_WINDOWED) != 0;
    if (session && (found = int64_field(window, str_end, &end)) != 1)
        goto done;
    /* `key or b""`: None (or no bytes) is no bytes */
    Py_ssize_t length = key_bytes == Py_None ? 0 : PyBytes_GET_SIZE(key_bytes);
    found = -1;
    if ((*out = PyBytes_FromStringAndSize(NULL, length + (session ? 16 : 8))) == NULL)
        goto done;
    char *bytes = PyBytes_AS_STRING(*out);
    if (length)
        memcpy(bytes, PyBytes_AS_STRING(key_bytes), length);
    if (session) {
        int64_into(bytes + length, end);
        int64_into(bytes + length + 8, start);
    }
    else
        int64_into(bytes + length, start);
    found = 1;
done:
    Py_XDECREF(key);
    Py_XDECREF(window);
    Py_XDECREF(key_bytes);
    return found;
}

/* serialize(value) for a serde in `format` (a new reference): C where it knows the case, else
 * the serde's own call. */
static PyObject *
serialized(int format, PyObject *serialize, PyObject *types, PyObject *value)
{
    PyObject *out = NULL;
    int done = 0;
    if (format & (FORMAT_TIME_WINDOWED | FORMAT_SESSION_WINDOWED))
        done = windowed_serialized(format, types, value, &out);
    else if (format != FORMAT_CALL)
        done = plain_serialized(format, value, &out);
    if (done < 0)
        return NULL;
    return done ? out : PyObject_CallOneArg(serialize, value);
}

/* serialize(format, serialize, value, windowed_types): `serialized`, for the tests. */
static PyObject *
serialize_function(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "serialize(format, serialize, value, windowed_types)");
        return NULL;
    }
    long format = PyLong_AsLong(args[0]);
    if (format == -1 && PyErr_Occurred())
        return NULL;
    return serialized((int)format, args[1], args[3], args[2]);
}

/* A ProducerRecord(topic, key, value, timestamp, headers, None), as _new_tuple builds it. */
static PyObject *
new_producer_record(Writer *self, PyObject *key, PyObject *value, PyObject *record)
{
    PyTypeObject *type = (PyTypeObject *)self->producer_record;
    PyObject *out = type->tp_alloc(type, 6);
    if (out == NULL)
        return NULL;
    PyTuple_SET_ITEM(out, 0, Py_NewRef(self->topic));
    PyTuple_SET_ITEM(out, 1, Py_NewRef(key));
    PyTuple_SET_ITEM(out, 2, Py_NewRef(value));
    PyTuple_SET_ITEM(out, 3, Py_NewRef(PyTuple_GET_ITEM(record, 2)));
    PyTuple_SET_ITEM(out, 4, Py_NewRef(PyTuple_GET_ITEM(record, 3)));
    PyTuple_SET_ITEM(out, 5, Py_NewRef(Py_None));
    return out;
}

static PyObject *
Writer_write(Writer *self, PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4) {
        PyErr_SetString(PyExc_TypeError, "a record is a (key, value, timestamp, headers) tuple");
        return NULL;
    }
    PyObject *key = NULL, *value = NULL, *out = NULL, *result = NULL;
    PyObject *current = PyObject_GetAttr(self->task, str_current);
    if (current == NULL)
        return NULL;
    int as_read = 0;
    if (current != Py_None && PyTuple_GET_ITEM(record, 1) != Py_None
        && PyTuple_GET_ITEM(record, 0) != Py_None) {
        if (!PyTuple_Check(current) || PyTuple_GET_SIZE(current) < 6) {
            PyErr_SetString(PyExc_TypeError, "task.current is not a consumed record");
            goto done;
        }
        as_read = PySequence_Contains(self->as_read, PyTuple_GET_ITEM(current, 0));
        if (as_read < 0)
            goto done;
    }
    if (as_read) {
        /* The source record itself, unchanged: its bytes are what serializing its key and
         * value would give back. */
        key = Py_NewRef(PyTuple_GET_ITEM(current, 4));
        value = Py_NewRef(PyTuple_GET_ITEM(current, 5));
    }
    else {
        key = serialized(self->key_format, self->serialize_key, self->windowed_types,
                         PyTuple_GET_ITEM(record, 0));
        if (key != NULL)
            value = serialized(self->value_format, self->serialize_value,
                               self->windowed_types, PyTuple_GET_ITEM(record, 1));
        if (value == NULL) {
            /* `except Exception` in the reference: a StreamsError too goes to the handler. */
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                goto done;
            PyObject *exception = taken();
            PyObject *handle = PyObject_GetAttr(self->task, str_handle), *handled = NULL;
            if (handle != NULL) {
                PyObject *args[5] = {self->production, self->sink_name, record, exception,
                                     self->topic};
                PyObject *names = PyTuple_Pack(1, str_topic);
                if (names != NULL)
                    handled = PyObject_Vectorcall(handle, args, 4, names);
                Py_XDECREF(names);
                Py_DECREF(handle);
            }
            Py_XDECREF(exception);
            if (handled == NULL)
                goto done;
            Py_DECREF(handled);
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    out = new_producer_record(self, key, value, record);
    if (out == NULL || PyList_Append(self->output, out) < 0)
        goto done;
    /* add_source(task.current or NO_SOURCE), read again as the reference does */
    Py_SETREF(current, PyObject_GetAttr(self->task, str_current));
    if (current == NULL)
        goto done;
    int truthy = PyObject_IsTrue(current);
    if (truthy < 0 || PyList_Append(self->sources, truthy ? current : self->no_source) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(current);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(out);
    return result;
}

static PyObject *
Writer_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a sink's write takes one record");
        return NULL;
    }
    return Writer_write((Writer *)self, args[0]);
}

static PyObject *
Writer_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static int
Writer_init(Writer *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"task", "topic", "serialize_key", "serialize_value", "as_read",
                            "output", "sources", "sink_name", "producer_record", "no_source",
                            "production", "key_format", "value_format", "windowed_types",
                            NULL};
    PyObject *values[12];
    int key_format = FORMAT_CALL, value_format = FORMAT_CALL;
    values[11] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO!O!OOOO|iiO:Writer", names,
                                     &values[0], &values[1], &values[2], &values[3],
                                     &values[4], &PyList_Type, &values[5], &PyList_Type,
                                     &values[6], &values[7], &values[8], &values[9],
                                     &values[10], &key_format, &value_format, &values[11]))
        return -1;
    if (key_format < 0 || key_format > (FORMAT_SESSION_WINDOWED | FORMAT_PLAIN)
        || value_format < 0 || value_format > FORMAT_PLAIN) {
        PyErr_SetString(PyExc_ValueError, "not a serde format");
        return -1;
    }
    if (!PyType_Check(values[8]) || !PyType_IsSubtype((PyTypeObject *)values[8], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "producer_record must be a tuple type");
        return -1;
    }
    PyObject **fields[] = {&self->task, &self->topic, &self->serialize_key,
                           &self->serialize_value, &self->as_read, &self->output,
                           &self->sources, &self->sink_name, &self->producer_record,
                           &self->no_source, &self->production, &self->windowed_types};
    for (int i = 0; i < 12; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*fields[i], values[i]);
    }
    self->key_format = key_format;
    self->value_format = value_format;
    self->vectorcall = Writer_vectorcall;
    return 0;
}

/* The writer refers to its task, whose delivery functions refer to the writer. */
static int
Writer_traverse(Writer *self, visitproc visit, void *arg)
{
    Py_VISIT(self->task);
    Py_VISIT(self->topic);
    Py_VISIT(self->serialize_key);
    Py_VISIT(self->serialize_value);
    Py_VISIT(self->as_read);
    Py_VISIT(self->output);
    Py_VISIT(self->sources);
    Py_VISIT(self->sink_name);
    Py_VISIT(self->producer_record);
    Py_VISIT(self->no_source);
    Py_VISIT(self->production);
    Py_VISIT(self->windowed_types);
    return 0;
}

static int
Writer_clear(Writer *self)
{
    Py_CLEAR(self->task);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->serialize_key);
    Py_CLEAR(self->serialize_value);
    Py_CLEAR(self->as_read);
    Py_CLEAR(self->output);
    Py_CLEAR(self->sources);
    Py_CLEAR(self->sink_name);
    Py_CLEAR(self->producer_record);
    Py_CLEAR(self->no_source);
    Py_CLEAR(self->production);
    Py_CLEAR(self->windowed_types);
    return 0;
}

static void
Writer_dealloc(Writer *self)
{
    PyObject_GC_UnTrack(self);
    Writer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "streamplatform.runtime._task_loop.Writer",
    .tp_doc = "A sink's delivery function (sink_writers.sink_writer's write), in C.",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_traverse = (traverseproc)Writer_traverse,
    .tp_clear = (inquiry)Writer_clear,
    .tp_call = Writer_call,
    .tp_vectorcall_offset = offsetof(Writer, vectorcall),
};

/* ---- Decoding a slice of source records in bulk --------------------------------------------
 *
 * `decode_slice(records, start, count, key_kind, value_kind, loads)`: what
 * source_records.decode_slice does with `serdes.deserialize_all` for the built-in string,
 * bytes and JSON serdes (DECODE_STRING, DECODE_BYTES, DECODE_JSON): the list of
 * `(record, key, value)` for records `[start, start + count)`, or None wherever
 * `deserialize_all` gives None (a key or value that is not bytes or None, UTF-8 that does not
 * decode, JSON with a run of 19 digits, which needs the standard library, or JSON `loads`,
 * orjson's, refuses): the caller then hands the slice to the loop undecoded, which decodes each
 * record through its serde and reports a failure at its record. One pass without the
 * interpreter: no per-slice lists of keys and values, joins or zips. */

enum { DECODE_STRING = 1, DECODE_BYTES = 2, DECODE_JSON = 3 };

/* Whether `data` holds a run of 19 or more ASCII digits (an integer orjson would read as a
 * float, losing digits; serdes._JsonSerde takes the standard library for it). */
static int
has_long_digit_run(const char *data, Py_ssize_t size)
{
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        if ((unsigned char)(data[i] - '0') <= 9) {
            if (++run >= 19)
                return 1;
        }
        else
            run = 0;
    }
    return 0;
}

/* One key or value decoded as `kind` says: a new reference; NULL without an exception when
 * the slice must take the record-by-record path; NULL with one for a failure of our own. */
static PyObject *
decoded_as(int kind, PyObject *data, PyObject *loads)
{
    if (data == Py_None)
        return Py_NewRef(Py_None);
    PyObject *result;
    if (PyByteArray_CheckExact(data) && kind != DECODE_JSON)  /* as deserialize_all does */
        result = kind == DECODE_BYTES
            ? PyBytes_FromObject(data)
            : PyUnicode_DecodeUTF8(PyByteArray_AS_STRING(data), PyByteArray_GET_SIZE(data), NULL);
    else if (!PyBytes_CheckExact(data))
        return NULL;
    else if (kind == DECODE_BYTES)
        return Py_NewRef(data);
    else if (kind == DECODE_STRING)
        result = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), NULL);
    else if (has_long_digit_run(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)))
        return NULL;
    else
        result = PyObject_CallOneArg(loads, data);
    if (result == NULL && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();  /* deserialize_all's `except Exception: return None` */
    return result;
}

static PyObject *
decode_slice(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_slice(records: list, start, count, key_kind, value_kind, loads)");
        return NULL;
    }
    PyObject *records = args[0], *loads = args[5];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), count = PyLong_AsSsize_t(args[2]);
    int key_kind = PyLong_AsLong(args[3]), value_kind = PyLong_AsLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (key_kind < DECODE_STRING || key_kind > DECODE_JSON || value_kind < DECODE_STRING
        || value_kind > DECODE_JSON) {
        PyErr_SetString(PyExc_ValueError, "not a decode kind");
        return NULL;
    }
    Py_ssize_t size = PyList_GET_SIZE(records);
    start = start < 0 ? 0 : (start > size ? size : start);
    Py_ssize_t stop = count < 0 || count > size - start ? size : start + count;
    PyObject *triples = PyList_New(stop - start);
    if (triples == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 6) {
            PyErr_SetString(PyExc_TypeError, "a source record is not a ConsumedRecord");
            goto failed;
        }
        PyObject *key = decoded_as(key_kind, PyTuple_GET_ITEM(record, 4), loads);
        if (key == NULL)
            goto failed;
        PyObject *value = decoded_as(value_kind, PyTuple_GET_ITEM(record, 5), loads);
        if (value == NULL) {
            Py_DECREF(key);
            goto failed;
        }
        PyObject *triple = PyTuple_New(3);
        if (triple == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto failed;
        }
        PyTuple_SET_ITEM(triple, 0, Py_NewRef(record));
        PyTuple_SET_ITEM(triple, 1, key);
        PyTuple_SET_ITEM(triple, 2, value);
        PyList_SET_ITEM(triples, i - start, triple);
    }
    return triples;
failed:
    Py_DECREF(triples);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- Output columns as Arrow buffers -------------------------------------------------------
 *
 * A task's output rows (sink records, changelog writes) go back to Spark as Arrow columns;
 * `pa.array` converts a list of Python objects one by one through its generic converter,
 * which checks each object's kind. These build the buffers of the two column kinds that
 * dominate, from the rows themselves, for `pa.Array.from_buffers` (runtime/rows.py):
 *
 * `binary_buffers(rows, index)`: column `index` of the tuples `rows` (bytes or None) as
 * `(null_count, validity or None, offsets, data)` of an Arrow binary array, or None when a
 * value is neither (or the data passes the int32 offsets): the caller then takes `pa.array`.
 *
 * `int64_buffer(rows, index)`: column `index` (ints within int64) as an Arrow int64 array's
 * values, or None when a value is not such an int (None included). */

/* rows[i][index], borrowed; NULL with TypeError when a row is no tuple that long. */
static PyObject *
row_item(PyObject *rows, Py_ssize_t i, Py_ssize_t index)
{
    PyObject *row = PySequence_Fast_GET_ITEM(rows, i);
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) <= index) {
        PyErr_SetString(PyExc_TypeError, "a row is not a tuple with that column");
        return NULL;
    }
    return PyTuple_GET_ITEM(row, index);
}

static int
rows_and_index(PyObject *const *args, Py_ssize_t nargs, const char *name, PyObject **rows,
               Py_ssize_t *index)
{
    if (nargs != 2 || !(PyList_Check(args[0]) || PyTuple_Check(args[0]))) {
        PyErr_Format(PyExc_TypeError, "%s(rows: list | tuple, index: int)", name);
        return -1;
    }
    *rows = args[0];
    *index = PyLong_AsSsize_t(args[1]);
    if (*index < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a column index is >= 0");
        return -1;
    }
    return 0;
}

static PyObject *
binary_buffers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *rows;
    Py_ssize_t index;
    if (rows_and_index(args, nargs, "binary_buffers", &rows, &index) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rows), nulls = 0;
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = row_item(rows, i, index);
        if (value == NULL)
            return NULL;
        if (value == Py_None)
            nulls++;
        else if (PyBytes_CheckExact(value))
            total += PyBytes_GET_SIZE(value);
        else
            Py_RETURN_NONE;
    }
    if (total > INT32_MAX)
        Py_RETURN_NONE;
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    PyObject *validity = nulls == 0 ? Py_NewRef(Py_None)
                                    : PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    PyObject *result = NULL;
    if (offsets == NULL || data == NULL || validity == NULL)
        goto done;
    int32_t *offset = (int32_t *)PyBytes_AS_STRING(offsets);
    char *bytes = PyBytes_AS_STRING(data);
    unsigned char *valid = validity == Py_None ? NULL : (unsigned char *)PyBytes_AS_STRING(validity);
    if (valid != NULL)
        memset(valid, 0, (size_t)((n + 7) / 8));
    int32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyTuple_GET_ITEM(PySequence_Fast_GET_ITEM(rows, i), index);
        offset[i] = at;
        if (value == Py_None)
            continue;
        if (valid != NULL)
            valid[i >> 3] |= (unsigned char)(1u << (i & 7));
        Py_ssize_t size = PyBytes_GET_SIZE(value);
        memcpy(bytes + at, PyBytes_AS_STRING(value), (size_t)size);
        at += (int32_t)size;
    }
    offset[n] = at;
    result = Py_BuildValue("nOOO", nulls, validity, offsets, data);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(validity);
    return result;
}

static PyObject *
int64_buffer(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *rows;
    Py_ssize_t index;
    if (rows_and_index(args, nargs, "int64_buffer", &rows, &index) < 0)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rows);
    PyObject *buffer = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (buffer == NULL)
        return NULL;
    int64_t *values = (int64_t *)PyBytes_AS_STRING(buffer);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = row_item(rows, i, index);
        if (value == NULL) {
            Py_DECREF(buffer);
            return NULL;
        }
        if (!PyLong_CheckExact(value))
            goto declined;
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow)
            goto declined;
        values[i] = (int64_t)number;
    }
    return buffer;
declined:
    Py_DECREF(buffer);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "The Python objects the loop needs (task.py, once)."},
    {"process_all", (PyCFunction)(void (*)(void))process_all, METH_FASTCALL,
     "Task._process_all's loop over (record, key, value) triples, in C."},
    {"serialize", (PyCFunction)(void (*)(void))serialize_function, METH_FASTCALL,
     "A Writer's serialization of one value (tests)."},
    {"decode_slice", (PyCFunction)(void (*)(void))decode_slice, METH_FASTCALL,
     "A slice of source records' keys and values decoded by the built-in serdes, or None."},
    {"binary_buffers", (PyCFunction)(void (*)(void))binary_buffers, METH_FASTCALL,
     "A column of bytes as an Arrow binary array's buffers, or None."},
    {"int64_buffer", (PyCFunction)(void (*)(void))int64_buffer, METH_FASTCALL,
     "A column of ints as an Arrow int64 array's values, or None."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "_task_loop", "A task's loop over its source records, in C.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__task_loop(void)
{
    CORES_INTERN(str_current, "current");
    CORES_INTERN(str_stream_time, "stream_time");
    CORES_INTERN(str_route, "_route");
    CORES_INTERN(str_handle, "_handle");
    CORES_INTERN(str_extracted, "_extracted");
    CORES_INTERN(str_punctuate, "_punctuate");
    CORES_INTERN(str_punctuations, "punctuations");
    CORES_INTERN(str_consumed, "consumed");
    CORES_INTERN(str_timing, "timing");
    CORES_INTERN(str_records_in, "records_in");
    CORES_INTERN(str_name, "name");
    CORES_INTERN(str_lateness_sum, "lateness_sum_ms");
    CORES_INTERN(str_lateness_max, "lateness_max_ms");
    CORES_INTERN(str_timestamp_sum, "timestamp_sum_ms");
    CORES_INTERN(str_timestamp_min, "timestamp_min");
    CORES_INTERN(str_timestamped, "timestamped");
    CORES_INTERN(str_topic, "topic");
    CORES_INTERN(str_key, "key");
    CORES_INTERN(str_window, "window");
    CORES_INTERN(str_start, "start");
    CORES_INTERN(str_end, "end");
    if (PyType_Ready(&WriterType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&definition);
    if (module == NULL)
        return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(module, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
