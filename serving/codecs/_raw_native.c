/* The raw path's native parts: a body scanned straight into columns, and the few-row transform.
 *
 * 1. `scan(body, min_rows, max_rows)` (serving/codecs/raw_body.py) reads a raw REST body, in row format
 * `{"instances": [{"I1": 3, "C1": "68fd1e64", ...}, ...], "signature_name"?: "raw"}` or columnar
 * `{"inputs": {"I1": [3, ...], "C1": ["68fd1e64", ...], ...}, "signature_name"?: "raw"}`, in one pass over its
 * bytes and returns (n, counts, keys, columnar): n rows, the counts as float64 (13, n) field-major
 * (NaN = missing) and the categorical values' keys as uint64 (26, n) field-major, in two bytearrays. A key is a
 * value's bytes (up to 8) as a little-endian uint64, zero-padded, and "" is eight 0x01 bytes: the keys of
 * ctr_features/compiled/value_table.py (`RawKeys`).
 *
 * It takes a strict subset of JSON and returns None for anything else, which then goes the way it always went
 * (msgspec, then the exact path that names the instance and field of an error). The subset:
 *   - the envelope holds "instances" or "inputs", and optionally "signature_name": "raw", each once, and
 *     nothing else;
 *   - a row, or `inputs`, holds only the 39 field names, each at most once, written without escapes; every
 *     column of `inputs` has the same length, and an absent field is all missing;
 *   - a count is a JSON integer of at most 15 digits, optionally with a fraction of zeros only (3.0), or "" or
 *     null; no exponent;
 *   - a categorical is a string of at most 8 ASCII characters from 0x20 to 0x7F without a backslash, or null;
 *   - at least `min_rows` rows and at most `max_rows` (its memory's bound: 39 * 8 bytes a row).
 * So it never accepts a body that is not JSON, and every body it takes decodes to the same values as the
 * other paths (tests/serving/unit/test_unit_raw_native.py compares them).
 *
 * Memory: two arrays of n rows (13 doubles and 26 keys each), grown by doubling, then one transposed copy in
 * the bytearrays; nothing else. Time: one pass over the body, without the GIL.
 *
 * 2. `table(...)` and `rows(table, z, counts, keys, n)` (serving/codecs/raw_rows.py): the compiled FeatureSpec
 * of ctr_features/compiled/table.py on a few keyed rows, with the z-scores of their counts given (numpy's
 * own, cached): the categorical lookups in the same cuckoo table as `ValueTable.lookup_keys`, the lifts and
 * the bucket counts, into float32 features. No arithmetic but a float32 += 1.0: the same bits as numpy's.
 *
 * 3. `keys(values)` (ctr_features/compiled/value_table.py): the same keys for values already decoded (gRPC tensors,
 * msgspec's rows), so those batches take the few-row transform and the batch-wide lookup too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define N_NUM 13
#define N_CAT 26
#define MAX_DIGITS 15 /* below 10**15 < 2**53: every such integer is exact in a double */
static const uint64_t EMPTY_KEY = 0x0101010101010101ULL;

typedef struct {
    const unsigned char *p, *end;
    double *num;   /* rows: row-major (cap, 13); columns: field-major (13, n) */
    uint64_t *key; /* rows: row-major (cap, 26); columns: field-major (26, n) */
    Py_ssize_t n, cap, max_rows;
    int nomem, columnar;
} Scan;

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

/* A categorical: a string of at most 8 plain ASCII characters (its key), or null ("", the missing value). */
static int categorical(Scan *s, uint64_t *out) {
    const unsigned char *p = s->p, *end = s->end;
    if (p >= end) return 0;
    if (*p == 'n') {
        if (!word(s, "null", 4)) return 0;
        *out = EMPTY_KEY;
        return 1;
    }
    if (*p != '"') return 0;
    p++;
    uint64_t key = 0;
    int len = 0;
    while (p < end && *p != '"') {
        unsigned char c = *p++;
        if (c < 0x20 || c > 0x7F || c == '\\' || len == 8) return 0;
        key |= (uint64_t)c << (8 * len++);
    }
    if (p >= end) return 0;
    s->p = p + 1;
    *out = len ? key : EMPTY_KEY;
    return 1;
}

