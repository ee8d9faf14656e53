/* Optional compiled versions of the graph IR's two hottest walks (core/graph.py).
 *
 * encode(order, slot, base=0) -> (steps, next_slot, ext)
 * encode_key(order, slot, marks, base=0) -> ((flat, hash), next_slot, ext)
 * collect(roots, seen) -> seen
 * describe(ext, position) -> (ext_desc, leaves, const_groups, positions)
 * node1(prim, params, inputs, depth, shape, dtype, trace, bdims) -> impl
 * node(prim, params, inputs, depth, avals, trace, bdims) -> [impl, ...]
 * replay(plan_nodes, env, ext, trace, made) -> None
 * meta(inputs) -> (refs, depth, trace, batched)
 * trace_collect(roots, stop) -> [node, ...]
 * plan_scan(order, markers, trace, opaque) -> (env, flags) | None
 * plan_ext(ext, ext_index, var_desc, scalar_code) -> [desc, ...] | None
 * wrap(cls, impl) -> tensor
 * scalar_tensor(prim, params, x, lit, first, dtype) -> tensor
 * unary_tensor(prim, params, x, shape, dtype) -> tensor
 * pair_tensor(prim, params, a, b, shape, dtype) -> tensor | NotImplemented
 * mark_leaves(leaves, trace, prim, is_float) -> (tensors, nodes) | None
 * flat_key(key, marks) -> (flat, hash)
 *
 * Each is an exact equivalent of the pure-Python function of the same name in core/graph.py
 * (`_encode_py`, `_encode_key_py`, `_collect_py`, `_describe_py`; `node1` and `node` are core/build.py's `_node1_py`
 * and `_node_py`, `meta` is its `_meta_py`, `replay` is core/transforms/plan.py's
 * `_replay_nodes_py`, `plan_scan` and `plan_ext` its `_scan_py` and `_ext_descs_py`, `wrap`
 * core/tensor.py's `Tensor._wrap_py`, `scalar_tensor`, `unary_tensor` and `pair_tensor`
 * core/prims/elementwise/builders.py's `_scalar_tensor_py`, `_unary_tensor_py` and
 * `_pair_tensor_py`, and `trace_collect` and `mark_leaves` core/transforms/trace.py's
 * `_collect_py` and `_mark_leaves_py`, and `flat_key` core/graph.py's `_flat_key_py`), which stays
 * the reference: tests/core/test_graph_compiled.py
 * compares the two on random graphs, and CI runs the whole Python 3.12 suite on the pure-Python
 * versions (NABLAX_PURE_PYTHON=1). The extension is built by `pip install` when a C compiler is
 * present and is optional: without it, nablax runs the Python versions.
 *
 * Node and Literal are classes with __slots__; their fields are read straight from the slot
 * offsets that setup() finds in the classes' member descriptors (exact types only; any other
 * object goes through getattr).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* Bumped whenever a function's contract changes: core/graph.py uses the extension only when
 * its VERSION is the one it expects (a stale build in a source checkout is ignored). */
#define GRAPHC_VERSION 12

static PyTypeObject *Var_Type = NULL;
static PyTypeObject *Node_Type = NULL;
static PyTypeObject *Literal_Type = NULL;

enum {
    F_INPUTS,
    F_VALUES,
    F_OUTS,
    F_PRIM,
    F_PARAMS,
    F_BDIMS,
    F_DEPTH,
    F_SEQ,
    F_TRACE,
    F_AVALS,
    N_NODE_FIELDS
};
static const char *node_field_names[N_NODE_FIELDS] = {
    "inputs", "values", "outs", "prim", "params", "bdims", "depth", "seq", "trace", "avals"};

/* core/build.py's TensorImpl, and what node1 needs of the interpreter (setup_build) */
enum { I_SRC, I_VALUE, I_LIT, I_SHAPE, I_DTYPE, I_BATCH_SHAPE, I_SHARDING, N_IMPL_FIELDS };
static const char *impl_field_names[N_IMPL_FIELDS] = {"src",   "value",       "lit",     "shape",
                                                      "dtype", "batch_shape", "sharding"};
static Py_ssize_t impl_off[N_IMPL_FIELDS];
static PyTypeObject *Impl_Type = NULL;
static PyObject *next_seq = NULL;     /* graph._next_seq */
static PyObject *ctx = NULL;          /* context.CTX (a threading.local) */
static PyObject *note_pending = NULL; /* context.note_pending */
static PyObject *deep_cut = NULL;     /* build._deep_cut(impls, depth) */
static PyObject *str_pending = NULL;
static PyObject *empty_tuple = NULL;
static Py_ssize_t node_off[N_NODE_FIELDS];
static PyObject *node_field_str[N_NODE_FIELDS];
static Py_ssize_t literal_value_off = -1, literal_dtype_off = -1, literal_weak_off = -1;
static PyObject *str_value = NULL, *str_dtype = NULL, *str_weak = NULL, *str_shape = NULL;
static PyObject *str_position = NULL;
static PyObject *str_level = NULL;
static PyObject *flag_pairs[2][2]; /* (computed, marker) pairs of plan_scan */
static PyObject *impl_field_str[N_IMPL_FIELDS];

/* The offset of a __slots__ member `name` of `tp`, or -1 (then fields are read by getattr). */
static Py_ssize_t
member_offset(PyTypeObject *tp, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)tp, name);
    Py_ssize_t off = -1;
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READ_RESTRICTED)) {
            off = m->offset;
        }
    }
    Py_DECREF(d);
    return off;
}

/* A new reference to field `f` of node `o`. */
static inline PyObject *
node_get(PyObject *o, int f)
{
    if (Py_IS_TYPE(o, Node_Type) && node_off[f] >= 0) {
        PyObject *v = *(PyObject **)((char *)o + node_off[f]);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, node_field_str[f]);
}

static inline PyObject *
literal_get(PyObject *o, Py_ssize_t off, PyObject *name)
{
    if (Py_IS_TYPE(o, Literal_Type) && off >= 0) {
        PyObject *v = *(PyObject **)((char *)o + off);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, name);
}

static inline PyObject *
literal_value(PyObject *o)
{
    return literal_get(o, literal_value_off, str_value);
}

static inline int
is_scalar(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type || t == &PyComplex_Type;
}

static PyObject *
graphc_setup(PyObject *self, PyObject *args)
{
    PyObject *var, *node, *literal;
    if (!PyArg_ParseTuple(args, "O!O!O!:setup", &PyType_Type, &var, &PyType_Type, &node,
                          &PyType_Type, &literal)) {
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)var, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "setup: Var must be a tuple subclass");
        return NULL;
    }
    Py_INCREF(var);
    Py_INCREF(node);
    Py_INCREF(literal);
    Py_XSETREF(Var_Type, (PyTypeObject *)var);
    Py_XSETREF(Node_Type, (PyTypeObject *)node);
    Py_XSETREF(Literal_Type, (PyTypeObject *)literal);
    for (int f = 0; f < N_NODE_FIELDS; f++) {
        node_off[f] = member_offset(Node_Type, node_field_names[f]);
    }
    literal_value_off = member_offset(Literal_Type, "value");
    literal_dtype_off = member_offset(Literal_Type, "dtype");
    literal_weak_off = member_offset(Literal_Type, "weak");
    Py_RETURN_NONE;
}

static int
ready(void)
{
    if (Var_Type == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "nablax.core._graphc: setup(Var, Node, Literal) was not called");
        return 0;
    }
    return 1;
}

/* The value a Var names is pending: node.values is None or values[index] is None. Returns 1, 0,
 * or -1 on error. */
static int
is_pending(PyObject *m, PyObject *index)
{
    PyObject *vals = node_get(m, F_VALUES);
    int r;
    if (vals == NULL) {
        return -1;
    }
    if (vals == Py_None) {
        r = 1;
    }
    else if (PyList_CheckExact(vals) && PyLong_CheckExact(index)) {
        Py_ssize_t j = PyLong_AsSsize_t(index);
        Py_ssize_t n = PyList_GET_SIZE(vals);
        if (j == -1 && PyErr_Occurred()) {
            Py_DECREF(vals);
            return -1;
        }
        if (j < 0) {
            j += n;
        }
        if (j < 0 || j >= n) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            Py_DECREF(vals);
            return -1;
        }
        r = PyList_GET_ITEM(vals, j) == Py_None;
    }
    else {
        PyObject *v = PyObject_GetItem(vals, index);
        if (v == NULL) {
            Py_DECREF(vals);
            return -1;
        }
        r = v == Py_None;
        Py_DECREF(v);
    }
    Py_DECREF(vals);
    return r;
}

/* Whether a Var input names a pending value (realization's walk follows those): 1, 0, -1. */
static int
pending_var(PyObject *var)
{
    if (PyTuple_GET_SIZE(var) < 2) {
        PyErr_SetString(PyExc_IndexError, "tuple index out of range");
        return -1;
    }
    return is_pending(PyTuple_GET_ITEM(var, 0), PyTuple_GET_ITEM(var, 1));
}

/* Whether a Var input's producer belongs to a trace (the reverse pass's walk): 1, 0, -1. */
static int
traced_var(PyObject *var)
{
    PyObject *t = node_get(PyTuple_GET_ITEM(var, 0), F_TRACE);
    if (t == NULL) {
        return -1;
    }
    Py_DECREF(t); /* only compared with None */
    return t != Py_None;
}

/* Push onto `stack`, and add to `seen`, the producer of each Var among a node's `inputs` that
 * `seen` lacks and `want` accepts. `want_first`: ask `want` before looking in `seen` (the order
 * in which the Python walk reads them). Returns 0, or -1 on error. */
static int
push_producers(PyObject *inputs, PyObject *seen, PyObject *stack, int (*want)(PyObject *),
               int want_first)
{
    PyObject *fast = PySequence_Fast(inputs, "node inputs must be a sequence");
    if (fast == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    int bad = 0;
    for (Py_ssize_t k = 0; k < n && !bad; k++) {
        PyObject *inp = items[k];
        if (!Py_IS_TYPE(inp, Var_Type)) {
            continue;
        }
        if (PyTuple_GET_SIZE(inp) < 1) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            bad = 1;
            break;
        }
        PyObject *m = PyTuple_GET_ITEM(inp, 0);
        int ok = want_first ? want(inp) : 1;
        int has = ok <= 0 ? 0 : PyDict_Contains(seen, m);
        if (ok > 0 && has == 0 && !want_first) {
            ok = want(inp);
        }
        if (ok < 0 || has < 0) {
            bad = 1;
        }
        else if (ok && !has) {
            bad = PyDict_SetItem(seen, m, Py_None) < 0 || PyList_Append(stack, m) < 0;
        }
    }
    Py_DECREF(fast);
    return bad ? -1 : 0;
}

