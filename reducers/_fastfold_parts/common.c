/* Helpers of reducers/_fastfold.c (included there: one translation unit): slots, the
 * composition's counts, the prelude every observation shares, ledger.touch, addresses. */

/* Store a new reference in a slot, dropping the old one. */
static void put(PyObject *obj, Py_ssize_t off, PyObject *value) {
    PyObject **p = (PyObject **)((char *)obj + off);
    PyObject *old = *p;
    *p = value;
    Py_XDECREF(old);
}

/* An int slot (not a bool) as a C long long; 0 when it is anything else. */
static int ll(PyObject *v, long long *out) {
    if (v == NULL || !PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

static int put_ll(PyObject *obj, Py_ssize_t off, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return 0;
    put(obj, off, v);
    return 1;
}

static int is_str(PyObject *v) { return v != NULL && PyUnicode_CheckExact(v); }

/* a == b for two str, -1 on error (none expected: both are exact str). */
static int same(PyObject *a, PyObject *b) { return PyObject_RichCompareBool(a, b, Py_EQ); }

/* proxies._SHARED.get(s, s), a new reference. */
static PyObject *shared_str(PyObject *s) {
    PyObject *v = PyDict_GetItemWithError(shared, s);
    v = v ? v : s;
    Py_INCREF(v);
    return v;
}

/* (*items, item) */
static PyObject *appended(PyObject *items, PyObject *item) {
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *t = PyTuple_New(n + 1);
    if (t == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(items, i);
        Py_INCREF(x);
        PyTuple_SET_ITEM(t, i, x);
    }
    Py_INCREF(item);
    PyTuple_SET_ITEM(t, n, item);
    return t;
}

/* counts[key] moved by +1 or -1 (Composition's arithmetic), a count of 0 deleted; -1 of
 * a count that is not there fails (the callers checked it, as Composition assumes). */
static int bump(PyObject *counts, PyObject *key, int delta) {
    long long n = 0;
    PyObject *was = PyDict_GetItemWithError(counts, key);
    if ((was == NULL && (PyErr_Occurred() || delta < 0)) || (was != NULL && !ll(was, &n))) return 0;
    if (n + delta == 0) return PyDict_DelItem(counts, key) == 0;
    PyObject *v = PyLong_FromLongLong(n + delta);
    int r = v ? PyDict_SetItem(counts, key, v) : -1;
    Py_XDECREF(v);
    return r == 0;
}

/* The counts of ``bucket`` (borrowed) where ``key``, a (proto, anon, country), has a
 * count; NULL where it has none, or on an error (then cleared by the caller's decline). */
static PyObject *holding(PyObject *buckets, long long bucket, PyObject *key) {
    PyObject *b = PyLong_FromLongLong(bucket);
    if (b == NULL) return NULL;
    PyObject *counts = PyDict_GetItemWithError(buckets, b);
    Py_DECREF(b);
    if (counts == NULL || !PyDict_CheckExact(counts)) return NULL;
    PyObject *n = PyDict_GetItemWithError(counts, key);
    long long nn;
    return n != NULL && ll(n, &nn) ? counts : NULL;
}

/* holding() for (proto, anon, country). */
static PyObject *counted_in(PyObject *buckets, long long bucket, PyObject *proto, PyObject *anon,
                            PyObject *country) {
    PyObject *key = PyTuple_Pack(3, proto, anon, country);
    if (key == NULL) return NULL;
    PyObject *counts = holding(buckets, bucket, key);
    Py_DECREF(key);
    return counts;
}

/* Composition.add for (bucket, key). */
static int comp_add(PyObject *buckets, long long bucket, PyObject *key) {
    PyObject *b = PyLong_FromLongLong(bucket);
    if (b == NULL) return 0;
    PyObject *counts = PyDict_GetItemWithError(buckets, b);
    int ok = counts != NULL || !PyErr_Occurred();
    if (ok && counts == NULL) {
        ok = (counts = PyDict_New()) != NULL && PyDict_SetItem(buckets, b, counts) == 0;
        Py_XDECREF(counts); /* the bucket dict holds it */
    }
    Py_DECREF(b);
    return ok && bump(counts, key, +1);
}

/* Composition.remove for (bucket, key), an emptied bucket dropped. */
static int comp_remove(PyObject *buckets, long long bucket, PyObject *key) {
    PyObject *b = PyLong_FromLongLong(bucket);
    if (b == NULL) return 0;
    PyObject *counts = PyDict_GetItemWithError(buckets, b);
    int ok = counts != NULL && bump(counts, key, -1);
    if (ok && PyDict_GET_SIZE(counts) == 0) ok = PyDict_DelItem(buckets, b) == 0;
    Py_DECREF(b);
    return ok;
}

/* Checked before anything changes, for every event: the message is not applied yet (seq)
 * and no sweep of the pool is due at its time (fold()'s tick: those stay fold()'s). */
static int in_order(PyObject *state, PyObject *const *args, long long *seq, long long *ts) {
    long long last_seq, sweep;
    return ll(args[2], seq) && ll(args[3], ts) && *ts >= 0 &&
           ll(GET(state, s_off[S_LAST_SEQ]), &last_seq) && *seq > last_seq &&
           ll(GET(state, s_off[S_SWEEP]), &sweep) && *ts < sweep * sweep_ms + sweep_ms;
}

/* f"{ip}:{port}" (sources.credit), built directly where the address is ASCII (it is
 * after admission; PyUnicode_FromFormat, the general way, was a tenth of this call). */
static PyObject *address(PyObject *ip, PyObject *port) {
    long long p;
    if (!PyUnicode_IS_ASCII(ip) || !ll(port, &p) || p < 0) return PyUnicode_FromFormat("%U:%S", ip, port);
    char digits[24];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + p % 10);
        p /= 10;
    } while (p);
    Py_ssize_t n = PyUnicode_GET_LENGTH(ip);
    PyObject *s = PyUnicode_New(n + 1 + nd, 127);
    if (s == NULL) return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(s);
    memcpy(out, PyUnicode_1BYTE_DATA(ip), (size_t)n);
    out[n] = ':';
    for (int i = 0; i < nd; i++) out[n + 1 + i] = (Py_UCS1)digits[nd - 1 - i];
    return s;
}

