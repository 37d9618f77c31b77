/* One-pass kernels for the statistics of a scan (stats.py): min, max, exact sum and exact
 * sum of squares of one- and two-byte integers, and their tally (counts per value).
 *
 * numpy needs a pass per quantity (min, max, sum, an einsum for the squares: about 1.4 ns
 * a byte together) and np.bincount copies its input as intp first (2.75 ns a byte); here
 * each is one pass the compiler vectorizes, with the GIL released, so a reader thread can
 * copy the next block meanwhile. Results are exact integers, equal to numpy's by
 * construction (tests/unit/test_smallints.py checks both ways on the same data). Inputs come by the
 * buffer protocol (C-contiguous), read as raw elements of the kind named by a format
 * letter: 'B' uint8 (bools too), 'b' int8, 'H' uint16, 'h' int16.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Elements per inner chunk: small enough that 32-bit partial sums cannot overflow
 * (32768 * 255 * 255 < 2^32), large enough that folding them costs nothing. */
#define CHUNK 32768

typedef struct {
    int64_t lo, hi, sum;
    uint64_t squares;
} Moments;

/* Each kernel sums a chunk in narrow lanes the compiler can vectorize, then folds it in. */
#define MOMENTS_KERNEL(NAME, T, SUM_T, MUL_T, SQ_T)                                                \
    static void NAME(const T *p, Py_ssize_t n, Moments *m) {                                       \
        T lo = p[0], hi = p[0];                                                                    \
        for (Py_ssize_t start = 0; start < n; start += CHUNK) {                                    \
            Py_ssize_t len = n - start < CHUNK ? n - start : CHUNK;                                \
            const T *q = p + start;                                                                \
            SUM_T s = 0;                                                                           \
            SQ_T sq = 0;                                                                           \
            T clo = q[0], chi = q[0];                                                              \
            for (Py_ssize_t i = 0; i < len; i++) {                                                 \
                T v = q[i];                                                                        \
                s += v;                                                                            \
                sq += (SQ_T)(MUL_T)((MUL_T)v * (MUL_T)v);                                          \
                clo = v < clo ? v : clo;                                                           \
                chi = v > chi ? v : chi;                                                           \
            }                                                                                      \
            m->sum += (int64_t)s;                                                                  \
            m->squares += (uint64_t)sq;                                                            \
            lo = clo < lo ? clo : lo;                                                              \
            hi = chi > hi ? chi : hi;                                                              \
        }                                                                                          \
        m->lo = lo;                                                                                \
        m->hi = hi;                                                                                \
    }

/* MUL_T holds a square exactly (255^2 < 2^16, 128^2 <= 2^14, 65535^2 < 2^32, 32768^2 = 2^30). */
MOMENTS_KERNEL(moments_u8, uint8_t, uint32_t, uint16_t, uint32_t)
MOMENTS_KERNEL(moments_i8, int8_t, int32_t, int16_t, uint32_t)
MOMENTS_KERNEL(moments_u16, uint16_t, int64_t, uint32_t, uint64_t)
MOMENTS_KERNEL(moments_i16, int16_t, int64_t, int32_t, uint64_t)

static Py_ssize_t item_size(int kind) {
    switch (kind) {
    case 'B': case 'b': return 1;
    case 'H': case 'h': return 2;
    default: return 0;
    }
}

static int get_input(PyObject *obj, Py_buffer *view, int kind) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % item_size(kind)) {
        PyErr_SetString(PyExc_ValueError, "the buffer's length is not a whole number of elements");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Largest element count per call: keeps every 64-bit total exact (2^30 squares of at
 * most 2^30 each). The Python side splits longer inputs. */
#define MAX_ELEMENTS ((Py_ssize_t)1 << 30)

static PyObject *moments(PyObject *self, PyObject *args) {
    PyObject *obj;
    int kind;
    if (!PyArg_ParseTuple(args, "OC:moments", &obj, &kind))
        return NULL;
    if (!item_size(kind))
        return PyErr_Format(PyExc_ValueError, "kind must be one of 'B', 'b', 'H', 'h', got %c", kind);
    Py_buffer view;
    if (get_input(obj, &view, kind) < 0)
        return NULL;
    Py_ssize_t n = view.len / item_size(kind);
    if (n == 0 || n > MAX_ELEMENTS) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "moments takes 1 to %zd elements, got %zd", MAX_ELEMENTS, n);
    }
    Moments m = {0, 0, 0, 0};
    Py_BEGIN_ALLOW_THREADS
    switch (kind) {
    case 'B': moments_u8((const uint8_t *)view.buf, n, &m); break;
    case 'b': moments_i8((const int8_t *)view.buf, n, &m); break;
    case 'H': moments_u16((const uint16_t *)view.buf, n, &m); break;
    default: moments_i16((const int16_t *)view.buf, n, &m); break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("LLLK", (long long)m.lo, (long long)m.hi, (long long)m.sum,
                         (unsigned long long)m.squares);
}