static PyObject *
graphc_collect(PyObject *self, PyObject *args)
{
    PyObject *roots, *seen, *stack = NULL, *it = NULL, *r;
    if (!PyArg_ParseTuple(args, "OO!:collect", &roots, &PyDict_Type, &seen) || !ready()) {
        return NULL;
    }
    stack = PyList_New(0);
    if (stack == NULL) {
        return NULL;
    }
    it = PyObject_GetIter(roots);
    if (it == NULL) {
        goto error;
    }
    while ((r = PyIter_Next(it)) != NULL) {
        int has = PyDict_Contains(seen, r);
        if (has == 0) {
            if (PyDict_SetItem(seen, r, Py_None) < 0 || PyList_Append(stack, r) < 0) {
                has = -1;
            }
        }
        Py_DECREF(r);
        if (has < 0) {
            goto error;
        }
    }
    Py_CLEAR(it);
    if (PyErr_Occurred()) {
        goto error;
    }
    while (PyList_GET_SIZE(stack) > 0) {
        Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
        PyObject *node = PyList_GET_ITEM(stack, top);
        PyObject *inputs;
        Py_INCREF(node);
        if (PyList_SetSlice(stack, top, top + 1, NULL) < 0) {
            Py_DECREF(node);
            goto error;
        }
        inputs = node_get(node, F_INPUTS);
        Py_DECREF(node);
        if (inputs == NULL) {
            goto error;
        }
        int bad = push_producers(inputs, seen, stack, pending_var, 0) < 0;
        Py_DECREF(inputs);
        if (bad) {
            goto error;
        }
    }
    Py_DECREF(stack);
    Py_INCREF(seen);
    return seen;
error:
    Py_XDECREF(it);
    Py_XDECREF(stack);
    return NULL;
}

/* Append (arr.shape, arr.dtype) to desc and arr to leaves; or, for an array already in leaves
 * (``first`` maps its address to its index there), that index to desc. */
static int
add_leaf(PyObject *arr, PyObject *desc, PyObject *leaves, PyObject *first)
{
    PyObject *addr = PyLong_FromVoidPtr(arr);
    if (addr == NULL) {
        return -1;
    }
    PyObject *k = PyDict_GetItemWithError(first, addr); /* borrowed */
    if (k != NULL || PyErr_Occurred()) {
        int r = k == NULL || PyList_Append(desc, k) < 0;
        Py_DECREF(addr);
        return r ? -1 : 0;
    }
    PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(leaves));
    int bad = index == NULL || PyDict_SetItem(first, addr, index) < 0;
    Py_XDECREF(index);
    Py_DECREF(addr);
    if (bad) {
        return -1;
    }
    PyObject *shape = PyObject_GetAttr(arr, str_shape);
    PyObject *dtype = shape == NULL ? NULL : PyObject_GetAttr(arr, str_dtype);
    PyObject *pair = dtype == NULL ? NULL : PyTuple_Pack(2, shape, dtype);
    int r = pair == NULL || PyList_Append(desc, pair) < 0 || PyList_Append(leaves, arr) < 0;
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(pair);
    return r ? -1 : 0;
}

static PyObject *
graphc_describe(PyObject *self, PyObject *args)
{
    PyObject *ext, *position, *fast, *desc = NULL, *leaves = NULL, *groups = NULL, *pos = NULL;
    PyObject *first = NULL; /* id(array) -> its index in leaves (graph._describe_py) */
    if (!PyArg_ParseTuple(args, "OO:describe", &ext, &position) || !ready()) {
        return NULL;
    }
    fast = PySequence_Fast(ext, "describe: ext must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    desc = PyList_New(0);
    leaves = PyList_New(0);
    groups = PyDict_New();
    pos = PyList_New(0);
    first = PyDict_New();
    if (desc == NULL || leaves == NULL || groups == NULL || pos == NULL || first == NULL) {
        goto error;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *inp = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *arr;
        if (Py_IS_TYPE(inp, Var_Type)) { /* computed by an earlier program: m.values[j] */
            if (PyTuple_GET_SIZE(inp) < 2) {
                PyErr_SetString(PyExc_IndexError, "tuple index out of range");
                goto error;
            }
            PyObject *vals = node_get(PyTuple_GET_ITEM(inp, 0), F_VALUES);
            if (vals == NULL) {
                goto error;
            }
            arr = PyObject_GetItem(vals, PyTuple_GET_ITEM(inp, 1));
            Py_DECREF(vals);
            if (arr == NULL) {
                goto error;
            }
        }
        else {
            arr = literal_value(inp);
            if (arr == NULL) {
                goto error;
            }
            if (is_scalar(arr)) {
                PyObject *weak = literal_get(inp, literal_weak_off, str_weak);
                int is_pos = weak == NULL ? -1 : PyObject_RichCompareBool(weak, position, Py_EQ);
                Py_XDECREF(weak);
                if (is_pos < 0) {
                    Py_DECREF(arr);
                    goto error;
                }
                if (is_pos) {
                    int bad = PyList_Append(desc, str_position) < 0 || PyList_Append(pos, arr) < 0;
                    Py_DECREF(arr);
                    if (bad) {
                        goto error;
                    }
                    continue;
                }
                PyObject *dt = literal_get(inp, literal_dtype_off, str_dtype);
                int bad = dt == NULL || PyList_Append(desc, dt) < 0;
                if (!bad) {
                    PyObject *group = PyDict_GetItemWithError(groups, dt); /* borrowed */
                    if (group != NULL) {
                        bad = PyList_Append(group, arr) < 0;
                    }
                    else if (PyErr_Occurred()) {
                        bad = 1;
                    }
                    else {
                        group = PyList_New(1);
                        if (group == NULL) {
                            bad = 1;
                        }
                        else {
                            Py_INCREF(arr);
                            PyList_SET_ITEM(group, 0, arr);
                            bad = PyDict_SetItem(groups, dt, group) < 0;
                            Py_DECREF(group);
                        }
                    }
                }
                Py_XDECREF(dt);
                Py_DECREF(arr);
                if (bad) {
                    goto error;
                }
                continue;
            }
        }
        int bad = add_leaf(arr, desc, leaves, first);
        Py_DECREF(arr);
        if (bad) {
            goto error;
        }
    }
    Py_DECREF(fast);
    Py_DECREF(first);
    return Py_BuildValue("(NNNN)", desc, leaves, groups, pos);
error:
    Py_DECREF(fast);
    Py_XDECREF(first);
    Py_XDECREF(desc);
    Py_XDECREF(leaves);
    Py_XDECREF(groups);
    Py_XDECREF(pos);
    return NULL;
}

static PyObject *
graphc_setup_build(PyObject *self, PyObject *args)
{
    PyObject *impl, *seq, *c, *note, *cut;
    if (!PyArg_ParseTuple(args, "O!OOOO:setup_build", &PyType_Type, &impl, &seq, &c, &note, &cut) ||
        !ready()) {
        return NULL;
    }
    for (int f = 0; f < N_IMPL_FIELDS; f++) {
        impl_off[f] = member_offset((PyTypeObject *)impl, impl_field_names[f]);
        if (impl_off[f] < 0) {
            PyErr_Format(PyExc_TypeError, "setup_build: %s has no __slots__ field %s",
                         ((PyTypeObject *)impl)->tp_name, impl_field_names[f]);
            return NULL;
        }
    }
    for (int f = 0; f < N_NODE_FIELDS; f++) {
        if (node_off[f] < 0) {
            PyErr_Format(PyExc_TypeError, "setup_build: Node has no __slots__ field %s",
                         node_field_names[f]);
            return NULL;
        }
    }
    Py_INCREF(impl);
    Py_INCREF(seq);
    Py_INCREF(c);
    Py_INCREF(note);
    Py_INCREF(cut);
    Py_XSETREF(Impl_Type, (PyTypeObject *)impl);
    Py_XSETREF(next_seq, seq);
    Py_XSETREF(ctx, c);
    Py_XSETREF(note_pending, note);
    Py_XSETREF(deep_cut, cut);
    Py_RETURN_NONE;
}

/* Store a new reference to v in the (empty) slot at byte offset off of o. */
static inline void
set_field(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)o + off);
    PyObject *old = *p;
    Py_INCREF(v);
    *p = v;
    Py_XDECREF(old);
}

/* Steals the reference to v. */
static inline void
put_field(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)o + off);
    PyObject *old = *p;
    *p = v;
    Py_XDECREF(old);
}

/* A new Node with every field set but `outs` (and `avals`, which the caller sets when traced),
 * numbered by graph._next_seq first, as the Python constructors do. */
