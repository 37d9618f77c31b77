/* Sum and min trees for prioritized sampling, the per-call loops of sumtree.py in C.
 *
 * Layout (shared with the numpy fallback): a complete binary tree in one float64 array of
 * 2 * cap entries, cap a power of two; node 1 is the root, node k has children 2k and
 * 2k + 1, leaf i is node cap + i. The min tree holds the smallest *positive* leaf below
 * each node (+inf where there is none): importance weights need the least probability a
 * slot that can be drawn has. Every node is recomputed from its two children, never
 * adjusted by a difference, so a tree rebuilt from the leaves equals one updated step by
 * step, bit for bit.
 * The trees live in memory only (rebuilt from the per-slot priorities at open), so these
 * functions never touch a file and need no error path beyond argument checks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static int get_buf(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->itemsize != itemsize || view->len % itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Set leaf idx[k] to val[k] for every k, in order (the last of a duplicated index wins),
 * and repair the paths to the root; with a copy, also copy[idx[k]] = val[k] and
 * dirty[idx[k] / block] = 3 first. Indices were checked. Level by level, so the loads of
 * different paths are independent and overlap in memory; a node shared by several paths
 * is recomputed once per path, always from children already final, so the result is the
 * same as path by path. Returns -1 (MemoryError set) when the scratch cannot be had. */
static int set_leaves(double *sums, double *mins, Py_ssize_t cap, const int64_t *idx, const double *val,
                      Py_ssize_t n, double *copy, uint8_t *dirty, Py_ssize_t block) {
    Py_ssize_t *nodes_at = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    if (nodes_at == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t node = cap + (Py_ssize_t)idx[k];
        if (copy != NULL) {
            dirty[idx[k] / block] = 3;
            copy[idx[k]] = val[k];
        }
        sums[node] = val[k];
        mins[node] = val[k] > 0.0 ? val[k] : INFINITY;
        nodes_at[k] = node >> 1;
    }
    for (Py_ssize_t level = cap >> 1; level >= 1; level >>= 1) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t node = nodes_at[k];
            double l = mins[2 * node], r = mins[2 * node + 1];
            sums[node] = sums[2 * node] + sums[2 * node + 1];
            mins[node] = l < r ? l : r;
            nodes_at[k] = node >> 1;
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(nodes_at);
    return 0;
}

/* update(sums, mins, leaf_idxs int64, values float64[, copy float64, dirty uint8, block]):
 * set each leaf and repair its path to the root (set_leaves); with the last three, also
 * store each value into ``copy`` (a store's live priorities) and mark its block of
 * ``block`` slots in ``dirty``, in the same call, so Ctrl-C never parts the two. Every
 * argument is checked before anything is written. */
static PyObject *update(PyObject *self, PyObject *args) {
    PyObject *o_sums, *o_mins, *o_idx, *o_val, *o_copy = NULL, *o_dirty = NULL;
    Py_ssize_t block = 1;
    if (!PyArg_ParseTuple(args, "OOOO|OOn", &o_sums, &o_mins, &o_idx, &o_val, &o_copy, &o_dirty, &block))
        return NULL;
    if ((o_copy == NULL) != (o_dirty == NULL) || block < 1) {
        PyErr_SetString(PyExc_TypeError, "update: pass copy, dirty and block (>= 1) together");
        return NULL;
    }
    Py_buffer bs, bm, bi, bv, bc = {0}, bd = {0};
    if (get_buf(o_sums, &bs, 1, 8, "sums") < 0) return NULL;
    if (get_buf(o_mins, &bm, 1, 8, "mins") < 0) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_idx, &bi, 0, 8, "idxs") < 0) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL; }
    if (get_buf(o_val, &bv, 0, 8, "values") < 0) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); return NULL;
    }
    PyObject *result = NULL;
    int have_copy = 0, have_dirty = 0;
    if (o_copy != NULL) {
        if (get_buf(o_copy, &bc, 1, 8, "copy") < 0) goto done;
        have_copy = 1;
        if (get_buf(o_dirty, &bd, 1, 1, "dirty") < 0) goto done;
        have_dirty = 1;
    }
    Py_ssize_t nodes = bs.len / 8, n = bi.len / 8;
    Py_ssize_t cap = nodes / 2;
    if (bm.len != bs.len || bv.len != bi.len || cap < 1 || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "update: trees of 2*cap entries (cap a power of two), one value per index");
        goto done;
    }
    const int64_t *idx = bi.buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (idx[k] < 0 || idx[k] >= cap) {
            PyErr_Format(PyExc_IndexError, "update: leaf %lld outside [0, %zd)", (long long)idx[k], cap);
            goto done;
        }
        if (have_copy && (idx[k] >= bc.len / 8 || idx[k] / block >= bd.len)) {
            PyErr_Format(PyExc_IndexError, "update: slot %lld outside the copy or its dirty map", (long long)idx[k]);
            goto done;
        }
    }
    if (set_leaves(bs.buf, bm.buf, cap, idx, bv.buf, n, have_copy ? bc.buf : NULL,
                   have_copy ? bd.buf : NULL, block) < 0)
        goto done;
    Py_INCREF(Py_None); result = Py_None;
