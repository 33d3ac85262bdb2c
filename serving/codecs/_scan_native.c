/* The native scan of raw REST bodies: JSON bytes straight into columns, a wire-format decoder.
 *
 * `scan(body, min_rows, max_rows)` (serving/codecs/raw_body.py) reads a raw REST body, in row format
 * `{"instances": [{"I1": 3, "C1": "68fd1e64", ...}, ...], "signature_name"?: "raw"}` or columnar
 * `{"inputs": {"I1": [3, ...], "C1": ["68fd1e64", ...], ...}, "signature_name"?: "raw"}`, in one pass over its
 * bytes and returns (n, counts, keys, columnar): n rows, the counts as float64 (13, n) field-major
 * (NaN = missing) and the categorical values' keys as uint64 (26, n) field-major, in two bytearrays. The keys
 * are the compiled table's (ctr_features/compiled/raw_key.h), so the transform looks them up as they are.
 *
 * It takes a strict subset of JSON and returns None for anything else, which then goes to the exact path
 * (serving/codecs/raw_codec.py, after orjson), which serves it or names the instance and field of its error.
 * The subset:
 *   - the envelope holds "instances" or "inputs", and optionally "signature_name": "raw", each once, and
 *     nothing else;
 *   - a row, or `inputs`, holds only the 39 field names, each at most once, written without escapes; every
 *     column of `inputs` has the same length, and an absent field is all missing;
 *   - a count is a JSON integer of at most 15 digits, optionally with a fraction of zeros only (3.0), or "" or
 *     null; no exponent;
 *   - a categorical is a string of at most 8 ASCII characters from 0x20 to 0x7F without a backslash, or null;
 *   - at least `min_rows` rows and at most `max_rows` (its memory's bound: 39 * 8 bytes a row).
 * So it never accepts a body that is not JSON, and every body it takes decodes to the same values as the
 * exact path (tests/serving/codecs/test_unit_raw_native.py and test_unit_raw_decoders.py compare them).
 *
 * `arrays(body, min_rows, max_rows)` is the same scan returning (columnar, counts, keys) with the two as numpy
 * arrays over those bytearrays (float64 (13, n), uint64 (26, n)), made here: the per-request decode
 * (serving/codecs/rest_codec.py) takes them as they are. numpy is imported at its first call (`scan` needs
 * none), through the Python API: no numpy headers.
 *
 * Memory: two arrays of n rows (13 doubles and 26 keys each), on the stack up to INLINE_ROWS rows (no malloc
 * for the usual few-row body), else grown by doubling, then one transposed copy in the bytearrays; nothing
 * else. Time: one pass over the body, without the GIL from RELEASE_GIL_BYTES on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "raw_key.h"

#define N_NUM 13
#define N_CAT 26
#define MAX_DIGITS 15 /* below 10**15 < 2**53: every such integer is exact in a double */

/* Bodies from this size on (~10 us of scan) are scanned without the GIL; a smaller one (a few rows, ~0.4 us)
 * keeps it: a batcher thread waiting for the GIL would take it, and the scan wait for it back. */
#define RELEASE_GIL_BYTES 16384

/* Rows held in the scan's own storage before any allocation: a body of a few rows (most requests) costs no
 * malloc. */
#define INLINE_ROWS 16

typedef struct {
    const unsigned char *p, *end;
    double *num;   /* rows: row-major (cap, 13); columns: field-major (13, n) */
    uint64_t *key; /* rows: row-major (cap, 26); columns: field-major (26, n) */
    Py_ssize_t n, cap, max_rows;
    int nomem, columnar;
    double num_inline[INLINE_ROWS * N_NUM]; /* num and key while the rows fit INLINE_ROWS */
    uint64_t key_inline[INLINE_ROWS * N_CAT];
} Scan;

/* Frees what the scan allocated (not its inline storage). */
static void scan_free(Scan *s) {
    if (s->num != s->num_inline) PyMem_RawFree(s->num);
    if (s->key != s->key_inline) PyMem_RawFree(s->key);
}

