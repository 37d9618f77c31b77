/* The writer's two per-row kernels in C (optional: rowsums.py and fastadd.py do the same
 * in numpy and Python where this is not built):
 *
 * crc_rows   the CRC-32 of many rows at once (rowsums.py: zlib's CRC-32 of the transition
 *            number, then each field's row), slicing by eight, straight from the mapped
 *            fields with the GIL released. numpy's version runs a pass per four bytes of
 *            the row over gathered copies: about 120 ns a W1 row, here about 15.
 * crc_join   the CRC-32 of a + b from those of a and b and len(b) (crcjoin.py; zlib's
 *            crc32_combine, which Python's zlib does not expose).
 * step       the body of a vector env's fast add (fastadd.py) after its checks: compare
 *            the step's states with the previous step's next states, then the commit
 *            protocol of counters.begin_step / commit_step around the row copies, in one
 *            call where Python pays a numpy call (a few hundred ns) per field.
 *
 * Inputs come by the buffer protocol. Destinations of `step` are addresses taken once
 * when the fast add is bound (the closure keeps their arrays, so the mapping stays), and
 * `step` only writes while the counter words give it a writable buffer: a closed writer
 * makes them read-only (Writer._release), so a held fast add refuses as numpy would.
 * A signal handler cannot run inside a C call, so a step is never left half-done by one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ CRC-32 (zlib's) */
static uint32_t T[8][256];

static void init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        T[0][i] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++)
            T[k][i] = (T[k - 1][i] >> 8) ^ T[0][T[k - 1][i] & 0xFF];
}

/* The running CRC (not inverted) over `n` more bytes. */
static uint32_t crc_bytes(uint32_t c, const uint8_t *p, Py_ssize_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
            T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
    }
#endif
    for (; n > 0; p++, n--)
        c = T[0][(c ^ *p) & 0xFF] ^ (c >> 8);
    return c;
}

/* ------------------------------------------------------------------ joining CRCs */
/* Polynomials over GF(2) modulo zlib's, bit-reflected (bit 31 holds x**0), as in crcjoin.py. */
static uint32_t X2K[64];  /* x**(2**k) */

static uint32_t times_mod(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            product ^= b;
        b = (b & 1) ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return product;
}

static void init_powers(void) {
    X2K[0] = 1u << 30;  /* x**1 */
    for (int k = 1; k < 64; k++)
        X2K[k] = times_mod(X2K[k - 1], X2K[k - 1]);
}

static PyObject *crc_join(PyObject *self, PyObject *args) {
    unsigned long long a, b, nbytes;
    if (!PyArg_ParseTuple(args, "KKK:crc_join", &a, &b, &nbytes))
        return NULL;
    uint32_t factor = 1u << 31;  /* x**(8 * nbytes) = x**(nbytes * 2**3) */
    for (int k = 3; nbytes; nbytes >>= 1, k++)
        if (nbytes & 1)
            factor = times_mod(X2K[k & 63], factor);
    return PyLong_FromUnsignedLong(times_mod(factor, (uint32_t)a) ^ (uint32_t)b);
}

