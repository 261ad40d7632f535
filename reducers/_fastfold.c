/* The fold's everyday events in C: a proxy confirmed, a failed recheck, a location.
 *
 * Why C: two thirds of the log are ProxyWorked, and most of them confirm a proxy the
 * pool knows already. In Python that confirmation walks reducers/fold.py, proxies.worked,
 * sources.credit, ledger.touch and trust.count: about 5 us an event, more than half of
 * the fold's time (`ppf bench fold`, BENCHMARKS.md issue 9). Here it is one pass.
 *
 *   reconfirm(state, event, seq, ts) -> bool
 *
 * The contract is reducers/fold.py's fold() for a ProxyWorked, answer for answer: True
 * when this call applied the event exactly as fold() would have; False when it changed
 * nothing at all, and fold() must apply it (tests/test_reconfirm.py folds generated
 * logs both ways and compares every projection). It answers False, before it touches
 * anything, wherever the event is not the everyday re-confirmation: an unknown proxy
 * (admission of an address, geo), a sweep due, a re-send or a derived id, an unknown
 * agent, another protocol, a spot-check of trust
 * that counts, provenance full for a trusted agent, a lease that expired on the way,
 * or any value of an unexpected type. So its rules are a subset of fold()'s, never
 * rules of their own.
 *
 *   refail(state, event, seq, ts) -> bool
 *
 * is fold() of a ProxyFailed of a known proxy (proxies.failed), with the same contract;
 * a spot-check of an untested agent's report (trust.checked) it leaves to fold().
 *
 *   locate(state, event, seq, ts) -> bool
 *
 * is fold() of a Located (reducers/geo.py's located), with the same contract. One
 * Located per address is a tenth of the messages while a pool grows, and the issue's
 * bar is that they add < 5 % to the fold: in Python their reduce was most of that.
 *
 * configure(spec) is called once by reducers/fold.py with the types and constants they
 * read; every field is read and written in the slot its member descriptor names (rows
 * are gc=False Structs, the state a __slots__ class), so no Python code runs inside.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <string.h>
#include <structmember.h>

enum { E_ID, E_AGENT, E_IP, E_PORT, E_PROTO, E_LATENCY, E_EXIT_IP, E_ANON, E_MITM, E_HTTPS,
       E_SOURCE, E_LEASE, E_N };
static const char *e_names[E_N] = {"id",      "agent",     "ip",   "port",  "proto",  "latency_ms",
                                   "exit_ip", "anonymity", "mitm", "https", "source", "lease"};
enum { S_LAST_SEQ, S_SWEEP, S_SETTINGS, S_HIGH_WATER, S_AGENTS, S_OPERATORS, S_JUDGES, S_TRUSTED,
       S_PROXIES, S_SOURCES, S_COMPOSITION, S_DIRTY_PROXIES, S_DIRTY_SOURCES, S_LEASE_OWNER,
       S_LEASES, S_DIRTY_LEASES, S_BY_IP, S_UNLOCATED, S_FAILING, S_TRUST_BASE, S_N };
static const char *s_names[S_N] = {
    "last_seq", "sweep_bucket", "settings", "high_water",  "agents",        "operators",
    "judges",   "trusted",      "proxies",  "sources",     "composition",   "dirty_proxies",
    "dirty_sources", "lease_owner", "leases", "dirty_leases", "by_ip", "unlocated", "failing", "trust_base"};
enum { F_ID, F_AGENT, F_IP, F_PORT, F_LEASE, F_N };
static const char *f_names[F_N] = {"id", "agent", "ip", "port", "lease"};
enum { G_IP, G_COUNTRY, G_ASN, G_AS_ORG, G_GEO, G_N };
static const char *g_names[G_N] = {"ip", "country", "asn", "as_org", "geo"};
enum { T_SUBJECTS, T_TRUST, T_ALPHA, T_SAMPLES, T_CAP, T_SPOT, T_LAB, T_N };
static const char *t_names[T_N] = {"agent_subjects", "trust",          "ema_alpha",    "latency_samples",
                                   "provenance_cap", "spot_window_s", "lab"};
enum { A_NAME, A_LAST_SEEN, A_COUNTS, A_LATE, A_QMIN, A_QEVENTS, A_QHOUR, A_QPROXIES, A_QSOURCES,
       A_N };
static const char *a_names[A_N] = {"name",         "last_seen",    "counts",
                                   "late",         "quota_minute", "quota_events",
                                   "quota_hour",   "quota_proxies", "quota_sources"};
enum { P_IP, P_PROTO, P_LAST_SEEN, P_LAST_FAILED, P_FAIL, P_EMA, P_CONF, P_SAMPLES, P_EXIT_IP,
       P_ANON, P_MITM, P_HTTPS, P_AGENTS, P_SOURCES, P_COUNTRY, P_ASN, P_AS_ORG, P_GEO, P_FLAPS,
       P_FAILED_BY, P_N };
static const char *p_names[P_N] = {"ip",      "proto",     "last_seen", "last_failed",
                                   "fail_streak", "latency_ema", "confirmations", "samples",
                                   "exit_ip", "anonymity", "mitm",      "https",
                                   "agents",  "sources",   "country",   "asn",
                                   "as_org",  "geo",       "flaps",     "failed_by"};
enum { R_URL_ID, R_CUR_LEASE, R_CUR_WORKING, R_ADDED, R_N };
static const char *r_names[R_N] = {"url_id", "cur_lease", "cur_working", "proxies_added"};
enum { L_STATUS, L_LEASE, L_HOLDER, L_EXPIRES, L_TTL, L_TARGET, L_N };
static const char *l_names[L_N] = {"status", "lease", "holder", "expires_at", "ttl_s", "target"};

static Py_ssize_t f_off[F_N], g_off[G_N], e_off[E_N], s_off[S_N], t_off[T_N], a_off[A_N], p_off[P_N], r_off[R_N],
    l_off[L_N], c_buckets;
static PyTypeObject *t_failed, *t_located, *t_event, *t_state, *t_settings, *t_agent, *t_proxy, *t_source, *t_lease,
    *t_comp;
static PyObject *places, *shared, *derived, *tag, *tag_failed, *leased, *empty, *empty_tuple, *row_kwnames;
/* events/address.py's ranges, as (network, mask) pairs: none may hold a public proxy,
 * and a lab admits these of them. */