static PyObject *
make_node(PyObject *prim, PyObject *params, PyObject *inputs, PyObject *depth_obj,
          PyObject *trace, PyObject *bdims)
{
    PyObject *seq = PyObject_CallNoArgs(next_seq);
    if (seq == NULL) {
        return NULL;
    }
    PyObject *node = Node_Type->tp_alloc(Node_Type, 0);
    if (node == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    set_field(node, node_off[F_PRIM], prim);
    set_field(node, node_off[F_PARAMS], params);
    set_field(node, node_off[F_INPUTS], inputs);
    set_field(node, node_off[F_VALUES], Py_None);
    set_field(node, node_off[F_DEPTH], depth_obj);
    put_field(node, node_off[F_SEQ], seq);
    set_field(node, node_off[F_TRACE], trace);
    set_field(node, node_off[F_BDIMS], bdims);
    return node;
}

/* The batch shape of a node's outputs: () without bdims, else bdims[1] (a new reference). */
static PyObject *
out_batch_shape(PyObject *bdims)
{
    if (bdims == Py_None) {
        Py_INCREF(empty_tuple);
        return empty_tuple;
    }
    return PySequence_GetItem(bdims, 1);
}

/* A new pending TensorImpl for output j of node (shape, dtype and batch_shape are borrowed). */
static PyObject *
make_impl(PyObject *node, Py_ssize_t j, PyObject *shape, PyObject *dtype, PyObject *batch_shape)
{
    PyObject *impl = Impl_Type->tp_alloc(Impl_Type, 0);
    PyObject *src = impl == NULL ? NULL : Var_Type->tp_alloc(Var_Type, 2); /* Var((node, j)) */
    PyObject *index = src == NULL ? NULL : PyLong_FromSsize_t(j);
    if (index == NULL) {
        Py_XDECREF(src);
        Py_XDECREF(impl);
        return NULL;
    }
    Py_INCREF(node);
    PyTuple_SET_ITEM(src, 0, node);
    PyTuple_SET_ITEM(src, 1, index);
    put_field(impl, impl_off[I_SRC], src);
    set_field(impl, impl_off[I_VALUE], Py_None);
    set_field(impl, impl_off[I_LIT], Py_None);
    set_field(impl, impl_off[I_SHARDING], Py_None);
    set_field(impl, impl_off[I_SHAPE], shape);
    set_field(impl, impl_off[I_DTYPE], dtype);
    set_field(impl, impl_off[I_BATCH_SHAPE], batch_shape);
    return impl;
}

/* The weak references of `outs` (a tuple) join this thread's pending list (note_pending's inlined
 * fast path while the list is short). Returns 0, or -1 on error. */
static int
join_pending(PyObject *outs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(outs);
    PyObject *pending = PyObject_GetAttr(ctx, str_pending);
    if (pending == NULL) {
        return -1;
    }
    int bad = 0;
    if (PyList_CheckExact(pending) && PyList_GET_SIZE(pending) + n < 4096) {
        for (Py_ssize_t j = 0; j < n && !bad; j++) {
            bad = PyList_Append(pending, PyTuple_GET_ITEM(outs, j)) < 0;
        }
    }
    else {
        for (Py_ssize_t j = 0; j < n && !bad; j++) {
            PyObject *r = PyObject_CallOneArg(note_pending, PyTuple_GET_ITEM(outs, j));
            bad = r == NULL;
            Py_XDECREF(r);
        }
    }
    Py_DECREF(pending);
    return bad ? -1 : 0;
}

/* build._deep_cut(impls, depth), called every 64 levels (it checks max_graph_depth). */
static int
check_depth(PyObject *impls, Py_ssize_t depth, PyObject *depth_obj)
{
    if (depth & 63) {
        return 0;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(deep_cut, impls, depth_obj, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static int
build_ready(void)
{
    if (Impl_Type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nablax.core._graphc: setup_build was not called");
        return 0;
    }
    return 1;
}

static PyObject *
graphc_node1(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "node1 takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!build_ready()) {
        return NULL;
    }
    PyObject *prim = args[0], *params = args[1], *inputs = args[2], *depth_obj = args[3];
    PyObject *shape = args[4], *dtype = args[5], *trace = args[6], *bdims = args[7];
    PyObject *batch_shape = NULL, *impl = NULL, *outs = NULL, *one = NULL;
    Py_ssize_t depth = PyLong_AsSsize_t(depth_obj);
    if (depth == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *node = make_node(prim, params, inputs, depth_obj, trace, bdims);
    if (node == NULL) {
        return NULL;
    }
    if (trace != Py_None) {
        PyObject *aval = PyTuple_Pack(2, shape, dtype);
        PyObject *avals = aval == NULL ? NULL : PyTuple_Pack(1, aval);
        Py_XDECREF(aval);
        if (avals == NULL) {
            goto error;
        }
        put_field(node, node_off[F_AVALS], avals);
    }
    batch_shape = out_batch_shape(bdims);
    impl = batch_shape == NULL ? NULL : make_impl(node, 0, shape, dtype, batch_shape);
    if (impl == NULL) {
        goto error;
    }
    outs = PyTuple_New(1);
    PyObject *wr = outs == NULL ? NULL : PyWeakref_NewRef(impl, NULL);
    if (wr == NULL) {
        goto error;
    }
    PyTuple_SET_ITEM(outs, 0, wr);
    Py_INCREF(outs);
    put_field(node, node_off[F_OUTS], outs);
    if (join_pending(outs) < 0) {
        goto error;
    }
    if (!(depth & 63)) {
        one = PyList_New(1);
        if (one == NULL) {
            goto error;
        }
        Py_INCREF(impl);
        PyList_SET_ITEM(one, 0, impl);
        if (check_depth(one, depth, depth_obj) < 0) {
            goto error;
        }
    }
    Py_XDECREF(one);
    Py_DECREF(outs);
    Py_DECREF(batch_shape);
    Py_DECREF(node);
    return impl;
error:
    Py_XDECREF(one);
    Py_XDECREF(outs);
    Py_XDECREF(impl);
    Py_XDECREF(batch_shape);
    Py_DECREF(node);
    return NULL;
}

/* (shape, dtype) of one output aval: new references, or -1 with ValueError as Python's unpacking
 * raises it. */
static int
unpack_aval(PyObject *aval, PyObject **shape, PyObject **dtype)
{
    PyObject *f = PySequence_Fast(aval, "cannot unpack non-iterable aval");
    if (f == NULL) {
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(f) != 2) {
        PyErr_Format(PyExc_ValueError, "an aval must be (shape, dtype): got %zd values",
                     PySequence_Fast_GET_SIZE(f));
        Py_DECREF(f);
        return -1;
    }
    *shape = PySequence_Fast_GET_ITEM(f, 0);
    *dtype = PySequence_Fast_GET_ITEM(f, 1);
    Py_INCREF(*shape);
    Py_INCREF(*dtype);
    Py_DECREF(f);
    return 0;
}

static PyObject *
graphc_node(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "node takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!build_ready()) {
        return NULL;
    }
    PyObject *prim = args[0], *params = args[1], *inputs = args[2], *depth_obj = args[3];
    PyObject *avals = args[4], *trace = args[5], *bdims = args[6];
    PyObject *fast = PySequence_Fast(avals, "node: avals must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n == 1) { /* almost every primitive: node1 */
        PyObject *shape, *dtype;
        if (unpack_aval(PySequence_Fast_GET_ITEM(fast, 0), &shape, &dtype) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
        Py_DECREF(fast);
        PyObject *a1[8] = {prim, params, inputs, depth_obj, shape, dtype, trace, bdims};
        PyObject *impl = graphc_node1(self, a1, 8);
        Py_DECREF(shape);
        Py_DECREF(dtype);
        if (impl == NULL) {
            return NULL;
        }
        PyObject *out = PyList_New(1);
        if (out == NULL) {
            Py_DECREF(impl);
            return NULL;
        }
        PyList_SET_ITEM(out, 0, impl);
        return out;
    }
    PyObject *node = NULL, *impls = NULL, *outs = NULL, *batch_shape = NULL;
    Py_ssize_t depth = PyLong_AsSsize_t(depth_obj);
    if (depth == -1 && PyErr_Occurred()) {
        goto error;
    }
    node = make_node(prim, params, inputs, depth_obj, trace, bdims);
    if (node == NULL) {
        goto error;
    }
    if (trace != Py_None) {
        PyObject *t = PySequence_Tuple(fast);
        if (t == NULL) {
            goto error;
        }
        put_field(node, node_off[F_AVALS], t);
    }
    batch_shape = out_batch_shape(bdims);
    if (batch_shape == NULL) {
        goto error;
    }
    impls = PyList_New(n);
    outs = PyTuple_New(n);
    if (impls == NULL || outs == NULL) {
        goto error;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *shape, *dtype;
        if (unpack_aval(PySequence_Fast_GET_ITEM(fast, j), &shape, &dtype) < 0) {
            goto error;
        }
        PyObject *impl = make_impl(node, j, shape, dtype, batch_shape);
        Py_DECREF(shape);
        Py_DECREF(dtype);
        if (impl == NULL) {
            goto error;
        }
        PyList_SET_ITEM(impls, j, impl);
        PyObject *wr = PyWeakref_NewRef(impl, NULL);
        if (wr == NULL) {
            goto error;
        }
        PyTuple_SET_ITEM(outs, j, wr);
    }
    Py_INCREF(outs);
    put_field(node, node_off[F_OUTS], outs);
    if (join_pending(outs) < 0 || check_depth(impls, depth, depth_obj) < 0) {
        goto error;
    }
    Py_DECREF(fast);
    Py_DECREF(node);
    Py_DECREF(outs);
    Py_DECREF(batch_shape);
    return impls;
error:
    Py_DECREF(fast);
    Py_XDECREF(node);
    Py_XDECREF(impls);
    Py_XDECREF(outs);
    Py_XDECREF(batch_shape);
    return NULL;
}

/* The node loop of a backward plan's replay (transforms/plan.py's _replay_nodes_py). */
static PyObject *
graphc_replay(PyObject *self, PyObject *args)
{
    PyObject *nodes, *env, *ext, *trace, *made, *fast;
    if (!PyArg_ParseTuple(args, "OO!O!OO!:replay", &nodes, &PyList_Type, &env, &PyList_Type, &ext,
                          &trace, &PyDict_Type, &made) ||
        !ready()) {
        return NULL;
    }
    fast = PySequence_Fast(nodes, "replay: plan nodes must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 8) {
            PyErr_SetString(PyExc_TypeError, "replay: a plan node is an 8-tuple");
            goto error;
        }
        PyObject *prim = PyTuple_GET_ITEM(rec, 0), *params = PyTuple_GET_ITEM(rec, 1);
        PyObject *codes = PyTuple_GET_ITEM(rec, 2), *base = PyTuple_GET_ITEM(rec, 3);
        PyObject *traced = PyTuple_GET_ITEM(rec, 4), *avals = PyTuple_GET_ITEM(rec, 5);
        PyObject *bdims = PyTuple_GET_ITEM(rec, 6), *keep = PyTuple_GET_ITEM(rec, 7);
        if (!PyTuple_CheckExact(codes) || !PyTuple_CheckExact(keep)) {
            PyErr_SetString(PyExc_TypeError, "replay: codes and keep must be tuples");
            goto error;
        }
        Py_ssize_t nc = PyTuple_GET_SIZE(codes);
        PyObject *refs = PyTuple_New(nc);
        if (refs == NULL) {
            goto error;
        }
        PyObject *depth = PyLong_FromLong(0); /* the deepest input node's depth, or 0 */
        if (depth == NULL) {
            Py_DECREF(refs);
            goto error;
        }
        for (Py_ssize_t k = 0; k < nc; k++) {
            Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(codes, k));
            if (c == -1 && PyErr_Occurred()) {
                Py_DECREF(refs);
                Py_XDECREF(depth);
                goto error;
            }
            PyObject *src = c >= 0 ? env : ext;
            Py_ssize_t at = c >= 0 ? c : ~c;
            if (at >= PyList_GET_SIZE(src)) {
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                Py_DECREF(refs);
                Py_XDECREF(depth);
                goto error;
            }
            PyObject *r = PyList_GET_ITEM(src, at);
            Py_INCREF(r);
            PyTuple_SET_ITEM(refs, k, r);
            if (Py_IS_TYPE(r, Var_Type)) {
                PyObject *d = node_get(PyTuple_GET_ITEM(r, 0), F_DEPTH);
                int deeper = d == NULL ? -1 : PyObject_RichCompareBool(d, depth, Py_GT);
                if (deeper < 0) {
                    Py_XDECREF(d);
                    Py_DECREF(refs);
                    Py_XDECREF(depth);
                    goto error;
                }
                if (deeper) {
                    Py_XSETREF(depth, d);
                }
                else {
                    Py_DECREF(d);
                }
            }
        }
        PyObject *one = PyLong_FromLong(1);
        PyObject *depth1 = one == NULL ? NULL : PyNumber_Add(depth, one);
        Py_XDECREF(one);
        Py_DECREF(depth);
        if (depth1 == NULL) {
            Py_DECREF(refs);
            goto error;
        }
        int is_traced = PyObject_IsTrue(traced);
        if (is_traced < 0) {
            Py_DECREF(refs);
            Py_DECREF(depth1);
            goto error;
        }
        PyObject *a[7] = {prim, params, refs, depth1, avals, is_traced ? trace : Py_None, bdims};
        PyObject *impls = graphc_node(self, a, 7);
        Py_DECREF(refs);
        Py_DECREF(depth1);
        if (impls == NULL) {
            goto error;
        }
        Py_ssize_t nout = PyList_GET_SIZE(impls);
        int bad = 0;
        for (Py_ssize_t j = 0; j < nout && !bad; j++) {
            /* impl.src: a fresh impl made by node(), so its slot is set */
            PyObject *src = *(PyObject **)((char *)PyList_GET_ITEM(impls, j) + impl_off[I_SRC]);
            bad = PyList_Append(env, src) < 0;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keep) && !bad; k++) {
            PyObject *jo = PyTuple_GET_ITEM(keep, k);
            Py_ssize_t j = PyLong_AsSsize_t(jo);
            if (j == -1 && PyErr_Occurred()) {
                bad = 1;
                break;
            }
            if (j < 0 || j >= nout) {
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                bad = 1;
                break;
            }
            PyObject *slot = PyNumber_Add(base, jo);
            bad = slot == NULL || PyDict_SetItem(made, slot, PyList_GET_ITEM(impls, j)) < 0;
            Py_XDECREF(slot);
        }
        Py_DECREF(impls);
        if (bad) {
            goto error;
        }
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
error:
    Py_DECREF(fast);
    return NULL;
}

/* A new reference to field `f` of TensorImpl `o`. */
static inline PyObject *
impl_get(PyObject *o, int f)
{
    if (Py_IS_TYPE(o, Impl_Type) && impl_off[f] >= 0) {
        PyObject *v = *(PyObject **)((char *)o + impl_off[f]);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, impl_field_str[f]);
}

/* `a.level > b.level` for two traces: 1, 0, or -1 on error. */
static int
deeper_level(PyObject *a, PyObject *b)
{
    PyObject *la = PyObject_GetAttr(a, str_level);
    PyObject *lb = la == NULL ? NULL : PyObject_GetAttr(b, str_level);
    int r = lb == NULL ? -1 : PyObject_RichCompareBool(la, lb, Py_GT);
    Py_XDECREF(la);
    Py_XDECREF(lb);
    return r;
}

/* build._meta_py: (refs, depth, trace, batched) of a node on `inputs`. */
static PyObject *
graphc_meta(PyObject *self, PyObject *inputs)
{
    if (!ready() || !build_ready()) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(inputs, "meta: inputs must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *refs = PyTuple_New(n);
    PyObject *depth = PyLong_FromLong(0); /* the deepest input node's depth, or 0 */
    PyObject *trace = Py_None;            /* the deepest trace among them */
    int batched = 0;
    Py_INCREF(trace);
    if (refs == NULL || depth == NULL) {
        goto error;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *i = items[k], *src;
        if (Py_IS_TYPE(i, Literal_Type)) {
            Py_INCREF(i);
            PyTuple_SET_ITEM(refs, k, i);
            continue;
        }
        if (Py_IS_TYPE(i, Var_Type)) {
            src = i;
            Py_INCREF(src);
        }
        else {
            PyObject *bs = impl_get(i, I_BATCH_SHAPE);
            int b = bs == NULL ? -1 : PyObject_IsTrue(bs);
            Py_XDECREF(bs);
            if (b < 0) {
                goto error;
            }
            batched |= b;
            src = impl_get(i, I_SRC);
            if (src == NULL) {
                goto error;
            }
            if (src == Py_None) {
                Py_DECREF(src);
                PyObject *lit = impl_get(i, I_LIT);
                if (lit == NULL) {
                    goto error;
                }
                PyTuple_SET_ITEM(refs, k, lit);
                continue;
            }
        }
        PyTuple_SET_ITEM(refs, k, src); /* steals */
        PyObject *node = PySequence_GetItem(src, 0);
        if (node == NULL) {
            goto error;
        }
        PyObject *d = node_get(node, F_DEPTH);
        int deeper = d == NULL ? -1 : PyObject_RichCompareBool(d, depth, Py_GT);
        if (deeper < 0) {
            Py_XDECREF(d);
            Py_DECREF(node);
            goto error;
        }
        if (deeper) {
            Py_SETREF(depth, d);
        }
        else {
            Py_DECREF(d);
        }
        PyObject *t = node_get(node, F_TRACE);
        Py_DECREF(node);
        if (t == NULL) {
            goto error;
        }
        if (t != Py_None && t != trace) {
            int take = trace == Py_None ? 1 : deeper_level(t, trace);
            if (take < 0) {
                Py_DECREF(t);
                goto error;
            }
            if (take) {
                Py_SETREF(trace, t);
                continue;
            }
        }
        Py_DECREF(t);
    }
    Py_DECREF(fast);
    PyObject *out = Py_BuildValue("(NNNO)", refs, depth, trace, batched ? Py_True : Py_False);
    return out;
error:
    Py_DECREF(fast);
    Py_XDECREF(refs);
    Py_XDECREF(depth);
    Py_XDECREF(trace);
    return NULL;
}

/* One entry of trace_collect's sort: a node's seq, its discovery index (ties keep discovery
 * order, as Python's stable sort does) and the node. */
typedef struct {
    long long seq;
    Py_ssize_t index;
    PyObject *node;
} seq_entry;

static int
seq_entry_cmp(const void *a, const void *b)
{
    const seq_entry *x = a, *y = b;
    if (x->seq != y->seq) {
        return x->seq < y->seq ? -1 : 1;
    }
    return x->index < y->index ? -1 : (x->index > y->index);
}

/* `nodes` (a list) sorted by `node.seq`, stably: in place. Returns 0, or -1 on error. */
static int
sort_by_seq(PyObject *nodes)
{
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    seq_entry *e = PyMem_New(seq_entry, n > 0 ? n : 1);
    int exact = 1;
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n && exact; k++) {
        PyObject *node = PyList_GET_ITEM(nodes, k);
        PyObject *seq = node_get(node, F_SEQ);
        if (seq == NULL) {
            PyMem_Free(e);
            return -1;
        }
        int overflow = 0;
        long long v = PyLong_CheckExact(seq) ? PyLong_AsLongLongAndOverflow(seq, &overflow) : 0;
        exact = PyLong_CheckExact(seq) && !overflow && !(v == -1 && PyErr_Occurred());
        Py_DECREF(seq);
        e[k].seq = v;
        e[k].index = k;
        e[k].node = node;
    }
    if (!exact) { /* not plain ints: sort (seq, discovery index, node) triples as Python does */
        PyMem_Free(e);
        PyErr_Clear();
        PyObject *triples = PyList_New(n);
        if (triples == NULL) {
            return -1;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *node = PyList_GET_ITEM(nodes, k);
            PyObject *seq = node_get(node, F_SEQ);
            PyObject *t = seq == NULL ? NULL : Py_BuildValue("(NnO)", seq, k, node);
            if (t == NULL) {
                Py_DECREF(triples);
                return -1;
            }
            PyList_SET_ITEM(triples, k, t);
        }
        if (PyList_Sort(triples) < 0) {
            Py_DECREF(triples);
            return -1;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *node = PyTuple_GET_ITEM(PyList_GET_ITEM(triples, k), 2);
            Py_INCREF(node);
            PyList_SetItem(nodes, k, node);
        }
        Py_DECREF(triples);
        return 0;
    }
    qsort(e, (size_t)n, sizeof(seq_entry), seq_entry_cmp);
    /* the list holds a reference to each node already: permute the borrowed pointers */
    for (Py_ssize_t k = 0; k < n; k++) {
        PyList_SET_ITEM(nodes, k, e[k].node);
    }
    PyMem_Free(e);
    return 0;
}

/* transforms/trace.py's _collect_py: the traced nodes behind `roots`, producers first; `stop`
 * nodes are included but not expanded. */
static PyObject *
graphc_trace_collect(PyObject *self, PyObject *args)
{
    PyObject *roots, *stop, *seen = NULL, *stack = NULL, *it = NULL, *r, *out = NULL;
    if (!PyArg_ParseTuple(args, "OO:trace_collect", &roots, &stop) || !ready()) {
        return NULL;
    }
    seen = PyDict_New();
    stack = PyList_New(0);
    it = seen == NULL || stack == NULL ? NULL : PyObject_GetIter(roots);
    if (it == NULL) {
        goto error;
    }
    while ((r = PyIter_Next(it)) != NULL) {
        PyObject *t = node_get(r, F_TRACE);
        int bad = t == NULL;
        if (!bad && t != Py_None) {
            int has = PyDict_Contains(seen, r);
            bad = has < 0 || (!has && PyDict_SetItem(seen, r, Py_None) < 0);
        }
        Py_XDECREF(t);
        Py_DECREF(r);
        if (bad) {
            goto error;
        }
    }
    Py_CLEAR(it);
    if (PyErr_Occurred()) {
        goto error;
    }
    Py_SETREF(stack, PyDict_Keys(seen));
    if (stack == NULL) {
        goto error;
    }
    while (PyList_GET_SIZE(stack) > 0) {
        Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
        PyObject *node = PyList_GET_ITEM(stack, top);
        Py_INCREF(node);
        if (PyList_SetSlice(stack, top, top + 1, NULL) < 0) {
            Py_DECREF(node);
            goto error;
        }
        int stopped = PySequence_Contains(stop, node);
        PyObject *inputs = stopped ? NULL : node_get(node, F_INPUTS);
        Py_DECREF(node);
        if (stopped < 0 || (!stopped && inputs == NULL)) {
            goto error;
        }
        if (stopped || inputs == Py_None) {
            Py_XDECREF(inputs);
            continue;
        }
        int bad = push_producers(inputs, seen, stack, traced_var, 1) < 0;
        Py_DECREF(inputs);
        if (bad) {
            goto error;
        }
    }
    out = PyDict_Keys(seen);
    if (out == NULL || sort_by_seq(out) < 0) {
        Py_CLEAR(out);
    }
error:
    Py_XDECREF(it);
    Py_XDECREF(stack);
    Py_XDECREF(seen);
    return out;
}

/* transforms/plan.py's _scan_py: (env, flags) of a forward graph, or None if unplannable. */
static PyObject *
graphc_plan_scan(PyObject *self, PyObject *args)
{
    PyObject *order, *markers, *trace, *opaque, *fast, *env = NULL, *flags = NULL;
    if (!PyArg_ParseTuple(args, "OOOO:plan_scan", &order, &markers, &trace, &opaque) || !ready()) {
        return NULL;
    }
    fast = PySequence_Fast(order, "plan_scan: order must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    env = PyList_New(0);
    flags = PyTuple_New(n);
    if (env == NULL || flags == NULL) {
        goto error;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *node = items[k];
        PyObject *t = node_get(node, F_TRACE);
        if (t == NULL) {
            goto error;
        }
        Py_DECREF(t); /* only its identity is used */
        if (t != trace) {
            goto unplannable;
        }
        PyObject *p = node_get(node, F_PARAMS);
        int nonempty = p == NULL ? -1 : PyObject_IsTrue(p);
        if (nonempty < 0) {
            Py_XDECREF(p);
            goto error;
        }
        if (nonempty) {
            PyObject *last = PySequence_GetItem(p, -1);
            if (last == NULL) {
                Py_DECREF(p);
                goto error;
            }
            int user_rule = (PyObject *)Py_TYPE(last) == opaque;
            Py_DECREF(last);
            if (user_rule) {
                Py_DECREF(p);
                goto unplannable;
            }
        }
        Py_DECREF(p);
        PyObject *outs = node_get(node, F_OUTS);
        Py_ssize_t nout = outs == NULL ? -1 : PyObject_Length(outs);
        Py_XDECREF(outs);
        if (nout < 0) {
            goto error;
        }
        for (Py_ssize_t j = 0; j < nout; j++) {
            PyObject *v = Var_Type->tp_alloc(Var_Type, 2); /* Var((node, j)) */
            PyObject *index = v == NULL ? NULL : PyLong_FromSsize_t(j);
            if (index == NULL) {
                Py_XDECREF(v);
                goto error;
            }
            Py_INCREF(node);
            PyTuple_SET_ITEM(v, 0, node);
            PyTuple_SET_ITEM(v, 1, index);
            int bad = PyList_Append(env, v) < 0;
            Py_DECREF(v);
            if (bad) {
                goto error;
            }
        }
        PyObject *vals = node_get(node, F_VALUES);
        if (vals == NULL) {
            goto error;
        }
        Py_DECREF(vals);
        int marker = PySequence_Contains(markers, node);
        if (marker < 0) {
            goto error;
        }
        PyObject *flag = flag_pairs[vals != Py_None][marker];
        Py_INCREF(flag);
        PyTuple_SET_ITEM(flags, k, flag);
    }
    Py_DECREF(fast);
    return Py_BuildValue("(NN)", env, flags);
unplannable:
    Py_DECREF(fast);
    Py_DECREF(env);
    Py_DECREF(flags);
    Py_RETURN_NONE;
error:
    Py_DECREF(fast);
    Py_XDECREF(env);
    Py_XDECREF(flags);
    return NULL;
}

/* transforms/plan.py's _ext_descs_py: the key's descriptor of each external value. */
static PyObject *
graphc_plan_ext(PyObject *self, PyObject *args)
{
    PyObject *ext, *ext_index, *var_desc, *scalar_code, *fast, *descs = NULL;
    if (!PyArg_ParseTuple(args, "OO!OO:plan_ext", &ext, &PyDict_Type, &ext_index, &var_desc,
                          &scalar_code) ||
        !ready()) {
        return NULL;
    }
    fast = PySequence_Fast(ext, "plan_ext: ext must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    descs = PyList_New(0);
    if (descs == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *inp = items[i], *d = NULL;
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL) {
            goto error;
        }
        if (Py_IS_TYPE(inp, Var_Type)) {
            d = PyObject_CallOneArg(var_desc, inp);
            if (d == Py_None) {
                Py_DECREF(d);
                Py_DECREF(index);
                Py_DECREF(fast);
                Py_DECREF(descs);
                Py_RETURN_NONE;
            }
            if (d == NULL || PyDict_SetItem(ext_index, inp, index) < 0) {
                Py_XDECREF(d);
                Py_DECREF(index);
                goto error;
            }
        }
        else {
            PyObject *v = literal_value(inp);
            if (v == NULL) {
                Py_DECREF(index);
                goto error;
            }
            if (is_scalar(v)) {
                PyObject *dt = literal_get(inp, literal_dtype_off, str_dtype);
                PyObject *weak = dt == NULL ? NULL : literal_get(inp, literal_weak_off, str_weak);
                PyObject *code = weak == NULL ? NULL : PyObject_CallOneArg(scalar_code, v);
                d = code == NULL ? NULL : Py_BuildValue("(sOOO)", "s", dt, weak, code);
                Py_XDECREF(dt);
                Py_XDECREF(weak);
                Py_XDECREF(code);
            }
            else {
                PyObject *id = PyLong_FromVoidPtr(v);
                int bad = id == NULL || PyDict_SetItem(ext_index, id, index) < 0;
                Py_XDECREF(id);
                PyObject *shape = bad ? NULL : PyObject_GetAttr(v, str_shape);
                PyObject *st = shape == NULL ? NULL : PySequence_Tuple(shape);
                PyObject *dt = st == NULL ? NULL : literal_get(inp, literal_dtype_off, str_dtype);
                d = dt == NULL ? NULL : Py_BuildValue("(sOO)", "a", st, dt);
                Py_XDECREF(shape);
                Py_XDECREF(st);
                Py_XDECREF(dt);
            }
            Py_DECREF(v);
            if (d == NULL) {
                Py_DECREF(index);
                goto error;
            }
        }
        Py_DECREF(index);
        int bad = PyList_Append(descs, d) < 0;
        Py_DECREF(d);
        if (bad) {
            goto error;
        }
    }
    Py_DECREF(fast);
    return descs;
error:
    Py_DECREF(fast);
    Py_XDECREF(descs);
    return NULL;
}

/* core/tensor.py's Tensor and the offset of its `_impl` slot (setup_tensor) */
static PyTypeObject *Tensor_Type = NULL;
static Py_ssize_t tensor_impl_off = -1;
static PyObject *str_impl = NULL, *str_new = NULL;

static PyObject *
graphc_setup_tensor(PyObject *self, PyObject *tensor)
{
    if (!PyType_Check(tensor)) {
        PyErr_SetString(PyExc_TypeError, "setup_tensor: Tensor must be a class");
        return NULL;
    }
    Py_ssize_t off = member_offset((PyTypeObject *)tensor, "_impl");
    if (off < 0) {
        PyErr_Format(PyExc_TypeError, "setup_tensor: %s has no __slots__ field _impl",
                     ((PyTypeObject *)tensor)->tp_name);
        return NULL;
    }
    Py_INCREF(tensor);
    Py_XSETREF(Tensor_Type, (PyTypeObject *)tensor);
    tensor_impl_off = off;
    Py_RETURN_NONE;
}

/* Tensor._wrap(impl) (a classmethod: called with the class): a new `cls` whose `_impl` is
 * impl, without __init__, as `object.__new__(cls)` then `t._impl = impl`. */
static PyObject *
graphc_wrap(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "_wrap takes 1 argument (%zd given)", nargs - 1);
        return NULL;
    }
    PyObject *cls = args[0], *impl = args[1], *t;
    if ((PyTypeObject *)cls == Tensor_Type && Tensor_Type != NULL) {
        t = Tensor_Type->tp_alloc(Tensor_Type, 0);
        if (t != NULL) {
            set_field(t, tensor_impl_off, impl);
        }
        return t;
    }
    t = PyObject_CallMethodOneArg((PyObject *)&PyBaseObject_Type, str_new, cls);
    if (t != NULL && PyObject_SetAttr(t, str_impl, impl) < 0) {
        Py_CLEAR(t);
    }
    return t;
}

/* ---- the element-wise builders' fast entries, returning the tensor ------------------------
 *
 * scalar_tensor, unary_tensor and pair_tensor are core/build.py's bind_scalar, bind_unary and
 * bind_pair followed by Tensor._wrap (core/prims/elementwise/builders.py's _scalar_tensor_py,
 * _unary_tensor_py and _pair_tensor_py): one call per element-wise op instead of three. */

/* The input reference of impl x (x.src, or x.lit for a leaf), its producer's depth (0 for a
 * leaf) and trace, as new references; 0, or -1 on error. */
static int
impl_input(PyObject *x, PyObject **ref, Py_ssize_t *depth, PyObject **trace)
{
    PyObject *src = impl_get(x, I_SRC);
    if (src == NULL) {
        return -1;
    }
    if (src == Py_None) {
        Py_DECREF(src);
        *ref = impl_get(x, I_LIT);
        *depth = 0;
        *trace = Py_NewRef(Py_None);
        return *ref == NULL ? -1 : 0;
    }
    PyObject *node = PySequence_GetItem(src, 0);
    PyObject *d = node == NULL ? NULL : node_get(node, F_DEPTH);
    Py_ssize_t dv = d == NULL ? -1 : PyLong_AsSsize_t(d);
    PyObject *t = dv == -1 && PyErr_Occurred() ? NULL : node_get(node, F_TRACE);
    Py_XDECREF(d);
    Py_XDECREF(node);
    if (t == NULL) {
        Py_DECREF(src);
        return -1;
    }
    *ref = src;
    *depth = dv;
    *trace = t;
    return 0;
}

/* A new Tensor of impl (stolen; NULL passes an error through) */
static PyObject *
tensor_of(PyObject *impl)
{
    if (impl == NULL) {
        return NULL;
    }
    PyObject *t = Tensor_Type->tp_alloc(Tensor_Type, 0);
    if (t != NULL) {
        set_field(t, tensor_impl_off, impl);
    }
    Py_DECREF(impl);
    return t;
}

static int
tensor_ready(void)
{
    if (Tensor_Type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nablax.core._graphc: setup_tensor was not called");
        return 0;
    }
    return build_ready();
}

/* node1(prim, params, inputs, depth + 1, shape, dtype, trace, bdims) as a Tensor; the
 * references passed (inputs, trace, bdims, shape) are released here (NULL: an error to pass) */
static PyObject *
tensor_node(PyObject *prim, PyObject *params, PyObject *inputs, Py_ssize_t depth, PyObject *shape,
            PyObject *dtype, PyObject *trace, PyObject *bdims)
{
    PyObject *depth_obj = PyLong_FromSsize_t(depth + 1);
    PyObject *impl = NULL;
    if (depth_obj != NULL && inputs != NULL && shape != NULL && trace != NULL && bdims != NULL) {
        PyObject *argv[8] = {prim, params, inputs, depth_obj, shape, dtype, trace, bdims};
        impl = graphc_node1(NULL, argv, 8);
    }
    Py_XDECREF(depth_obj);
    Py_XDECREF(inputs);
    Py_XDECREF(shape);
    Py_XDECREF(trace);
    Py_XDECREF(bdims);
    return tensor_of(impl);
}

/* scalar_tensor(prim, params, x, lit, first, dtype) -> Tensor */
static PyObject *
graphc_scalar_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "scalar_tensor takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!tensor_ready()) {
        return NULL;
    }
    PyObject *x = args[2], *lit = args[3], *ref, *trace;
    Py_ssize_t depth;
    int first = PyObject_IsTrue(args[4]);
    if (first < 0 || impl_input(x, &ref, &depth, &trace) < 0) {
        return NULL;
    }
    PyObject *b = impl_get(x, I_BATCH_SHAPE);
    int batched = b == NULL ? -1 : PyObject_IsTrue(b);
    PyObject *bdims = NULL;
    if (batched > 0) { /* ((0, len(b)) if first else (len(b), 0), b) */
        Py_ssize_t nb = PyObject_Length(b);
        bdims = nb < 0 ? NULL : Py_BuildValue("((nn)O)", first ? 0 : nb, first ? nb : 0, b);
    }
    else if (batched == 0) {
        bdims = Py_NewRef(Py_None);
    }
    Py_XDECREF(b);
    PyObject *inputs = first ? PyTuple_Pack(2, lit, ref) : PyTuple_Pack(2, ref, lit);
    Py_DECREF(ref);
    return tensor_node(args[0], args[1], inputs, depth, impl_get(x, I_SHAPE), args[5], trace,
                       bdims);
}

