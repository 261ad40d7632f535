/* The dense-list scanner: agents/extract.py's _FAST regex, as one C pass.
 *
 * Why C: a dense 30 MB list holds about 1.5 million candidates, and building them one
 * regex match at a time in Python ran at 6% of a bare re.findall (ppf bench extract).
 * Here the scan, the public-address and port rules, the (ip, port, proto) dedup and the
 * Candidate tuples are all made in one pass, so what is left per candidate is the
 * allocation of its fields.
 *
 * The contract is the regex, match for match (tests/test_extract.py runs both on
 * generated text and compares):
 *
 *   (?<![\w.])(?:([A-Za-z][A-Za-z0-9]*)://)?(?!NOT_PUBLIC)(OCT\.OCT\.OCT\.OCT)
 *   (?:(:)|[ \t]*[,;|\t][ \t]*|[ \t]+)(PORT)(?![\d.:])
 *
 * scanned leftmost-first without overlaps, as re.findall does. Every octet and the port
 * must be a whole digit run (the regex's lookbehind and lookahead force that), so they
 * are read as numbers and the NOT_PUBLIC prefixes compared numerically.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { P_NONE = 0, P_HTTP, P_HTTPS, P_SOCKS4, P_SOCKS5, P_UNKNOWN };

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline int is_alpha(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
static inline int is_word(unsigned char c) { return is_digit(c) || is_alpha(c) || c == '_'; }
static inline int is_blank(unsigned char c) { return c == ' ' || c == '\t'; }

/* A whole digit run at p, as an octet (0-255, no leading zero); its length, or 0. */
static Py_ssize_t read_octet(const unsigned char *p, const unsigned char *end, int *value) {
    Py_ssize_t n = 0;
    int v = 0;
    while (p + n < end && is_digit(p[n])) {
        if (n == 3) return 0;
        v = v * 10 + (p[n] - '0');
        n++;
    }
    if (n == 0 || v > 255 || (n > 1 && p[0] == '0')) return 0;
    *value = v;
    return n;
}

static int not_public(const int o[4]) {
    switch (o[0]) {
    case 0: case 10: case 127: return 1;
    case 100: return o[1] >= 64 && o[1] <= 127;
    case 169: return o[1] == 254;
    case 172: return o[1] >= 16 && o[1] <= 31;
    case 192:
        return (o[1] == 0 && (o[2] == 0 || o[2] == 2)) || (o[1] == 88 && o[2] == 99) ||
               o[1] == 168;
    case 198: return o[1] == 18 || o[1] == 19 || (o[1] == 51 && o[2] == 100);
    case 203: return o[1] == 0 && o[2] == 113;
    default: return o[0] >= 224;
    }
}

static int scheme_code(const unsigned char *s, Py_ssize_t n) {
    static const struct { const char *name; int code; } table[] = {
        {"http", P_HTTP},     {"https", P_HTTPS},  {"socks4", P_SOCKS4}, {"socks4a", P_SOCKS4},
        {"socks5", P_SOCKS5}, {"socks5h", P_SOCKS5}, {"socks", P_SOCKS5},
    };
    for (size_t t = 0; t < sizeof table / sizeof table[0]; t++) {
        if ((Py_ssize_t)strlen(table[t].name) != n) continue;
        Py_ssize_t k = 0;
        while (k < n && (s[k] | 0x20) == table[t].name[k]) k++;
        if (k == n) return table[t].code;
    }
    return P_UNKNOWN;
}

typedef struct {
    int ok;             /* matched at all */
    Py_ssize_t end;     /* where the match ends */
    int proto;          /* P_NONE: no scheme; P_UNKNOWN: a scheme that is not a proxy's */
    int colon;
    const unsigned char *ip;
    Py_ssize_t ip_len;
    uint32_t ip32;
    int port;
} match_t;

