/* The stream reader's common frame, parsed in C.
 *
 * Why C: the fold reads a million messages for every million events, and in Python the
 * frame of each (a regex match, six groups, four int() calls, two slices and a tuple)
 * cost about as much CPU as the fold's own admission checks. Here a run of frames is
 * one call. eventlog/stream.py's _scan_py is its Python twin and the reference
 * (tests/test_firehose.py runs both over the same buffers and compares).
 *
 *   scan(data, pos, expect, until, batch[, end]) -> (pos, expect, status)
 *
 * data is any contiguous buffer (the reader's own bytearray, reused); only data[:end]
 * is read, end defaulting to its length.
 * Appends (stream_seq, server_ts_ms, subject, payload) to the list batch for each
 * complete data frame at pos of the form
 *   HMSG <subject> 1 $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts_ns>.<pending> <hlen> <total>\r\n
 * followed by <total> bytes and \r\n, and stops at the first frame that is anything
 * else or incomplete (status 0: the caller's general path takes it), at a consumer
 * sequence other than expect (status 1: a gap; pos is that frame), or at a stream
 * sequence past until when until > 0 (status 2; pos is that frame).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Digits at p (at most 19), up to end; sets *out and returns the first byte after them,
 * or NULL when there is no digit or too many. */
static const char *digits(const char *p, const char *end, long long *out) {
    long long v = 0;
    const char *start = p;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - start >= 19)
            return NULL;
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == start)
        return NULL;
    *out = v;
    return p;
}

/* A token of at least one byte that is neither '.' nor ' ' (nor a line end), followed
 * by '.'; returns the byte after the dot, or NULL. */
static const char *token_dot(const char *p, const char *end) {
    const char *start = p;
    while (p < end && *p != '.' && *p != ' ' && *p != '\r' && *p != '\n')
        p++;
    if (p == start || p >= end || *p != '.')
        return NULL;
    return p + 1;
}

static const char *expect_byte(const char *p, const char *end, char c) {
    return (p < end && *p == c) ? p + 1 : NULL;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos;
    long long expect, until;
    PyObject *batch;
    Py_ssize_t limit = -1;
    if (!PyArg_ParseTuple(args, "y*nLLO!|n", &buf, &pos, &expect, &until, &PyList_Type, &batch, &limit))
        return NULL;
    if (limit < 0 || limit > buf.len)
        limit = buf.len;
    const char *base = (const char *)buf.buf;
    const char *end = base + limit;
    int status = 0;
    while (pos < limit) {
        const char *p = base + pos;
        long long delivered, sseq, cseq, ts, pending, hlen, total;
        if (end - p < 5 || memcmp(p, "HMSG ", 5) != 0)
            break;
        p += 5;
        const char *subject = p;
        while (p < end && *p != ' ' && *p != '\r' && *p != '\n')
            p++;
        Py_ssize_t subject_len = p - subject;
        if (subject_len == 0 || end - p < 12 || memcmp(p, " 1 $JS.ACK.", 11) != 0)
            break;
        p += 11;
        if ((p = token_dot(p, end)) == NULL || (p = token_dot(p, end)) == NULL)
            break;
        if ((p = digits(p, end, &delivered)) == NULL || (p = expect_byte(p, end, '.')) == NULL ||
            (p = digits(p, end, &sseq)) == NULL || (p = expect_byte(p, end, '.')) == NULL ||
            (p = digits(p, end, &cseq)) == NULL || (p = expect_byte(p, end, '.')) == NULL ||
            (p = digits(p, end, &ts)) == NULL || (p = expect_byte(p, end, '.')) == NULL ||
            (p = digits(p, end, &pending)) == NULL || (p = expect_byte(p, end, ' ')) == NULL ||
            (p = digits(p, end, &hlen)) == NULL || (p = expect_byte(p, end, ' ')) == NULL ||
            (p = digits(p, end, &total)) == NULL || (p = expect_byte(p, end, '\r')) == NULL ||
            (p = expect_byte(p, end, '\n')) == NULL)
            break;
        if (hlen > total || total + 2 > end - p)
            break; /* incomplete: the next read brings the rest */
        if (cseq != expect) {
            status = 1;
            break;
        }
        if (until > 0 && sseq > until) {
            status = 2;
            break;
        }
        /* Built by hand: Py_BuildValue parses its format string at every call. */
        PyObject *item = PyTuple_New(4);
        if (item == NULL)
            goto fail;
        PyObject *fields[4] = {
            PyLong_FromLongLong(sseq),
            PyLong_FromLongLong(ts / 1000000),
            PyBytes_FromStringAndSize(subject, subject_len),
            PyBytes_FromStringAndSize(p + hlen, (Py_ssize_t)(total - hlen)),
        };
        for (int i = 0; i < 4; i++) {
            if (fields[i] == NULL) {
                for (int j = i + 1; j < 4; j++)
                    Py_XDECREF(fields[j]);
                Py_DECREF(item); /* releases the fields set before i */
                goto fail;
            }
            PyTuple_SET_ITEM(item, i, fields[i]);
        }
        int appended = PyList_Append(batch, item);
        Py_DECREF(item);
        if (appended < 0)
            goto fail;
        expect = cseq + 1;
        pos = (p - base) + total + 2;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(nLi)", pos, expect, status);
fail:
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Parse a run of JetStream data frames into batch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