/* unary_tensor(prim, params, x, shape, dtype) -> Tensor */
static PyObject *
graphc_unary_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "unary_tensor takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!tensor_ready()) {
        return NULL;
    }
    PyObject *x = args[2], *ref, *trace;
    Py_ssize_t depth;
    if (impl_input(x, &ref, &depth, &trace) < 0) {
        return NULL;
    }
    PyObject *b = impl_get(x, I_BATCH_SHAPE);
    int batched = b == NULL ? -1 : PyObject_IsTrue(b);
    PyObject *bdims = NULL;
    if (batched > 0) { /* ((len(b),), b) */
        Py_ssize_t nb = PyObject_Length(b);
        bdims = nb < 0 ? NULL : Py_BuildValue("((n)O)", nb, b);
    }
    else if (batched == 0) {
        bdims = Py_NewRef(Py_None);
    }
    Py_XDECREF(b);
    PyObject *inputs = PyTuple_Pack(1, ref);
    Py_DECREF(ref);
    return tensor_node(args[0], args[1], inputs, depth, Py_NewRef(args[3]), args[4], trace, bdims);
}

/* Whether impl x is batched (x.batch_shape is non-empty): 1, 0, or -1 on error */
static int
impl_batched(PyObject *x)
{
    PyObject *b = impl_get(x, I_BATCH_SHAPE);
    int r = b == NULL ? -1 : PyObject_IsTrue(b);
    Py_XDECREF(b);
    return r;
}

