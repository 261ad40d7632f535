/* The fold's everyday admission question, as one C call.
 *
 * Why C: once a fleet runs with agent subjects, the fold asks of every event whether it
 * came on the subject its fields give, from an enrolled agent whose role may say it,
 * and whether its fields make sense (reducers/admission.py, events/validate.py). In
 * Python that was twenty-odd attribute reads, string builds and calls an event, and it
 * made the fold 40 % slower (ppf bench fold); here it is one pass over the fields.
 *
 * The contract is admission._plainly_admitted, its Python twin, answer for answer
 * (tests/test_admission.py runs both over generated events and compares), for the types
 * that make up the log: ProxyWorked, ProxyFailed, Leased, Released, Fetched, Extracted,
 * Heartbeat, and Located (one per address: a tenth of the messages while a pool grows).
 * False is never a refusal: the caller then asks the full checks, which find the reason
 * or admit the event. So this pass may also answer False where it does not
 * decide (text that is not ASCII, an IPv6 address), and only there may it differ.
 *
 *   admit(subject, event, state, ts) -> 0, 1 or 2
 *
 * state is the fold's State; ts the message's log time. 1: admissible, quotas included
 * (also whenever state.settings.agent_subjects is off: admission then takes events as
 * they come); 2: admissible on its subject and facts, but its agent is at a quota's
 * edge, so the caller asks trust.over_quota (whether a report is of a new proxy is the
 * state's); 0: the full checks decide (a type this pass does not know among them).
 * configure(kinds) is called once by admission.py: {event type: (KIND_ code, the roles
 * that may publish it on their own subjects)}. Quotas come from state.quotas: None
 * while trust is off, else (the operator's agents, quota_events_per_min,
 * quota_proxies_per_hour).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h>

enum {
    KIND_WORKED = 1,
    KIND_FAILED = 2,
    KIND_LEASE = 3, /* Leased, Released: ppf.lease.<kind>.<target> */
    KIND_FETCHED = 4,
    KIND_EXTRACTED = 5,
    KIND_HEARTBEAT = 6,
    KIND_LOCATED = 7, /* the service's record of a lookup: ppf.geo.<ip>, one per address */
};

/* Fields are read straight from the slot their member descriptor names (msgspec Structs
 * keep fields in slots), the offset looked up once per type: a generic getattr cost
 * more than the rest of the checks together. Anything else takes PyObject_GetAttr. */
typedef struct {
    const char *text;
    PyObject *name;
    int n;
    PyTypeObject *types[8];
    Py_ssize_t offsets[8]; /* -1: not a plain slot, use PyObject_GetAttr */
} Field;

static Py_ssize_t slot_offset(PyTypeObject *type, PyObject *name) {
    PyObject *d = PyObject_GetAttr((PyObject *)type, name);
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX || m->type == T_OBJECT) offset = m->offset;
    }
    Py_DECREF(d);
    return offset;
}

/* obj.<field>, a new reference; NULL with an exception set when there is none. */
static PyObject *getf(PyObject *obj, Field *f) {
    PyTypeObject *type = Py_TYPE(obj);
    Py_ssize_t offset = -1;
    int i = 0;
    for (; i < f->n; i++)
        if (f->types[i] == type) break;
    if (i < f->n) {
        offset = f->offsets[i];
    } else {
        offset = slot_offset(type, f->name);
        if (f->n < 8) { /* types are long-lived (the event and row classes) */
            Py_INCREF(type);
            f->types[f->n] = type;
            f->offsets[f->n++] = offset;
        }
    }
    if (offset >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + offset);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(obj, f->name);
}

