/* locate: fold() of a Located (included by reducers/_fastfold.c). */

/* The counts of ``row``'s bucket in ``comp`` where ``old`` (the row's key) has a count:
 * Composition.moved's lookup, borrowed; NULL where it has none. */
static PyObject *moving_counts(PyObject *comp, PyObject *row, PyObject *old) {
    long long seen;
    if (comp == NULL || Py_TYPE(comp) != t_comp || !ll(GET(row, p_off[P_LAST_SEEN]), &seen) || seen < 0)
        return NULL;
    PyObject *buckets = GET(comp, c_buckets);
    if (buckets == NULL || !PyDict_CheckExact(buckets)) return NULL;
    return holding(buckets, floordiv(seen, bucket_ms), old);
}

#define MAX_PORTS 64 /* rows of one address checked at once; more: fold() does it */

/* geo.located for a Located whose fields are given (the event's, or its payload's, read
 * in place by located_wire.c): 1 when applied as fold() would, 0 when nothing was
 * touched and fold() must take it, -1 on an error (raised). */
static int locate_fields(PyObject *state, PyObject *ip, PyObject *country, PyObject *asn, PyObject *as_org,
                         PyObject *geo, long long seq) {
    if (!is_str(ip) || !is_str(country) || asn == NULL || !PyLong_CheckExact(asn) || !is_str(as_org) ||
        !is_str(geo))
        goto no;
    PyObject *by_ip = GET(state, s_off[S_BY_IP]), *unlocated = GET(state, s_off[S_UNLOCATED]);
    PyObject *rows = GET(state, s_off[S_PROXIES]), *dirty = GET(state, s_off[S_DIRTY_PROXIES]);
    PyObject *comp = GET(state, s_off[S_COMPOSITION]), *failing = GET(state, s_off[S_FAILING]);
    if (by_ip == NULL || !PyDict_CheckExact(by_ip) || unlocated == NULL || !PySet_CheckExact(unlocated) ||
        rows == NULL || !PyDict_CheckExact(rows) || dirty == NULL || !PySet_CheckExact(dirty))
        goto no;
    PyObject *entry = PyDict_GetItemWithError(by_ip, ip);
    if (entry == NULL) {
        if (PyErr_Occurred()) goto no;
        goto done; /* no row has the address: nothing to copy it onto */
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) goto no;
    PyObject *was = PyTuple_GET_ITEM(entry, 0), *ports = PyTuple_GET_ITEM(entry, 1);
    if (!PyTuple_CheckExact(ports) || PyTuple_GET_SIZE(ports) > MAX_PORTS) goto no;
    Py_ssize_t n = PyTuple_GET_SIZE(ports);

    /* ---- Checked first: the rows, and the counts a change of country moves. ---- */
    /* Per row: its key, the row, and where a change of country moves it: its old
     * (proto, anon, country) and the counts holding it in the composition and, for a
     * failing row, in the failing one (Composition.moved, one key built for both). */
    PyObject *keys[MAX_PORTS], *found[MAX_PORTS], *olds[MAX_PORTS], *counts[MAX_PORTS], *fcounts[MAX_PORTS];
    int change[MAX_PORTS];
    Py_ssize_t made = 0;
    PyObject *fresh = PyTuple_Pack(4, country, asn, as_org, geo);
    if (fresh == NULL) goto no;
    PyObject *place = PyDict_SetDefault(places, fresh, fresh); /* geo._PLACES.setdefault */
    Py_DECREF(fresh);
    if (place == NULL) goto no;
    if (place == was) goto done; /* a re-sent lookup: the rows carry it already */
    for (; made < n; made++) {
        Py_ssize_t i = made;
        olds[i] = counts[i] = fcounts[i] = NULL;
        keys[i] = PyTuple_Pack(2, ip, PyTuple_GET_ITEM(ports, i));
        if (keys[i] == NULL) goto undo;
        found[i] = PyDict_GetItemWithError(rows, keys[i]);
        if (found[i] == NULL || Py_TYPE(found[i]) != t_proxy) {
            made++;
            goto undo;
        }
        PyObject *row = found[i];
        PyObject *r_country = GET(row, p_off[P_COUNTRY]), *r_geo = GET(row, p_off[P_GEO]);
        PyObject *r_asn = GET(row, p_off[P_ASN]), *r_org = GET(row, p_off[P_AS_ORG]);
        long long fail;
        if (!is_str(r_country) || !is_str(r_geo) || !is_str(r_org) || r_asn == NULL ||
            !PyLong_CheckExact(r_asn) || !ll(GET(row, p_off[P_FAIL]), &fail) ||
            !is_str(GET(row, p_off[P_PROTO])) || !is_str(GET(row, p_off[P_ANON]))) {
            made++;
            goto undo;
        }
        int g = same(r_geo, geo), c = same(r_country, country), a = same(r_asn, asn), o = same(r_org, as_org);
        if (g < 0 || c < 0 || a < 0 || o < 0) {
            made++;
            goto undo;
        }
        change[i] = !(g && c && a && o);
        if (change[i] && !c) {
            olds[i] = PyTuple_Pack(3, GET(row, p_off[P_PROTO]), GET(row, p_off[P_ANON]), r_country);
            if (olds[i] != NULL) counts[i] = moving_counts(comp, row, olds[i]);
            if (counts[i] != NULL && fail) fcounts[i] = moving_counts(failing, row, olds[i]);
            if (counts[i] == NULL || (fail && fcounts[i] == NULL)) {
                made++;
                goto undo;
            }
        }
    }

    /* ---- Apply, in geo.located's order. ---- */
    {
        PyObject *t = PyTuple_Pack(2, place, ports);
        int r = t ? PyDict_SetItem(by_ip, ip, t) : -1;
        Py_XDECREF(t);
        if (r < 0) goto fail;
        if (was == Py_None && PySet_Discard(unlocated, ip) < 0) goto fail;
        /* ``was`` and ``ports`` were the old entry's: ``ports`` lives on in the new one */
        PyObject *p_country = PyTuple_GET_ITEM(place, 0), *p_asn = PyTuple_GET_ITEM(place, 1);
        PyObject *p_org = PyTuple_GET_ITEM(place, 2), *p_geo = PyTuple_GET_ITEM(place, 3);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!change[i]) continue;
            PyObject *row = found[i];
            if (olds[i] != NULL) {
                PyObject *new = PyTuple_Pack(3, GET(row, p_off[P_PROTO]), GET(row, p_off[P_ANON]), p_country);
                int ok = new != NULL && bump(counts[i], olds[i], -1) && bump(counts[i], new, +1) &&
                         (fcounts[i] == NULL || (bump(fcounts[i], olds[i], -1) && bump(fcounts[i], new, +1)));
                Py_XDECREF(new);
                if (!ok) goto fail;
            }
            Py_INCREF(p_country);
            put(row, p_off[P_COUNTRY], p_country);
            Py_INCREF(p_asn);
            put(row, p_off[P_ASN], p_asn);
            Py_INCREF(p_org);
            put(row, p_off[P_AS_ORG], p_org);
            Py_INCREF(p_geo);
            put(row, p_off[P_GEO], p_geo);
            if (PySet_Add(dirty, keys[i]) < 0) goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(keys[i]);
        Py_XDECREF(olds[i]);
    }
done:
    return put_ll(state, s_off[S_LAST_SEQ], seq) ? 1 : -1;
undo:
    for (Py_ssize_t i = 0; i < made; i++) {
        Py_XDECREF(keys[i]);
        Py_XDECREF(olds[i]);
    }
no:
    if (PyErr_Occurred()) PyErr_Clear();
    return 0;
fail:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "locate: half applied");
    return -1;
}

static PyObject *locate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "locate(state, event, seq, ts)");
        return NULL;
    }
    PyObject *state = args[0], *e = args[1];
    long long seq, ts;
    if (!ready || Py_TYPE(e) != t_located || Py_TYPE(state) != t_state || !in_order(state, args, &seq, &ts)) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    int r = locate_fields(state, GET(e, g_off[G_IP]), GET(e, g_off[G_COUNTRY]), GET(e, g_off[G_ASN]),
                          GET(e, g_off[G_AS_ORG]), GET(e, g_off[G_GEO]), seq);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}