#define MAX_RANGES 32
static unsigned int blocked[MAX_RANGES][2], lab_ranges[MAX_RANGES][2];
static int n_blocked, n_lab;
static long long sweep_ms, bucket_ms;
static int ready = 0;

#define GET(obj, off) (*(PyObject **)((char *)(obj) + (off)))

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

/* Composition.add for (bucket, key): counts[key] = counts.get(key, 0) + 1. */
static int comp_add(PyObject *buckets, long long bucket, PyObject *key) {
    PyObject *b = PyLong_FromLongLong(bucket);
    if (b == NULL) return 0;
    PyObject *counts = PyDict_GetItemWithError(buckets, b);
    if (counts == NULL) {
        if (PyErr_Occurred() || (counts = PyDict_New()) == NULL) goto fail;
        int r = PyDict_SetItem(buckets, b, counts);
        Py_DECREF(counts); /* the bucket dict holds it */
        if (r < 0) goto fail;
    }
    long long n = 0;
    PyObject *was = PyDict_GetItemWithError(counts, key);
    if (was != NULL && !ll(was, &n)) goto fail;
    if (was == NULL && PyErr_Occurred()) goto fail;
    PyObject *v = PyLong_FromLongLong(n + 1);
    if (v == NULL) goto fail;
    int r = PyDict_SetItem(counts, key, v);
    Py_DECREF(v);
    Py_DECREF(b);
    return r == 0;
fail:
    Py_DECREF(b);
    return 0;
}