static int get_buf(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (itemsize && (view->itemsize != itemsize || view->len % itemsize)) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#define MAX_FIELDS 64

/* crc_rows(out, slots, ts, fields, rows): out[i] = CRC-32 of ts[i] (8 bytes, little-endian)
 * followed by row slots[i] of every field in `fields` (each a buffer of `rows` rows). */
static PyObject *crc_rows(PyObject *self, PyObject *args) {
    PyObject *out_obj, *slots_obj, *ts_obj, *fields_obj;
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "OOOOn:crc_rows", &out_obj, &slots_obj, &ts_obj, &fields_obj, &rows))
        return NULL;
    if (rows < 1)
        return PyErr_Format(PyExc_ValueError, "rows must be positive, got %zd", rows);
    PyObject *seq = PySequence_Fast(fields_obj, "fields must be a sequence of buffers");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nf = PySequence_Fast_GET_SIZE(seq);
    if (nf > MAX_FIELDS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d fields", MAX_FIELDS);
    }
    Py_buffer out, slots, ts, fields[MAX_FIELDS];
    const uint8_t *base[MAX_FIELDS];
    Py_ssize_t width[MAX_FIELDS];
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (get_buf(out_obj, &out, PyBUF_WRITABLE, 4, "out") < 0)
        goto done_seq;
    if (get_buf(slots_obj, &slots, 0, 8, "slots") < 0)
        goto done_out;
    if (get_buf(ts_obj, &ts, 0, 8, "ts") < 0)
        goto done_slots;
    Py_ssize_t n = out.len / 4;
    if (slots.len / 8 != n || ts.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "out, slots and ts must have the same length");
        goto done_ts;
    }
    for (; got < nf; got++) {
        if (get_buf(PySequence_Fast_GET_ITEM(seq, got), &fields[got], 0, 0, "field") < 0)
            goto done_fields;
        if (fields[got].len % rows) {
            PyErr_Format(PyExc_ValueError, "field %zd: %zd bytes are not %zd whole rows", got, fields[got].len, rows);
            got++;
            goto done_fields;
        }
        base[got] = (const uint8_t *)fields[got].buf;
        width[got] = fields[got].len / rows;
    }
    const int64_t *s = (const int64_t *)slots.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || s[i] >= rows) {
            PyErr_Format(PyExc_IndexError, "slot %lld out of range for %zd rows", (long long)s[i], rows);
            goto done_fields;
        }
    }
    const int64_t *t = (const int64_t *)ts.buf;
    uint32_t *o = (uint32_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t number[8];
        uint64_t v = (uint64_t)t[i];
        for (int k = 0; k < 8; k++)
            number[k] = (uint8_t)(v >> (8 * k));
        uint32_t c = crc_bytes(0xFFFFFFFFu, number, 8);
        for (Py_ssize_t f = 0; f < nf; f++)
            c = crc_bytes(c, base[f] + s[i] * width[f], width[f]);
        o[i] = c ^ 0xFFFFFFFFu;
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done_fields:
    while (got > 0)
        PyBuffer_Release(&fields[--got]);
done_ts:
    PyBuffer_Release(&ts);
done_slots:
    PyBuffer_Release(&slots);
done_out:
    PyBuffer_Release(&out);
done_seq:
    Py_DECREF(seq);
    return result;
}

/* ------------------------------------------------------------------ the vector add's step */
/* A plan (a bytes object made by fastadd.step_plan) is an array of int64:
 * [0] fields, [1] num_envs, [2] rows in the ring, [3] key, [4] ns area bytes, [5] ns area 0
 * address, [6] ns area 1 address, [7..9] the word indices of intent, seen and check (at
 * most NWORDS), then per field its row bytes and its first row's address. */
enum { P_FIELDS, P_ENVS, P_ROWS, P_KEY, P_NS_BYTES, P_NS0, P_NS1, P_INTENT, P_SEEN, P_CHECK, P_HEAD };
#define NWORDS 16

#define RELEASE_BYTES (1 << 16)

/* The commit's orders hold on any CPU with GCC or Clang (FORMAT.md, "Memory ordering");
 * other compilers get plain volatile stores and no fence, which, like the Python paths,
 * rely on x86-64 TSO. */
static void store_word(int64_t *w, int64_t v) {
#if defined(__GNUC__)
    __atomic_store_n(w, v, __ATOMIC_RELEASE);  /* the stores before it are seen first */
#else
    *(volatile int64_t *)w = v;
#endif
}

static void fence(void) {
#if defined(__GNUC__)
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* intent is stored before any row */
#endif
}

/* step(plan, words, seen, base, due, states, *fields, next_states) -> bool or None, for
 * the step of transitions (seen, t_end = seen + num_envs] of a ring whose oldest is after
 * `base`: False (nothing written) when it is the general path's (t_end past `due`, a
 * flush or its early work; slots across the ring end; `states` differing from the
 * previous step's next states, ns area (seen / num_envs) & 1: a jump); None (nothing
 * written) when an input is not a C-contiguous buffer; else True: it marks `t_end` in
 * flight, copies field k's rows to its rows [slot, slot + num_envs), the next states to
 * ns area (t_end / num_envs) & 1, and commits t_end. The caller checked every input's type,
 * shape and dtype; the byte counts are checked here again (a ValueError before anything
 * is written otherwise). */