/* The regex, tried at position i. */
static match_t try_at(const unsigned char *buf, Py_ssize_t len, Py_ssize_t i) {
    match_t m = {0};
    const unsigned char *end = buf + len;
    if (i > 0 && (is_word(buf[i - 1]) || buf[i - 1] == '.')) return m;
    Py_ssize_t p = i;
    m.proto = P_NONE;
    if (is_alpha(buf[p])) {
        Py_ssize_t q = p + 1;
        while (q < len && (is_alpha(buf[q]) || is_digit(buf[q]))) q++;
        if (q + 3 > len || buf[q] != ':' || buf[q + 1] != '/' || buf[q + 2] != '/') return m;
        m.proto = scheme_code(buf + p, q - p);
        p = q + 3;
    }
    int o[4];
    m.ip = buf + p;
    for (int k = 0; k < 4; k++) {
        Py_ssize_t n = read_octet(buf + p, end, &o[k]);
        if (n == 0) return m;
        p += n;
        if (k < 3) {
            if (p >= len || buf[p] != '.') return m;
            p++;
        }
    }
    m.ip_len = (buf + p) - m.ip;
    if (not_public(o)) return m;
    /* The separator: ':' alone, or blanks around at most one of , ; | (a tab counts
       as a blank), or blanks alone. */
    if (p < len && buf[p] == ':') {
        m.colon = 1;
        p++;
    } else {
        Py_ssize_t q = p;
        while (q < len && is_blank(buf[q])) q++;
        if (q < len && (buf[q] == ',' || buf[q] == ';' || buf[q] == '|')) {
            q++;
            while (q < len && is_blank(buf[q])) q++;
        }
        if (q == p) return m;
        p = q;
    }
    if (p >= len || buf[p] < '1' || buf[p] > '9') return m;
    int port = 0;
    Py_ssize_t n = 0;
    while (p + n < len && is_digit(buf[p + n])) {
        if (n == 5) return m;
        port = port * 10 + (buf[p + n] - '0');
        n++;
    }
    if (port > 65535) return m;
    p += n;
    if (p < len && (buf[p] == '.' || buf[p] == ':')) return m;
    m.ok = 1;
    m.end = p;
    m.port = port;
    m.ip32 = ((uint32_t)o[0] << 24) | ((uint32_t)o[1] << 16) | ((uint32_t)o[2] << 8) | (uint32_t)o[3];
    return m;
}

/* An open-addressing set of (ip, port, proto) keys, each stored plus one so 0 is empty. */
typedef struct {
    uint64_t *slots;
    size_t mask;
    size_t used;
    int bits;
} keyset_t;

/* Fibonacci hashing: the high bits of the product are the well-mixed ones. */
static inline size_t slot_of(uint64_t key, int bits) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static int keyset_grow(keyset_t *s, size_t at_least) {
    int bits = s->slots ? s->bits + 1 : 12;
    while (((size_t)1 << bits) < at_least) bits++;
    size_t cap = (size_t)1 << bits;
    uint64_t *slots = PyMem_RawCalloc(cap, sizeof(uint64_t));
    if (!slots) return -1;
    for (size_t k = 0; s->slots && k <= s->mask; k++) {
        uint64_t key = s->slots[k];
        if (!key) continue;
        size_t h = slot_of(key, bits);
        while (slots[h]) h = (h + 1) & (cap - 1);
        slots[h] = key;
    }
    PyMem_RawFree(s->slots);
    s->slots = slots;
    s->mask = cap - 1;
    s->bits = bits;
    return 0;
}

/* 1 when added, 0 when already there, -1 on no memory. */
static int keyset_add(keyset_t *s, uint64_t key) {
    key += 1;
    if ((s->used + 1) * 2 > s->mask + 1) {
        if (keyset_grow(s, 0) < 0) return -1;
    }
    size_t h = slot_of(key, s->bits);
    while (s->slots[h]) {
        if (s->slots[h] == key) return 0;
        h = (h + 1) & s->mask;
    }
    s->slots[h] = key;
    s->used++;
    return 1;
}

/* One match, kept between the passes: where its address is and what it will become. */
typedef struct {
    uint64_t key;       /* ip << 19 | port << 3 | proto */
    Py_ssize_t ip_off;
    uint8_t ip_len;
    uint8_t which;      /* index into the confidences */
    uint8_t keep;       /* the first of its key */
} hit_t;

/* Pass 1: every match in order, as fixed-size records (sequential writes only). */
static hit_t *find_hits(const unsigned char *buf, Py_ssize_t len, int hint, size_t *count) {
    size_t n = 0, cap = 1024;
    hit_t *hits = PyMem_RawMalloc(cap * sizeof(hit_t));
    if (!hits) return NULL;
    for (Py_ssize_t i = 0; i < len;) {
        unsigned char c = buf[i];
        if (!(is_digit(c) || is_alpha(c))) {
            i++;
            continue;
        }
        match_t m = try_at(buf, len, i);
        if (!m.ok) {
            /* Every later start inside this word or dotted run fails the lookbehind;
               skip to its end. */
            i++;
            while (i < len && (is_word(buf[i]) || buf[i] == '.')) i++;
            continue;
        }
        i = m.end;
        if (m.proto == P_UNKNOWN) continue; /* ftp://, rtsp://: not a proxy URL */
        if (n == cap) {
            hit_t *more = PyMem_RawRealloc(hits, 2 * cap * sizeof(hit_t));
            if (!more) {
                PyMem_RawFree(hits);
                return NULL;
            }
            hits = more;
            cap *= 2;
        }
        int proto = m.proto != P_NONE ? m.proto : hint;
        hits[n].key = (((uint64_t)m.ip32 << 16 | (uint64_t)m.port) << 3) | (uint64_t)proto;
        hits[n].ip_off = m.ip - buf;
        hits[n].ip_len = (uint8_t)m.ip_len;
        hits[n].which = m.proto != P_NONE ? 0 : (m.colon ? (hint ? 1 : 2) : (hint ? 3 : 4));
        hits[n].keep = 0;
        n++;
    }
    *count = n;
    return hits;
}

