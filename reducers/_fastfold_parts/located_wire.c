/* located_wire: a Located read from its payload in place (included by reducers/_fastfold.c).
 *
 * Why: the contract publishes one Located per address, a tenth of the log while a pool
 * grows, and issue 10's bar is that they add < 5 % to the fold. Of what one costs inside
 * the fold, msgspec's decode (the union's tag, each key looked up, a Struct built and
 * freed) and admission's reads of its attributes were two fifths (callgrind,
 * BENCHMARKS.md issue 10); the rest is geo.located's own work.
 *
 * msgspec's encoder, which the service publishes with, writes a Located one way only:
 *
 *   {"type":"Located","id":"…","agent":"…","at":N,"v":N,"ip":"…","country":"…","asn":N,
 *    "as_org":"…","geo":"…"}
 *
 * its fields in the Struct's order, no spaces. That form, where every string is printable
 * ASCII needing no escape and every integer is plain digits that fit, is read here. Any
 * other bytes (another order, a space, an escape, UTF-8, a field missing or added, an
 * integer with a sign msgspec would refuse, a leading zero, twenty digits) are left to
 * msgspec, untouched: this reader takes only what msgspec would decode to the same
 * event, and decides nothing else. tests/test_fastfold.py holds it to that. */

typedef struct {
    const char *s;
    Py_ssize_t n;
} Span;

typedef struct {
    Span id, agent, ip, country, as_org, geo;
    long long at, v, asn;
} Wire;

/* The literal ``text`` at *p. */
static int wire_lit(const char **p, const char *end, const char *text, size_t n) {
    if ((size_t)(end - *p) < n || memcmp(*p, text, n) != 0) return 0;
    *p += n;
    return 1;
}

/* A string's content up to its closing quote, which is consumed: printable ASCII with
 * no backslash (so nothing to unescape) and no quote. */
static int wire_text(const char **p, const char *end, Span *out) {
    const char *s = *p;
    while (s < end && *s != '"') {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c > 0x7e || c == '\\') return 0;
        s++;
    }
    if (s == end) return 0;
    out->s = *p;
    out->n = s - *p;
    *p = s + 1;
    return 1;
}

/* An integer as JSON writes one: 0, or an optional minus and up to 18 digits, the first
 * not 0 (so it fits a long long, and "-0", "01" and the like are msgspec's to judge). */
static int wire_int(const char **p, const char *end, long long *out) {
    const char *s = *p;
    int minus = s < end && *s == '-';
    s += minus;
    if (s < end && *s == '0') {
        if (minus) return 0;
        *out = 0;
        *p = s + 1;
        return s + 1 == end || (s[1] < '0' || s[1] > '9');
    }
    long long v = 0;
    int digits = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (++digits > 18) return 0; /* before it could overflow: 18 nines fit */
        v = v * 10 + (*s - '0');
        s++;
    }
    if (digits == 0) return 0;
    if (s < end && (*s == '.' || *s == 'e' || *s == 'E')) return 0; /* a float: msgspec's */
    *out = minus ? -v : v;
    *p = s;
    return 1;
}

#define LIT(text) wire_lit(&p, end, text, sizeof text - 1)

/* ``payload`` in the encoder's form of a Located, into ``w``: 1, or 0 for any other bytes. */
static int read_located(const char *p, Py_ssize_t size, Wire *w) {
    const char *end = p + size;
    return LIT("{\"type\":\"Located\",\"id\":\"") && wire_text(&p, end, &w->id) &&
           LIT(",\"agent\":\"") && wire_text(&p, end, &w->agent) && LIT(",\"at\":") &&
           wire_int(&p, end, &w->at) && LIT(",\"v\":") && wire_int(&p, end, &w->v) &&
           LIT(",\"ip\":\"") && wire_text(&p, end, &w->ip) && LIT(",\"country\":\"") &&
           wire_text(&p, end, &w->country) && LIT(",\"asn\":") && wire_int(&p, end, &w->asn) &&
           LIT(",\"as_org\":\"") && wire_text(&p, end, &w->as_org) && LIT(",\"geo\":\"") &&
           wire_text(&p, end, &w->geo) && LIT("}") && p == end;
}

#undef LIT

/* What reducers/_admit.c answers 1 for, for this Located (it runs no quota): agent
 * subjects off, or its subject is ppf.geo.<ip, dots as dashes> and its id printable and
 * at most 64 long. 0 where admission must be asked (it decides). */
static int wire_admitted(PyObject *state, const char *sub, Py_ssize_t sn, const Wire *w) {
    PyObject *settings = GET(state, s_off[S_SETTINGS]);
    if (settings == NULL || Py_TYPE(settings) != t_settings) return 0;
    PyObject *on = GET(settings, t_off[T_SUBJECTS]);
    if (on == Py_False) return 1;
    if (on != Py_True || w->id.n > 64 || sn != 8 + w->ip.n || memcmp(sub, "ppf.geo.", 8) != 0) return 0;
    for (Py_ssize_t i = 0; i < w->ip.n; i++)
        if (sub[8 + i] != (w->ip.s[i] == '.' ? '-' : w->ip.s[i])) return 0;
    return 1;
}

static PyObject *wire_str(Span s) {
    PyObject *v = PyUnicode_New(s.n, 127);
    if (v != NULL) memcpy(PyUnicode_1BYTE_DATA(v), s.s, (size_t)s.n);
    return v;
}

/* Folder's steps for one message on ppf.geo.*, from its bytes: 1 when it was decoded,
 * admitted and folded as decode, admit and locate would have; 0 when it was not taken
 * (nothing touched: the caller takes it the usual way); -1 on an error (raised). */
static int located_wire(PyObject *state, PyObject *subject, PyObject *payload, PyObject *seq_obj,
                        PyObject *ts_obj) {
    Wire w;
    if (!PyBytes_CheckExact(payload) || !read_located(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), &w) ||
        !wire_admitted(state, PyBytes_AS_STRING(subject), PyBytes_GET_SIZE(subject), &w))
        return 0;
    PyObject *args[4] = {state, NULL, seq_obj, ts_obj};
    long long seq, ts;
    if (!in_order(state, args, &seq, &ts)) {
        PyErr_Clear();
        return 0;
    }
    PyObject *ip = wire_str(w.ip), *country = wire_str(w.country), *as_org = wire_str(w.as_org);
    PyObject *geo = wire_str(w.geo), *asn = PyLong_FromLongLong(w.asn);
    int r = ip && country && as_org && geo && asn ? locate_fields(state, ip, country, asn, as_org, geo, seq) : -1;
    Py_XDECREF(ip);
    Py_XDECREF(country);
    Py_XDECREF(as_org);
    Py_XDECREF(geo);
    Py_XDECREF(asn);
    return r;
}

/* located_fields(payload) -> (id, agent, at, v, ip, country, asn, as_org, geo) or None:
 * what read_located reads, for the tests that hold it to msgspec's decode. */
static PyObject *located_fields(PyObject *self, PyObject *payload) {
    (void)self;
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, "located_fields(payload: bytes)");
        return NULL;
    }
    Wire w;
    if (!read_located(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), &w)) Py_RETURN_NONE;
    return Py_BuildValue("(s#s#LLs#s#Ls#s#)", w.id.s, w.id.n, w.agent.s, w.agent.n, w.at, w.v, w.ip.s, w.ip.n,
                         w.country.s, w.country.n, w.asn, w.as_org.s, w.as_org.n, w.geo.s, w.geo.n);
}