static int grow(Scan *s) {
    Py_ssize_t cap = s->cap ? 2 * s->cap : 128;
    double *num = PyMem_RawRealloc(s->num, (size_t)cap * N_NUM * sizeof(double));
    if (!num) return 0;
    s->num = num;
    uint64_t *key = PyMem_RawRealloc(s->key, (size_t)cap * N_CAT * sizeof(uint64_t));
    if (!key) return 0;
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
    for (int j = 0; j < N_CAT; j++) key[j] = EMPTY_KEY;
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
            n = m;
            s->num = PyMem_RawMalloc((size_t)(n ? n : 1) * N_NUM * sizeof(double));
            s->key = PyMem_RawMalloc((size_t)(n ? n : 1) * N_CAT * sizeof(uint64_t));
            if (!s->num || !s->key) {
                s->nomem = 1;
                goto done;
            }
            for (Py_ssize_t i = 0; i < n * N_NUM; i++) s->num[i] = NAN;
            for (Py_ssize_t i = 0; i < n * N_CAT; i++) s->key[i] = EMPTY_KEY;
        }
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

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer body;
    Py_ssize_t min_rows, max_rows;
    if (!PyArg_ParseTuple(args, "y*nn", &body, &min_rows, &max_rows)) return NULL;
    Scan s = {body.buf, (const unsigned char *)body.buf + body.len, NULL, NULL, 0, 0, max_rows, 0, 0};
    int ok;
    Py_BEGIN_ALLOW_THREADS ok = envelope(&s) && s.n >= min_rows;
    Py_END_ALLOW_THREADS PyBuffer_Release(&body);
    PyObject *result = NULL;
    if (s.nomem) {
        PyErr_NoMemory();
    } else if (!ok) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *num, *key;
        if (s.columnar) { /* field-major already */
            num = PyByteArray_FromStringAndSize((const char *)s.num, s.n * N_NUM * 8);
            key = num ? PyByteArray_FromStringAndSize((const char *)s.key, s.n * N_CAT * 8) : NULL;
        } else {
            num = columns(s.num, s.n, N_NUM);
            key = num ? columns(s.key, s.n, N_CAT) : NULL;
        }
        if (num && key) result = Py_BuildValue("nNNO", s.n, num, key, s.columnar ? Py_True : Py_False);
        else Py_XDECREF(num);
    }
    PyMem_RawFree(s.num);
    PyMem_RawFree(s.key);
    return result;
}

/* ---- 2. the few-row transform ---- */

#define MIX 0x9E3779B97F4A7C15ULL /* ctr_features/compiled/value_table.py's multiply-shift constants */
#define MIX2 0xC2B2AE3D27D4EB4FULL

/* A slot and an entry each in one place: a lookup misses the cache about twice (a slot, its entry) instead of
 * four or five times in the numpy layout's separate arrays (a 118k-entry table is ~4 MB). */
typedef struct {
    uint64_t key; /* the salted key (0: empty) */
    int32_t code; /* its entry */
    int32_t pad;
} Slot;

typedef struct {
    float lift;     /* the entry's lift */
    int32_t column; /* the bucket column its value counts in */
} Entry;

typedef struct {
    Slot *slot;      /* the cuckoo table */
    unsigned shift;  /* 64 - log2(slots) */
    int32_t missing; /* the entry of a value no slot names */
    uint64_t salt[N_CAT];
    Entry *entry;
    Py_ssize_t entries, width;
} Table;

static void table_free(PyObject *capsule) {
    Table *t = PyCapsule_GetPointer(capsule, "ctr.raw_table");
    if (!t) return;
    PyMem_Free(t->slot);
    PyMem_Free(t->entry);
    PyMem_Free(t);
}