static inline void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static inline int eat(Scan *s, unsigned char c) {
    ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

static inline int word(Scan *s, const char *w, Py_ssize_t len) {
    if (s->end - s->p >= len && memcmp(s->p, w, (size_t)len) == 0) {
        s->p += len;
        return 1;
    }
    return 0;
}

/* A quoted key without escapes, after its opening quote: its bytes, and the position after the closing
 * quote. Returns 0 for a backslash, a control character or no closing quote. */
static int key_text(Scan *s, const unsigned char **start, Py_ssize_t *len) {
    const unsigned char *q = s->p;
    while (q < s->end && *q != '"') {
        if (*q == '\\' || *q < 0x20) return 0;
        q++;
    }
    if (q >= s->end) return 0;
    *start = s->p;
    *len = q - s->p;
    s->p = q + 1;
    return 1;
}

/* A field name after its opening quote: 0..12 for I1..I13, 13..38 for C1..C26, -1 for anything else. */
static int field_index(Scan *s) {
    const unsigned char *t;
    Py_ssize_t len;
    if (!key_text(s, &t, &len) || len < 2 || len > 3) return -1;
    if (t[1] < '1' || t[1] > '9') return -1; /* no leading zero */
    int k = t[1] - '0';
    if (len == 3) {
        if (t[2] < '0' || t[2] > '9') return -1;
        k = 10 * k + (t[2] - '0');
    }
    if (t[0] == 'I' && k <= N_NUM) return k - 1;
    if (t[0] == 'C' && k <= N_CAT) return N_NUM + k - 1;
    return -1;
}

/* A count: an integer of at most MAX_DIGITS digits, a fraction of zeros allowed, "" or null (NaN). */
static int count(Scan *s, double *out) {
    const unsigned char *p = s->p, *end = s->end;
    if (p >= end) return 0;
    if (*p == '"') {
        if (end - p >= 2 && p[1] == '"') {
            s->p = p + 2;
            *out = NAN;
            return 1;
        }
        return 0;
    }
    if (*p == 'n') {
        if (!word(s, "null", 4)) return 0;
        *out = NAN;
        return 1;
    }
    int negative = 0;
    if (*p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return 0;
    int64_t value = 0;
    int digits = 0;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') return 0; /* a leading zero is not JSON */
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (++digits > MAX_DIGITS) return 0;
            value = 10 * value + (*p++ - '0');
        }
    }
    int fraction = 0;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0; /* "3." is not JSON */
        while (p < end && *p == '0') p++;
        if (p < end && *p >= '1' && *p <= '9') return 0; /* not integral: the exact path names it */
        fraction = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) return 0;
    s->p = p;
    double v = (double)value;
    /* -0 is the integer 0; -0.0 the float -0.0 (as the other paths decode them) */
    *out = negative ? (value || fraction ? -v : 0.0) : v;
    return 1;
}

#define BYTES(c) (0x0101010101010101ULL * (c))
/* Whether none of the 8 bytes of `w` ends a string or is declined by the loop of `categorical` below: no
 * control character (< 0x20), none over ASCII (so none fails raw_key_byte), no quote, no backslash. */
static inline int plain8(uint64_t w) {
    uint64_t high = BYTES(0x80);
    uint64_t quote = w ^ BYTES('"'), backslash = w ^ BYTES('\\');
    uint64_t below = (w - BYTES(0x20)) & ~w;            /* a byte < 0x20 sets its top bit */
    uint64_t zero = ((quote - BYTES(1)) & ~quote) |      /* a byte == '"' */
                    ((backslash - BYTES(1)) & ~backslash); /* a byte == '\\' */
    return !((w | below | zero) & high);
}