static long long floordiv(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* What fold() does for every observation before its own reducer: the agent's high-water
 * mark (a re-send is fold()'s), its last_seen, its quotas (trust.count), its counts. */
typedef struct {
    PyObject *high_water, *eid, *name, *tag, *agent, *aname, *counts;
    int subjects, counted, judge;
    long long a_seen, a_late, tag_n, q_min, q_events, q_hour, q_proxies;
} Prelude;

static int prelude(Prelude *p, PyObject *state, PyObject *eid, PyObject *name, PyObject *tag,
                   int subjects, int trust) {
    p->eid = eid, p->name = name, p->tag = tag, p->subjects = subjects;
    p->counted = p->judge = 0;
    p->q_min = p->q_events = p->q_hour = p->q_proxies = p->tag_n = 0;
    p->high_water = GET(state, s_off[S_HIGH_WATER]);
    if (subjects) {
        if (p->high_water == NULL || !PyDict_CheckExact(p->high_water)) return 0;
        int derived_id = PyUnicode_Tailmatch(eid, derived, 0, PyUnicode_GET_LENGTH(derived), -1);
        if (derived_id != 0) return 0; /* 1: kept once by its fixed id instead; -1: error */
        PyObject *mark = PyDict_GetItemWithError(p->high_water, name);
        if (mark == NULL && PyErr_Occurred()) return 0;
        if (PyUnicode_Compare(eid, mark ? mark : empty) <= 0) return 0; /* a re-send */
        if (PyErr_Occurred()) return 0;
    }
    PyObject *agents = GET(state, s_off[S_AGENTS]);
    p->agent = agents && PyDict_CheckExact(agents) ? PyDict_GetItemWithError(agents, name) : NULL;
    if (p->agent == NULL || Py_TYPE(p->agent) != t_agent) return 0;
    p->aname = GET(p->agent, a_off[A_NAME]);
    p->counts = GET(p->agent, a_off[A_COUNTS]);
    if (!is_str(p->aname) || p->counts == NULL || !PyDict_CheckExact(p->counts)) return 0;
    if (!ll(GET(p->agent, a_off[A_LAST_SEEN]), &p->a_seen) || !ll(GET(p->agent, a_off[A_LATE]), &p->a_late))
        return 0;
    PyObject *tag_was = PyDict_GetItemWithError(p->counts, tag);
    if ((tag_was == NULL && PyErr_Occurred()) || (tag_was != NULL && !ll(tag_was, &p->tag_n))) return 0;
    if (trust) {
        PyObject *operators = GET(state, s_off[S_OPERATORS]), *judges = GET(state, s_off[S_JUDGES]);
        if (operators == NULL || !PyFrozenSet_CheckExact(operators) || judges == NULL ||
            !PyFrozenSet_CheckExact(judges))
            return 0;
        int op = PySet_Contains(operators, p->aname);
        p->judge = PySet_Contains(judges, p->aname);
        if (op < 0 || p->judge < 0) return 0;
        p->counted = !op;
        if (p->counted && (!ll(GET(p->agent, a_off[A_QMIN]), &p->q_min) ||
                           !ll(GET(p->agent, a_off[A_QEVENTS]), &p->q_events) ||
                           !ll(GET(p->agent, a_off[A_QHOUR]), &p->q_hour) ||
                           !ll(GET(p->agent, a_off[A_QPROXIES]), &p->q_proxies)))
            return 0;
    }
    return 1;
}

static int prelude_apply(Prelude *p, long long ts) {
    PyObject *agent = p->agent;
    if (p->subjects && PyDict_SetItem(p->high_water, p->name, p->eid) < 0) return 0;
    if (ts > p->a_seen && !put_ll(agent, a_off[A_LAST_SEEN], ts)) return 0;
    if (p->counted) {
        long long minute = ts / 60000, hour = ts / 3600000;
        long long events = p->q_min != minute ? 0 : p->q_events;
        if (p->q_min != minute && !put_ll(agent, a_off[A_QMIN], minute)) return 0;
        if (!put_ll(agent, a_off[A_QEVENTS], events + 1)) return 0;
        if (p->q_hour != hour &&
            (!put_ll(agent, a_off[A_QHOUR], hour) || !put_ll(agent, a_off[A_QPROXIES], 0) ||
             !put_ll(agent, a_off[A_QSOURCES], 0)))
            return 0;
    }
    PyObject *n_tag = PyLong_FromLongLong(p->tag_n + 1);
    if (n_tag == NULL) return 0;
    int r = PyDict_SetItem(p->counts, p->tag, n_tag);
    Py_DECREF(n_tag);
    return r == 0;
}

/* ledger.touch of the lease an event names (none: ""), checked, then applied. */
typedef struct {
    PyObject *lease, *lrow, *dirty;
    int touched;
    long long ttl;
} Touch;

static int touch_check(Touch *t, PyObject *state, PyObject *lease, PyObject *name, long long ts) {
    t->lease = lease, t->lrow = NULL, t->touched = 0, t->ttl = 0;
    t->dirty = GET(state, s_off[S_DIRTY_LEASES]);
    if (!PyUnicode_GET_LENGTH(lease)) return 1;
    if (t->dirty == NULL || !PySet_CheckExact(t->dirty)) return 0;
    PyObject *owner = GET(state, s_off[S_LEASE_OWNER]), *leases = GET(state, s_off[S_LEASES]);
    if (owner == NULL || !PyDict_CheckExact(owner) || leases == NULL || !PyDict_CheckExact(leases)) return 0;
    PyObject *target = PyDict_GetItemWithError(owner, lease);
    if (target == NULL) return !PyErr_Occurred(); /* no lease of that id: a late event */
    PyObject *lrow = t->lrow = PyDict_GetItemWithError(leases, target);
    if (lrow == NULL || Py_TYPE(lrow) != t_lease) return 0;
    PyObject *status = GET(lrow, l_off[L_STATUS]), *l_lease = GET(lrow, l_off[L_LEASE]);
    PyObject *holder = GET(lrow, l_off[L_HOLDER]);
    long long expires;
    if (!is_str(status) || !is_str(l_lease) || !is_str(holder) ||
        !ll(GET(lrow, l_off[L_EXPIRES]), &expires) || !ll(GET(lrow, l_off[L_TTL]), &t->ttl) ||
        !is_str(GET(lrow, l_off[L_TARGET])))
        return 0;
    int live = same(status, leased);
    if (live < 0 || (live && ts > expires)) return 0; /* expired on the way: ledger._expire */
    int mine = live ? same(l_lease, lease) : 0;
    int held = mine == 1 ? same(holder, name) : 0;
    if (mine < 0 || held < 0) return 0;
    t->touched = held;
    return 1;
}

static int touch_apply(Touch *t, Prelude *p, long long ts) {
    if (!PyUnicode_GET_LENGTH(t->lease)) return 1;
    if (!t->touched) return put_ll(p->agent, a_off[A_LATE], p->a_late + 1); /* a lost lease */
    if (!put_ll(t->lrow, l_off[L_EXPIRES], ts + t->ttl * 1000)) return 0;
    return PySet_Add(t->dirty, GET(t->lrow, l_off[L_TARGET])) == 0;
}

static int within(unsigned int (*ranges)[2], int n, unsigned int v) {
    for (int i = 0; i < n; i++)
        if ((v & ranges[i][1]) == ranges[i][0]) return 1;
    return 0;
}

/* events.address.proxy_address_ok for a dotted quad: 1 when it may be a public proxy
 * (or a lab's), 0 when not, -1 where only the Python decides (not an ASCII dotted quad:
 * IPv6, or text inet_pton would read differently from Python's). */
static int address_ok(PyObject *ip, long long port, int lab) {
    if (!(0 < port && port <= 65535)) return 0;
    if (!PyUnicode_IS_ASCII(ip) || PyUnicode_GET_LENGTH(ip) > 15) return -1;
    const char *text = (const char *)PyUnicode_1BYTE_DATA(ip);
    if ((Py_ssize_t)strlen(text) != PyUnicode_GET_LENGTH(ip)) return -1; /* a NUL inside */
    struct in_addr a;
    if (inet_pton(AF_INET, text, &a) != 1) return -1;
    unsigned int v = ntohl(a.s_addr);
    if (!within(blocked, n_blocked, v)) return 1;
    return lab && within(lab_ranges, n_lab, v);
}