static Field s_ip[1] = {{.text = "ip"}},
    s_port[1] = {{.text = "port"}},
    s_proto[1] = {{.text = "proto"}},
    s_agent[1] = {{.text = "agent"}},
    s_id[1] = {{.text = "id"}},
    s_lease[1] = {{.text = "lease"}},
    s_latency_ms[1] = {{.text = "latency_ms"}},
    s_exit_ip[1] = {{.text = "exit_ip"}},
    s_source[1] = {{.text = "source"}},
    s_judge[1] = {{.text = "judge"}},
    s_error[1] = {{.text = "error"}},
    s_kind[1] = {{.text = "kind"}},
    s_target[1] = {{.text = "target"}},
    s_url_id[1] = {{.text = "url_id"}},
    s_http_status[1] = {{.text = "http_status"}},
    s_bytes[1] = {{.text = "bytes"}},
    s_fetch_ms[1] = {{.text = "fetch_ms"}},
    s_content_hash[1] = {{.text = "content_hash"}},
    s_count[1] = {{.text = "count"}},
    s_candidates[1] = {{.text = "candidates"}},
    s_extractor[1] = {{.text = "extractor"}},
    s_token_sha256[1] = {{.text = "token_sha256"}},
    s_role[1] = {{.text = "role"}},
    s_quota_minute[1] = {{.text = "quota_minute"}},
    s_quota_events[1] = {{.text = "quota_events"}},
    s_quota_hour[1] = {{.text = "quota_hour"}},
    s_quota_proxies[1] = {{.text = "quota_proxies"}},
    s_settings[1] = {{.text = "settings"}},
    s_agent_subjects[1] = {{.text = "agent_subjects"}},
    s_agents[1] = {{.text = "agents"}},
    s_quotas[1] = {{.text = "quotas"}};

/* {event type: (KIND_ code, roles)}, from configure(). */
static PyObject *kinds = NULL;

#define MAX_LATENCY_MS 600000
#define MAX_NAME 256
#define MAX_TEXT 500
#define MAX_CANDIDATES 1000
#define MAX_BYTES (1LL << 30)

/* An attribute as ASCII bytes; NULL (no error set) when it is not an ASCII str. */
static const char *ascii_attr(PyObject *obj, Field *name, PyObject **hold, Py_ssize_t *len) {
    PyObject *v = getf(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (!PyUnicode_Check(v) || !PyUnicode_IS_ASCII(v)) {
        Py_DECREF(v);
        return NULL;
    }
    *hold = v;
    *len = PyUnicode_GET_LENGTH(v);
    return (const char *)PyUnicode_1BYTE_DATA(v);
}

/* str.isprintable() of ASCII text: the space through the tilde. */
static int printable(const char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e) return 0;
    }
    return 1;
}

/* validate._text passes: ASCII text of at most cap printable characters (or empty). */
static int text_ok(PyObject *obj, Field *name, Py_ssize_t cap) {
    PyObject *hold;
    Py_ssize_t n;
    const char *s = ascii_attr(obj, name, &hold, &n);
    if (s == NULL) return 0;
    int ok = n <= cap && printable(s, n);
    Py_DECREF(hold);
    return ok;
}

/* An int attribute within lo..hi. */
static int int_in(PyObject *obj, Field *name, long long lo, long long hi) {
    PyObject *v = getf(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int overflow = 0;
    long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : lo - 1;
    Py_DECREF(v);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow && x >= lo && x <= hi;
}

static int proto_ok(const char *s, Py_ssize_t n) {
    switch (n) {
    case 4: return memcmp(s, "http", 4) == 0;
    case 5: return memcmp(s, "https", 5) == 0;
    case 6: return memcmp(s, "socks4", 6) == 0 || memcmp(s, "socks5", 6) == 0;
    default: return 0;
    }
}

static int proto_attr_ok(PyObject *obj) {
    PyObject *hold;
    Py_ssize_t n;
    const char *s = ascii_attr(obj, s_proto, &hold, &n);
    if (s == NULL) return 0;
    int ok = proto_ok(s, n);
    Py_DECREF(hold);
    return ok;
}

/* validate._IPV4, fullmatch: four octets 0-255, no leading zero. */
static int dotted_quad(const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part) {
            if (i >= n || s[i] != '.') return 0;
            i++;
        }
        Py_ssize_t start = i;
        int v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9' && i - start < 3) {
            v = v * 10 + (s[i] - '0');
            i++;
        }
        Py_ssize_t len = i - start;
        if (len == 0 || v > 255 || (len > 1 && s[start] == '0')) return 0;
    }
    return i == n;
}