/* Composition.remove; the caller checked that the count exists. */
static int comp_remove(PyObject *buckets, long long bucket, PyObject *key) {
    PyObject *b = PyLong_FromLongLong(bucket);
    if (b == NULL) return 0;
    PyObject *counts = PyDict_GetItemWithError(buckets, b);
    long long n = 0;
    PyObject *was = counts ? PyDict_GetItemWithError(counts, key) : NULL;
    int ok = was != NULL && ll(was, &n);
    if (ok) {
        if (n - 1) {
            PyObject *v = PyLong_FromLongLong(n - 1);
            ok = v != NULL && PyDict_SetItem(counts, key, v) == 0;
            Py_XDECREF(v);
        } else {
            ok = PyDict_DelItem(counts, key) == 0;
            if (ok && PyDict_GET_SIZE(counts) == 0) ok = PyDict_DelItem(buckets, b) == 0;
        }
    }
    Py_DECREF(b);
    return ok;
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

static PyObject *reconfirm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "reconfirm(state, event, seq, ts)");
        return NULL;
    }
    PyObject *state = args[0], *e = args[1];
    PyObject *key = NULL, *made = NULL; /* made: the row of a new proxy, not yet in the pool */
    long long seq, ts, last_seq, sweep;
    if (!ready || Py_TYPE(e) != t_event || Py_TYPE(state) != t_state) goto no;
    if (!ll(args[2], &seq) || !ll(args[3], &ts) || ts < 0) goto no;
    if (!ll(GET(state, s_off[S_LAST_SEQ]), &last_seq) || seq <= last_seq) goto no;
    if (!ll(GET(state, s_off[S_SWEEP]), &sweep) || ts >= sweep * sweep_ms + sweep_ms) goto no;

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
    if (moved) { /* the count it leaves must be there, as Composition.remove assumes */
        PyObject *b = PyLong_FromLongLong(was_bucket);
        if (b == NULL) goto no;
        PyObject *cnt = PyDict_GetItemWithError(buckets, b);
        Py_DECREF(b);
        if (cnt == NULL || !PyDict_CheckExact(cnt)) goto no;
        PyObject *old_key = PyTuple_Pack(3, r_proto, r_anon, r_country);
        if (old_key == NULL) goto no;
        PyObject *n = PyDict_GetItemWithError(cnt, old_key);
        Py_DECREF(old_key);
        long long nn;
        if (n == NULL || !ll(n, &nn)) goto no;
    }
    PyObject *failing = NULL;
    if (fail) { /* a suspect back: its count in state.failing must be there to leave */
        PyObject *fc = GET(state, s_off[S_FAILING]);
        failing = fc && Py_TYPE(fc) == t_comp ? GET(fc, c_buckets) : NULL;
        if (failing == NULL || !PyDict_CheckExact(failing)) goto no;
        PyObject *b = PyLong_FromLongLong(was_bucket);
        if (b == NULL) goto no;
        PyObject *cnt = PyDict_GetItemWithError(failing, b);
        Py_DECREF(b);
        if (cnt == NULL || !PyDict_CheckExact(cnt)) goto no;
        PyObject *fkey = PyTuple_Pack(3, r_proto, r_anon, r_country);
        if (fkey == NULL) goto no;
        PyObject *n = PyDict_GetItemWithError(cnt, fkey);
        Py_DECREF(fkey);
        long long nn;
        if (n == NULL || !ll(n, &nn)) goto no;
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
    long long seq, ts, last_seq, sweep, spot_s;
    if (!ready || Py_TYPE(e) != t_failed || Py_TYPE(state) != t_state) goto no;
    if (!ll(args[2], &seq) || !ll(args[3], &ts) || ts < 0) goto no;
    if (!ll(GET(state, s_off[S_LAST_SEQ]), &last_seq) || seq <= last_seq) goto no;
    if (!ll(GET(state, s_off[S_SWEEP]), &sweep) || ts >= sweep * sweep_ms + sweep_ms) goto no;
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

/* The bucket's counts of ``row`` (Composition.moved's lookup), borrowed; NULL when the
 * count it leaves is not there. */
static PyObject *moving_counts(PyObject *comp, PyObject *row) {
    long long seen;
    if (comp == NULL || Py_TYPE(comp) != t_comp || !ll(GET(row, p_off[P_LAST_SEEN]), &seen) || seen < 0)
        return NULL;
    PyObject *buckets = GET(comp, c_buckets);
    if (buckets == NULL || !PyDict_CheckExact(buckets)) return NULL;
    PyObject *b = PyLong_FromLongLong(floordiv(seen, bucket_ms));
    if (b == NULL) return NULL;
    PyObject *counts = PyDict_GetItemWithError(buckets, b);
    Py_DECREF(b);
    if (counts == NULL || !PyDict_CheckExact(counts)) return NULL;
    PyObject *old = PyTuple_Pack(3, GET(row, p_off[P_PROTO]), GET(row, p_off[P_ANON]), GET(row, p_off[P_COUNTRY]));
    if (old == NULL) return NULL;
    PyObject *n = PyDict_GetItemWithError(counts, old);
    Py_DECREF(old);
    long long nn;
    return n != NULL && ll(n, &nn) ? counts : NULL;
}

/* Composition.moved: the row's count goes from its country to ``country``. */
static int move(PyObject *counts, PyObject *row, PyObject *country) {
    PyObject *proto = GET(row, p_off[P_PROTO]), *anon = GET(row, p_off[P_ANON]);
    PyObject *old = PyTuple_Pack(3, proto, anon, GET(row, p_off[P_COUNTRY]));
    PyObject *new = PyTuple_Pack(3, proto, anon, country);
    int ok = old != NULL && new != NULL;
    long long n = 0;
    PyObject *was = ok ? PyDict_GetItemWithError(counts, old) : NULL;
    ok = ok && was != NULL && ll(was, &n);
    if (ok) {
        if (n - 1) {
            PyObject *v = PyLong_FromLongLong(n - 1);
            ok = v != NULL && PyDict_SetItem(counts, old, v) == 0;
            Py_XDECREF(v);
        } else {
            ok = PyDict_DelItem(counts, old) == 0;
        }
    }
    if (ok) {
        long long m = 0;
        PyObject *had = PyDict_GetItemWithError(counts, new);
        ok = (had != NULL || !PyErr_Occurred()) && (had == NULL || ll(had, &m));
        PyObject *v = ok ? PyLong_FromLongLong(m + 1) : NULL;
        ok = v != NULL && PyDict_SetItem(counts, new, v) == 0;
        Py_XDECREF(v);
    }
    Py_XDECREF(old);
    Py_XDECREF(new);
    return ok;
}

#define MAX_PORTS 64 /* rows of one address checked at once; more: fold() does it */

static PyObject *locate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "locate(state, event, seq, ts)");
        return NULL;
    }
    PyObject *state = args[0], *e = args[1];
    long long seq, ts, last_seq, sweep;
    if (!ready || Py_TYPE(e) != t_located || Py_TYPE(state) != t_state) goto no;
    if (!ll(args[2], &seq) || !ll(args[3], &ts) || ts < 0) goto no;
    if (!ll(GET(state, s_off[S_LAST_SEQ]), &last_seq) || seq <= last_seq) goto no;
    if (!ll(GET(state, s_off[S_SWEEP]), &sweep) || ts >= sweep * sweep_ms + sweep_ms) goto no;
    PyObject *ip = GET(e, g_off[G_IP]), *country = GET(e, g_off[G_COUNTRY]);
    PyObject *asn = GET(e, g_off[G_ASN]), *as_org = GET(e, g_off[G_AS_ORG]), *geo = GET(e, g_off[G_GEO]);
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
    PyObject *keys[MAX_PORTS], *found[MAX_PORTS], *counts[MAX_PORTS], *fcounts[MAX_PORTS];
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
        counts[i] = fcounts[i] = NULL;
        if (change[i] && !c) {
            counts[i] = moving_counts(comp, row);
            if (fail) fcounts[i] = moving_counts(failing, row);
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
            if (counts[i] != NULL && !move(counts[i], row, p_country)) goto fail;
            if (fcounts[i] != NULL && !move(fcounts[i], row, p_country)) goto fail;
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
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(keys[i]);
done:
    if (!put_ll(state, s_off[S_LAST_SEQ], seq)) return NULL;
    Py_RETURN_TRUE;
undo:
    for (Py_ssize_t i = 0; i < made; i++) Py_XDECREF(keys[i]);
no:
    if (PyErr_Occurred()) PyErr_Clear();
    Py_RETURN_FALSE;
fail:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "locate: half applied");
    return NULL;
}