done:
    if (have_copy) PyBuffer_Release(&bc);
    if (have_dirty) PyBuffer_Release(&bd);
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); PyBuffer_Release(&bv);
    return result;
}

/* For each mass[k] in [0, total) the leaf with prefix(i) <= mass < prefix(i + 1) into
 * out[k]; a leaf of priority 0 is never returned (ties of rounding at the top end go to the
 * last leaf with a positive sum on the path). ``mass`` is consumed. All masses descend one
 * level at a time (out[k] holds each one's node meanwhile): the loads of different masses
 * are independent, so their cache misses overlap. */
static void descend(const double *sums, Py_ssize_t cap, double *mass, int64_t *out, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++)
        out[k] = 1;
    for (Py_ssize_t width = 1; width < cap; width <<= 1) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t node = (Py_ssize_t)out[k];
            double left = sums[2 * node];
            /* go right when the mass is past the left subtree, or the left one is empty */
            if ((mass[k] >= left && sums[2 * node + 1] > 0.0) || !(left > 0.0)) {
                mass[k] -= left;
                out[k] = 2 * node + 1;
            } else {
                out[k] = 2 * node;
            }
        }
    }
    for (Py_ssize_t k = 0; k < n; k++)
        out[k] -= cap;
}

/* find(sums, masses float64, out int64): the leaf holding each prefix mass (descend). */
static PyObject *find(PyObject *self, PyObject *args) {
    PyObject *o_sums, *o_u, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_sums, &o_u, &o_out))
        return NULL;
    Py_buffer bs, bu, bo;
    if (get_buf(o_sums, &bs, 0, 8, "sums") < 0) return NULL;
    if (get_buf(o_u, &bu, 0, 8, "masses") < 0) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_out, &bo, 1, 8, "out") < 0) { PyBuffer_Release(&bs); PyBuffer_Release(&bu); return NULL; }
    PyObject *result = NULL;
    Py_ssize_t cap = bs.len / 16, n = bu.len / 8;
    if (bo.len != bu.len || cap < 1 || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "find: a tree of 2*cap entries (cap a power of two), one output per mass");
        goto done;
    }
    double *mass = PyMem_Malloc((n ? n : 1) * sizeof(double));
    if (mass == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    memcpy(mass, bu.buf, n * sizeof(double));
    descend(bs.buf, cap, mass, bo.buf, n);
    Py_END_ALLOW_THREADS
    PyMem_Free(mass);
    Py_INCREF(Py_None); result = Py_None;
done:
    PyBuffer_Release(&bs); PyBuffer_Release(&bu); PyBuffer_Release(&bo);
    return result;
}

/* draw(sums, mins, uniforms float64, out int64, weights float32, last, beta): a prioritized
 * batch in one call. The masses are uniforms[k] * total (as numpy would multiply them);
 * with last >= 0 the final index is replaced by it (CER); weights[k] is
 * (p / min positive p) ** -beta of each drawn leaf, rounded to float32. */