/* validate._hex(value, 16): exactly 16 lower-case hex digits. */
static int hex16(const char *s, Py_ssize_t n) {
    if (n != 16) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

static int hex16_attr(PyObject *obj, Field *name, int empty_ok) {
    PyObject *hold;
    Py_ssize_t n;
    const char *s = ascii_attr(obj, name, &hold, &n);
    if (s == NULL) return 0;
    int ok = (empty_ok && n == 0) || hex16(s, n);
    Py_DECREF(hold);
    return ok;
}

/* The subject, read left to right: each step consumes what it matched or fails. */
typedef struct {
    const char *p, *end;
} Cursor;

static int eat(Cursor *c, const char *lit, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, lit, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* The attribute's text; with dashes for dots when the attribute is an address. */
static int eat_attr(Cursor *c, PyObject *obj, Field *name, int dashed) {
    PyObject *hold;
    Py_ssize_t n;
    const char *s = ascii_attr(obj, name, &hold, &n);
    if (s == NULL) return 0;
    int ok = c->end - c->p >= n;
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = c->p[i] == (dashed && s[i] == '.' ? '-' : s[i]);
    Py_DECREF(hold);
    if (ok) c->p += n;
    return ok;
}

/* str(port) to the end of the subject. */
static int eat_port(Cursor *c, PyObject *obj) {
    PyObject *port = getf(obj, s_port);
    if (port == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (!PyLong_CheckExact(port)) {
        Py_DECREF(port);
        return 0;
    }
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(port, &overflow);
    Py_DECREF(port);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    /* str(value): digits written backwards into a small buffer (no snprintf: locale
     * lookups cost more than the rest of this check) */
    char digits[24];
    int dn = 0;
    unsigned long long u = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[sizeof digits - 1 - dn++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0) digits[sizeof digits - 1 - dn++] = '-';
    return eat(c, digits + sizeof digits - dn, dn);
}

/* SUBJECT_TAILS, matched rather than built. */
static int tail_ok(Cursor *c, PyObject *e, int kind) {
    int ok;
    switch (kind) {
    case KIND_WORKED:
    case KIND_FAILED:
        ok = eat(c, "proxy.", 6) && eat_attr(c, e, s_ip, 1) && eat(c, "_", 1) && eat_port(c, e);
        break;
    case KIND_LEASE:
        ok = eat(c, "lease.", 6) && eat_attr(c, e, s_kind, 0) && eat(c, ".", 1) &&
             eat_attr(c, e, s_target, 0);
        break;
    case KIND_FETCHED:
    case KIND_EXTRACTED:
        ok = eat(c, "source.", 7) && eat_attr(c, e, s_url_id, 0);
        break;
    case KIND_HEARTBEAT:
        ok = eat(c, "agent.", 6) && eat_attr(c, e, s_agent, 0);
        break;
    case KIND_LOCATED:
        ok = eat(c, "geo.", 4) && eat_attr(c, e, s_ip, 1);
        break;
    default:
        return 0;
    }
    return ok && c->p == c->end;
}

/* An enrolled agent (a token) whose role is among ``roles``. */
static int enrolled(PyObject *agents, PyObject *name, PyObject *roles) {
    PyObject *row = PyDict_GetItemWithError(agents, name); /* borrowed */
    if (row == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *token = getf(row, s_token_sha256);
    if (token == NULL) {
        PyErr_Clear();
        return 0;
    }
    int has = PyObject_IsTrue(token);
    Py_DECREF(token);
    if (has <= 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *role = getf(row, s_role);
    if (role == NULL) {
        PyErr_Clear();
        return 0;
    }
    int in = PySet_Contains(roles, role);
    Py_DECREF(role);
    if (in < 0) PyErr_Clear();
    return in == 1;
}

/* Who may say it, and where: the subject part of _plainly_admitted. */
static int subject_ok(const char *sub, Py_ssize_t sn, PyObject *e, int kind, PyObject *agents,
                      PyObject *roles) {
    Cursor c = {sub, sub + sn};
    if (eat(&c, "ppf.in.", 7)) {
        const char *dot = memchr(c.p, '.', c.end - c.p);
        if (dot == NULL) return 0;
        PyObject *name = getf(e, s_agent);
        if (name == NULL) {
            PyErr_Clear();
            return 0;
        }
        int ok = PyUnicode_Check(name) && PyUnicode_IS_ASCII(name) &&
                 PyUnicode_GET_LENGTH(name) == dot - c.p &&
                 memcmp(PyUnicode_1BYTE_DATA(name), c.p, dot - c.p) == 0 &&
                 enrolled(agents, name, roles);
        Py_DECREF(name);
        if (!ok) return 0;
        c.p = dot + 1;
    } else if (!eat(&c, "ppf.", 4)) {
        return 0;
    }
    return tail_ok(&c, e, kind);
}

/* validate.sound_report, less lease and id (facts_ok asks those of every kind). */
static int worked_sound(PyObject *e) {
    if (!proto_attr_ok(e) || !int_in(e, s_latency_ms, 0, MAX_LATENCY_MS)) return 0;
    PyObject *hold;
    Py_ssize_t n;
    const char *s = ascii_attr(e, s_exit_ip, &hold, &n);
    if (s == NULL) return 0;
    int ok = n == 0 || dotted_quad(s, n);
    if (!ok) { /* the proxy's own address needs no second look (validate._proxy_worked) */
        PyObject *ip = getf(e, s_ip);
        if (ip == NULL) {
            PyErr_Clear();
        } else {
            ok = PyUnicode_Check(ip) && PyUnicode_Compare(ip, hold) == 0;
            Py_DECREF(ip);
        }
    }
    Py_DECREF(hold);
    return ok && hex16_attr(e, s_source, 1) && text_ok(e, s_judge, MAX_NAME);
}

static int fetched_sound(PyObject *e) {
    return hex16_attr(e, s_url_id, 0) && int_in(e, s_http_status, 0, 999) &&
           int_in(e, s_bytes, 0, MAX_BYTES) && int_in(e, s_fetch_ms, 0, MAX_LATENCY_MS) &&
           text_ok(e, s_error, MAX_TEXT) && text_ok(e, s_content_hash, 128);
}

/* One of Extracted's candidates: (address, port, protocol or "", confidence). */
static int candidate_sound(PyObject *t) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) return 0;
    PyObject *ip = PyTuple_GET_ITEM(t, 0), *port = PyTuple_GET_ITEM(t, 1),
             *proto = PyTuple_GET_ITEM(t, 2), *conf = PyTuple_GET_ITEM(t, 3);
    if (!PyUnicode_Check(ip) || !PyUnicode_IS_ASCII(ip) ||
        !dotted_quad((const char *)PyUnicode_1BYTE_DATA(ip), PyUnicode_GET_LENGTH(ip)))
        return 0;
    if (!PyLong_Check(port)) return 0;
    int overflow;
    long long p = PyLong_AsLongLongAndOverflow(port, &overflow);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow || p <= 0 || p > 65535) return 0;
    if (!PyUnicode_Check(proto) || !PyUnicode_IS_ASCII(proto)) return 0;
    Py_ssize_t pn = PyUnicode_GET_LENGTH(proto);
    if (pn && !proto_ok((const char *)PyUnicode_1BYTE_DATA(proto), pn)) return 0;
    if (!PyFloat_CheckExact(conf)) return 0;
    double v = PyFloat_AS_DOUBLE(conf);
    return v >= 0.0 && v <= 1.0;
}

static int extracted_sound(PyObject *e) {
    if (!hex16_attr(e, s_url_id, 0) || !int_in(e, s_count, 0, 10000000)) return 0;
    PyObject *cands = getf(e, s_candidates);
    if (cands == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyList_Check(cands) && PyList_GET_SIZE(cands) <= MAX_CANDIDATES;
    for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(cands); i++)
        ok = candidate_sound(PyList_GET_ITEM(cands, i));
    Py_DECREF(cands);
    return ok && text_ok(e, s_extractor, MAX_NAME) && text_ok(e, s_content_hash, 128);
}

/* The facts part: validate.problem finds nothing (sound_report for ProxyWorked). */
static int facts_ok(PyObject *e, int kind) {
    switch (kind) {
    case KIND_WORKED:
        if (!worked_sound(e)) return 0;
        break;
    case KIND_FAILED:
        if (!(proto_attr_ok(e) && text_ok(e, s_error, MAX_TEXT))) return 0;
        break;
    case KIND_FETCHED:
        if (!fetched_sound(e)) return 0;
        break;
    case KIND_EXTRACTED:
        if (!extracted_sound(e)) return 0;
        break;
    case KIND_LEASE:
    case KIND_HEARTBEAT:
    case KIND_LOCATED:
        /* validate._envelope(id, ""): their lease field is not an envelope's */
        return text_ok(e, s_id, 64);
    default:
        return 0;
    }
    return text_ok(e, s_lease, 64) && text_ok(e, s_id, 64);
}

/* An int attribute; 0 with *ok cleared when it is not one that fits. */
static long long int_attr(PyObject *obj, Field *name, int *ok) {
    PyObject *v = getf(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        *ok = 0;
        return 0;
    }
    int overflow = 0;
    long long x = PyLong_Check(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
    if (!PyLong_Check(v) || overflow || PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    Py_DECREF(v);
    return x;
}

/* 1 when no quota can refuse this observation at ts (trust.over_quota would say ""
 * without looking further); 2 when trust.over_quota must be asked. */
static int quota_clear(PyObject *e, int kind, PyObject *agents, PyObject *quotas, long long ts) {
    if (quotas == Py_None || kind == KIND_LEASE || kind == KIND_HEARTBEAT || kind == KIND_LOCATED)
        return 1;
    if (!PyTuple_Check(quotas) || PyTuple_GET_SIZE(quotas) != 3) return 2;
    PyObject *name = getf(e, s_agent);
    if (name == NULL) {
        PyErr_Clear();
        return 2;
    }
    int is_operator = PySet_Contains(PyTuple_GET_ITEM(quotas, 0), name);
    PyObject *row = is_operator == 0 ? PyDict_GetItemWithError(agents, name) : NULL;
    Py_DECREF(name);
    if (is_operator == 1) return 1; /* the operator's agents have none */
    if (is_operator < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 2;
    }
    if (row == NULL) return 1; /* over_quota: an agent with no row has counted nothing */
    int ok = 1;
    long long per_min = PyLong_AsLongLong(PyTuple_GET_ITEM(quotas, 1));
    long long cap = PyLong_AsLongLong(PyTuple_GET_ITEM(quotas, 2));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 2;
    }
    if (per_min && int_attr(row, s_quota_minute, &ok) == ts / 60000 &&
        int_attr(row, s_quota_events, &ok) >= per_min)
        return 2;
    if (kind == KIND_WORKED && cap && int_attr(row, s_quota_hour, &ok) == ts / 3600000 &&
        int_attr(row, s_quota_proxies, &ok) >= cap)
        return 2;
    return ok ? 1 : 2;
}

static PyObject *admit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "admit(subject: bytes, event, state, ts: int)");
        return NULL;
    }
    PyObject *e = args[1], *state = args[2];
    long long ts = PyLong_AsLongLong(args[3]);
    if (ts == -1 && PyErr_Occurred()) return NULL;
    int how = 0;
    PyObject *settings = getf(state, s_settings);
    PyObject *on = settings ? getf(settings, s_agent_subjects) : NULL;
    Py_XDECREF(settings);
    if (on == NULL) goto done;
    int checking = PyObject_IsTrue(on);
    Py_DECREF(on);
    if (checking <= 0) {
        how = checking == 0; /* off: taken as they come */
        goto done;
    }
    PyObject *entry = kinds ? PyDict_GetItemWithError(kinds, (PyObject *)Py_TYPE(e)) : NULL;
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) goto done;
    int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    PyObject *roles = PyTuple_GET_ITEM(entry, 1);
    PyObject *agents = getf(state, s_agents);
    if (agents == NULL) goto done;
    if (PyDict_Check(agents) && PyAnySet_Check(roles) &&
        subject_ok(PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), e, kind, agents,
                   roles) &&
        facts_ok(e, kind)) {
        PyObject *quotas = getf(state, s_quotas);
        if (quotas != NULL) {
            how = quota_clear(e, kind, agents, quotas, ts);
            Py_DECREF(quotas);
        }
    }
    Py_DECREF(agents);