/* The offsets of ``names`` in ``type``: each must be a plain object slot. */
static int offsets(PyObject *type, const char **names, Py_ssize_t *out, int n) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(type, names[i]);
        if (d == NULL) return 0;
        int plain = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                    (((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX ||
                     ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT);
        if (plain) out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!plain) {
            PyErr_Format(PyExc_TypeError, "%R.%s is not a plain slot", type, names[i]);
            return 0;
        }
    }
    return 1;
}

/* A tuple of (network, mask) int pairs. */
static int ranges(PyObject *t, unsigned int (*out)[2], int *n) {
    if (t == NULL || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) > MAX_RANGES) {
        PyErr_SetString(PyExc_TypeError, "configure: ranges must be a tuple of (network, mask)");
        return 0;
    }
    *n = (int)PyTuple_GET_SIZE(t);
    for (int i = 0; i < *n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(t, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) return 0;
        unsigned long net = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(pair, 0));
        unsigned long mask = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred()) return 0;
        out[i][0] = (unsigned int)net;
        out[i][1] = (unsigned int)mask;
    }
    return 1;
}

static PyTypeObject *type_of(PyObject *spec, const char *k) {
    PyObject *t = PyDict_GetItemString(spec, k);
    if (t == NULL || !PyType_Check(t)) {
        PyErr_Format(PyExc_TypeError, "configure: %s must be a type", k);
        return NULL;
    }
    Py_INCREF(t);
    return (PyTypeObject *)t;
}

