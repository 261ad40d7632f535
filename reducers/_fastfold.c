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
 * nothing at all, and fold() must apply it (tests/test_fastfold.py folds generated
 * logs both ways and compares every projection). It folds a known proxy confirmed again,
 * a suspect one back, and a new proxy on a public dotted quad (or a lab's address in lab
 * mode); it answers False, before it touches anything, wherever the event is not such an
 * everyday confirmation: IPv6 or a refused address (the rejection is fold()'s), a sweep
 * due, a re-send or a derived id, an unknown agent, another protocol, a spot-check of
 * trust that counts, provenance full for a trusted agent, a lease that expired on the
 * way, or any value of an unexpected type. So its rules are a subset of fold()'s, never
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
 *   fold_batch(state, messages, start, decode, admit, fast, rules, dlq)
 *
 * is projections/folder.py's loop over a batch, which calls the three above
 * (_fastfold_parts/batch.c says when it stops and hands a message back), a Located's
 * payload read in place where it has the encoder's form (_fastfold_parts/located_wire.c;
 * located_fields(payload) shows what it reads).
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

/* One translation unit, in parts of a readable size: every helper stays static. */
#include "_fastfold_parts/common.c"
#include "_fastfold_parts/confirm.c"
#include "_fastfold_parts/fail.c"
#include "_fastfold_parts/locate.c"
#include "_fastfold_parts/located_wire.c"
#include "_fastfold_parts/batch.c"

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
    if (!(t_failed = type_of(spec, "failed")) || !(t_located = type_of(spec, "located")) || !(t_event = type_of(spec, "worked")) || !(t_state = type_of(spec, "state")) ||
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
    {"fold_batch", (PyCFunction)(void (*)(void))fold_batch, METH_FASTCALL,
     "Folder.apply's loop from start: (stop, applied, resent), stopping before the first "
     "message Folder must take in Python (a DLQ subject, a refused payload, admission "
     "undecided)."},
    {"located_fields", located_fields, METH_O,
     "A Located's payload read in place, as fold_batch reads it: (id, agent, at, v, ip, "
     "country, asn, as_org, geo), or None where msgspec must decode it."},
    {"configure", configure, METH_O, "The types and constants reconfirm and locate read."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastfold", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastfold(void) { return PyModule_Create(&module); }