/* table(key, code, salts, shift, default, lift, column, width) -> a capsule: the arrays checked and copied. */
static PyObject *table(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer key, code, salts, lift, column;
    unsigned shift;
    int missing;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*y*y*Iiy*y*n", &key, &code, &salts, &shift, &missing, &lift, &column, &width))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t slots = key.len / 8, entries = lift.len / 4;
    const char *bad = NULL;
    if (shift < 2 || shift > 63 || slots != (Py_ssize_t)1 << (64 - shift) || key.len != slots * 8)
        bad = "the key table must hold 2**(64 - shift) uint64";
    else if (code.len != slots * 4) bad = "one int32 code per slot";
    else if (salts.len != N_CAT * 8) bad = "one uint64 salt per categorical field";
    else if (column.len != lift.len || entries < 1) bad = "one float32 lift and one int32 column per entry";
    if (!bad) {
        const int32_t *c = code.buf, *col = column.buf;
        for (Py_ssize_t i = 0; i < slots && !bad; i++)
            if (c[i] < 0 || c[i] >= entries) bad = "a code is not an entry";
        for (Py_ssize_t i = 0; i < entries && !bad; i++)
            if (col[i] < 2 * N_NUM + N_CAT || col[i] >= width) bad = "a column is not a bucket column";
        if (missing < 0 || missing >= entries) bad = "the default is not an entry";
    }
    Table *t = NULL;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
    } else if (!(t = PyMem_Calloc(1, sizeof(Table))) || !(t->slot = PyMem_Malloc((size_t)slots * sizeof(Slot))) ||
               !(t->entry = PyMem_Malloc((size_t)entries * sizeof(Entry)))) {
        PyErr_NoMemory();
    } else {
        const uint64_t *k = key.buf;
        const int32_t *c = code.buf, *col = column.buf;
        const float *l = lift.buf;
        for (Py_ssize_t i = 0; i < slots; i++) t->slot[i] = (Slot){k[i], c[i], 0};
        for (Py_ssize_t i = 0; i < entries; i++) t->entry[i] = (Entry){l[i], col[i]};
        memcpy(t->salt, salts.buf, sizeof t->salt);
        t->shift = shift;
        t->missing = missing;
        t->entries = entries;
        t->width = width;
        result = PyCapsule_New(t, "ctr.raw_table", table_free);
        if (result) t = NULL;
    }
    if (t) {
        PyMem_Free(t->slot);
        PyMem_Free(t->entry);
        PyMem_Free(t);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&code);
    PyBuffer_Release(&salts);
    PyBuffer_Release(&lift);
    PyBuffer_Release(&column);
    return result;
}

static inline int32_t lookup(const Table *t, uint64_t key, int field) {
    uint64_t salted = key ^ t->salt[field];
    uint64_t first = (salted * MIX) >> t->shift, second = (salted * MIX2) >> t->shift;
    if (t->slot[first].key == salted) return t->slot[first].code;
    if (t->slot[second].key == salted) return t->slot[second].code;
    return t->missing;
}

/* rows(table, z, counts, keys, n) -> (features, entries), or None when a present count has no z-score.
 *
 * z: 13 * n floats or None, field-major (the cached z-score of each count; None: not cached);
 * counts: float64 (13, n); keys: uint64 (26, n), every value keyed. A count without a z-score is missing when
 * it is NaN (z 0, missing flag 1), else the caller's numpy transform must run (None). Returns the float32
 * (n, width) features and the int32 (n, 26) entries (row-major: each row's contiguous, for drift) in bytearrays. */