/* Counts per byte value, in eight tables, one per byte of a 64-bit load, so that equal
 * neighbouring bytes (frames are mostly runs) do not wait on each other's increment;
 * 32-bit counts folded into the int64 ones every 2^30 bytes. */
#define TALLY_TABLES 8
static void tally_u8(const uint8_t *p, Py_ssize_t n, int64_t *counts) {
    uint32_t t[TALLY_TABLES][256];
    for (Py_ssize_t start = 0; start < n; start += (Py_ssize_t)1 << 30) {
        Py_ssize_t len = n - start < ((Py_ssize_t)1 << 30) ? n - start : ((Py_ssize_t)1 << 30);
        const uint8_t *q = p + start;
        memset(t, 0, sizeof t);
        Py_ssize_t i = 0;
        for (; i + TALLY_TABLES <= len; i += TALLY_TABLES) {
            uint64_t w;
            memcpy(&w, q + i, sizeof w);  /* the byte order does not matter: all eight are counted */
            for (int k = 0; k < TALLY_TABLES; k++)
                t[k][(w >> (8 * k)) & 255]++;
        }
        for (; i < len; i++)
            t[0][q[i]]++;
        for (int v = 0; v < 256; v++) {
            int64_t sum = 0;
            for (int k = 0; k < TALLY_TABLES; k++)
                sum += t[k][v];
            counts[v] += sum;
        }
    }
}

static void tally_u16(const uint16_t *p, Py_ssize_t n, int64_t *counts) {
    for (Py_ssize_t i = 0; i < n; i++)
        counts[p[i]]++;
}

/* Whether a buffer's format describes native 64-bit signed integers ("l" or "q"). */
static int is_int64(const char *format, Py_ssize_t itemsize) {
    if (format == NULL || itemsize != 8)
        return 0;
    if (*format == '@' || *format == '=')
        format++;
    return (format[0] == 'l' || format[0] == 'q') && format[1] == '\0';
}

static PyObject *tally(PyObject *self, PyObject *args) {
    PyObject *obj, *out;
    int kind;
    if (!PyArg_ParseTuple(args, "OCO:tally", &obj, &kind, &out))
        return NULL;
    Py_ssize_t size = item_size(kind);
    if (!size)
        return PyErr_Format(PyExc_ValueError, "kind must be one of 'B', 'b', 'H', 'h', got %c", kind);
    Py_buffer view, counts;
    if (get_input(obj, &view, kind) < 0)
        return NULL;
    if (PyObject_GetBuffer(out, &counts, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (counts.len != ((Py_ssize_t)8 << (8 * size)) || !is_int64(counts.format, counts.itemsize)) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&counts);
        return PyErr_Format(PyExc_ValueError, "counts must be %zd int64 values", (Py_ssize_t)1 << (8 * size));
    }
    Py_BEGIN_ALLOW_THREADS
    if (size == 1)
        tally_u8((const uint8_t *)view.buf, view.len, (int64_t *)counts.buf);
    else
        tally_u16((const uint16_t *)view.buf, view.len / 2, (int64_t *)counts.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyBuffer_Release(&counts);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"moments", moments, METH_VARARGS,
     "moments(buffer, kind) -> (min, max, sum, sum of squares) of the elements, exact ints;\n"
     "kind: 'B' uint8, 'b' int8, 'H' uint16, 'h' int16; 1 to 2**30 elements."},
    {"tally", tally, METH_VARARGS,
     "tally(buffer, kind, counts): counts[raw bits] += occurrences of each element's raw bits;\n"
     "counts: a writable int64 array of 256 (1-byte kinds) or 65536 (2-byte kinds) values."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "One-pass exact statistics of small integers.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