static PyObject *step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 7)
        return PyErr_Format(PyExc_TypeError, "step takes at least 7 arguments, got %zd", nargs);
    if (!PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) < (Py_ssize_t)(P_HEAD * 8))
        return PyErr_Format(PyExc_TypeError, "step: the plan must be the bytes made by step_plan");
    const int64_t *plan = (const int64_t *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t nfields = (Py_ssize_t)plan[P_FIELDS];
    if (PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)((P_HEAD + 2 * nfields) * 8) || nargs != 5 + nfields + 1 ||
        nfields > MAX_FIELDS || nfields < 1 || plan[P_ENVS] < 1 || plan[P_ROWS] < 1 ||
        plan[P_INTENT] >= NWORDS || plan[P_SEEN] >= NWORDS || plan[P_CHECK] >= NWORDS ||
        plan[P_INTENT] < 0 || plan[P_SEEN] < 0 || plan[P_CHECK] < 0)
        return PyErr_Format(PyExc_TypeError, "step: the plan is for %zd fields, got %zd arguments", nfields, nargs);
    long long seen = PyLong_AsLongLong(args[2]);
    long long base = PyLong_AsLongLong(args[3]);
    long long due = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (base < 0 || seen < base)
        return PyErr_Format(PyExc_ValueError, "step: seen %lld before base %lld", seen, base);
    int64_t envs = plan[P_ENVS];
    long long t_end = seen + envs;
    Py_ssize_t slot = (Py_ssize_t)((seen - base) % plan[P_ROWS]);
    if (t_end > due || slot + envs > plan[P_ROWS])
        Py_RETURN_FALSE;
    long parity = (long)((seen / envs) & 1);
    Py_buffer words, in[MAX_FIELDS + 1];
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (get_buf(args[1], &words, PyBUF_WRITABLE, 0, "words") < 0)
        return NULL;
    if (words.len < NWORDS * 8) {
        PyErr_SetString(PyExc_ValueError, "step: words too short");
        goto done;
    }
    int64_t ns_bytes = plan[P_NS_BYTES];
    for (; got <= nfields; got++) {  /* the fields (states first), then the next states */
        if (get_buf(args[5 + got], &in[got], 0, 0, "input") < 0) {
            PyErr_Clear();  /* not C-contiguous (or no buffer): the caller copies it its own way */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        int64_t want = got < nfields ? plan[P_HEAD + 2 * got] * envs : ns_bytes;
        if (in[got].len != want) {
            PyErr_Format(PyExc_ValueError, "step: input %zd holds %zd bytes, expected %lld", got, in[got].len,
                         (long long)want);
            got++;
            goto done;
        }
    }
    const uint8_t *previous = (const uint8_t *)(intptr_t)plan[parity ? P_NS1 : P_NS0];
    int64_t *w = (int64_t *)words.buf;
    int same;
    /* Large steps (frames) copy without the GIL, as numpy's copies would: another thread's
     * Python runs meanwhile; the writer's mutex, held by the caller, keeps the store's. */
    PyThreadState *saved = ns_bytes >= RELEASE_BYTES ? PyEval_SaveThread() : NULL;
    same = memcmp(in[0].buf, previous, (size_t)ns_bytes) == 0;
    if (same) {
        store_word(&w[plan[P_INTENT]], t_end);
        fence();
        for (Py_ssize_t f = 0; f < nfields; f++) {
            int64_t row_bytes = plan[P_HEAD + 2 * f];
            uint8_t *dst = (uint8_t *)(intptr_t)plan[P_HEAD + 2 * f + 1] + slot * row_bytes;
            memcpy(dst, in[f].buf, (size_t)(row_bytes * envs));
        }
        memcpy((uint8_t *)(intptr_t)plan[((t_end / envs) & 1) ? P_NS1 : P_NS0], in[nfields].buf, (size_t)ns_bytes);
        store_word(&w[plan[P_SEEN]], t_end);
        store_word(&w[plan[P_CHECK]], t_end ^ plan[P_KEY]);
    }
    if (saved != NULL)
        PyEval_RestoreThread(saved);
    result = same ? Py_True : Py_False;  /* False: a jump, nothing written */
    Py_INCREF(result);
done:
    while (got > 0)
        PyBuffer_Release(&in[--got]);
    PyBuffer_Release(&words);
    return result;
}

static PyMethodDef methods[] = {
    {"crc_rows", crc_rows, METH_VARARGS,
     "crc_rows(out, slots, ts, fields, rows): out[i] = zlib.crc32 of ts[i] as 8 little-endian bytes,\n"
     "then row slots[i] of each field (a C-contiguous buffer of `rows` rows); out uint32, slots and ts int64."},
    {"crc_join", crc_join, METH_VARARGS,
     "crc_join(crc_a, crc_b, nbytes) -> the CRC-32 of a + b, where nbytes = len(b) (zlib's crc32_combine)."},
    {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
     "step(plan, words, seen, base, due, states, *fields, next_states) -> bool or None: the vector\n"
     "fast add's compare and commit (fastadd.py); False: the general path's step; None: an input\n"
     "is not C-contiguous."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", "The writer's per-row kernels: CRCs, joining CRCs, and a step.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) {
    init_tables();
    init_powers();
    return PyModule_Create(&module);
}