/* A categorical: a string of at most RAW_KEY_BYTES plain ASCII characters (its key), or null ("", the missing value). */
static int categorical(Scan *s, uint64_t *out) {
    const unsigned char *p = s->p, *end = s->end;
    if (p >= end) return 0;
    if (*p == 'n') {
        if (!word(s, "null", 4)) return 0;
        *out = RAW_EMPTY_KEY;
        return 1;
    }
    if (*p != '"') return 0;
    const unsigned char *start = ++p;
    if (end - start > RAW_KEY_BYTES && start[RAW_KEY_BYTES] == '"') { /* 8 characters (Criteo's) at once */
        uint64_t w;
        memcpy(&w, start, 8);
        if (plain8(w)) {
            s->p = start + RAW_KEY_BYTES + 1;
            *out = raw_key8(start);
            return 1;
        } /* a quote among them (a shorter value), or a byte to decline: byte by byte */
    }
    while (p < end && *p != '"') {
        unsigned char c = *p;
        /* JSON's plain characters (no control character, no escape) that a key holds */
        if (c < 0x20 || c == '\\' || !raw_key_byte(c) || p - start == RAW_KEY_BYTES) return 0;
        p++;
    }
    if (p >= end) return 0;
    s->p = p + 1;
    *out = raw_key(start, (size_t)(p - start));
    return 1;
}

/* Sizes of n rows never pass PY_SSIZE_T_MAX: a larger one is a failed allocation (a MemoryError). */
#define MAX_CELLS (PY_SSIZE_T_MAX / (N_CAT * 8))

static int grow(Scan *s) {
    if (s->cap > MAX_CELLS / 2) return 0;
    int was_inline = s->num == s->num_inline;
    Py_ssize_t cap = was_inline ? 128 : 2 * s->cap; /* out of the stack: 128 rows, then doubling */
    double *num = PyMem_RawRealloc(was_inline ? NULL : s->num, (size_t)cap * N_NUM * sizeof(double));
    if (!num) return 0;
    if (was_inline) memcpy(num, s->num_inline, sizeof s->num_inline);
    s->num = num;
    uint64_t *key = PyMem_RawRealloc(was_inline ? NULL : s->key, (size_t)cap * N_CAT * sizeof(uint64_t));
    if (!key) return 0;
    if (was_inline) memcpy(key, s->key_inline, sizeof s->key_inline);
    s->key = key;
    s->cap = cap;
    return 1;
}

static int row(Scan *s) {
    if (!eat(s, '{')) return 0;
    if (s->n == s->max_rows) return 0; /* more rows than any request may hold: the exact path's */
    if (s->n == s->cap && !grow(s)) {
        s->nomem = 1;
        return 0;
    }
    double *num = s->num + s->n * N_NUM;
    uint64_t *key = s->key + s->n * N_CAT;
    for (int j = 0; j < N_NUM; j++) num[j] = NAN;
    for (int j = 0; j < N_CAT; j++) key[j] = RAW_EMPTY_KEY;
    s->n++;
    if (eat(s, '}')) return 1;
    uint64_t seen = 0;
    do {
        if (!eat(s, '"')) return 0;
        int f = field_index(s);
        if (f < 0 || (seen >> f & 1)) return 0; /* another key, or a repeated one */
        seen |= 1ULL << f;
        if (!eat(s, ':')) return 0;
        ws(s);
        if (f < N_NUM ? !count(s, num + f) : !categorical(s, key + f - N_NUM)) return 0;
    } while (eat(s, ','));
    return eat(s, '}');
}

static int instances(Scan *s) {
    if (!eat(s, '[')) return 0;
    if (eat(s, ']')) return 0; /* no rows: the exact path's to answer */
    do {
        if (!row(s)) return 0;
    } while (eat(s, ','));
    return eat(s, ']');
}

/* One column of the columnar format, `[v, ...]`, into `tmp` (grown as needed): its length, or -1. */
static Py_ssize_t column(Scan *s, int f, uint64_t **tmp, Py_ssize_t *cap) {
    if (!eat(s, '[')) return -1;
    Py_ssize_t m = 0;
    if (eat(s, ']')) return 0;
    do {
        if (m == s->max_rows) return -1;
        if (m == *cap) {
            if (*cap > MAX_CELLS / 2) {
                s->nomem = 1;
                return -1;
            }
            Py_ssize_t grown = *cap ? 2 * *cap : 128;
            uint64_t *more = PyMem_RawRealloc(*tmp, (size_t)grown * 8);
            if (!more) {
                s->nomem = 1;
                return -1;
            }
            *tmp = more;
            *cap = grown;
        }
        ws(s);
        if (f < N_NUM) {
            double v;
            if (!count(s, &v)) return -1;
            memcpy(*tmp + m, &v, 8);
        } else if (!categorical(s, *tmp + m)) {
            return -1;
        }
        m++;
    } while (eat(s, ','));
    return eat(s, ']') ? m : -1;
}