done:
    if (PyErr_Occurred()) PyErr_Clear();
    return PyLong_FromLong(how);
}

static PyObject *configure(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "configure(kinds: dict)");
        return NULL;
    }
    Py_INCREF(arg);
    Py_XSETREF(kinds, arg);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"admit", (PyCFunction)(void (*)(void))admit, METH_FASTCALL,
     "admission._plainly_admitted and the quota's edge in one pass: 1 admissible, 2 "
     "admissible but ask the quota, 0 the full checks must decide."},
    {"configure", configure, METH_O, "Set {event type: (kind code, roles)}."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_admit", NULL, -1, methods};

PyMODINIT_FUNC PyInit__admit(void) {
    Field *fields[] = {s_ip, s_port, s_proto, s_agent, s_id, s_lease, s_latency_ms, s_exit_ip, s_source, s_judge, s_error, s_kind, s_target, s_url_id, s_http_status, s_bytes, s_fetch_ms, s_content_hash, s_count, s_candidates, s_extractor, s_token_sha256, s_role, s_quota_minute, s_quota_events, s_quota_hour, s_quota_proxies, s_settings, s_agent_subjects, s_agents, s_quotas};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if ((fields[i]->name = PyUnicode_InternFromString(fields[i]->text)) == NULL) return NULL;
    return PyModule_Create(&module);
}
