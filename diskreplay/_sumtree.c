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

/* update(sums, mins, leaf_idxs int64, values float64): set each leaf (the last of a
 * duplicated index wins, as the calls run in order) and repair its path to the root. */
static PyObject *update(PyObject *self, PyObject *args) {
    PyObject *o_sums, *o_mins, *o_idx, *o_val;
    if (!PyArg_ParseTuple(args, "OOOO", &o_sums, &o_mins, &o_idx, &o_val))
        return NULL;
    Py_buffer bs, bm, bi, bv;
    if (get_buf(o_sums, &bs, 1, 8, "sums") < 0) return NULL;
    if (get_buf(o_mins, &bm, 1, 8, "mins") < 0) { PyBuffer_Release(&bs); return NULL; }
    if (get_buf(o_idx, &bi, 0, 8, "idxs") < 0) { PyBuffer_Release(&bs); PyBuffer_Release(&bm); return NULL; }
    if (get_buf(o_val, &bv, 0, 8, "values") < 0) {
        PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t nodes = bs.len / 8, n = bi.len / 8;
    Py_ssize_t cap = nodes / 2;
    if (bm.len != bs.len || bv.len != bi.len || cap < 1 || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "update: trees of 2*cap entries (cap a power of two), one value per index");
        goto done;
    }
    double *sums = bs.buf, *mins = bm.buf;
    const int64_t *idx = bi.buf;
    const double *val = bv.buf;
    for (Py_ssize_t k = 0; k < n; k++)
        if (idx[k] < 0 || idx[k] >= cap) {
            PyErr_Format(PyExc_IndexError, "update: leaf %lld outside [0, %zd)", (long long)idx[k], cap);
            goto done;
        }
    Py_ssize_t *nodes_at = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    if (nodes_at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Level by level, so the loads of different paths are independent and overlap in
     * memory; a node shared by several paths is recomputed once per path, always from
     * children already final, so the result is the same as path by path. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t node = cap + (Py_ssize_t)idx[k];
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
    Py_INCREF(Py_None); result = Py_None;
done:
    PyBuffer_Release(&bs); PyBuffer_Release(&bm); PyBuffer_Release(&bi); PyBuffer_Release(&bv);
    return result;
}

/* find(sums, masses float64, out int64): for each mass u in [0, total) the leaf i with
 * prefix(i) <= u < prefix(i + 1); a leaf of priority 0 is never returned (ties of
 * rounding at the top end go to the last leaf with a positive sum on the path). */
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
    const double *sums = bs.buf, *u = bu.buf;
    int64_t *out = bo.buf;
    double *mass = PyMem_Malloc((n ? n : 1) * sizeof(double));
    if (mass == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* All masses descend one level at a time (out[k] holds each one's node meanwhile):
     * the loads of different masses are independent, so their cache misses overlap. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        mass[k] = u[k];
        out[k] = 1;
    }
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
    Py_END_ALLOW_THREADS
    PyMem_Free(mass);
    Py_INCREF(Py_None); result = Py_None;
done:
    PyBuffer_Release(&bs); PyBuffer_Release(&bu); PyBuffer_Release(&bo);
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
    {"update", update, METH_VARARGS, "update(sums, mins, idxs, values): set leaves, repair their paths"},
    {"find", find, METH_VARARGS, "find(sums, masses, out): the leaf holding each prefix mass"},
    {"build", build, METH_VARARGS, "build(sums, mins): every inner node from the leaves"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sumtree", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sumtree(void) { return PyModule_Create(&module); }