/* pair_tensor(prim, params, a, b, shape, dtype) -> Tensor, or NotImplemented where bind_pair
 * needs Python (a batched input, or inputs of two different traces) */
static PyObject *
graphc_pair_tensor(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "pair_tensor takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!tensor_ready()) {
        return NULL;
    }
    int ba = impl_batched(args[2]);
    int bb = ba != 0 ? ba : impl_batched(args[3]);
    if (ba < 0 || bb < 0) {
        return NULL;
    }
    if (ba || bb) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *ra, *ta, *rb, *tb;
    Py_ssize_t da, db;
    if (impl_input(args[2], &ra, &da, &ta) < 0) {
        return NULL;
    }
    if (impl_input(args[3], &rb, &db, &tb) < 0) {
        Py_DECREF(ra);
        Py_DECREF(ta);
        return NULL;
    }
    if (ta != Py_None && tb != Py_None && ta != tb) {
        Py_DECREF(ra);
        Py_DECREF(ta);
        Py_DECREF(rb);
        Py_DECREF(tb);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *trace = ta != Py_None ? ta : tb;
    Py_INCREF(trace);
    Py_DECREF(ta);
    Py_DECREF(tb);
    PyObject *inputs = PyTuple_Pack(2, ra, rb);
    Py_DECREF(ra);
    Py_DECREF(rb);
    return tensor_node(args[0], args[1], inputs, da > db ? da : db, Py_NewRef(args[4]), args[5],
                       trace, Py_NewRef(Py_None));
}