static PyObject *draw(PyObject *self, PyObject *args) {
    PyObject *o_sums, *o_mins, *o_u, *o_out, *o_w;
    long long last;
    double beta;
    if (!PyArg_ParseTuple(args, "OOOOOLd", &o_sums, &o_mins, &o_u, &o_out, &o_w, &last, &beta))
        return NULL;
    Py_buffer bs, bm, bu, bo, bw;
    if (get_buf(o_sums, &bs, 0, 8, "sums") < 0) return NULL;
    if (get_buf(o_mins, &bm, 0, 8, "mins") < 0) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_u, &bu, 0, 8, "uniforms") < 0) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL; }
    if (get_buf(o_out, &bo, 1, 8, "out") < 0) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bu); return NULL;
    }
    if (get_buf(o_w, &bw, 1, 4, "weights") < 0) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bu); PyBuffer_Release(&bo); return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t cap = bs.len / 16, n = bu.len / 8;
    if (bm.len != bs.len || bo.len != bu.len || bw.len * 2 != bu.len || cap < 1 || (cap & (cap - 1))
        || last >= cap) {
        PyErr_SetString(PyExc_ValueError, "draw: trees of 2*cap entries (cap a power of two), one index and "
                                          "one weight per uniform, last < cap");
        goto done;
    }
    double *mass = PyMem_Malloc((n ? n : 1) * sizeof(double));
    if (mass == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const double *sums = bs.buf, *u = bu.buf;
    int64_t *out = bo.buf;
    float *w = bw.buf;
    Py_BEGIN_ALLOW_THREADS
    double total = sums[1], least = ((const double *)bm.buf)[1];
    for (Py_ssize_t k = 0; k < n; k++)
        mass[k] = u[k] * total;
    descend(sums, cap, mass, out, n);
    if (last >= 0 && n > 0)
        out[n - 1] = last;
    for (Py_ssize_t k = 0; k < n; k++)
        w[k] = (float)pow(sums[cap + out[k]] / least, -beta);
    Py_END_ALLOW_THREADS
    PyMem_Free(mass);
    Py_INCREF(Py_None); result = Py_None;
done:
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bu); PyBuffer_Release(&bo); PyBuffer_Release(&bw);
    return result;
}

/* build(sums, mins): the min leaves and every inner node from the sum leaves (open,
 * after a bulk load). */
static PyObject *build(PyObject *self, PyObject *args) {
    PyObject *o_sums, *o_mins;
    if (!PyArg_ParseTuple(args, "OO", &o_sums, &o_mins))
        return NULL;
    Py_buffer bs, bm;
    if (get_buf(o_sums, &bs, 1, 8, "sums") < 0) return NULL;
    if (get_buf(o_mins, &bm, 1, 8, "mins") < 0) { PyBuffer_Release(&bs); return NULL; }
    PyObject *result = NULL;
    Py_ssize_t cap = bs.len / 16;
    if (bm.len != bs.len || cap < 1 || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "build: trees of 2*cap entries, cap a power of two");
        goto done;
    }
    double *sums = bs.buf, *mins = bm.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t node = cap; node < 2 * cap; node++)
        mins[node] = sums[node] > 0.0 ? sums[node] : INFINITY;
    for (Py_ssize_t node = cap - 1; node >= 1; node--) {
        double l = mins[2 * node], r = mins[2 * node + 1];
        sums[node] = sums[2 * node] + sums[2 * node + 1];
        mins[node] = l < r ? l : r;
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None); result = Py_None;
done:
    PyBuffer_Release(&bs); PyBuffer_Release(&bm);
    return result;
}

static PyMethodDef methods[] = {
    {"update", update, METH_VARARGS,
     "update(sums, mins, idxs, values[, copy, dirty, block]): set leaves (and a copy), repair their paths"},
    {"draw", draw, METH_VARARGS, "draw(sums, mins, uniforms, out, weights, last, beta): a prioritized batch"},
    {"find", find, METH_VARARGS, "find(sums, masses, out): the leaf holding each prefix mass"},
    {"build", build, METH_VARARGS, "build(sums, mins): every inner node from the leaves"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sumtree", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sumtree(void) { return PyModule_Create(&module); }
