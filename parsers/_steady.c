/* parsers._steady: parsers.block._steady's scan in C, for the steady state of a training log.
 *
 * steady(block, save_of) -> None | (loss, rbf, pod, saves, first_ts, last_ts, last_seconds, forgot_ts)
 *
 * `block` holds complete lines. One pass finds every tagged line; LOSS-PARTS, REQUIRED_RBF
 * and `completed step` lines are cut and converted here, any other tagged line goes to
 * `save_of(line)`, the reference parser's answer (ts_ns, step) for a checkpoint save or None.
 * The rows are then checked as parsers.block._steady_py checks them (each kind's steps
 * strictly rising, timestamps all present and non-decreasing or all absent, no line repeated
 * at one instant) and returned as the fields of parsers.block.Steady.
 *
 * It accepts a subset of what the Python scan accepts and returns the same fields for it;
 * anything else (a line it does not vouch for, two tags on a line, a year past 2200, a long
 * number, a value a column cannot hold, a clock jump between two lines) returns None and the
 * block is read line by line by the reference parser.
 * Numbers follow parsers/numbers.py: steps and weights UNSIGNED (uint_), values CANONICAL
 * (num), ASCII only; tests/test_number_grammar.py calls number() and unsigned() to hold them.
 * tests/test_parser_native.py holds the C and Python scans to each other. Numbers are
 * converted by PyOS_string_to_double, float()'s own routine (or exactly, see to_double). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINE (1 << 20) /* parsers.line.MAX_LINE */
#define MAX_NUM 64         /* longest number copied for conversion */
#define MAX_KEYS 64        /* LOSS-PARTS parts per line */
#define MAX_SAME_TS 256    /* lines at one instant compared for repeats */
/* What the columns hold and the largest step between timestamps: parsers.bounds */
#define STEP_MAX 2147483647LL
#define CE_RAW_MAX 64
#define PROGRAM_MAX 128
#define CLOCK_JUMP_NS 3600000000000LL

static const char *TAGS[] = {"LOSS-PARTS",         "REQUIRED_RBF",         "completed step:",
                             "Config param ",      "Restoring checkpoint", "Saved a checkpoint",
                             "distributed system"};
#define NTAGS 7
enum { LOSS = 0, RBF = 1, POD = 2, SAVE = 3 };

typedef struct {
    Py_ssize_t start, end; /* the line, without its newline */
    int kind;
    int has_ts;
    int64_t ts, step;
    /* LOSS: ce, [ce_raw), [tail) | RBF: max, [layers), [program) | POD: 4 floats, weights */
    double f[4];
    int64_t weights;
    Py_ssize_t a0, a1, b0, b1;
    PyObject *save_ts; /* SAVE: the ts object save_of gave (owned) */
} Entry;

typedef struct {
    Entry *e;
    Py_ssize_t n, cap;
} Entries;

static int push(Entries *v, const Entry *x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 1024;
        Entry *e = PyMem_Realloc(v->e, (size_t)cap * sizeof(Entry));
        if (e == NULL) return -1;
        v->e = e;
        v->cap = cap;
    }
    v->e[v->n++] = *x;
    return 0;
}

/* ---- small scanners over [p, end): each returns the position after what it read, or NULL */

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *lit(const char *p, const char *end, const char *s, size_t n) {
    return ((size_t)(end - p) >= n && memcmp(p, s, n) == 0) ? p + n : NULL;
}
#define LIT(p, end, s) lit((p), (end), (s), sizeof(s) - 1)

/* [0-9]+ as int64 (at most 18 digits) */
static const char *uint_(const char *p, const char *end, int64_t *out) {
    const char *s = p;
    int64_t v = 0;
    while (p < end && is_digit(*p)) {
        if (p - s >= 18) return NULL;
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == s) return NULL;
    *out = v;
    return p;
}

/* A JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, longest match; `point`
 * requires the fraction (per-layer values are decimals). */
