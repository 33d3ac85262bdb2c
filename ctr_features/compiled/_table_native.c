/* The compiled table's native parts: the few-row transform and the keys of decoded values.
 *
 * 1. `table(...)` and `rows(table, z, counts, keys, n)` (ctr_features/compiled/few_rows.py): the compiled
 * FeatureSpec of ctr_features/compiled/table.py on a few keyed rows, with the z-scores of their counts given
 * (numpy's own, cached): the categorical lookups in the same cuckoo table as `ValueTable.lookup_keys`, the
 * lifts and the bucket counts, into float32 features. No arithmetic but a float32 += 1.0: the same bits as
 * numpy's.
 *
 * `cells(table, keys, n)`: the same lookups, lifts and bucket counts on any number of keyed rows, for the numpy
 * transform of a larger batch (ctr_features/compiled/table.py), which adds the counts' columns itself.
 *
 * 2. `keys(values)` (ctr_features/compiled/value_table.py): the keys (ctr_features/compiled/raw_key.h) of
 * values already decoded (gRPC tensors, REST bodies the native scan declined), so those batches take the
 * few-row transform and the batch-wide lookup too.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "raw_key.h"

#define N_NUM 13
#define N_CAT 26
#define MAX_WIDTH (1 << 20) /* a row's features: far above any spec's, and n * width * 4 stays checked */

/* a * b, or 0 (an OverflowError set) when it exceeds PY_SSIZE_T_MAX; a, b >= 0. */
static int mul_size(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out, const char *what) {
    if (b && a > PY_SSIZE_T_MAX / b) {
        PyErr_Format(PyExc_OverflowError, "%s is too large", what);
        return 0;
    }
    *out = a * b;
    return 1;
}

/* Loads from buffers `y*` accepts at any alignment (a memoryview slice): memcpy, one load on x86. */
static inline uint64_t load_u64(const char *p, Py_ssize_t i) {
    uint64_t v;
    memcpy(&v, p + i * 8, 8);
    return v;
}
static inline int32_t load_i32(const char *p, Py_ssize_t i) {
    int32_t v;
    memcpy(&v, p + i * 4, 4);
    return v;
}
static inline float load_f32(const char *p, Py_ssize_t i) {
    float v;
    memcpy(&v, p + i * 4, 4);
    return v;
}
static inline double load_f64(const char *p, Py_ssize_t i) {
    double v;
    memcpy(&v, p + i * 8, 8);
    return v;
}

/* ---- 1. the few-row transform ---- */

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

/* table(key, code, salts, shift, default, lift, column, width) -> a capsule: the arrays checked and copied
 * (at any alignment), the width from 2 * N_NUM + N_CAT + 1 to MAX_WIDTH. */
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
    else if (column.len != lift.len || lift.len % 4 || entries < 1)
        bad = "one float32 lift and one int32 column per entry";
    else if (width <= 2 * N_NUM + N_CAT || width > MAX_WIDTH) bad = "the width must be from 53 to 1048576";
    if (!bad) {
        const char *c = code.buf, *col = column.buf;
        for (Py_ssize_t i = 0; i < slots && !bad; i++)
            if (load_i32(c, i) < 0 || load_i32(c, i) >= entries) bad = "a code is not an entry";
        for (Py_ssize_t i = 0; i < entries && !bad; i++)
            if (load_i32(col, i) < 2 * N_NUM + N_CAT || load_i32(col, i) >= width)
                bad = "a column is not a bucket column";
        if (missing < 0 || missing >= entries) bad = "the default is not an entry";
    }
    Table *t = NULL;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad);
    } else if (slots > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Slot) ||
               entries > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Entry)) {
        PyErr_SetString(PyExc_OverflowError, "the table is too large");
    } else if (!(t = PyMem_Calloc(1, sizeof(Table))) || !(t->slot = PyMem_Malloc((size_t)slots * sizeof(Slot))) ||
               !(t->entry = PyMem_Malloc((size_t)entries * sizeof(Entry)))) {
        PyErr_NoMemory();
    } else {
        const char *k = key.buf, *c = code.buf, *col = column.buf, *l = lift.buf;
        for (Py_ssize_t i = 0; i < slots; i++) t->slot[i] = (Slot){load_u64(k, i), load_i32(c, i), 0};
        for (Py_ssize_t i = 0; i < entries; i++) t->entry[i] = (Entry){load_f32(l, i), load_i32(col, i)};
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

#define ROWS_SIZES "z, counts and keys must hold 13, 13 and 26 values per row"
#define CELLS_SIZES "keys must hold 26 values per row, of at least one row"

/* The table of `capsule`, for n >= 1 rows whose sizes (n * 26 * 8, n * width * 4) stay below PY_SSIZE_T_MAX;
 * NULL with an exception set otherwise (`sizes`: the ValueError's message for n < 1). */
static Table *table_of(PyObject *capsule, Py_ssize_t n, const char *sizes) {
    Table *t = PyCapsule_GetPointer(capsule, "ctr.raw_table");
    Py_ssize_t size;
    if (!t) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, sizes);
        return NULL;
    }
    if (!mul_size(n, N_CAT * 8, &size, "n") || !mul_size(n, t->width * 4, &size, "n * width")) return NULL;
    return t;
}