/* transforms/trace.py's _mark_leaves_py: markers of computed float parameters, or None. */
static PyObject *
graphc_mark_leaves(PyObject *self, PyObject *args)
{
    PyObject *leaves, *trace, *prim, *is_float, *fast, *new = NULL, *nodes = NULL, *kept = NULL;
    PyObject *last_dtype = NULL; /* the last dtype is_float accepted (borrowed from its impl) */
    if (!PyArg_ParseTuple(args, "OOOO:mark_leaves", &leaves, &trace, &prim, &is_float) ||
        !ready() || !build_ready()) {
        return NULL;
    }
    if (Tensor_Type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "nablax.core._graphc: setup_tensor was not called");
        return NULL;
    }
    fast = PySequence_Fast(leaves, "mark_leaves: leaves must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    /* every leaf first: a computed, unbatched float Tensor, or the caller's general loop runs */
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *leaf = items[k];
        if (!Py_IS_TYPE(leaf, Tensor_Type)) {
            goto general;
        }
        PyObject *impl = *(PyObject **)((char *)leaf + tensor_impl_off);
        if (impl == NULL || !Py_IS_TYPE(impl, Impl_Type)) {
            goto general;
        }
#define IMPL_FIELD(i) (*(PyObject **)((char *)impl + impl_off[i]))
        PyObject *src = IMPL_FIELD(I_SRC), *bs = IMPL_FIELD(I_BATCH_SHAPE);
        PyObject *value = IMPL_FIELD(I_VALUE), *dtype = IMPL_FIELD(I_DTYPE);
        if (src != Py_None || value == NULL || value == Py_None || bs == NULL || dtype == NULL ||
            IMPL_FIELD(I_LIT) == NULL || IMPL_FIELD(I_SHAPE) == NULL ||
            IMPL_FIELD(I_SHARDING) == NULL) {
            goto general;
        }
        int batched = PyObject_IsTrue(bs);
        if (batched < 0) {
            goto error;
        }
        if (batched) {
            goto general;
        }
        if (dtype != last_dtype) {
            PyObject *r = PyObject_CallOneArg(is_float, dtype);
            int ok = r == NULL ? -1 : PyObject_IsTrue(r);
            Py_XDECREF(r);
            if (ok < 0) {
                goto error;
            }
            if (!ok) {
                goto general;
            }
            last_dtype = dtype;
        }
    }
    kept = PyObject_GetAttrString(trace, "kept");
    new = PyList_New(n);
    nodes = PyList_New(n);
    if (kept == NULL || new == NULL || nodes == NULL) {
        goto error;
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) {
        goto error;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *impl = *(PyObject **)((char *)items[k] + tensor_impl_off);
        PyObject *value = IMPL_FIELD(I_VALUE);
        PyObject *inputs = PyTuple_Pack(1, IMPL_FIELD(I_LIT));
        if (inputs == NULL) {
            Py_DECREF(one);
            goto error;
        }
        PyObject *a[8] = {prim, empty_tuple, inputs, one, IMPL_FIELD(I_SHAPE), IMPL_FIELD(I_DTYPE),
                          trace, Py_None};
        PyObject *out = graphc_node1(self, a, 8);
        Py_DECREF(inputs);
        if (out == NULL) {
            Py_DECREF(one);
            goto error;
        }
        /* a fresh impl of node1: its src slot is the Var (node, 0) */
        PyObject *node = PyTuple_GET_ITEM(*(PyObject **)((char *)out + impl_off[I_SRC]), 0);
        PyObject *vals = PyList_New(1);
        PyObject *wr = vals == NULL ? NULL : PyWeakref_NewRef(node, NULL);
        if (wr == NULL) {
            Py_XDECREF(vals);
            Py_DECREF(out);
            Py_DECREF(one);
            goto error;
        }
        Py_INCREF(value);
        PyList_SET_ITEM(vals, 0, value);
        put_field(node, node_off[F_VALUES], vals);
        set_field(out, impl_off[I_VALUE], value);
        set_field(out, impl_off[I_LIT], IMPL_FIELD(I_LIT));
        set_field(out, impl_off[I_SHARDING], IMPL_FIELD(I_SHARDING));
        int bad = PyList_Append(kept, wr) < 0;
        Py_DECREF(wr);
        PyObject *t = bad ? NULL : Tensor_Type->tp_alloc(Tensor_Type, 0);
        if (t == NULL) {
            Py_DECREF(out);
            Py_DECREF(one);
            goto error;
        }
        put_field(t, tensor_impl_off, out); /* steals out */
        PyList_SET_ITEM(new, k, t);
        Py_INCREF(node);
        PyList_SET_ITEM(nodes, k, node);
    }
#undef IMPL_FIELD
    Py_DECREF(one);
    Py_DECREF(kept);
    Py_DECREF(fast);
    return Py_BuildValue("(NN)", new, nodes);
general:
    Py_DECREF(fast);
    Py_RETURN_NONE;
error:
    Py_DECREF(fast);
    Py_XDECREF(kept);
    Py_XDECREF(new);
    Py_XDECREF(nodes);
    return NULL;
}

/* ---- flat_key: a nested structure key as one flat tuple ----------------------------------
 *
 * graph._flat_key_py: every exact tuple of length n becomes marks[n] followed by its items
 * (marks[m] then n when n >= m = len(marks) - 1), recursively; any other object is kept as it
 * is. Equal keys give equal flat keys and unequal keys unequal ones (the encoding is
 * self-delimiting and each mark equals only itself), so the flat key can stand for the nested
 * one in a cache. Comparing two flat keys reads one contiguous array instead of chasing every
 * nested tuple of a stored key (which, stored long ago, misses the processor's caches). Exact
 * ints in [-FK_INTS, FK_INTS) are replaced by one shared object per value: equal ints are then
 * identical and compare without being read. Returns (flat, hash): the hash mixes the items'
 * hashes (a mark's index for a mark) as CPython's tuple hash does, in the same pass; equal keys
 * have equal hashes as long as their items' hashes agree with their equality (Python's rule). */
#define FK_INTS 32768
static PyObject *fk_ints[2 * FK_INTS];