/* The columnar format's `inputs`: `{"I1": [3, null], "C1": ["68fd1e64", ""], ...}`, every present field of the
 * same length, each at most once; an absent field is all missing (as serving/codecs/raw_codec.py reads it). */
static int inputs(Scan *s) {
    uint64_t *tmp = NULL, seen = 0;
    Py_ssize_t cap = 0, n = -1;
    int ok = 0;
    s->columnar = 1;
    if (!eat(s, '{') || eat(s, '}')) goto done; /* no field: the exact path names the empty batch */
    do {
        if (!eat(s, '"')) goto done;
        int f = field_index(s);
        if (f < 0 || (seen >> f & 1) || !eat(s, ':')) goto done;
        seen |= 1ULL << f;
        Py_ssize_t m = column(s, f, &tmp, &cap);
        if (m < 0 || (n >= 0 && m != n)) goto done; /* another length: the exact path names them */
        if (n < 0) {
            n = m; /* m <= s->cap <= MAX_CELLS: n * 26 * 8 fits */
            s->num = PyMem_RawMalloc((size_t)(n ? n : 1) * N_NUM * sizeof(double));
            s->key = PyMem_RawMalloc((size_t)(n ? n : 1) * N_CAT * sizeof(uint64_t));
            if (!s->num || !s->key) {
                s->nomem = 1;
                goto done;
            }
            for (Py_ssize_t i = 0; i < n * N_NUM; i++) s->num[i] = NAN;
            for (Py_ssize_t i = 0; i < n * N_CAT; i++) s->key[i] = RAW_EMPTY_KEY;
        }
        if (n == 0) continue; /* an empty column: nothing to copy (tmp is NULL) */
        if (f < N_NUM) memcpy(s->num + (Py_ssize_t)f * n, tmp, (size_t)n * 8);
        else memcpy(s->key + (Py_ssize_t)(f - N_NUM) * n, tmp, (size_t)n * 8);
    } while (eat(s, ','));
    ok = eat(s, '}') && n > 0;
    s->n = n;
done:
    PyMem_RawFree(tmp);
    return ok;
}

static int envelope(Scan *s) {
    int has_instances = 0, has_signature = 0;
    if (!eat(s, '{')) return 0;
    do {
        const unsigned char *t;
        Py_ssize_t len;
        if (!eat(s, '"') || !key_text(s, &t, &len) || !eat(s, ':')) return 0;
        ws(s);
        if (len == 9 && memcmp(t, "instances", 9) == 0 && !has_instances) {
            has_instances = 1;
            if (!instances(s)) return 0;
        } else if (len == 6 && memcmp(t, "inputs", 6) == 0 && !has_instances) {
            has_instances = 1;
            if (!inputs(s)) return 0;
        } else if (len == 14 && memcmp(t, "signature_name", 14) == 0 && !has_signature) {
            has_signature = 1;
            if (!word(s, "\"raw\"", 5)) return 0;
        } else {
            return 0;
        }
    } while (eat(s, ','));
    if (!eat(s, '}')) return 0;
    ws(s);
    return has_instances && s->p == s->end;
}

/* Row-major (n, width) -> field-major (width, n), in a new bytearray. */
static PyObject *columns(const void *rows, Py_ssize_t n, int width) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * width * 8);
    if (!out) return NULL;
    const uint64_t *in = rows;
    uint64_t *col = (uint64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++)
        for (int j = 0; j < width; j++) col[(Py_ssize_t)j * n + i] = in[i * width + j];
    return out;
}

/* Scans `args` (body, min_rows, max_rows): 1 with the counts and keys as field-major bytearrays in
 * `num` and `key` (n rows), 0 when the scan declines the body, -1 with an exception set. */