static const char *num(const char *p, const char *end, int point) {
    if (p < end && *p == '-') p++;
    if (p >= end || !is_digit(*p)) return NULL;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && *p == '.') {
        const char *q = p + 1;
        while (q < end && is_digit(*q)) q++;
        if (q == p + 1) return NULL; /* a point without digits: no regex match either */
        p = q;
    } else if (point) {
        return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (q < end && (*q == '+' || *q == '-')) q++;
        const char *d = q;
        while (q < end && is_digit(*q)) q++;
        if (q > d) p = q; /* else the exponent is not part of the number */
    }
    return p;
}

/* A decimal of at most 15 significant digits times 10^k, |k| <= 22, is m * 10^k or m / 10^-k
 * with m and 10^|k| exact doubles: one correctly rounded operation, the same double as
 * float() (Clinger's fast path). Most logged numbers are such; -1 for the others. */
static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int exact_double(const char *p, const char *e, double *out) {
    int neg = 0, sig = 0, scale = 0;
    uint64_t m = 0;
    if (p < e && *p == '-') neg = *p++ == '-';
    for (; p < e && is_digit(*p); p++) {
        if (m == 0 && *p == '0') continue; /* leading zeros are not significant */
        if (++sig > 15) return -1;
        m = m * 10 + (uint64_t)(*p - '0');
    }
    if (p < e && *p == '.') {
        for (p++; p < e && is_digit(*p); p++, scale--) {
            if (m == 0 && *p == '0') continue;
            if (++sig > 15) return -1;
            m = m * 10 + (uint64_t)(*p - '0');
        }
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        int eneg = 0, ex = 0, nd = 0;
        if (++p < e && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        for (; p < e && is_digit(*p); p++) {
            if (++nd > 4) return -1;
            ex = ex * 10 + (*p - '0');
        }
        if (nd == 0) return -1;
        scale += eneg ? -ex : ex;
    }
    if (p != e) return -1;
    double v;
    if (m == 0)
        v = 0.0;
    else if (scale >= 0 && scale <= 22)
        v = (double)m * POW10[scale];
    else if (scale < 0 && scale >= -22)
        v = (double)m / POW10[-scale];
    else
        return -1;
    *out = neg ? -v : v;
    return 0;
}

static int to_double(const char *s, const char *e, double *out) {
    if (exact_double(s, e, out) == 0) return 0;
    char buf[MAX_NUM + 1];
    size_t n = (size_t)(e - s);
    if (n == 0 || n > MAX_NUM) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *stop;
    double v = PyOS_string_to_double(buf, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (stop != buf + n) return -1;
    *out = v;
    return 0;
}

/* ---- kubelet timestamp, as parsers.fast.ts_of: 1 ok, 0 none, -1 not vouched for */

static int two(const char *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

static int64_t days_from_civil(int64_t y, int m, int d) { /* H. Hinnant's algorithm */
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int timestamp(const char *line, Py_ssize_t len, int64_t *out) {
    if (len == 0 || !is_digit(line[0])) return 0;
    /* line.find(b"Z ", 19, 31) */
    Py_ssize_t z = -1;
    for (Py_ssize_t i = 19; i + 2 <= len && i + 2 <= 31; i++) {
        if (line[i] == 'Z' && line[i + 1] == ' ') {
            z = i;
            break;
        }
    }
    if (z < 0) return -1;
    static const char shape[] = "dddd-dd-ddTdd:dd:dd";
    for (int i = 0; i < 19; i++) {
        if (shape[i] == 'd' ? !is_digit(line[i]) : line[i] != shape[i]) return -1;
    }
    int year = two(line) * 100 + two(line + 2), mon = two(line + 5), day = two(line + 8);
    int h = two(line + 11), mi = two(line + 14), s = two(line + 17);
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (year < 1970 || year > 2200 || mon < 1 || mon > 12 || day < 1) return -1;
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if (day > mdays[mon - 1] + (mon == 2 && leap)) return -1;
    if (h > 23 || mi > 59 || s > 61) return -1;
    int64_t ns = (days_from_civil(year, mon, day) * 86400 + h * 3600 + mi * 60 + s) * 1000000000LL;
    if (z > 19) {
        if (line[19] != '.' || z - 20 < 1 || z - 20 > 9) return -1;
        int64_t frac = 0, scale = 1000000000LL;
        for (Py_ssize_t i = 20; i < z; i++) {
            if (!is_digit(line[i])) return -1;
            frac = frac * 10 + (line[i] - '0');
            scale /= 10;
        }
        ns += frac * scale;
    }
    *out = ns;
    return 1;
}

/* ---- one line of each kind; 0 ok, -1 not vouched for */

/* trailing [ \t]* to the end */
static int blank_to_end(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    return p == end ? 0 : -1;
}

static int key_char(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }

static int loss_body(const char *p, const char *end, Entry *x, const char *base) {
    if (!(p = LIT(p, end, "LOSS-PARTS step=")) || !(p = uint_(p, end, &x->step)) || x->step > STEP_MAX ||
        !(p = LIT(p, end, " ce=")))
        return -1;
    const char *ce = p;
    const char *q = num(p, end, 0);
    if (q == NULL) { /* nan | inf | -inf, as words */
        if ((q = LIT(p, end, "nan")) == NULL && (q = LIT(p, end, "inf")) == NULL && (q = LIT(p, end, "-inf")) == NULL)
            return -1;
    }
    if (q < end && *q != ' ') return -1;
    if (q - ce > CE_RAW_MAX || to_double(ce, q, &x->f[0]) < 0) return -1;
    x->a0 = ce - base;
    x->a1 = q - base;
    const char *tail = q, *tail_end = q;
    const char *keys[MAX_KEYS];
    size_t lens[MAX_KEYS];
    int nkeys = 0;
    p = q;
    while (p < end) {
        if (!(*p == ' ' && p + 1 < end && key_char(p[1]))) {
            if (nkeys == 0 || blank_to_end(p, end) < 0) return -1; /* `ce=1 ` alone: not canonical */
            break;
        }
        const char *k = ++p;
        while (p < end && key_char(*p)) p++;
        if (p >= end || *p != '=') return -1; /* keys with digits go to the Python scan too */
        size_t kl = (size_t)(p - k);
        if ((kl == 4 && memcmp(k, "step", 4) == 0) || (kl == 2 && memcmp(k, "ce", 2) == 0)) return -1;
        if (nkeys == MAX_KEYS) return -1;
        for (int i = 0; i < nkeys; i++)
            if (lens[i] == kl && memcmp(keys[i], k, kl) == 0) return -1;
        keys[nkeys] = k;
        lens[nkeys++] = kl;
        if ((p = num(p + 1, end, 0)) == NULL) return -1;
        if (p < end && *p != ' ' && *p != '\t') return -1;
        tail_end = p;
    }
    x->b0 = tail - base;
    x->b1 = tail_end - base;
    return 0;
}

static int rbf_body(const char *p, const char *end, Entry *x, const char *base) {
    if (!(p = LIT(p, end, "REQUIRED_RBF step=")) || !(p = uint_(p, end, &x->step)) || x->step > STEP_MAX ||
        !(p = LIT(p, end, " max=")))
        return -1;
    const char *m = p;
    if ((p = num(p, end, 0)) == NULL || to_double(m, p, &x->f[0]) < 0) return -1;
    if (!(p = LIT(p, end, " per_layer=["))) return -1;
    x->a0 = p - base;
    if (p < end && *p != ']') {
        for (;;) {
            if ((p = num(p, end, 1)) == NULL) return -1;
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            break;
        }
    }
    x->a1 = p - base;
    if (!(p = LIT(p, end, "] program="))) return -1;
    if (p >= end || !key_char(*p)) return -1;
    x->b0 = p - base;
    while (p < end && (key_char(*p) || is_digit(*p) || *p == '.' || *p == '-')) p++;
    x->b1 = p - base;
    if (x->b1 - x->b0 > PROGRAM_MAX) return -1;
    return blank_to_end(p, end);
}

static int pod_body(const char *p, const char *end, Entry *x) {
    static const char *const labels[] = {", seconds: ", ", TFLOP/s/device: ", ", Tokens/s/device: "};
    if (!(p = LIT(p, end, "completed step: ")) || !(p = uint_(p, end, &x->step)) || x->step > STEP_MAX) return -1;
    for (int i = 0; i < 3; i++) {
        if (!(p = lit(p, end, labels[i], strlen(labels[i])))) return -1;
        const char *s = p;
        if ((p = num(p, end, 0)) == NULL || to_double(s, p, &x->f[i]) < 0) return -1;
    }
    if (!(p = LIT(p, end, ", total_weights: ")) || !(p = uint_(p, end, &x->weights)) || !(p = LIT(p, end, ", loss: ")))
        return -1;
    const char *s = p;
    if ((p = num(p, end, 0)) == NULL || to_double(s, p, &x->f[3]) < 0) return -1;
    return blank_to_end(p, end);
}

/* ---- finding the tags: one pass for all seven (Wu-Manber: a shift table on byte pairs
 * over the shortest tag's length, so most of the block is skipped, not read byte by byte) */

#define WM 10 /* length of the shortest tag */
static unsigned char SHIFT[65536];
static unsigned char MAYBE[65536]; /* pairs that end some tag's first WM bytes */

static void wm_init(void) {
    memset(SHIFT, WM - 1, sizeof SHIFT);
    for (int t = 0; t < NTAGS; t++) {
        const unsigned char *p = (const unsigned char *)TAGS[t];
        for (int j = 0; j + 1 < WM; j++) {
            unsigned h = (unsigned)p[j] << 8 | p[j + 1];
            unsigned char shift = (unsigned char)(WM - 2 - j);
            if (shift < SHIFT[h]) SHIFT[h] = shift;
        }
        MAYBE[(unsigned)p[WM - 2] << 8 | p[WM - 1]] = 1;
    }
}

/* The next tag at or after `from` (its index in *tag), or NULL. */
static const char *next_tag(const char *b, Py_ssize_t blen, Py_ssize_t from, int *tag) {
    const unsigned char *u = (const unsigned char *)b;
    Py_ssize_t pos = from + WM - 1;
    while (pos < blen) {
        unsigned h = (unsigned)u[pos - 1] << 8 | u[pos];
        unsigned char shift = SHIFT[h];
        if (shift) {
            pos += shift;
            continue;
        }
        if (MAYBE[h]) {
            const char *w = b + pos - (WM - 1);
            for (int t = 0; t < NTAGS; t++) {
                size_t n = strlen(TAGS[t]);
                if ((size_t)(blen - (w - b)) >= n && memcmp(w, TAGS[t], n) == 0) {
                    *tag = t;
                    return w;
                }
            }
        }
        pos++;
    }
    return NULL;
}

/* Every tagged line of the block: per-step lines parsed here, checkpoint saves by save_of.
 * -1 when the block is not vouched for (or on a Python error, which is then set). */
static int scan(const char *b, Py_ssize_t blen, PyObject *save_of, Entries *out) {
    Py_ssize_t from = 0, line_end = -1;
    int tag;
    const char *hit;
    while ((hit = next_tag(b, blen, from, &tag)) != NULL) {
        from = hit - b + 1;
        if (hit - b < line_end) return -1; /* a second tag on one line: the Python scan decides */
        const char *s = hit;
        while (s > b && s[-1] != '\n') s--;
        const char *e = memchr(hit, '\n', (size_t)(b + blen - hit));
        if (e == NULL) return -1;
        line_end = e - b;
        Py_ssize_t len = e - s;
        Entry x;
        memset(&x, 0, sizeof x);
        x.start = s - b;
        x.end = e - b;
        if (tag > POD) {
            PyObject *r = PyObject_CallFunction(save_of, "y#", s, len);
            if (r == NULL) return -1;
            if (r == Py_None || !PyArg_ParseTuple(r, "OL", &x.save_ts, &x.step)) {
                Py_DECREF(r);
                PyErr_Clear();
                return -1; /* not a save: a start-up, restore or config line is the model's to read */
            }
            Py_INCREF(x.save_ts);
            Py_DECREF(r);
            x.kind = SAVE;
            if (x.save_ts != Py_None) {
                x.ts = PyLong_AsLongLong(x.save_ts);
                if (x.ts == -1 && PyErr_Occurred()) {
                    Py_DECREF(x.save_ts);
                    return -1;
                }
                x.has_ts = 1;
            }
            if (push(out, &x) < 0) {
                Py_DECREF(x.save_ts);
                return -1;
            }
            continue;
        }
        const char *le = e;
        if (len > MAX_LINE || memchr(s, 0x1b, (size_t)len) != NULL) return -1;
        if (le > hit && le[-1] == '\r') le--; /* CRLF */
        x.kind = tag;
        int t = timestamp(s, len, &x.ts);
        if (t < 0) return -1;
        x.has_ts = t;
        int ok = tag == LOSS ? loss_body(hit, le, &x, b) : tag == RBF ? rbf_body(hit, le, &x, b) : pod_body(hit, le, &x);
        if (ok < 0 || push(out, &x) < 0) return -1;
    }
    return 0;
}

/* ---- building the columns */

static PyObject *ts_obj(const Entry *x) {
    if (x->has_ts) return PyLong_FromLongLong(x->ts);
    Py_RETURN_NONE;
}

static PyObject *parts_json(const char *b, const Entry *x) {
    /* '{"' + tail[1:].replace("=", '":').replace(" ", ',"') + '}' over ` k=v k=v` */
    Py_ssize_t n = x->b1 - x->b0;
    if (n == 0) return PyUnicode_FromStringAndSize("{}", 2);
    char stackbuf[512];
    char *out = (size_t)(2 * n + 4) <= sizeof stackbuf ? stackbuf : PyMem_Malloc((size_t)(2 * n + 4));
    if (out == NULL) return PyErr_NoMemory();
    Py_ssize_t o = 0;
    out[o++] = '{';
    out[o++] = '"';
    for (Py_ssize_t i = x->b0 + 1; i < x->b1; i++) {
        char c = b[i];
        if (c == '=') {
            out[o++] = '"';
            out[o++] = ':';
        } else if (c == ' ') {
            out[o++] = ',';
            out[o++] = '"';
        } else {
            out[o++] = c;
        }
    }
    out[o++] = '}';
    PyObject *s = PyUnicode_FromStringAndSize(out, o);
    if (out != stackbuf) PyMem_Free(out);
    return s;
}

static PyObject *layers_json(const char *b, const Entry *x) {
    Py_ssize_t n = x->a1 - x->a0;
    PyObject *s = PyUnicode_New(n + 2, 127);
    if (s == NULL) return NULL;
    char *d = (char *)PyUnicode_DATA(s);
    d[0] = '[';
    memcpy(d + 1, b + x->a0, (size_t)n);
    d[n + 1] = ']';
    return s;
}

static PyObject *ascii(const char *b, Py_ssize_t s, Py_ssize_t e) {
    return PyUnicode_FromStringAndSize(b + s, e - s); /* ASCII by the grammar above */
}

/* One row's fields into the columns at index i. */
static int fill(PyObject *cols, Py_ssize_t i, const char *b, const Entry *x) {
    PyObject *v[7] = {0};
    int n;
    v[0] = ts_obj(x);
    v[1] = PyLong_FromLongLong(x->step);
    if (x->kind == LOSS) {
        n = 5;
        v[2] = PyFloat_FromDouble(x->f[0]);
        v[3] = ascii(b, x->a0, x->a1);
        v[4] = parts_json(b, x);
    } else if (x->kind == RBF) {
        n = 5;
        v[2] = PyFloat_FromDouble(x->f[0]);
        v[3] = layers_json(b, x);
        v[4] = ascii(b, x->b0, x->b1);
    } else {
        n = 7;
        v[2] = PyFloat_FromDouble(x->f[0]);
        v[3] = PyFloat_FromDouble(x->f[1]);
        v[4] = PyFloat_FromDouble(x->f[2]);
        v[5] = PyLong_FromLongLong(x->weights);
        v[6] = PyFloat_FromDouble(x->f[3]);
    }
    for (int k = 0; k < n; k++) {
        if (v[k] == NULL) {
            for (int j = 0; j < n; j++) Py_XDECREF(v[j]);
            return -1;
        }
    }
    for (int k = 0; k < n; k++) PyTuple_SET_ITEM(PyTuple_GET_ITEM(cols, k), i, v[k]);
    return 0;
}

static PyObject *columns(const char *b, Entries *all, int kind, Py_ssize_t count) {
    if (count == 0) return PyTuple_New(0);
    int n = kind == POD ? 7 : 5;
    PyObject *cols = PyTuple_New(n);
    if (cols == NULL) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *c = PyTuple_New(count);
        if (c == NULL) {
            Py_DECREF(cols);
            return NULL;
        }
        PyTuple_SET_ITEM(cols, k, c);
    }
    Py_ssize_t i = 0;
    for (Py_ssize_t j = 0; j < all->n; j++) {
        if (all->e[j].kind == kind && fill(cols, i++, b, &all->e[j]) < 0) {
            Py_DECREF(cols); /* unset slots are NULL: tuple dealloc skips them */
            return NULL;
        }
    }
    return cols;
}

static int same_line(const char *b, const Entry *x, const Entry *y) {
    Py_ssize_t n = x->end - x->start;
    return n == y->end - y->start && memcmp(b + x->start, b + y->start, (size_t)n) == 0;
}

static void release(Entries *all) {
    for (Py_ssize_t i = 0; i < all->n; i++) Py_XDECREF(all->e[i].save_ts);
    PyMem_Free(all->e);
}

static PyObject *saves_list(Entries *all) {
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < all->n; i++) {
        const Entry *x = &all->e[i];
        if (x->kind != SAVE) continue;
        PyObject *row = Py_BuildValue("(OL)", x->save_ts, (long long)x->step);
        if (row == NULL || PyList_Append(out, row) < 0) Py_CLEAR(out);
        Py_XDECREF(row);
    }
    return out;
}

static PyObject *steady(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    PyObject *save_of;
    if (!PyArg_ParseTuple(args, "y*O", &buf, &save_of)) return NULL;
    const char *b = buf.buf;
    Py_ssize_t blen = buf.len;
    Entries all = {0};
    PyObject *result = NULL;
    int bad = blen == 0 || b[blen - 1] != '\n' || scan(b, blen, save_of, &all) < 0;
    if (PyErr_Occurred()) goto done;
    Py_ssize_t counts[4] = {0}, run_from = 0;
    int64_t last_step[4] = {0};
    for (Py_ssize_t i = 0; !bad && i < all.n; i++) { /* in line order: the scan goes line by line */
        const Entry *x = &all.e[i];
        if (counts[x->kind] && x->step <= last_step[x->kind]) {
            bad = 1; /* a step going back or repeating: the model decides */
            break;
        }
        const Entry *prev = &all.e[run_from];
        if (x->has_ts != prev->has_ts || (x->has_ts && x->ts != prev->ts)) {
            /* missing, going back or jumping ahead (unsigned: a save's ts may be any int64) */
            if (!x->has_ts || !prev->has_ts || x->ts < prev->ts ||
                (uint64_t)x->ts - (uint64_t)prev->ts > (uint64_t)CLOCK_JUMP_NS)
                bad = 1;
            run_from = i;
        } else if (x->has_ts) {
            if (i - run_from > MAX_SAME_TS) bad = 1;
            for (Py_ssize_t k = run_from; !bad && k < i; k++)
                if (same_line(b, &all.e[k], x)) bad = 1; /* the same line twice at one instant */
        }
        last_step[x->kind] = x->step;
        counts[x->kind]++;
    }
    if (bad || all.n == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    const Entry *lastx = &all.e[all.n - 1];
    /* the lines stamped from 4 s before the last line's second on: what the dedupe cursor
       remembers (runs.cursor.remember_from); stamps rise, so they end the block */
    Py_ssize_t from = all.n;
    if (lastx->has_ts) {
        int64_t since = lastx->ts - (int64_t)(((lastx->ts % 1000000000) + 1000000000) % 1000000000)
                        - 4 * (int64_t)1000000000;
        while (from > 0 && all.e[from - 1].ts >= since) from--;
    }
    PyObject *at_last = PyList_New(0);
    for (Py_ssize_t i = from; at_last != NULL && lastx->has_ts && i < all.n; i++) {
        PyObject *ln = PyBytes_FromStringAndSize(b + all.e[i].start, all.e[i].end - all.e[i].start);
        if (ln == NULL || PyList_Append(at_last, ln) < 0) Py_CLEAR(at_last);
        Py_XDECREF(ln);
    }
    PyObject *loss = at_last ? columns(b, &all, LOSS, counts[LOSS]) : NULL;
    PyObject *rbf = loss ? columns(b, &all, RBF, counts[RBF]) : NULL;
    PyObject *pod = rbf ? columns(b, &all, POD, counts[POD]) : NULL;
    PyObject *saves = pod ? saves_list(&all) : NULL;
    PyObject *fts = saves ? ts_obj(&all.e[0]) : NULL;
    PyObject *lts = fts ? ts_obj(lastx) : NULL;
    PyObject *forgot = lts == NULL ? NULL : from > 0 ? ts_obj(&all.e[from - 1]) : Py_NewRef(Py_None);
    if (forgot != NULL) result = PyTuple_Pack(8, loss, rbf, pod, saves, fts, lts, at_last, forgot);
    Py_XDECREF(forgot);
    Py_XDECREF(loss);
    Py_XDECREF(rbf);
    Py_XDECREF(pod);
    Py_XDECREF(saves);
    Py_XDECREF(fts);
    Py_XDECREF(lts);
    Py_XDECREF(at_last);
done:
    release(&all);
    PyBuffer_Release(&buf);
    return result;
}

/* The scanners above on one token, for tests/test_number_grammar.py: the C grammar held to
 * parsers/numbers.py. number(token, point) -> whether num() reads all of it and to_double
 * converts it (the float, else None); unsigned(token) -> uint_'s value or None. */
static PyObject *number(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *s;
    Py_ssize_t n;
    int point;
    if (!PyArg_ParseTuple(args, "y#p", &s, &n, &point)) return NULL;
    const char *q = num(s, s + n, point);
    double v;
    if (q != s + n || to_double(s, q, &v) < 0) Py_RETURN_NONE;
    return PyFloat_FromDouble(v);
}

static PyObject *unsigned_(PyObject *Py_UNUSED(self), PyObject *arg) {
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &s, &n) < 0) return NULL;
    int64_t v;
    if (uint_(s, s + n, &v) != s + n) Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static PyMethodDef methods[] = {
    {"steady", steady, METH_VARARGS, "steady(block, save_of) -> None | the fields of parsers.block.Steady"},
    {"number", number, METH_VARARGS, "number(token, point) -> float | None: the scan's number grammar"},
    {"unsigned", unsigned_, METH_O, "unsigned(token) -> int | None: the scan's step grammar"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "parsers._steady", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__steady(void) {
    wm_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *tags = PyTuple_New(NTAGS);
    if (tags == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    for (int t = 0; t < NTAGS; t++) PyTuple_SET_ITEM(tags, t, PyBytes_FromString(TAGS[t]));
    if (PyModule_AddObject(m, "TAGS", tags) < 0) {
        Py_DECREF(tags);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *jump = PyLong_FromLongLong(CLOCK_JUMP_NS);
    if (jump == NULL || PyModule_AddObjectRef(m, "CLOCK_JUMP_NS", jump) < 0 ||
        PyModule_AddIntConstant(m, "STEP_MAX", (long)STEP_MAX) < 0 || PyModule_AddIntConstant(m, "CE_RAW_MAX", CE_RAW_MAX) < 0 ||
        PyModule_AddIntConstant(m, "PROGRAM_MAX", PROGRAM_MAX) < 0) {
        Py_XDECREF(jump);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(jump);
    return m;
}