/* The categorical part of n keyed rows into features `out` (n, width), zeroed, and `found` (n, 26): each value's
 * entry, its lift, and a count in its bucket column. Value (f, r)'s key is the uint64 at k + f * field + r * row
 * (in uint64s): field-major keys have (field, row) = (n, 1), row-major ones (1, 26). */
static void categorical(const Table *t, const char *k, Py_ssize_t n, Py_ssize_t field, Py_ssize_t row_step,
                        float *out, int32_t *found) {
    for (Py_ssize_t r = 0; r < n; r++) {
        float *row = out + r * t->width;
        for (int f = 0; f < N_CAT; f++) {
            int32_t e = lookup(t, load_u64(k, f * field + r * row_step), f);
            found[r * N_CAT + f] = e; /* row-major: a row's 26 are contiguous */
            row[2 * N_NUM + f] = t->entry[e].lift;
            row[t->entry[e].column] += 1.0f; /* two fields may share a bucket */
        }
    }
}

/* rows(table, z, counts, keys, n) -> (features, entries), or None when a present count has no z-score.
 *
 * z: a list of 13 * n floats or None, field-major (the cached z-score of each count; None: not cached), read
 * from a tuple copy (an item's __float__ may change the list, not the copy); counts: float64 (13, n); keys:
 * uint64 (26, n), every value keyed, at any alignment. A count without a z-score is missing when it is NaN
 * (z 0, missing flag 1), else the caller's numpy transform must run (None). Every size is checked against
 * PY_SSIZE_T_MAX (an OverflowError). Returns the float32 (n, width) features and the int32 (n, 26) entries
 * (row-major: each row's contiguous, for drift) in bytearrays. */