/* Pass 2: mark the first hit of each key. The table is sized once, from the count,
   and each slot is prefetched a few hits ahead: with a million random addresses every
   probe is a cache miss, and this lets several be in flight at once. */
static int mark_first(hit_t *hits, size_t n) {
    enum { AHEAD = 12 };
    keyset_t seen = {0};
    if (keyset_grow(&seen, 2 * n + 2) < 0) return -1;
    for (size_t k = 0; k < n; k++) {
        if (k + AHEAD < n)
            __builtin_prefetch(&seen.slots[slot_of(hits[k + AHEAD].key + 1, seen.bits)], 1);
        hits[k].keep = (uint8_t)keyset_add(&seen, hits[k].key);
    }
    PyMem_RawFree(seen.slots);
    return 0;
}

/* scan(data, hint, candidate_type, protos, confidences) -> list
 *
 * hint: 0-4 (P_NONE..P_SOCKS5); protos: the 5 proto values by code (None first);
 * confidences: (scheme, colon+hint, colon, blank+hint, blank) floats. */
static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    int hint;
    PyTypeObject *cls;
    PyObject *protos, *conf;
    if (!PyArg_ParseTuple(args, "y*iO!O!O!", &view, &hint, &PyType_Type, &cls, &PyTuple_Type,
                          &protos, &PyTuple_Type, &conf))
        return NULL;
    if (hint < P_NONE || hint > P_SOCKS5 || PyTuple_GET_SIZE(protos) != 5 ||
        PyTuple_GET_SIZE(conf) != 5 || !PyType_IsSubtype(cls, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: bad hint, protos, confidences or type");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    size_t n = 0, kept = 0;
    PyObject *out = NULL;
    hit_t *hits;
    int marked = -1;
    /* Passes 1 and 2 touch no Python object (raw allocator only): other threads run. */
    Py_BEGIN_ALLOW_THREADS
    hits = find_hits(buf, view.len, hint, &n);
    if (hits) marked = mark_first(hits, n);
    Py_END_ALLOW_THREADS
    if (!hits || marked < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t k = 0; k < n; k++) kept += hits[k].keep;
    /* Pass 3: the Candidates, in order of first appearance. */
    out = PyList_New((Py_ssize_t)kept);
    if (!out) goto done;
    Py_ssize_t at = 0;
    for (size_t k = 0; k < n; k++) {
        const hit_t *h = &hits[k];
        if (!h->keep) continue;
        PyObject *cand = cls->tp_alloc(cls, 4);
        PyObject *ip = PyUnicode_New(h->ip_len, 127);
        PyObject *port = PyLong_FromLong((long)(h->key >> 3 & 0xFFFF));
        if (!cand || !ip || !port) {
            Py_XDECREF(cand);
            Py_XDECREF(ip);
            Py_XDECREF(port);
            Py_CLEAR(out);
            goto done;
        }
        memcpy(PyUnicode_DATA(ip), buf + h->ip_off, h->ip_len);
        PyObject *p = PyTuple_GET_ITEM(protos, (Py_ssize_t)(h->key & 7));
        PyObject *f = PyTuple_GET_ITEM(conf, h->which);
        Py_INCREF(p);
        Py_INCREF(f);
        PyTuple_SET_ITEM(cand, 0, ip);
        PyTuple_SET_ITEM(cand, 1, port);
        PyTuple_SET_ITEM(cand, 2, p);
        PyTuple_SET_ITEM(cand, 3, f);
        /* Only str, int, float and None inside: it can never be part of a cycle, so
           the collector need not walk it (CPython untracks such tuples itself, but
           only once a collection has walked them, which for a million of them cost
           more than building them). */
        PyObject_GC_UnTrack(cand);
        PyList_SET_ITEM(out, at++, cand);
    }
done:
    PyMem_RawFree(hits);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Dense-list candidates: the _FAST regex of agents.extract, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "agents._scan", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