#if SIZEOF_PY_UHASH_T > 4
#define FK_P1 11400714785074694791ULL
#define FK_P2 14029467366897019727ULL
#define FK_P5 2870177450012600261ULL
#define FK_ROT(x) ((x << 31) | (x >> 33))
#else
#define FK_P1 2654435761UL
#define FK_P2 2246822519UL
#define FK_P5 374761393UL
#define FK_ROT(x) ((x << 13) | (x >> 19))
#endif

typedef struct {
    PyObject **items; /* the flat key so far (owned references), grown as needed */
    Py_ssize_t cap;
    Py_ssize_t i;
    PyObject **marks;
    Py_ssize_t m; /* tuples of length >= m: marks[m] then the length */
    Py_uhash_t acc;
} fk_state;

static int
fk_reserve(fk_state *st)
{
    if (st->i < st->cap) {
        return 0;
    }
    Py_ssize_t cap = st->cap < 64 ? 64 : 2 * st->cap;
    PyObject **p = PyMem_Realloc(st->items, (size_t)cap * sizeof(PyObject *));
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    st->items = p;
    st->cap = cap;
    return 0;
}

static void
fk_clear(fk_state *st)
{
    for (Py_ssize_t k = 0; k < st->i; k++) {
        Py_DECREF(st->items[k]);
    }
    PyMem_Free(st->items);
    st->items = NULL;
    st->i = st->cap = 0;
}

/* (flat, hash) of what st holds, which it gives up (st is empty afterwards) */
static PyObject *
fk_finish(fk_state *st)
{
    PyObject *flat = PyTuple_New(st->i);
    if (flat == NULL) {
        fk_clear(st);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < st->i; k++) {
        PyTuple_SET_ITEM(flat, k, st->items[k]);
    }
    Py_uhash_t acc = st->acc + ((Py_uhash_t)st->i ^ (FK_P5 ^ 3527539UL));
    if (acc == (Py_uhash_t)-1) {
        acc = 1546275796;
    }
    PyMem_Free(st->items);
    st->items = NULL;
    st->i = st->cap = 0;
    return Py_BuildValue("(Nn)", flat, (Py_hash_t)acc);
}

/* The lane of the hash of a mark: FK_MARK_LANE + its index in marks */
#define FK_MARK_LANE 1000003

static inline void
fk_mix(fk_state *st, Py_uhash_t lane)
{
    st->acc += lane * FK_P2;
    st->acc = FK_ROT(st->acc);
    st->acc *= FK_P1;
}

/* x (a new reference) as the next item of the flat key, its hash mixed in (an exact int is
 * made the shared object of its value) */
static int
fk_put(fk_state *st, PyObject *x)
{
    if (x == NULL) {
        return -1;
    }
    Py_uhash_t lane = 0;
    int shared = 0; /* a small exact int: its lane is its value, no hash call */
    if (PyLong_CheckExact(x)) {
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(x, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(x);
            return -1;
        }
        if (!overflow && v >= -FK_INTS && v < FK_INTS) {
            PyObject **slot = &fk_ints[v + FK_INTS];
            if (*slot == NULL) {
                *slot = Py_NewRef(x); /* kept for the process: one object per value */
            }
            Py_SETREF(x, Py_NewRef(*slot));
            lane = (Py_uhash_t)(v == -1 ? -2 : v); /* hash(v) */
            shared = 1;
        }
    }
    if (!shared) {
        Py_hash_t h = PyObject_Hash(x);
        if (h == -1) {
            Py_DECREF(x);
            return -1;
        }
        lane = (Py_uhash_t)h;
    }
    if (fk_reserve(st) < 0) {
        Py_DECREF(x);
        return -1;
    }
    st->items[st->i++] = x;
    fk_mix(st, lane);
    return 0;
}

/* The shared object of int v for v in [-FK_INTS, FK_INTS), else a new int: a new reference */
static PyObject *
fk_int(Py_ssize_t v)
{
    if (v < -FK_INTS || v >= FK_INTS) {
        return PyLong_FromSsize_t(v);
    }
    PyObject **slot = &fk_ints[v + FK_INTS];
    if (*slot == NULL) {
        *slot = PyLong_FromSsize_t(v); /* kept for the process: one object per value */
        if (*slot == NULL) {
            return NULL;
        }
    }
    return Py_NewRef(*slot);
}

static inline int
fk_mark(fk_state *st, Py_ssize_t k)
{
    if (fk_reserve(st) < 0) {
        return -1;
    }
    st->items[st->i++] = Py_NewRef(st->marks[k]);
    fk_mix(st, (Py_uhash_t)(FK_MARK_LANE + k));
    return 0;
}

/* The head of a tuple of length len: its mark (then len, past the marks) */
static int
fk_head(fk_state *st, Py_ssize_t len)
{
    if (len < st->m) {
        return fk_mark(st, len);
    }
    if (fk_mark(st, st->m) < 0) {
        return -1;
    }
    return fk_put(st, PyLong_FromSsize_t(len));
}

static int
fk_fill(fk_state *st, PyObject *x)
{
    if (!PyTuple_CheckExact(x)) {
        return fk_put(st, Py_NewRef(x));
    }
    Py_ssize_t len = PyTuple_GET_SIZE(x);
    if (fk_head(st, len) < 0 || Py_EnterRecursiveCall(" in flat_key")) {
        return -1;
    }
    for (Py_ssize_t k = 0; k < len; k++) {
        if (fk_fill(st, PyTuple_GET_ITEM(x, k)) < 0) {
            Py_LeaveRecursiveCall();
            return -1;
        }
    }
    Py_LeaveRecursiveCall();
    return 0;
}

static int
fk_start(fk_state *st, PyObject *marks)
{
    Py_ssize_t m = PyTuple_GET_SIZE(marks) - 1;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "flat_key: marks must not be empty");
        return -1;
    }
    fk_state init = {NULL, 0, 0, &PyTuple_GET_ITEM(marks, 0), m, FK_P5};
    *st = init;
    return 0;
}

/* An int as the next item, without a hash call in the shared range */
static int
fk_put_ssize(fk_state *st, Py_ssize_t v)
{
    if (v < -FK_INTS || v >= FK_INTS) {
        return fk_put(st, PyLong_FromSsize_t(v));
    }
    PyObject *x = fk_int(v);
    if (x == NULL) {
        return -1;
    }
    if (fk_reserve(st) < 0) {
        Py_DECREF(x);
        return -1;
    }
    st->items[st->i++] = x;
    fk_mix(st, (Py_uhash_t)(v == -1 ? -2 : v)); /* hash(v) */
    return 0;
}

static PyObject *
graphc_flat_key(PyObject *self, PyObject *args)
{
    PyObject *key, *marks;
    fk_state st;
    if (!PyArg_ParseTuple(args, "OO!:flat_key", &key, &PyTuple_Type, &marks) ||
        fk_start(&st, marks) < 0) {
        return NULL;
    }
    if (fk_fill(&st, key) < 0) {
        fk_clear(&st);
        return NULL;
    }
    return fk_finish(&st);
}

/* ---- encode and encode_key ----------------------------------------------------------------
 *
 * graph._encode_py numbers the values of nodes for a program and writes each node as a step
 * (prim, params, codes, first slot, output count, batch dims); encode_key writes the same steps
 * straight into the flat key of tuple(steps) (graph._encode_key_py), without making the step
 * tuples: a realization that hits the program cache never needs them. */

/* The code of input `inp` (encode's rules), in *code; 0, or -1 on error. */
static int
encode_input(PyObject *inp, PyObject *slot, PyObject *ext, PyObject *ext_index, Py_ssize_t *code)
{
    PyObject *key;
    if (Py_IS_TYPE(inp, Var_Type)) {
        if (PyTuple_GET_SIZE(inp) < 2) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return -1;
        }
        PyObject *b = PyDict_GetItemWithError(slot, PyTuple_GET_ITEM(inp, 0)); /* borrowed */
        if (b != NULL) {
            Py_ssize_t bv = PyLong_AsSsize_t(b);
            if (bv == -1 && PyErr_Occurred()) {
                return -1;
            }
            Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(inp, 1));
            if (j == -1 && PyErr_Occurred()) {
                return -1;
            }
            *code = bv + j;
            return 0;
        }
        if (PyErr_Occurred()) {
            return -1;
        }
        key = Py_NewRef(inp);
    }
    else {
        PyObject *v = literal_value(inp);
        if (v == NULL) {
            return -1;
        }
        if (is_scalar(v)) { /* one entry per occurrence */
            Py_DECREF(v);
            *code = ~PyList_GET_SIZE(ext);
            return PyList_Append(ext, inp);
        }
        key = PyLong_FromVoidPtr(v); /* id(v) */
        Py_DECREF(v);
        if (key == NULL) {
            return -1;
        }
    }
    PyObject *idx = PyDict_GetItemWithError(ext_index, key); /* borrowed */
    Py_ssize_t e;
    int bad;
    if (idx == NULL) {
        e = PyList_GET_SIZE(ext);
        idx = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(e);
        bad = idx == NULL || PyDict_SetItem(ext_index, key, idx) < 0 ||
              PyList_Append(ext, inp) < 0;
        Py_XDECREF(idx);
    }
    else {
        e = PyLong_AsSsize_t(idx);
        bad = e == -1 && PyErr_Occurred();
    }
    Py_DECREF(key);
    *code = ~e;
    return bad ? -1 : 0;
}

/* `bd and bd[0]` of a node's bdims: a new reference, or NULL on error */
static PyObject *
step_bdims(PyObject *node)
{
    PyObject *bd = node_get(node, F_BDIMS);
    if (bd == NULL) {
        return NULL;
    }
    int truth = PyObject_IsTrue(bd);
    PyObject *bd0 = truth > 0 ? PySequence_GetItem(bd, 0) : truth == 0 ? Py_NewRef(bd) : NULL;
    Py_DECREF(bd);
    return bd0;
}

/* One node's step: appended to `steps` (a list), or, when steps is NULL, written to the flat
 * key `st`. slot[node] gets the node's first slot `base`; returns its output count, or -1 on
 * error. */