static int scan_body(PyObject *args, Py_ssize_t *n, PyObject **num, PyObject **key, int *columnar) {
    Py_buffer body;
    Py_ssize_t min_rows, max_rows;
    if (!PyArg_ParseTuple(args, "y*nn", &body, &min_rows, &max_rows)) return -1;
    Scan s;
    s.p = body.buf;
    s.end = (const unsigned char *)body.buf + body.len;
    s.num = s.num_inline; /* the first INLINE_ROWS rows' storage (`grow` copies them out of it) */
    s.key = s.key_inline;
    s.n = 0;
    s.cap = INLINE_ROWS;
    s.max_rows = max_rows;
    s.nomem = s.columnar = 0;
    int ok;
    if (body.len < RELEASE_GIL_BYTES) {
        ok = envelope(&s) && s.n >= min_rows;
    } else {
        Py_BEGIN_ALLOW_THREADS ok = envelope(&s) && s.n >= min_rows;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&body);
    int result = -1;
    *num = *key = NULL;
    if (s.nomem) {
        PyErr_NoMemory();
    } else if (!ok) {
        result = 0;
    } else {
        if (s.columnar) { /* field-major already */
            *num = PyByteArray_FromStringAndSize((const char *)s.num, s.n * N_NUM * 8);
            *key = *num ? PyByteArray_FromStringAndSize((const char *)s.key, s.n * N_CAT * 8) : NULL;
        } else {
            *num = columns(s.num, s.n, N_NUM);
            *key = *num ? columns(s.key, s.n, N_CAT) : NULL;
        }
        if (*num && *key) {
            result = 1;
            *n = s.n;
            *columnar = s.columnar;
        } else {
            Py_CLEAR(*num);
        }
    }
    scan_free(&s);
    return result;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n;
    PyObject *num, *key;
    int columnar;
    int found = scan_body(args, &n, &num, &key, &columnar);
    if (found <= 0) return found < 0 ? NULL : Py_NewRef(Py_None);
    return Py_BuildValue("nNNO", n, num, key, columnar ? Py_True : Py_False);
}

/* numpy's ndarray type and the two dtypes, imported at the first `arrays` call (`scan` needs no numpy). */
static PyObject *ndarray, *float64, *uint64;

static int import_numpy(void) {
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (!numpy) return 0;
    PyObject *type = PyObject_GetAttrString(numpy, "ndarray");
    PyObject *dtype = type ? PyObject_GetAttrString(numpy, "dtype") : NULL;
    PyObject *f = dtype ? PyObject_CallFunction(dtype, "s", "float64") : NULL;
    PyObject *u = f ? PyObject_CallFunction(dtype, "s", "uint64") : NULL;
    Py_DECREF(numpy);
    Py_XDECREF(dtype);
    if (!u) {
        Py_XDECREF(type);
        Py_XDECREF(f);
        return 0;
    }
    ndarray = type;
    float64 = f;
    uint64 = u;
    return 1;
}

/* ndarray((height, n), dtype, buffer): a view of the bytearray, as np.frombuffer(...).reshape(...) gives. */
static PyObject *view(PyObject *buffer, Py_ssize_t height, Py_ssize_t n, PyObject *dtype) {
    PyObject *shape = Py_BuildValue("(nn)", height, n);
    if (!shape) return NULL;
    PyObject *call[3] = {shape, dtype, buffer};
    PyObject *out = PyObject_Vectorcall(ndarray, call, 3, NULL);
    Py_DECREF(shape);
    return out;
}

static PyObject *arrays(PyObject *self, PyObject *args) {
    (void)self;
    if (!ndarray && !import_numpy()) return NULL;
    Py_ssize_t n;
    PyObject *num, *key;
    int columnar;
    int found = scan_body(args, &n, &num, &key, &columnar);
    if (found <= 0) return found < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *counts = view(num, N_NUM, n, float64);
    PyObject *keys = counts ? view(key, N_CAT, n, uint64) : NULL;
    Py_DECREF(num);
    Py_DECREF(key);
    if (!keys) {
        Py_XDECREF(counts);
        return NULL;
    }
    return Py_BuildValue("ONN", columnar ? Py_True : Py_False, counts, keys);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(body, min_rows, max_rows) -> (n, counts, keys, columnar) or None: a raw REST body as columns."},
    {"arrays", arrays, METH_VARARGS,
     "arrays(body, min_rows, max_rows) -> (columnar, counts, keys) or None: scan's columns as numpy arrays."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan_native(void) { return PyModule_Create(&module); }
