/* refail: fold() of a ProxyFailed (included by reducers/_fastfold.c). */

#define VANTAGES 4 /* agents kept in a failing proxy's failed_by (proxies._VANTAGES) */
#define BASE_HALVES_AT 10000 /* trust._BASE_HALVES_AT */

/* fold() of a ProxyFailed: a known proxy's failed recheck (proxies.failed, with the
 * baseline check of trust.checked), under the contract of reconfirm. */
static PyObject *refail(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "refail(state, event, seq, ts)");
        return NULL;
    }
    PyObject *state = args[0], *e = args[1], *key = NULL;
    long long seq, ts, spot_s;
    if (!ready || Py_TYPE(e) != t_failed || Py_TYPE(state) != t_state) goto no;
    if (!in_order(state, args, &seq, &ts)) goto no;
    PyObject *settings = GET(state, s_off[S_SETTINGS]);
    if (settings == NULL || Py_TYPE(settings) != t_settings) goto no;
    PyObject *subjects_o = GET(settings, t_off[T_SUBJECTS]), *trust_o = GET(settings, t_off[T_TRUST]);
    if (subjects_o == NULL || !PyBool_Check(subjects_o) || trust_o == NULL || !PyBool_Check(trust_o) ||
        !ll(GET(settings, t_off[T_SPOT]), &spot_s))
        goto no;
    int trust = trust_o == Py_True;
    PyObject *eid = GET(e, f_off[F_ID]), *name = GET(e, f_off[F_AGENT]), *ip = GET(e, f_off[F_IP]);
    PyObject *port = GET(e, f_off[F_PORT]), *lease = GET(e, f_off[F_LEASE]);
    if (!is_str(eid) || !is_str(name) || !is_str(ip) || !is_str(lease) || port == NULL ||
        !PyLong_CheckExact(port))
        goto no;
    Prelude pre;
    if (!prelude(&pre, state, eid, name, tag_failed, subjects_o == Py_True, trust)) goto no;
    Touch touch;
    if (!touch_check(&touch, state, lease, name, ts)) goto no;

    PyObject *proxies = GET(state, s_off[S_PROXIES]), *dirty = GET(state, s_off[S_DIRTY_PROXIES]);
    if (proxies == NULL || !PyDict_CheckExact(proxies) || dirty == NULL || !PySet_CheckExact(dirty)) goto no;
    if ((key = PyTuple_Pack(2, ip, port)) == NULL) goto no;
    PyObject *row = PyDict_GetItemWithError(proxies, key);
    if (row == NULL || Py_TYPE(row) != t_proxy) goto no; /* unknown: fold() counts it rejected */
    long long fail, seen, failed_at;
    PyObject *r_agents = GET(row, p_off[P_AGENTS]), *failed_by = GET(row, p_off[P_FAILED_BY]);
    if (!ll(GET(row, p_off[P_FAIL]), &fail) || fail < 0 || !ll(GET(row, p_off[P_LAST_SEEN]), &seen) ||
        seen < 0 || !ll(GET(row, p_off[P_LAST_FAILED]), &failed_at) || r_agents == NULL ||
        !PyTuple_CheckExact(r_agents) || failed_by == NULL || !PyTuple_CheckExact(failed_by) ||
        !is_str(GET(row, p_off[P_PROTO])) || !is_str(GET(row, p_off[P_ANON])) ||
        !is_str(GET(row, p_off[P_COUNTRY])))
        goto no;

    int baseline = 0, counts_on_row = 1;
    PyObject *base = NULL;
    long long checks = 0, failed = 0;
    if (trust) {
        if (pre.judge && !(seen <= failed_at || ts - seen > spot_s * 1000) && PyTuple_GET_SIZE(r_agents)) {
            /* trust.checked: a baseline check where an operator's agent confirmed it, else a
             * spot-check of the others (fold() weighs those) */
            PyObject *operators = GET(state, s_off[S_OPERATORS]);
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r_agents) && !baseline; i++) {
                int in = PySet_Contains(operators, PyTuple_GET_ITEM(r_agents, i));
                if (in < 0) goto no;
                baseline = in;
            }
            if (!baseline) goto no;
            base = GET(state, s_off[S_TRUST_BASE]);
            if (base == NULL || !PyList_CheckExact(base) || PyList_GET_SIZE(base) != 2 ||
                !ll(PyList_GET_ITEM(base, 0), &checks) || !ll(PyList_GET_ITEM(base, 1), &failed))
                goto no;
        }
        PyObject *trusted = GET(state, s_off[S_TRUSTED]);
        if (trusted == NULL || !PyFrozenSet_CheckExact(trusted)) goto no;
        int t = PySet_Contains(trusted, pre.aname);
        if (t < 0) goto no;
        counts_on_row = t; /* an agent nobody vouches for makes no proxy suspect */
    }
    PyObject *counts = NULL;
    if (counts_on_row && !fail) { /* state.failing.add: the bucket it joins */
        PyObject *fc = GET(state, s_off[S_FAILING]);
        counts = fc && Py_TYPE(fc) == t_comp ? GET(fc, c_buckets) : NULL;
        if (counts == NULL || !PyDict_CheckExact(counts)) goto no;
    }
    int add_by = counts_on_row && PyUnicode_GET_LENGTH(pre.aname) && PyTuple_GET_SIZE(failed_by) < VANTAGES;
    if (add_by) {
        int has = PySequence_Contains(failed_by, pre.aname);
        if (has < 0) goto no;
        add_by = !has;
    }

    /* ---- Apply, in fold()'s order. ---- */
    if (!prelude_apply(&pre, ts)) goto fail;
    if (baseline) {
        checks += 1, failed += 1;
        if (checks >= BASE_HALVES_AT) checks /= 2, failed /= 2;
        PyObject *c = PyLong_FromLongLong(checks), *f = PyLong_FromLongLong(failed);
        if (c == NULL || f == NULL) {
            Py_XDECREF(c);
            Py_XDECREF(f);
            goto fail;
        }
        PyList_SetItem(base, 0, c); /* steals, drops the old */
        PyList_SetItem(base, 1, f);
    }
    if (counts_on_row) {
        if (counts != NULL) {
            PyObject *k = PyTuple_Pack(3, GET(row, p_off[P_PROTO]), GET(row, p_off[P_ANON]),
                                       GET(row, p_off[P_COUNTRY]));
            int ok = k && comp_add(counts, floordiv(seen, bucket_ms), k);
            Py_XDECREF(k);
            if (!ok) goto fail;
        }
        if (!put_ll(row, p_off[P_FAIL], fail + 1)) goto fail;
        if (ts > failed_at && !put_ll(row, p_off[P_LAST_FAILED], ts)) goto fail;
        if (add_by) {
            PyObject *t = appended(failed_by, pre.aname);
            if (t == NULL) goto fail;
            put(row, p_off[P_FAILED_BY], t);
        }
        if (PySet_Add(dirty, key) < 0) goto fail;
    }
    if (!touch_apply(&touch, &pre, ts)) goto fail;
    if (!put_ll(state, s_off[S_LAST_SEQ], seq)) goto fail;
    Py_DECREF(key);
    Py_RETURN_TRUE;
no:
    Py_XDECREF(key);
    if (PyErr_Occurred()) PyErr_Clear();
    Py_RETURN_FALSE;
fail:
    Py_XDECREF(key);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "refail: half applied");
    return NULL;
}