static PyObject *configure(PyObject *self, PyObject *spec) {
    (void)self;
    ready = 0;
    if (!PyDict_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "configure(spec: dict)");
        return NULL;
    }
    if (!(t_failed = type_of(spec, "failed")) || !(t_located = type_of(spec, "located")) || !(t_event = type_of(spec, "event")) || !(t_state = type_of(spec, "state")) ||
        !(t_settings = type_of(spec, "settings")) || !(t_agent = type_of(spec, "agent")) ||
        !(t_proxy = type_of(spec, "proxy")) || !(t_source = type_of(spec, "source")) ||
        !(t_lease = type_of(spec, "lease")) || !(t_comp = type_of(spec, "composition")))
        return NULL;
    if (!offsets((PyObject *)t_failed, f_names, f_off, F_N) ||
        !offsets((PyObject *)t_located, g_names, g_off, G_N) ||
        !offsets((PyObject *)t_event, e_names, e_off, E_N) ||
        !offsets((PyObject *)t_state, s_names, s_off, S_N) ||
        !offsets((PyObject *)t_settings, t_names, t_off, T_N) ||
        !offsets((PyObject *)t_agent, a_names, a_off, A_N) ||
        !offsets((PyObject *)t_proxy, p_names, p_off, P_N) ||
        !offsets((PyObject *)t_source, r_names, r_off, R_N) ||
        !offsets((PyObject *)t_lease, l_names, l_off, L_N))
        return NULL;
    const char *b[1] = {"buckets"};
    if (!offsets((PyObject *)t_comp, b, &c_buckets, 1)) return NULL;
    places = PyDict_GetItemString(spec, "places");
    shared = PyDict_GetItemString(spec, "shared");
    derived = PyDict_GetItemString(spec, "derived");
    tag = PyDict_GetItemString(spec, "tag");
    tag_failed = PyDict_GetItemString(spec, "tag_failed");
    leased = PyDict_GetItemString(spec, "leased");
    PyObject *sw = PyDict_GetItemString(spec, "sweep_ms"), *bu = PyDict_GetItemString(spec, "bucket_ms");
    if (!places || !PyDict_CheckExact(places) || !shared || !PyDict_CheckExact(shared) || !is_str(derived) || !is_str(tag) || !is_str(tag_failed) || !is_str(leased) ||
        !ll(sw, &sweep_ms) || !ll(bu, &bucket_ms) || sweep_ms <= 0 || bucket_ms <= 0) {
        PyErr_SetString(PyExc_TypeError, "configure: shared, derived, tag, leased, sweep_ms, bucket_ms");
        return NULL;
    }
    Py_INCREF(places);
    Py_INCREF(shared);
    Py_INCREF(derived);
    Py_INCREF(tag);
    Py_INCREF(tag_failed);
    Py_INCREF(leased);
    if (empty == NULL && (empty = PyUnicode_FromString("")) == NULL) return NULL;
    if (empty_tuple == NULL && (empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    if (row_kwnames == NULL &&
        (row_kwnames = Py_BuildValue("(sssssss)", "ip", "port", "proto", "protos", "first_seen",
                                     "last_seen", "latency_ema")) == NULL)
        return NULL;
    if (!ranges(PyDict_GetItemString(spec, "blocked"), blocked, &n_blocked) ||
        !ranges(PyDict_GetItemString(spec, "lab_ranges"), lab_ranges, &n_lab))
        return NULL;
    ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"reconfirm", (PyCFunction)(void (*)(void))reconfirm, METH_FASTCALL,
     "fold() of a ProxyWorked confirming a known proxy: True when applied, False when "
     "nothing changed and fold() must apply it."},
    {"refail", (PyCFunction)(void (*)(void))refail, METH_FASTCALL,
     "fold() of a ProxyFailed: True when applied, False when nothing changed and fold() "
     "must apply it."},
    {"locate", (PyCFunction)(void (*)(void))locate, METH_FASTCALL,
     "fold() of a Located: True when applied, False when nothing changed and fold() must "
     "apply it."},
    {"configure", configure, METH_O, "The types and constants reconfirm and locate read."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastfold", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastfold(void) { return PyModule_Create(&module); }
