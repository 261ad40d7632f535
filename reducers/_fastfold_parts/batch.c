/* fold_batch: projections/folder.py's loop over a batch of messages (included by
 * reducers/_fastfold.c).
 *
 * Why: with the everyday events folded in C, the Python loop around them (unpacking a
 * message, the redelivery and DLQ checks, decode's frame, admission's call, the fast
 * fold's lookup) was a tenth of the fold, the same for every message whatever it holds:
 * most of what one Located costs beside its reduce (issue 10's bar).
 *
 *   fold_batch(state, messages, start, decode, admit, fast, rules, dlq)
 *       -> (stop, applied, resent)
 *
 * folds ``messages`` (a list of (seq, ts, subject, payload) tuples) from ``start`` on,
 * as Folder.apply does, and stops before the first message it cannot take plainly: a DLQ
 * subject, a payload ``decode`` (msgspec's) refuses, one admission does not admit at once
 * (``admit`` answers other than 1), or anything not of the expected types. Such a message
 * it has not touched: Folder.apply takes it in Python (the rejection, its reason and the
 * DLQ are Folder's), then calls again from the next one. Admitted events go to
 * ``fast[type]`` (this module's folds) and, where that declines or there is none, to
 * ``rules`` (fold_rules); an exception from either is raised as Folder.apply would.
 * A Located that ``fast`` folds is first read from its bytes (located_wire.c), which
 * takes the encoder's form and hands anything else to these steps. */

static PyObject *fold_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8 || !PyList_CheckExact(args[1]) || !PyLong_CheckExact(args[2]) || !PyDict_CheckExact(args[5]) ||
        !PyBytes_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "fold_batch(state, messages: list, start: int, decode, admit, fast: dict, rules, dlq: bytes)");
        return NULL;
    }
    PyObject *state = args[0], *messages = args[1], *decode = args[3], *admit = args[4], *fast = args[5];
    PyObject *rules = args[6];
    const char *dlq = PyBytes_AS_STRING(args[7]);
    Py_ssize_t dlq_n = PyBytes_GET_SIZE(args[7]);
    Py_ssize_t i = PyLong_AsSsize_t(args[2]), n = PyList_GET_SIZE(messages);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "fold_batch: start must be >= 0");
        return NULL;
    }
    long long applied = 0, resent = 0;
    if (!ready || Py_TYPE(state) != t_state) goto stop;
    int wire = PyDict_GetItemWithError(fast, (PyObject *)t_located) != NULL;
    if (PyErr_Occurred()) return NULL;
    for (; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(messages, i);
        if (!PyTuple_CheckExact(m) || PyTuple_GET_SIZE(m) != 4) goto stop;
        PyObject *seq = PyTuple_GET_ITEM(m, 0), *ts = PyTuple_GET_ITEM(m, 1);
        PyObject *subject = PyTuple_GET_ITEM(m, 2), *payload = PyTuple_GET_ITEM(m, 3);
        long long s, last;
        if (!ll(seq, &s) || !PyLong_CheckExact(ts) || !ll(GET(state, s_off[S_LAST_SEQ]), &last) ||
            !PyBytes_CheckExact(subject))
            goto stop;
        if (s <= last) continue; /* redelivered: applied already */
        if (PyBytes_GET_SIZE(subject) >= dlq_n && memcmp(PyBytes_AS_STRING(subject), dlq, (size_t)dlq_n) == 0)
            goto stop;
        if (wire && PyBytes_GET_SIZE(subject) > 8 && memcmp(PyBytes_AS_STRING(subject), "ppf.geo.", 8) == 0) {
            int r = located_wire(state, subject, payload, seq, ts);
            if (r < 0) return NULL;
            if (r > 0) {
                applied++;
                continue;
            }
        }
        PyObject *event = PyObject_Vectorcall(decode, &payload, 1, NULL);
        if (event == NULL) {
            PyErr_Clear(); /* Folder.apply decodes it again, for the reason */
            goto stop;
        }
        PyObject *a_args[4] = {subject, event, state, ts};
        PyObject *how = PyObject_Vectorcall(admit, a_args, 4, NULL);
        long yes = how != NULL && PyLong_CheckExact(how) ? PyLong_AsLong(how) : 0;
        Py_XDECREF(how);
        if (yes != 1) {
            if (PyErr_Occurred()) PyErr_Clear();
            Py_DECREF(event);
            goto stop;
        }
        PyObject *f_args[4] = {state, event, seq, ts};
        PyObject *in_c = PyDict_GetItemWithError(fast, (PyObject *)Py_TYPE(event));
        if (in_c == NULL && PyErr_Occurred()) {
            Py_DECREF(event);
            return NULL;
        }
        if (in_c != NULL) {
            PyObject *r = PyObject_Vectorcall(in_c, f_args, 4, NULL);
            if (r == NULL) {
                Py_DECREF(event);
                return NULL;
            }
            int folded = r == Py_True;
            Py_DECREF(r);
            if (folded) {
                Py_DECREF(event);
                applied++;
                continue;
            }
        }
        PyObject *r = PyObject_Vectorcall(rules, f_args, 4, NULL);
        Py_DECREF(event);
        if (r == NULL) return NULL;
        int truth = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (truth < 0) return NULL;
        if (truth)
            applied++;
        else
            resent++; /* an agent's re-send of what is folded already */
    }
stop:
    return Py_BuildValue("(nLL)", i, applied, resent);
}