static Py_ssize_t
encode_node(PyObject *node, PyObject *slot, Py_ssize_t base, PyObject *ext, PyObject *ext_index,
            PyObject *steps, fk_state *st)
{
    PyObject *inputs_fast = NULL, *codes = NULL, *b = NULL, *n_obj = NULL, *bd0 = NULL;
    PyObject *prim = node_get(node, F_PRIM);
    PyObject *params = prim == NULL ? NULL : node_get(node, F_PARAMS);
    PyObject *inputs = params == NULL ? NULL : node_get(node, F_INPUTS);
    Py_ssize_t nout = -1;
    if (inputs == NULL) {
        goto done;
    }
    inputs_fast = PySequence_Fast(inputs, "encode: a node's inputs are not iterable");
    Py_DECREF(inputs);
    if (inputs_fast == NULL) {
        goto done;
    }
    Py_ssize_t n_in = PySequence_Fast_GET_SIZE(inputs_fast);
    PyObject **items = PySequence_Fast_ITEMS(inputs_fast);
    if (steps != NULL) {
        codes = PyTuple_New(n_in);
        if (codes == NULL) {
            goto done;
        }
    }
    else if (fk_mark(st, 6) < 0 || fk_fill(st, prim) < 0 || fk_fill(st, params) < 0 ||
             fk_head(st, n_in) < 0) {
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_in; k++) {
        Py_ssize_t code;
        if (encode_input(items[k], slot, ext, ext_index, &code) < 0) {
            goto done;
        }
        if (steps == NULL) {
            if (fk_put_ssize(st, code) < 0) {
                goto done;
            }
            continue;
        }
        PyObject *c = fk_int(code);
        if (c == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(codes, k, c);
    }
    b = fk_int(base);
    if (b == NULL || PyDict_SetItem(slot, node, b) < 0) {
        goto done;
    }
    PyObject *outs = node_get(node, F_OUTS);
    Py_ssize_t n = outs == NULL ? -1 : PyObject_Length(outs);
    Py_XDECREF(outs);
    bd0 = n < 0 ? NULL : step_bdims(node);
    if (bd0 == NULL) {
        goto done;
    }
    if (steps == NULL) {
        if (fk_put_ssize(st, base) < 0 || fk_put_ssize(st, n) < 0 || fk_fill(st, bd0) < 0) {
            goto done;
        }
    }
    else {
        n_obj = fk_int(n);
        PyObject *step =
            n_obj == NULL ? NULL : PyTuple_Pack(6, prim, params, codes, b, n_obj, bd0);
        int bad = step == NULL || PyList_Append(steps, step) < 0;
        Py_XDECREF(step);
        if (bad) {
            goto done;
        }
    }
    nout = n;
done:
    Py_XDECREF(prim);
    Py_XDECREF(params);
    Py_XDECREF(inputs_fast);
    Py_XDECREF(codes);
    Py_XDECREF(b);
    Py_XDECREF(n_obj);
    Py_XDECREF(bd0);
    return nout;
}

/* encode (st == NULL: the steps) or encode_key (the flat key of tuple(steps), as (flat, hash)):
 * (steps or key, next slot, ext) */
static PyObject *
encode_walk(PyObject *order, PyObject *slot, Py_ssize_t base, fk_state *st)
{
    PyObject *steps = NULL, *ext = NULL, *ext_index = NULL, *out;
    PyObject *fast = PySequence_Fast(order, "encode: order must be a sequence of nodes");
    if (fast == NULL) {
        if (st != NULL) {
            fk_clear(st);
        }
        return NULL;
    }
    Py_ssize_t n_nodes = PySequence_Fast_GET_SIZE(fast);
    steps = st == NULL ? PyList_New(0) : NULL;
    ext = PyList_New(0);
    ext_index = PyDict_New(); /* Var, or id(array) -> index in ext */
    if ((st == NULL && steps == NULL) || ext == NULL || ext_index == NULL) {
        goto error;
    }
    if (st != NULL && fk_head(st, n_nodes) < 0) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < n_nodes; i++) {
        Py_ssize_t nout = encode_node(PySequence_Fast_GET_ITEM(fast, i), slot, base, ext,
                                      ext_index, steps, st);
        if (nout < 0) {
            goto error;
        }
        base += nout;
    }
    out = st == NULL ? steps : fk_finish(st);
    steps = NULL;
    if (out != NULL) {
        Py_DECREF(fast);
        Py_DECREF(ext_index);
        return Py_BuildValue("(NnN)", out, base, ext);
    }
error:
    Py_DECREF(fast);
    Py_XDECREF(steps);
    Py_XDECREF(ext);
    Py_XDECREF(ext_index);
    if (st != NULL) {
        fk_clear(st);
    }
    return NULL;
}

static PyObject *
graphc_encode(PyObject *self, PyObject *args)
{
    PyObject *order, *slot;
    Py_ssize_t base = 0;
    if (!PyArg_ParseTuple(args, "OO!|n:encode", &order, &PyDict_Type, &slot, &base) || !ready()) {
        return NULL;
    }
    return encode_walk(order, slot, base, NULL);
}

static PyObject *
graphc_encode_key(PyObject *self, PyObject *args)
{
    PyObject *order, *slot, *marks;
    Py_ssize_t base = 0;
    fk_state st;
    if (!PyArg_ParseTuple(args, "OO!O!|n:encode_key", &order, &PyDict_Type, &slot, &PyTuple_Type,
                          &marks, &base) ||
        !ready() || fk_start(&st, marks) < 0) {
        return NULL;
    }
    return encode_walk(order, slot, base, &st);
}

static PyMethodDef graphc_methods[] = {
    {"setup", graphc_setup, METH_VARARGS,
     "setup(Var, Node, Literal): the graph IR's classes (core/graph.py calls it once)."},
    {"encode", graphc_encode, METH_VARARGS,
     "encode(order, slot, base=0) -> (steps, next_slot, ext): graph.encode, compiled."},
    {"encode_key", graphc_encode_key, METH_VARARGS,
     "encode_key(order, slot, marks, base=0) -> ((flat, hash), next_slot, ext): the flat key of "
     "encode's tuple(steps), without the steps."},
    {"collect", graphc_collect, METH_VARARGS,
     "collect(roots, seen) -> seen: the pending nodes behind roots, added to seen."},
    {"setup_build", graphc_setup_build, METH_VARARGS,
     "setup_build(TensorImpl, next_seq, CTX, note_pending, deep_cut): core/build.py's pieces."},
    {"node1", (PyCFunction)(void (*)(void))graphc_node1, METH_FASTCALL,
     "node1(prim, params, inputs, depth, shape, dtype, trace, bdims) -> impl: build._node1."},
    {"node", (PyCFunction)(void (*)(void))graphc_node, METH_FASTCALL,
     "node(prim, params, inputs, depth, avals, trace, bdims) -> [impl, ...]: build._node."},
    {"replay", graphc_replay, METH_VARARGS,
     "replay(plan_nodes, env, ext, trace, made): a backward plan's nodes, rebuilt."},
    {"plan_scan", graphc_plan_scan, METH_VARARGS,
     "plan_scan(order, markers, trace, opaque) -> (env, flags) or None: plan._scan, compiled."},
    {"plan_ext", graphc_plan_ext, METH_VARARGS,
     "plan_ext(ext, ext_index, var_desc, scalar_code) -> descs or None: plan._ext_descs."},
    {"setup_tensor", graphc_setup_tensor, METH_O,
     "setup_tensor(Tensor): core/tensor.py's class, for wrap."},
    {"wrap", (PyCFunction)(void (*)(void))graphc_wrap, METH_FASTCALL,
     "wrap(cls, impl) -> tensor: Tensor._wrap (a classmethod), compiled."},
    {"scalar_tensor", (PyCFunction)(void (*)(void))graphc_scalar_tensor, METH_FASTCALL,
     "scalar_tensor(prim, params, x, lit, first, dtype) -> Tensor: Tensor._wrap(bind_scalar(...))."},
    {"unary_tensor", (PyCFunction)(void (*)(void))graphc_unary_tensor, METH_FASTCALL,
     "unary_tensor(prim, params, x, shape, dtype) -> Tensor: Tensor._wrap(bind_unary(...))."},
    {"pair_tensor", (PyCFunction)(void (*)(void))graphc_pair_tensor, METH_FASTCALL,
     "pair_tensor(prim, params, a, b, shape, dtype) -> Tensor, or NotImplemented where "
     "bind_pair needs Python: Tensor._wrap(bind_pair(...))."},
    {"mark_leaves", graphc_mark_leaves, METH_VARARGS,
     "mark_leaves(leaves, trace, prim, is_float) -> (tensors, nodes) or None: trace."
     "_mark_leaves."},
    {"meta", graphc_meta, METH_O,
     "meta(inputs) -> (refs, depth, trace, batched): build._meta, compiled."},
    {"trace_collect", graphc_trace_collect, METH_VARARGS,
     "trace_collect(roots, stop) -> [node, ...]: transforms/trace.py's collect, compiled."},
    {"flat_key", graphc_flat_key, METH_VARARGS,
     "flat_key(key, marks) -> (flat, hash): graph._flat_key_py, compiled."},
    {"describe", graphc_describe, METH_VARARGS,
     "describe(ext, position) -> (ext_desc, leaves, const_groups, positions)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef graphc_module = {
    PyModuleDef_HEAD_INIT, "_graphc", "Compiled walks of nablax's graph IR (optional).", -1,
    graphc_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__graphc(void)
{
    PyObject *m = PyModule_Create(&graphc_module);
    if (m == NULL) {
        return NULL;
    }
    for (int f = 0; f < N_NODE_FIELDS; f++) {
        node_off[f] = -1;
        node_field_str[f] = PyUnicode_InternFromString(node_field_names[f]);
        if (node_field_str[f] == NULL) {
            Py_DECREF(m);
            return NULL;
        }
    }
    str_value = PyUnicode_InternFromString("value");
    str_dtype = PyUnicode_InternFromString("dtype");
    str_weak = PyUnicode_InternFromString("weak");
    str_shape = PyUnicode_InternFromString("shape");
    str_position = PyUnicode_InternFromString("position");
    str_pending = PyUnicode_InternFromString("pending");
    str_level = PyUnicode_InternFromString("level");
    str_impl = PyUnicode_InternFromString("_impl");
    str_new = PyUnicode_InternFromString("__new__");
    if (str_impl == NULL || str_new == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    for (int a = 0; a < 2; a++) {
        for (int b = 0; b < 2; b++) {
            flag_pairs[a][b] = PyTuple_Pack(2, a ? Py_True : Py_False, b ? Py_True : Py_False);
            if (flag_pairs[a][b] == NULL) {
                Py_DECREF(m);
                return NULL;
            }
        }
    }
    empty_tuple = PyTuple_New(0);
    for (int f = 0; f < N_IMPL_FIELDS; f++) {
        impl_off[f] = -1;
        impl_field_str[f] = PyUnicode_InternFromString(impl_field_names[f]);
        if (impl_field_str[f] == NULL) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (str_pending == NULL || str_level == NULL || empty_tuple == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    if (str_value == NULL || str_dtype == NULL || str_weak == NULL || str_shape == NULL ||
        str_position == NULL || PyModule_AddIntConstant(m, "VERSION", GRAPHC_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