static PyObject *rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule, *list;
    Py_buffer counts, keys;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OO!y*y*n", &capsule, &PyList_Type, &list, &counts, &keys, &n)) return NULL;
    PyObject *result = NULL, *features = NULL, *entries = NULL, *z = NULL;
    Py_ssize_t n_num, n_cat, cells;
    Table *t = table_of(capsule, n, ROWS_SIZES);
    if (!t) goto done;
    n_num = N_NUM * n;
    n_cat = N_CAT * n;
    cells = n * t->width;
    if (PyList_GET_SIZE(list) != n_num || counts.len != n_num * 8 || keys.len != n_cat * 8) {
        PyErr_SetString(PyExc_ValueError, ROWS_SIZES);
        goto done;
    }
    if (!(z = PyList_AsTuple(list))) goto done; /* strong references: __float__ cannot free them */
    features = PyByteArray_FromStringAndSize(NULL, cells * 4);
    entries = PyByteArray_FromStringAndSize(NULL, n_cat * 4);
    if (!features || !entries) goto done;
    float *out = (float *)PyByteArray_AS_STRING(features);
    int32_t *found = (int32_t *)PyByteArray_AS_STRING(entries);
    const char *x = counts.buf, *k = keys.buf;
    memset(out, 0, (size_t)cells * 4);
    for (Py_ssize_t j = 0; j < N_NUM; j++) {
        for (Py_ssize_t r = 0; r < n; r++) {
            PyObject *v = PyTuple_GET_ITEM(z, j * n + r);
            float *row = out + r * t->width;
            if (v == Py_None) {
                double c = load_f64(x, j * n + r);
                if (c == c) { /* present, not cached: numpy's turn */
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
    categorical(t, k, n, n, 1, out, found); /* field-major keys */
    result = Py_BuildValue("OO", features, entries);
done:
    Py_XDECREF(z);
    Py_XDECREF(features);
    Py_XDECREF(entries);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&keys);
    return result;
}

/* cells(table, keys, n) -> (features, entries): the categorical part of n keyed rows of any number, for the
 * numpy transform of a batch (ctr_features/compiled/table.py), which fills in the counts' columns: the float32
 * (n, width) features with the lifts and bucket counts set and every other column 0, and the int32 (n, 26)
 * entries. keys: uint64 (n, 26), row-major (a merged batch's, RawBatch.concat), every value keyed. */
static PyObject *cells(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    Py_buffer keys;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Oy*n", &capsule, &keys, &n)) return NULL;
    PyObject *result = NULL, *features = NULL, *entries = NULL;
    Table *t = table_of(capsule, n, CELLS_SIZES);
    if (!t) goto done;
    if (keys.len != n * N_CAT * 8) {
        PyErr_SetString(PyExc_ValueError, CELLS_SIZES);
        goto done;
    }
    features = PyByteArray_FromStringAndSize(NULL, n * t->width * 4);
    entries = PyByteArray_FromStringAndSize(NULL, n * N_CAT * 4);
    if (!features || !entries) goto done;
    float *out = (float *)PyByteArray_AS_STRING(features);
    memset(out, 0, (size_t)(n * t->width) * 4);
    categorical(t, keys.buf, n, 1, N_CAT, out, (int32_t *)PyByteArray_AS_STRING(entries));
    result = Py_BuildValue("OO", features, entries);
done:
    Py_XDECREF(features);
    Py_XDECREF(entries);
    PyBuffer_Release(&keys);
    return result;
}

/* ---- 2. keys of values already decoded ---- */

/* keys(values) -> bytearray of one uint64 key per value, or None when a value is not a str of up to
 * RAW_KEY_BYTES ASCII characters without a NUL or a 0x01 (the numpy path of
 * ctr_features/compiled/value_table.py then decides). */
static PyObject *keys(PyObject *self, PyObject *values) {
    (void)self;
    if (!PyList_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "keys() takes a list of str");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(values), size;
    if (!mul_size(m, 8, &size, "the list")) return NULL;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, size);
    if (!out) return NULL;
    uint64_t *key = (uint64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyUnicode_Check(v) || !PyUnicode_IS_ASCII(v) || PyUnicode_GET_LENGTH(v) > RAW_KEY_BYTES) goto none;
        Py_ssize_t len = PyUnicode_GET_LENGTH(v);
        const unsigned char *c = PyUnicode_DATA(v);
        for (Py_ssize_t j = 0; j < len; j++)
            if (!raw_key_byte(c[j])) goto none;
        key[i] = raw_key(c, (size_t)len);
    }
    return out;
none:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"keys", keys, METH_O, "keys(values) -> bytearray of uint64 keys, or None: the keys of a list of str."},
    {"table", table, METH_VARARGS, "table(key, code, salts, shift, default, lift, column, width) -> a capsule."},
    {"rows", rows, METH_VARARGS,
     "rows(table, z, counts, keys, n) -> (features, entries) or None: the few-row transform of keyed rows."},
    {"cells", cells, METH_VARARGS,
     "cells(table, keys, n) -> (features, entries): the categorical part of the transform of keyed rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_table_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__table_native(void) { return PyModule_Create(&module); }