static PyObject *rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule, *z;
    Py_buffer counts, keys;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OO!y*y*n", &capsule, &PyList_Type, &z, &counts, &keys, &n)) return NULL;
    PyObject *result = NULL, *features = NULL, *entries = NULL;
    Table *t = PyCapsule_GetPointer(capsule, "ctr.raw_table");
    if (!t) goto done;
    if (n < 1 || PyList_GET_SIZE(z) != N_NUM * n || counts.len != N_NUM * n * 8 || keys.len != N_CAT * n * 8) {
        PyErr_SetString(PyExc_ValueError, "z, counts and keys must hold 13, 13 and 26 values per row");
        goto done;
    }
    features = PyByteArray_FromStringAndSize(NULL, n * t->width * 4);
    entries = PyByteArray_FromStringAndSize(NULL, N_CAT * n * 4);
    if (!features || !entries) goto done;
    float *out = (float *)PyByteArray_AS_STRING(features);
    int32_t *found = (int32_t *)PyByteArray_AS_STRING(entries);
    const double *x = counts.buf;
    const uint64_t *k = keys.buf;
    memset(out, 0, (size_t)(n * t->width) * 4);
    for (Py_ssize_t j = 0; j < N_NUM; j++) {
        for (Py_ssize_t r = 0; r < n; r++) {
            PyObject *v = PyList_GET_ITEM(z, j * n + r);
            float *row = out + r * t->width;
            if (v == Py_None) {
                if (x[j * n + r] == x[j * n + r]) { /* present, not cached: numpy's turn */
                    result = Py_NewRef(Py_None);
                    goto done;
                }
                row[N_NUM + j] = 1.0f; /* missing: z 0, flag 1 */
            } else {
                double d = PyFloat_AsDouble(v);
                if (d == -1.0 && PyErr_Occurred()) goto done;
                row[j] = (float)d;
            }
        }
    }
    for (int f = 0; f < N_CAT; f++) {
        for (Py_ssize_t r = 0; r < n; r++) {
            int32_t e = lookup(t, k[f * n + r], f);
            float *row = out + r * t->width;
            found[r * N_CAT + f] = e; /* row-major: a row's 26 are contiguous */
            row[2 * N_NUM + f] = t->entry[e].lift;
            row[t->entry[e].column] += 1.0f; /* two fields may share a bucket */
        }
    }
    result = Py_BuildValue("OO", features, entries);
done:
    Py_XDECREF(features);
    Py_XDECREF(entries);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&keys);
    return result;
}

/* ---- 3. keys of values already decoded ---- */

/* keys(values) -> bytearray of one uint64 key per value (the scan's keys), or None when a value is not a str
 * of up to 8 ASCII characters without a NUL or a 0x01 (the numpy path of value_table.py then decides). */
static PyObject *keys(PyObject *self, PyObject *values) {
    (void)self;
    if (!PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "keys() takes a list of str");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(values);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, m * 8);
    if (!out) return NULL;
    uint64_t *key = (uint64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyUnicode_Check(v) || !PyUnicode_IS_ASCII(v) || PyUnicode_GET_LENGTH(v) > 8) goto none;
        Py_ssize_t len = PyUnicode_GET_LENGTH(v);
        const unsigned char *c = PyUnicode_DATA(v);
        uint64_t k = 0;
        for (Py_ssize_t j = 0; j < len; j++) {
            if (c[j] < 2) goto none; /* a NUL would cut the value, a 0x01 read as "" */
            k |= (uint64_t)c[j] << (8 * j);
        }
        key[i] = len ? k : EMPTY_KEY;
    }
    return out;
none:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(body, min_rows, max_rows) -> (n, counts, keys, columnar) or None: a raw REST body as columns."},
    {"keys", keys, METH_O, "keys(values) -> bytearray of uint64 keys, or None: the keys of a list of str."},
    {"table", table, METH_VARARGS, "table(key, code, salts, shift, default, lift, column, width) -> a capsule."},
    {"rows", rows, METH_VARARGS,
     "rows(table, z, counts, keys, n) -> (features, entries) or None: the few-row transform of keyed rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_raw_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__raw_native(void) { return PyModule_Create(&module); }
