/* reconfirm: fold() of a ProxyWorked (included by reducers/_fastfold.c). */

static PyObject *reconfirm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "reconfirm(state, event, seq, ts)");
        return NULL;
    }
    PyObject *state = args[0], *e = args[1];
    PyObject *key = NULL, *made = NULL; /* made: the row of a new proxy, not yet in the pool */
    long long seq, ts;
    if (!ready || Py_TYPE(e) != t_event || Py_TYPE(state) != t_state) goto no;
    if (!in_order(state, args, &seq, &ts)) goto no;

    /* ---- What fold() would do, read and checked; nothing is changed before "apply". ---- */
    PyObject *settings = GET(state, s_off[S_SETTINGS]);
    if (settings == NULL || Py_TYPE(settings) != t_settings) goto no;
    PyObject *alpha_o = GET(settings, t_off[T_ALPHA]);
    long long samples_n, cap, spot_s;
    if (alpha_o == NULL || !PyFloat_CheckExact(alpha_o)) goto no;
    if (!ll(GET(settings, t_off[T_SAMPLES]), &samples_n) || samples_n < 0) goto no;
    if (!ll(GET(settings, t_off[T_CAP]), &cap) || !ll(GET(settings, t_off[T_SPOT]), &spot_s)) goto no;
    PyObject *subjects_o = GET(settings, t_off[T_SUBJECTS]), *trust_o = GET(settings, t_off[T_TRUST]);
    if (subjects_o == NULL || !PyBool_Check(subjects_o) || trust_o == NULL || !PyBool_Check(trust_o))
        goto no;
    PyObject *lab_o = GET(settings, t_off[T_LAB]);
    if (lab_o == NULL || !PyBool_Check(lab_o)) goto no;
    int subjects = subjects_o == Py_True, trust = trust_o == Py_True;
    double alpha = PyFloat_AS_DOUBLE(alpha_o);

    PyObject *eid = GET(e, e_off[E_ID]), *name = GET(e, e_off[E_AGENT]);
    PyObject *ip = GET(e, e_off[E_IP]), *port = GET(e, e_off[E_PORT]);
    PyObject *proto = GET(e, e_off[E_PROTO]), *exit_ip = GET(e, e_off[E_EXIT_IP]);
    PyObject *anon = GET(e, e_off[E_ANON]), *mitm = GET(e, e_off[E_MITM]);
    PyObject *https = GET(e, e_off[E_HTTPS]), *source = GET(e, e_off[E_SOURCE]);
    PyObject *lease = GET(e, e_off[E_LEASE]);
    long long latency;
    if (!is_str(eid) || !is_str(name) || !is_str(ip) || !is_str(proto) || !is_str(exit_ip) ||
        !is_str(anon) || !is_str(https) || !is_str(source) || !is_str(lease) || mitm == NULL ||
        !PyBool_Check(mitm) || !PyLong_CheckExact(port) || !ll(GET(e, e_off[E_LATENCY]), &latency))
        goto no;
    if (latency < 0) latency = 0;

    Prelude pre;
    if (!prelude(&pre, state, eid, name, tag, subjects, trust)) goto no;
    PyObject *agent = pre.agent, *aname = pre.aname;
    int judge = pre.judge, counted = pre.counted;
    long long q_hour = pre.q_hour, q_proxies = pre.q_proxies;
    PyObject *proxies = GET(state, s_off[S_PROXIES]);
    if (proxies == NULL || !PyDict_CheckExact(proxies)) goto no;
    if ((key = PyTuple_Pack(2, ip, port)) == NULL) goto no;
    PyObject *row = PyDict_GetItemWithError(proxies, key);
    if (row == NULL && PyErr_Occurred()) goto no;
    int fresh = row == NULL;
    PyObject *by_ip = NULL, *ip_entry = NULL, *ip_place = Py_None, *ip_ports = NULL, *unlocated = NULL;
    if (fresh) { /* proxies.worked's new row, built here and put in the pool below */
        long long p;
        if (!ll(port, &p) || address_ok(ip, p, lab_o == Py_True) != 1) goto no; /* rejected: fold() */
        by_ip = GET(state, s_off[S_BY_IP]);
        unlocated = GET(state, s_off[S_UNLOCATED]);
        if (by_ip == NULL || !PyDict_CheckExact(by_ip) || unlocated == NULL || !PySet_CheckExact(unlocated))
            goto no;
        ip_entry = PyDict_GetItemWithError(by_ip, ip); /* geo.admitted: other rows of its address */
        if (ip_entry == NULL && PyErr_Occurred()) goto no;
        if (ip_entry != NULL) {
            if (!PyTuple_CheckExact(ip_entry) || PyTuple_GET_SIZE(ip_entry) != 2) goto no;
            ip_place = PyTuple_GET_ITEM(ip_entry, 0);
            ip_ports = PyTuple_GET_ITEM(ip_entry, 1);
            if (!PyTuple_CheckExact(ip_ports)) goto no;
            if (ip_place != Py_None &&
                (!PyTuple_CheckExact(ip_place) || PyTuple_GET_SIZE(ip_place) != 4))
                goto no;
        }
        PyObject *proto_s = shared_str(proto), *protos = PyTuple_Pack(1, proto_s);
        PyObject *at = PyLong_FromLongLong(ts), *ema0 = PyFloat_FromDouble((double)latency);
        if (proto_s && protos && at && ema0) {
            PyObject *argv[7] = {ip, port, proto_s, protos, at, at, ema0};
            made = PyObject_Vectorcall((PyObject *)t_proxy, argv, 0, row_kwnames);
        }
        Py_XDECREF(proto_s);
        Py_XDECREF(protos);
        Py_XDECREF(at);
        Py_XDECREF(ema0);
        if (made == NULL || Py_TYPE(made) != t_proxy) goto no;
        row = made;
    } else if (Py_TYPE(row) != t_proxy) {
        goto no;
    }
    long long fail, seen, failed_at, conf;
    long long flaps = 0;
    if (!ll(GET(row, p_off[P_FAIL]), &fail) || fail < 0) goto no;
    if (fail && !ll(GET(row, p_off[P_FLAPS]), &flaps)) goto no; /* suspect: revived below */
    if (!ll(GET(row, p_off[P_LAST_SEEN]), &seen) || seen < 0) goto no;
    if (!ll(GET(row, p_off[P_LAST_FAILED]), &failed_at) || !ll(GET(row, p_off[P_CONF]), &conf)) goto no;
    PyObject *r_proto = GET(row, p_off[P_PROTO]), *r_ip = GET(row, p_off[P_IP]);
    PyObject *r_exit = GET(row, p_off[P_EXIT_IP]), *r_anon = GET(row, p_off[P_ANON]);
    PyObject *r_country = GET(row, p_off[P_COUNTRY]), *r_ema = GET(row, p_off[P_EMA]);
    PyObject *r_samples = GET(row, p_off[P_SAMPLES]), *r_agents = GET(row, p_off[P_AGENTS]);
    PyObject *r_sources = GET(row, p_off[P_SOURCES]);
    if (!is_str(r_proto) || !is_str(r_ip) || !is_str(r_exit) || !is_str(r_anon) ||
        !is_str(r_country) || r_ema == NULL || !PyFloat_CheckExact(r_ema) || r_samples == NULL ||
        !PyBytes_CheckExact(r_samples) || r_agents == NULL || !PyTuple_CheckExact(r_agents) ||
        r_sources == NULL || !PyTuple_CheckExact(r_sources))
        goto no;
    if (same(proto, r_proto) != 1) goto no; /* another protocol: fold() records it */
    if (judge && r_agents != NULL && PyTuple_GET_SIZE(r_agents) &&
        !(seen <= failed_at || ts - seen > spot_s * 1000))
        goto no; /* a check that counts for trust (trust.checked): fold() weighs it */
    int has_agent = PySequence_Contains(r_agents, aname);
    if (has_agent < 0) goto no;
    int add_agent = !has_agent && PyTuple_GET_SIZE(r_agents) < cap;
    if (!has_agent && !add_agent) {
        PyObject *trusted = GET(state, s_off[S_TRUSTED]);
        if (trusted == NULL || !PyFrozenSet_CheckExact(trusted)) goto no;
        int t = PySet_Contains(trusted, aname);
        if (t != 0) goto no; /* room made for a trusted agent (trust.make_room) */
    }

    PyObject *sources = GET(state, s_off[S_SOURCES]);
    if (sources == NULL || !PyDict_CheckExact(sources)) goto no;
    PyObject *src = NULL;
    if (PyUnicode_GET_LENGTH(source)) {
        src = PyDict_GetItemWithError(sources, source);
        if (src == NULL && PyErr_Occurred()) goto no;
        if (src != NULL && Py_TYPE(src) != t_source) goto no;
    }
    PyObject *credited = src ? GET(src, r_off[R_URL_ID]) : source; /* the projection's copy */
    if (!is_str(credited)) goto no;
    int has_source = PySequence_Contains(r_sources, credited);
    if (has_source < 0) goto no;
    int add_source = !has_source && PyUnicode_GET_LENGTH(credited) && PyTuple_GET_SIZE(r_sources) < cap;
    PyObject *cur_lease = NULL, *cur_working = NULL;
    int work = 0;
    long long added = 0;
    if (src != NULL && fresh && !ll(GET(src, r_off[R_ADDED]), &added)) goto no;
    if (src != NULL) {
        cur_lease = GET(src, r_off[R_CUR_LEASE]);
        cur_working = GET(src, r_off[R_CUR_WORKING]);
        if (!is_str(cur_lease) || cur_working == NULL || !PyTuple_CheckExact(cur_working)) goto no;
        if (PyUnicode_GET_LENGTH(cur_lease)) {
            work = same(lease, cur_lease);
            if (work < 0) goto no;
        }
    }

    Touch touch;
    if (!touch_check(&touch, state, lease, name, ts)) goto no;
    PyObject *comp = GET(state, s_off[S_COMPOSITION]);
    PyObject *buckets = comp && Py_TYPE(comp) == t_comp ? GET(comp, c_buckets) : NULL;
    if (buckets == NULL || !PyDict_CheckExact(buckets)) goto no;
    long long was_bucket = floordiv(seen, bucket_ms);
    long long now_seen = ts > seen ? ts : seen;
    int anon_set = 0;
    if (PyUnicode_GET_LENGTH(anon)) {
        anon_set = !same(anon, r_anon);
        if (PyErr_Occurred()) goto no;
    }
    int moved = !fresh && (floordiv(now_seen, bucket_ms) != was_bucket || anon_set);
    /* the counts it leaves must be there, as Composition.remove assumes */
    if (moved && !counted_in(buckets, was_bucket, r_proto, r_anon, r_country)) goto no;
    PyObject *failing = NULL;
    if (fail) { /* a suspect back: out of state.failing's counts */
        PyObject *fc = GET(state, s_off[S_FAILING]);
        failing = fc && Py_TYPE(fc) == t_comp ? GET(fc, c_buckets) : NULL;
        if (failing == NULL || !PyDict_CheckExact(failing)) goto no;
        if (!counted_in(failing, was_bucket, r_proto, r_anon, r_country)) goto no;
    }
    PyObject *dirty_p = GET(state, s_off[S_DIRTY_PROXIES]), *dirty_s = GET(state, s_off[S_DIRTY_SOURCES]);
    if (dirty_p == NULL || !PySet_CheckExact(dirty_p) || dirty_s == NULL || !PySet_CheckExact(dirty_s))
        goto no;

    /* ---- Apply, in fold()'s order. Only memory can fail from here on. ---- */
    if (!prelude_apply(&pre, ts)) goto fail;
    if (counted && fresh && !put_ll(agent, a_off[A_QPROXIES], (q_hour != ts / 3600000 ? 0 : q_proxies) + 1))
        goto fail; /* trust.count: a new proxy */
    /* proxies.worked() */
    if (fresh) { /* into the pool, and filed under its address (geo.admitted) */
        if (PyDict_SetItem(proxies, key, made) < 0) goto fail;
        PyObject *ports = ip_ports ? appended(ip_ports, port) : PyTuple_Pack(1, port);
        PyObject *entry = ports ? PyTuple_Pack(2, ip_place, ports) : NULL;
        Py_XDECREF(ports);
        int r2 = entry ? PyDict_SetItem(by_ip, ip, entry) : -1;
        Py_XDECREF(entry);
        if (r2 < 0) goto fail;
        if (ip_entry == NULL) {
            if (PySet_Add(unlocated, ip) < 0) goto fail;
        } else if (ip_place != Py_None) { /* the address is located: the row takes it */
            for (int i = 0; i < 4; i++) Py_INCREF(PyTuple_GET_ITEM(ip_place, i));
            put(made, p_off[P_COUNTRY], PyTuple_GET_ITEM(ip_place, 0));
            put(made, p_off[P_ASN], PyTuple_GET_ITEM(ip_place, 1));
            put(made, p_off[P_AS_ORG], PyTuple_GET_ITEM(ip_place, 2));
            put(made, p_off[P_GEO], PyTuple_GET_ITEM(ip_place, 3));
            r_country = GET(made, p_off[P_COUNTRY]);
        }
    }
    if (fail) { /* suspect no more: out of the failing counts, as it was counted */
        PyObject *fkey = PyTuple_Pack(3, r_proto, r_anon, r_country);
        int ok = fkey != NULL && comp_remove(failing, was_bucket, fkey);
        Py_XDECREF(fkey);
        if (!ok) goto fail;
    }
    if (!fresh) { /* a new row starts at its first latency, no average yet */
        PyObject *ema = PyFloat_FromDouble(alpha * (double)latency + (1.0 - alpha) * PyFloat_AS_DOUBLE(r_ema));
        if (ema == NULL) goto fail;
        put(row, p_off[P_EMA], ema);
    }
    if (ts > seen && !put_ll(row, p_off[P_LAST_SEEN], ts)) goto fail;
    if (!put_ll(row, p_off[P_CONF], conf + 1)) goto fail;
    if (fail) { /* back after failing */
        Py_INCREF(empty_tuple);
        if (!put_ll(row, p_off[P_FLAPS], flaps + 1) || !put_ll(row, p_off[P_FAIL], 0)) goto fail;
        put(row, p_off[P_FAILED_BY], empty_tuple);
    }
    {
        Py_ssize_t keep = (Py_ssize_t)(2 * samples_n), had = PyBytes_GET_SIZE(r_samples);
        unsigned int sample = latency < 65535 ? (unsigned int)latency : 65535u;
        PyObject *packed;
        if (keep) {
            Py_ssize_t total = had + 2, from = total > keep ? total - keep : 0;
            packed = PyBytes_FromStringAndSize(NULL, total - from);
            if (packed == NULL) goto fail;
            char *out = PyBytes_AS_STRING(packed);
            const char *in = PyBytes_AS_STRING(r_samples);
            char tail[2] = {(char)(sample & 0xff), (char)(sample >> 8)};
            for (Py_ssize_t i = from; i < total; i++) *out++ = i < had ? in[i] : tail[i - had];
        } else {
            packed = PyBytes_FromStringAndSize("", 0);
            if (packed == NULL) goto fail;
        }
        put(row, p_off[P_SAMPLES], packed);
    }
    if (PyUnicode_GET_LENGTH(exit_ip) && !same(exit_ip, r_exit)) {
        PyObject *v = same(exit_ip, r_ip) ? r_ip : exit_ip;
        Py_INCREF(v);
        put(row, p_off[P_EXIT_IP], v);
    }
    Py_INCREF(r_anon); /* was_anonymity, for the composition's move */
    PyObject *was_anon = r_anon;
    if (anon_set) put(row, p_off[P_ANON], shared_str(anon));
    Py_INCREF(mitm);
    put(row, p_off[P_MITM], mitm);
    if (PyUnicode_GET_LENGTH(https)) put(row, p_off[P_HTTPS], shared_str(https));
    if (moved) {
        PyObject *old_key = PyTuple_Pack(3, r_proto, was_anon, r_country);
        PyObject *new_key = PyTuple_Pack(3, r_proto, GET(row, p_off[P_ANON]), r_country);
        int ok = old_key && new_key && comp_remove(buckets, was_bucket, old_key) &&
                 comp_add(buckets, floordiv(now_seen, bucket_ms), new_key);
        Py_XDECREF(old_key);
        Py_XDECREF(new_key);
        if (!ok) {
            Py_DECREF(was_anon);
            goto fail;
        }
    }
    Py_DECREF(was_anon);
    if (fresh) {
        PyObject *new_key = PyTuple_Pack(3, r_proto, GET(row, p_off[P_ANON]), r_country);
        int ok = new_key && comp_add(buckets, floordiv(now_seen, bucket_ms), new_key);
        Py_XDECREF(new_key);
        if (!ok) goto fail;
    }
    if (add_agent) {
        PyObject *t = appended(r_agents, aname);
        if (t == NULL) goto fail;
        put(row, p_off[P_AGENTS], t);
    }
    if (add_source) {
        PyObject *t = appended(r_sources, credited);
        if (t == NULL) goto fail;
        put(row, p_off[P_SOURCES], t);
    }
    if (PySet_Add(dirty_p, key) < 0) goto fail;

    /* fold(): sources.credit, ledger.touch */
    if (src != NULL && fresh && !put_ll(src, r_off[R_ADDED], added + 1)) goto fail;
    if (src != NULL) {
        if (work == 1) {
            PyObject *addr = address(ip, port);
            if (addr == NULL) goto fail;
            int has = PySequence_Contains(cur_working, addr);
            if (has == 0) {
                PyObject *t = appended(cur_working, addr);
                if (t == NULL) {
                    Py_DECREF(addr);
                    goto fail;
                }
                put(src, r_off[R_CUR_WORKING], t);
            }
            Py_DECREF(addr);
            if (has < 0) goto fail;
        }
        if (PySet_Add(dirty_s, credited) < 0) goto fail;
    }
    if (!touch_apply(&touch, &pre, ts)) goto fail;
    if (!put_ll(state, s_off[S_LAST_SEQ], seq)) goto fail;
    Py_DECREF(key);
    Py_XDECREF(made); /* the pool holds it */
    Py_RETURN_TRUE;

no:
    Py_XDECREF(key);
    Py_XDECREF(made);
    if (PyErr_Occurred()) PyErr_Clear();
    Py_RETURN_FALSE;
fail:
    Py_XDECREF(key);
    Py_XDECREF(made);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "reconfirm: half applied");
    return NULL;
}

