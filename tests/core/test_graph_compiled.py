"""The optional compiled graph walks (core/_graphc.c) against their pure-Python references
(core/graph.py's ``_encode_py``, ``_collect_py``, ``_describe_py``, ``_flat_key_py``; core/build.py's
``_node1_py``, ``_node_py``, ``_meta_py``; transforms/trace.py's ``_collect_py``; transforms/
plan.py's ``_replay_nodes_py``).

Both versions are run here whichever one nablax uses (``NABLAX_PURE_PYTHON=1`` picks the Python
ones; CI runs its Python 3.12 suite that way): on random graphs built node by node (multi-output
nodes, computed values, external ``Var``s, arrays shared between inputs, scalars of every Python
type, index positions, batched nodes, pre-numbered slots) and on graphs of real programs
(``grad``, ``vmap``, indexing), the results must be identical, object for object, and so must the
errors. The extension is built by ``pip install`` where a C compiler is present; where it is not,
the comparisons skip (and on CI, which has a compiler, that is a failure)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import types
import weakref
from fractions import Fraction

import numpy as np
import pytest

import nablax as nx
import nablax.core
from nablax.core import graph
from nablax.core.graph import POSITION, Literal, Node, Var, new_var

try:
    from nablax.core import _graphc  # type: ignore[attr-defined]
except ImportError:  # no C compiler at install time: only the Python versions exist
    _graphc = None
else:
    _graphc.setup(Var, Node, Literal)

needs_c = pytest.mark.skipif(_graphc is None, reason="nablax.core._graphc was not built")


def test_ci_builds_the_extension():
    """CI has a compiler, so the compiled versions must be there and be tested."""
    if not os.environ.get("CI"):
        pytest.skip("only CI promises a C compiler")
    assert _graphc is not None, "CI installed nablax without building nablax.core._graphc"
    assert _graphc.VERSION == graph._COMPILED_VERSION


def test_the_environment_variable_selects_the_pure_python_walks():
    code = (
        "from nablax.core import graph, realize\n"
        "assert not graph.COMPILED\n"
        "assert graph.encode is graph._encode_py and graph.collect is graph._collect_py\n"
        "assert realize._collect is graph._collect_py and realize.encode is graph._encode_py\n"
        "assert realize.describe is graph._describe_py\n"
        "from nablax.core import build\n"
        "from nablax.core.transforms import trace, plan\n"
        "assert build._meta is build._meta_py and build._node1 is build._node1_py\n"
        "assert trace.collect is trace._collect_py\n"
        "assert plan._replay_nodes is plan._replay_nodes_py and plan._scan is plan._scan_py\n"
        "assert plan._ext_descs is plan._ext_descs_py\n"
        "assert plan._make_key is plan._caches.HashedTuple\n"
        "from nablax.core.tensor import Tensor\n"
        "assert Tensor.__dict__['_wrap'] is Tensor.__dict__['_wrap_py']\n"
        "assert trace._mark_leaves is trace._mark_leaves_py\n"
        "from nablax.core.prims.elementwise import builders as b\n"
        "assert b.scalar_tensor is b._scalar_tensor_py and b.pair_tensor is b._pair_tensor_py\n"
        "assert b.unary_tensor is b._unary_tensor_py\n"
        "import nablax as nx\n"
        "x = nx.arange(6.0).reshape(2, 3)\n"
        "assert (x * 2 + 1).sum().item() == 36.0\n"
    )
    env = {**os.environ, "NABLAX_PURE_PYTHON": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_stale_build_is_ignored_with_a_warning(monkeypatch):
    """An extension of another VERSION (left from an older checkout) is not used."""
    fake = types.ModuleType("nablax.core._graphc")
    fake.VERSION = graph._COMPILED_VERSION + 1
    fake.__file__ = "/somewhere/_graphc.so"
    monkeypatch.delenv("NABLAX_PURE_PYTHON", raising=False)
    monkeypatch.setitem(sys.modules, "nablax.core._graphc", fake)
    monkeypatch.setattr(nablax.core, "_graphc", fake, raising=False)
    with pytest.warns(RuntimeWarning, match=r"version .*pip install -e \."):
        assert graph._load_compiled() is None


def test_the_module_uses_the_compiled_walks_when_built():
    if os.environ.get("NABLAX_PURE_PYTHON", "") not in ("", "0") or _graphc is None:
        assert not graph.COMPILED
        assert graph.encode is graph._encode_py
    else:
        assert graph.COMPILED
        assert graph.encode is _graphc.encode and graph.collect is _graphc.collect
        assert graph.describe is _graphc.describe
        from nablax.core import build
        from nablax.core.transforms import plan, trace

        assert build._meta is _graphc.meta and build._node1 is _graphc.node1
        assert trace.collect is _graphc.trace_collect
        assert plan._replay_nodes is _graphc.replay and plan._scan is _graphc.plan_scan
        assert plan._ext_descs is _graphc.plan_ext
        from nablax.core.tensor import Tensor

        assert Tensor.__dict__["_wrap"].__func__ is _graphc.wrap
        assert trace._mark_leaves is _graphc.mark_leaves
        from nablax.core.prims.elementwise import builders

        assert builders.scalar_tensor is _graphc.scalar_tensor
        assert builders.unary_tensor is _graphc.unary_tensor
        assert builders.pair_tensor is _graphc.pair_tensor


# --- random graphs -------------------------------------------------------------------------


class _Prim:
    def __init__(self, name):
        self.name = name


class _Impl:
    """A stand-in for a node's output tensor (weakly referenced by ``node.outs``)."""

    def __init__(self):
        self.value = None


_PRIMS = [_Prim(f"p{i}") for i in range(5)]


def _node(rng, inputs, nout, bdims, keep):
    n = object.__new__(Node)
    n.prim = rng.choice(_PRIMS)
    n.params = rng.choice([(), (1,), ("axis", (0, 1)), (np.float32,)])
    n.inputs = tuple(inputs)
    n.values = None
    impls = [_Impl() for _ in range(nout)]
    keep.extend(impls)
    n.outs = tuple(weakref.ref(i) for i in impls)
    n.depth = 1
    n.seq = 0
    n.trace = None
    n.bdims = bdims
    return n


def _random_graph(seed, n_nodes=60):
    """Nodes in creation order (inputs before consumers), some computed, and what they read."""
    rng = random.Random(seed)
    keep: list = []  # the output stand-ins, alive for the test
    arrays = [np.full((rng.randint(1, 3),), i, np.float32) for i in range(4)]
    outside = [_node(rng, (), rng.randint(1, 3), None, keep) for _ in range(3)]
    for m in outside:  # computed earlier: their Vars are external values
        m.values = [np.float32(i) for i in range(len(m.outs))]
    nodes: list = []
    scalars = [0, 1, 7, 300, -5, 2.5, -0.0, float("nan"), True, False, 1 + 2j, 10**30]

    def literal():
        kind = rng.random()
        if kind < 0.3:
            return Literal(rng.choice(arrays), np.float32)  # shared arrays: one ext entry each
        value = rng.choice(scalars)
        if kind < 0.4 and type(value) is int:
            return Literal(value, np.int32, POSITION)
        return Literal(value, rng.choice([np.float32, np.int32, np.float64]), rng.random() < 0.5)

    for _ in range(n_nodes):
        inputs = []
        for _ in range(rng.randint(0, 4)):
            r = rng.random()
            if nodes and r < 0.55:
                m = rng.choice(nodes)
                inputs.append(new_var(Var, (m, rng.randrange(len(m.outs)))))
            elif r < 0.7:
                m = rng.choice(outside)
                inputs.append(new_var(Var, (m, rng.randrange(len(m.outs)))))
            else:
                inputs.append(literal())
        bdims = rng.choice([None, None, (), ((0,) * len(inputs), (3,)), ((None,), (2, 2))])
        nodes.append(_node(rng, inputs, rng.choice([1, 1, 1, 2, 3]), bdims, keep))
    for n in nodes:  # some computed: some of their outputs, or all
        if rng.random() < 0.2:
            n.values = [np.float32(1.0) if rng.random() < 0.6 else None for _ in n.outs]
    for i, n in enumerate(nodes):
        n.seq = i
    return nodes, outside, keep


def _same_objects(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x is y


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_encode_matches_the_python_reference(seed):
    nodes, outside, _keep = _random_graph(seed)
    rng = random.Random(seed)
    pre = {}
    if seed % 3 == 0:  # a body's inputs numbered by the caller
        pre = {m: 100 + 5 * i for i, m in enumerate(outside)}
    base = rng.choice([0, 0, 7, 1000])
    order = nodes if seed % 2 else tuple(nodes)
    slot_py, slot_c = dict(pre), dict(pre)
    steps_py, next_py, ext_py = graph._encode_py(order, slot_py, base)
    steps_c, next_c, ext_c = _graphc.encode(order, slot_c, base)
    assert steps_c == steps_py
    assert next_c == next_py
    _same_objects(ext_c, ext_py)
    assert list(slot_c.items()) == list(slot_py.items())
    for s_c, s_py in zip(steps_c, steps_py):  # the same objects, not only equal ones
        assert s_c[0] is s_py[0] and s_c[1] is s_py[1] and s_c[5] is s_py[5]
        assert type(s_c[2]) is tuple and type(s_c[3]) is int


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_encode_key_matches_the_python_reference(seed):
    """encode_key writes the flat key of encode's tuple(steps) (the same items and hash as
    flat_key of the steps), numbers the slots and collects ext exactly as encode does."""
    nodes, outside, _keep = _random_graph(seed)
    rng = random.Random(seed + 500)
    pre = {m: 100 + 5 * i for i, m in enumerate(outside)} if seed % 3 == 0 else {}
    base = rng.choice([0, 0, 7, 1000, 40_000])  # past the shared ints too
    order = nodes if seed % 2 else tuple(nodes)
    slot_py, slot_c, slot_e = dict(pre), dict(pre), dict(pre)
    (flat_py, h_py), next_py, ext_py = graph._encode_key_py(order, slot_py, base)
    (flat_c, h_c), next_c, ext_c = _graphc.encode_key(order, slot_c, graph.MARKS, base)
    assert h_c == h_py and next_c == next_py
    assert flat_c == flat_py
    for a, b in zip(flat_c, flat_py):  # the same objects, except ints
        assert a is b or (type(a) is int and type(b) is int and a == b)
    _same_objects(ext_c, ext_py)
    assert list(slot_c.items()) == list(slot_py.items())
    steps, _, _ = _graphc.encode(order, slot_e, base)
    assert (flat_c, h_c) == _graphc.flat_key(tuple(steps), graph.MARKS)


@needs_c
def test_encode_key_errors_leave_nothing_behind():
    """A node whose params cannot be hashed raises TypeError as hashing encode's steps would;
    a bad marks argument is refused."""
    nodes, _outside, _keep = _random_graph(3)
    bad = graph.Node.__new__(graph.Node)
    for f in graph.Node.__slots__:
        try:
            setattr(bad, f, getattr(nodes[-1], f))
        except AttributeError:
            pass
    bad.params = ([1, 2],)
    with pytest.raises(TypeError, match="unhashable"):
        _graphc.encode_key([*nodes, bad], {}, graph.MARKS)
    with pytest.raises(TypeError, match="unhashable"):
        graph._encode_key_py([*nodes, bad], {})
    with pytest.raises(ValueError, match="marks must not be empty"):
        _graphc.encode_key(nodes, {}, ())


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_collect_matches_the_python_reference(seed):
    nodes, _outside, _keep = _random_graph(seed)
    rng = random.Random(seed + 1000)
    roots = rng.sample(nodes, k=rng.randint(1, 4))
    start = {} if seed % 2 else {n: None for n in rng.sample(nodes, k=5)}
    seen_py = graph._collect_py(iter(roots) if seed % 4 == 1 else roots, dict(start))
    seen_c = _graphc.collect(iter(roots) if seed % 4 == 1 else roots, dict(start))
    assert list(seen_c) == list(seen_py)  # the same nodes, in the same (discovery) order
    pre = dict(start)
    assert _graphc.collect(roots, pre) is pre  # fills and returns the caller's dict


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_describe_matches_the_python_reference(seed):
    nodes, _outside, _keep = _random_graph(seed)
    pending = [n for n in nodes if n.values is None]
    _steps, _n, ext = graph._encode_py(pending, {})
    ext = [e for e in ext if type(e) is not Var or (e[0].values or [None] * 3)[e[1]] is not None]
    desc_py, leaves_py, groups_py, pos_py = graph._describe_py(ext, POSITION)
    desc_c, leaves_c, groups_c, pos_c = _graphc.describe(ext, POSITION)
    assert desc_c == desc_py
    _same_objects(leaves_c, leaves_py)
    assert list(groups_c) == list(groups_py)
    for d in groups_py:
        _same_objects(groups_c[d], groups_py[d])
    _same_objects(pos_c, pos_py)


def _error(f, *args):
    try:
        f(*args)
    except Exception as e:  # noqa: BLE001 - the comparison is the point
        return type(e)
    return None


def _copy(node):
    """A new node with the same fields."""
    n = object.__new__(Node)
    for f in Node.__slots__:
        if f != "__weakref__" and hasattr(node, f):
            setattr(n, f, getattr(node, f))
    return n


@needs_c
def test_errors_match_the_python_reference():
    nodes, _outside, _keep = _random_graph(3, n_nodes=10)
    released = _copy(nodes[0])  # a computed node whose inputs were dropped
    released.inputs = None
    for py, c, nodes_in in [
        (graph._encode_py, _graphc.encode, [released]),
        (graph._collect_py, _graphc.collect, [released]),
        (graph._encode_py, _graphc.encode, [object()]),
    ]:
        e_py, e_c = _error(py, nodes_in, {}), _error(c, nodes_in, {})
        assert e_py is not None and e_c is e_py, (py.__name__, e_py, e_c)
    short = _copy(nodes[0])  # computed, with fewer values than its Var's index
    short.values = []
    bad = _copy(nodes[1])
    bad.inputs = (new_var(Var, (short, 0)),)
    assert _error(graph._collect_py, [bad], {}) is IndexError
    assert _error(_graphc.collect, [bad], {}) is IndexError
    assert _error(graph._describe_py, [new_var(Var, (short, 0))], POSITION) is IndexError
    assert _error(_graphc.describe, [new_var(Var, (short, 0))], POSITION) is IndexError


# --- graphs of real programs ---------------------------------------------------------------


def _real_graphs():
    x = nx.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    w = nx.tensor(np.ones((4, 2), np.float32))
    y = nx.relu(x @ w * 1.5 - 0.25)
    yield [y]
    g = nx.grad(lambda w: (nx.tanh(x @ w) ** 2).sum())(w)
    yield [g]
    v = nx.vmap(lambda r: (r * 2.0 + r.sum()) / 3)(x)
    yield [v]
    i = 1
    yield [x[i] + x[:, i].sum(), x.at[i, 2].set(5.0)]


@needs_c
@pytest.mark.parametrize("case", range(4))
def test_real_program_graphs_encode_alike(case):
    outs = list(_real_graphs())[case]
    roots = [t._impl.src[0] for t in outs if t._impl.src is not None]
    assert roots
    seen_py = graph._collect_py(roots, {})
    seen_c = _graphc.collect(roots, {})
    assert list(seen_c) == list(seen_py)
    order = sorted(seen_py, key=graph.seq_of)
    a, b = graph._encode_py(order, {}), _graphc.encode(order, {})
    assert a[0] == b[0] and a[1] == b[1]
    _same_objects(a[2], b[2])
    d_py, d_c = graph._describe_py(a[2], POSITION), _graphc.describe(b[2], POSITION)
    assert d_py[0] == d_c[0]
    _same_objects(d_py[1], d_c[1])
    _same_objects(d_py[3], d_c[3])
    for t in outs:  # and the values are right whichever walks realized them
        t.numpy()


# --- traced graphs: the reverse pass's walk, and a node's metadata --------------------------


def _traced_graph(seed):
    """A random graph whose nodes belong to nested traces or to none, with integer seqs (or, for
    some seeds, float seqs and ties, which the compiled sort hands back to Python's)."""
    nodes, outside, keep = _random_graph(seed)
    rng = random.Random(seed + 7)
    root = graph.Trace(None)
    traces = [root, graph.Trace(root), graph.Trace(graph.Trace(root))]
    for n in nodes + outside:
        n.trace = rng.choice([None, *traces, traces[0]])
        n.depth = rng.randint(1, 9)
    if seed % 5 == 0:
        for n in nodes:
            n.seq = float(n.seq // 3)  # ties: the discovery order must decide, as sorted() does
    elif seed % 5 == 1:
        for n in nodes:
            n.seq = n.seq + 2**70  # past a C long long
    return nodes, outside, keep, traces


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_trace_collect_matches_the_python_reference(seed):
    from nablax.core.transforms import trace

    nodes, outside, _keep, _traces = _traced_graph(seed)
    rng = random.Random(seed + 2000)
    roots = rng.sample(nodes + outside, k=rng.randint(1, 5))
    stop = rng.sample(nodes, k=rng.randint(0, 6))
    stop = set(stop) if seed % 2 else dict.fromkeys(stop)
    for n in rng.sample(nodes, k=3):
        if seed % 3 == 0:
            n.inputs = None  # a realized node whose inputs were freed
    got_py = trace._collect_py(iter(roots) if seed % 4 == 1 else roots, stop)
    got_c = _graphc.trace_collect(iter(roots) if seed % 4 == 1 else roots, stop)
    assert type(got_c) is list
    _same_objects(got_c, got_py)


@needs_c
def test_trace_collect_errors_match_the_python_reference():
    from nablax.core.transforms import trace

    nodes, _outside, _keep, _traces = _traced_graph(2)
    traced = [n for n in nodes if n.trace is not None and n.inputs]
    bad = _copy(traced[-1])
    del bad.seq  # an unset slot
    cases = [([object()], {}), ([bad], {}), (5, {}), (traced[-1:], 5)]
    for roots, stop in cases:
        e_py, e_c = (
            _error(trace._collect_py, roots, stop),
            _error(_graphc.trace_collect, roots, stop),
        )
        assert e_py is not None and e_c is e_py, (roots, stop, e_py, e_c)


@needs_c
@pytest.mark.parametrize("seed", range(30))
def test_plan_scan_matches_the_python_reference(seed):
    from nablax.core.transforms import plan
    from nablax.core.transforms.trace import Opaque

    nodes, _outside, _keep, traces = _traced_graph(seed)
    rng = random.Random(seed + 4000)
    trace = traces[seed % 3]
    for n in nodes:
        n.trace = trace
    if seed % 4 == 1:
        rng.choice(nodes).trace = rng.choice([None, traces[(seed + 1) % 3]])  # another trace
    if seed % 4 == 2:
        rng.choice(nodes).params = (1, Opaque(object()))  # a user rule: never planned
    if seed % 4 == 3:
        rng.choice(nodes).params = (Opaque(object()), 1)  # an Opaque not last: planned
    markers = rng.sample(nodes, k=4)
    markers = set(markers) if seed % 2 else dict.fromkeys(markers)
    order = nodes if seed % 3 else tuple(nodes)
    got_py = plan._scan_py(order, markers, trace, Opaque)
    got_c = _graphc.plan_scan(order, markers, trace, Opaque)
    assert (got_py is None) == (got_c is None) == (seed % 4 in (1, 2))
    if got_py is not None:
        (env_py, flags_py), (env_c, flags_c) = got_py, got_c
        assert type(env_c) is list and type(flags_c) is tuple
        assert env_c == env_py and all(type(v) is Var for v in env_c)
        assert [v[0] for v in env_c] == [v[0] for v in env_py]  # the same nodes
        assert flags_c == flags_py and len(flags_c) == len(nodes)


@needs_c
def test_plan_scan_errors_match_the_python_reference():
    from nablax.core.transforms import plan
    from nablax.core.transforms.trace import Opaque

    nodes, _outside, _keep, traces = _traced_graph(5)
    for n in nodes:
        n.trace = traces[0]
    no_outs = _copy(nodes[0])
    del no_outs.outs
    odd_params = _copy(nodes[1])
    odd_params.params = 5  # not a sequence
    for order, markers in [(5, {}), ([no_outs], {}), ([odd_params], {}), (nodes[:3], 5)]:
        args = (order, markers, traces[0], Opaque)
        e_py, e_c = _error(plan._scan_py, *args), _error(_graphc.plan_scan, *args)
        assert e_py is not None and e_c is e_py, (order, markers, e_py, e_c)


@needs_c
@pytest.mark.parametrize("seed", range(30))
def test_plan_ext_matches_the_python_reference(seed):
    """The structure key's descriptors of a forward graph's external values."""
    from nablax.core.transforms import plan

    nodes, outside, _keep, traces = _traced_graph(seed)
    for m in outside:
        m.trace = None
    if seed % 3 == 1:
        outside[0].trace = traces[0]  # a traced Var outside the graph: not plannable
    pending = [n for n in nodes if n.values is None]
    _steps, _n, ext = graph._encode_py(pending, {})
    ext = list(ext) + [Literal(np.zeros((2, 3), np.float32), np.float32)]

    def var_desc(v):
        m, j = v
        return None if m.trace is not None else ("x", j, len(m.outs), m.values is not None)

    index_py, index_c = {}, {}
    got_py = plan._ext_descs_py(ext, index_py, var_desc, plan._scalar_code)
    got_c = _graphc.plan_ext(ext, index_c, var_desc, plan._scalar_code)
    assert got_c == got_py
    assert list(index_c.items()) == list(index_py.items())
    if got_py is not None:
        assert len(got_c) == len(ext)
        assert any(d[0] == "a" for d in got_c) and any(d[0] == "s" for d in got_c)


@needs_c
def test_plan_ext_errors_match_the_python_reference():
    from nablax.core.transforms import plan

    no_shape = Literal(object(), np.float32)
    cases = [5, [object()], [no_shape], [new_var(Var, (object(), 0))]]
    for ext in cases:
        args = (ext, {}, lambda v: v[0].trace, plan._scalar_code)
        e_py, e_c = _error(plan._ext_descs_py, *args), _error(_graphc.plan_ext, *args)
        assert e_py is not None and e_c is e_py, (ext, e_py, e_c)


@needs_c
def test_wrap_matches_the_python_reference():
    from nablax.core.tensor import Tensor
    from nablax.core.transforms.compile.scalars import TracedScalar

    _graphc.setup_tensor(Tensor)
    impl = nx.arange(6.0)._impl
    for cls in (Tensor, TracedScalar):
        a, b = Tensor._wrap_py.__func__(cls, impl), _graphc.wrap(cls, impl)
        assert type(a) is type(b) is cls and a._impl is b._impl is impl
        assert not hasattr(b, "_grad")
    assert (_graphc.wrap(Tensor, impl) * 2).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    for args in [(Tensor,), (Tensor, impl, impl), (5, impl), (int, impl)]:
        e_py = _error(Tensor._wrap_py.__func__, *args)
        e_c = _error(_graphc.wrap, *args)
        assert e_py is not None and e_c is e_py, (args, e_py, e_c)


def _marked(fn, leaves):
    from nablax.core.transforms import trace as tr

    t = graph.Trace(None)
    got = fn(leaves, t, tr.trace_input_p, tr.is_float)
    return got, t


@needs_c
def test_mark_leaves_matches_the_python_reference():
    from nablax.core import build
    from nablax.core.tensor import Tensor
    from nablax.core.transforms import trace as tr

    _graphc.setup_build(
        build.TensorImpl, graph._next_seq, build.CTX, build.note_pending, build._deep_cut
    )
    _graphc.setup_tensor(Tensor)
    params = [nx.ones((2, 3)), nx.arange(4.0).astype(nx.float16), nx.zeros(()), nx.ones(5)]
    for p in params:
        p.numpy()  # computed leaves
    (m_py, n_py), t_py = _marked(tr._mark_leaves_py, params)
    (m_c, n_c), t_c = _marked(_graphc.mark_leaves, params)
    assert len(m_c) == len(n_c) == len(params) == len(t_c.kept) == len(t_py.kept)
    for a, b, na, nb, p in zip(m_py, m_c, n_py, n_c, params):
        assert type(b) is Tensor and b._impl.src[0] is nb and [w() for w in t_c.kept].count(nb) == 1
        for f in ("value", "lit", "sharding", "shape", "dtype", "batch_shape"):
            assert getattr(a._impl, f) is getattr(b._impl, f) is getattr(p._impl, f) or (
                f == "batch_shape" and a._impl.batch_shape == b._impl.batch_shape == ()
            ), f
        for f in ("prim", "params", "inputs", "depth", "bdims", "avals"):
            assert getattr(na, f) == getattr(nb, f), f
        assert (
            na.trace is t_py
            and nb.trace is t_c
            and nb.values == [p._impl.value]
            and nb.inputs == (p._impl.lit,)
        )
        assert nb.seq > na.seq
    assert _graphc.mark_leaves([], graph.Trace(None), tr.trace_input_p, tr.is_float) == ([], [])
    pending = nx.ones(3) * 2.0
    batched = Tensor._wrap(
        build.TensorImpl(None, params[3]._impl.value, (), np.dtype(np.float32), (5,))
    )
    others = [nx.arange(3), pending, batched, np.ones(3, np.float32), 1.5, None]
    for other in others:  # one leaf the general loop must handle: nothing is built
        leaves = [params[0], other]
        seq = graph._next_seq()
        got_py, t1 = _marked(tr._mark_leaves_py, leaves)
        got_c, t2 = _marked(_graphc.mark_leaves, leaves)
        assert got_py is None and got_c is None and not t1.kept and not t2.kept, other
        assert graph._next_seq() == seq + 1


@needs_c
def test_mark_leaves_errors_match_the_python_reference():
    from nablax.core.transforms import trace as tr

    x = nx.ones(2)
    x.numpy()

    def bad_is_float(dtype):
        raise RuntimeError("no")

    for args in [
        (5, graph.Trace(None), tr.trace_input_p, tr.is_float),
        ([x], graph.Trace(None), tr.trace_input_p, bad_is_float),
        ([x], object(), tr.trace_input_p, tr.is_float),
    ]:
        e_py, e_c = _error(tr._mark_leaves_py, *args), _error(_graphc.mark_leaves, *args)
        assert e_py is not None and e_c is e_py, (args, e_py, e_c)


def _impl(rng, nodes):
    """A real TensorImpl: pending (a node's output), computed (a leaf with a literal), batched."""
    from nablax.core.build import TensorImpl

    impl = object.__new__(TensorImpl)
    impl.value = impl.sharding = None
    impl.shape, impl.dtype = (2,), np.dtype(np.float32)
    impl.batch_shape = rng.choice([(), (), (3,), (2, 2)])
    if rng.random() < 0.35:
        impl.src, impl.lit = None, Literal(np.ones(2, np.float32), np.float32)
    else:
        m = rng.choice(nodes)
        impl.src, impl.lit = new_var(Var, (m, rng.randrange(len(m.outs)))), None
    return impl


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_meta_matches_the_python_reference(seed):
    from nablax.core import build

    _graphc.setup_build(
        build.TensorImpl, graph._next_seq, build.CTX, build.note_pending, build._deep_cut
    )
    nodes, outside, _keep, _traces = _traced_graph(seed)
    rng = random.Random(seed + 3000)
    for _ in range(20):
        inputs = []
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            if r < 0.4:
                inputs.append(_impl(rng, nodes + outside))
            elif r < 0.8:
                m = rng.choice(nodes + outside)
                inputs.append(new_var(Var, (m, rng.randrange(len(m.outs)))))
            else:
                inputs.append(Literal(rng.choice([1, 2.5, np.ones(2)]), np.float32))
        if rng.random() < 0.5:
            inputs = tuple(inputs)
        refs_py, depth_py, trace_py, b_py = build._meta_py(inputs)
        refs_c, depth_c, trace_c, b_c = _graphc.meta(inputs)
        assert type(refs_c) is tuple
        _same_objects(refs_c, refs_py)
        assert depth_c == depth_py and type(depth_c) is int
        assert trace_c is trace_py and b_c is b_py


@needs_c
def test_meta_errors_match_the_python_reference():
    from nablax.core import build

    nodes, _outside, _keep, traces = _traced_graph(4)
    no_depth = _copy(nodes[0])
    del no_depth.depth
    odd_trace = _copy(nodes[1])
    odd_trace.trace = object()  # no .level to compare
    deeper = _copy(nodes[2])
    deeper.trace = traces[2]
    cases = [
        5,
        [object()],
        [new_var(Var, (no_depth, 0))],
        [new_var(Var, (deeper, 0)), new_var(Var, (odd_trace, 0))],
    ]
    for inputs in cases:
        e_py, e_c = _error(build._meta_py, inputs), _error(_graphc.meta, inputs)
        assert e_py is not None and e_c is e_py, (inputs, e_py, e_c)


# --- building a node -----------------------------------------------------------------------


def _node_fields(impl):
    node, j = impl.src
    fields = {
        f: getattr(node, f) for f in Node.__slots__ if f != "__weakref__" and hasattr(node, f)
    }
    fields.pop("seq")
    outs = fields.pop("outs")
    assert len(outs) == 1 and outs[0]() is impl and j == 0 and type(impl.src) is Var
    impl_fields = {f: getattr(impl, f) for f in ("value", "lit", "shape", "dtype", "batch_shape")}
    return fields, impl_fields, node.seq


@needs_c
@pytest.mark.parametrize(
    "trace_kind, bdims",
    [(None, None), ("trace", None), (None, ((0, None), (3,))), ("trace", ((1,), (2, 5)))],
)
def test_node1_matches_the_python_reference(trace_kind, bdims):
    from nablax.core import build
    from nablax.core.context import CTX

    assert build._node1 is build._node1_py or build._node1 is _graphc.node1
    _graphc.setup_build(build.TensorImpl, graph._next_seq, CTX, build.note_pending, build._deep_cut)
    prim, params = _PRIMS[1], ("axis", 1)
    x = nx.ones((2, 3))
    inputs = (x._impl.lit, Literal(2.0, np.float32, True))
    trace = graph.Trace(None) if trace_kind else None
    shape, dtype = (2, 3), np.dtype(np.float32)
    a = build._node1_py(prim, params, inputs, 5, shape, dtype, trace, bdims)
    b = _graphc.node1(prim, params, inputs, 5, shape, dtype, trace, bdims)
    fa, ia, seq_a = _node_fields(a)
    fb, ib, seq_b = _node_fields(b)
    assert seq_b > seq_a  # one counter: creation order is a topological order
    assert fa.keys() == fb.keys()
    for k in fa:
        assert fa[k] == fb[k] if k in ("avals", "values") else fa[k] is fb[k], k
    assert ia == ib and ib["batch_shape"] == (() if bdims is None else bdims[1])
    assert ("avals" in fb) == (trace is not None)
    pending = [wr() for wr in CTX.pending[-4:]]
    assert a in pending and b in pending
    del a, b


def _impl_of(kind, trace=None):
    """An impl of each kind the element-wise builders meet: a realized leaf, a pending value, a
    traced one, a batched one (traced or not)."""
    from nablax.core import build

    x = nx.ones((2, 3))
    if kind == "leaf":
        return x._impl
    if kind == "pending":
        return (x * 2.0)._impl
    bdims = ((0,), (4,)) if kind.startswith("batched") else None
    trace = trace if trace is not None or kind in ("batched",) else graph.Trace(None)
    return build._node1_py(
        _PRIMS[3], (), (x._impl.lit,), 3, (2, 3), np.dtype(np.float32), trace, bdims
    )


def _same_built(a, b):
    """Two tensors whose nodes and impls are equal field by field (the same objects where the
    builders pass them through)."""
    assert type(a) is type(b) is nx.Tensor
    fa, ia, seq_a = _node_fields(a._impl)
    fb, ib, seq_b = _node_fields(b._impl)
    assert seq_b > seq_a and fa.keys() == fb.keys()
    for k in fa:
        if k == "inputs":
            _same_objects(fa[k], fb[k])
        elif k in ("avals", "values", "bdims", "depth"):
            assert fa[k] == fb[k], k
        else:
            assert fa[k] is fb[k], k
    assert ia == ib


@needs_c
@pytest.mark.parametrize("kind", ["leaf", "pending", "traced", "batched", "batched_traced"])
@pytest.mark.parametrize("first", [False, True])
def test_compiled_tensor_builders_match_the_python_reference(kind, first):
    """scalar_tensor and unary_tensor (a builder's node and its tensor in one call) make the
    node Tensor._wrap(bind_scalar(...)) and Tensor._wrap(bind_unary(...)) make."""
    from nablax.core.prims.elementwise import builders

    x = _impl_of(kind)
    lit = Literal(1.5, np.dtype(np.float32), True)
    dt = np.dtype(np.float32)
    args = (_PRIMS[1], ("p", 1), x, lit, first, dt)
    _same_built(builders._scalar_tensor_py(*args), _graphc.scalar_tensor(*args))
    args = (_PRIMS[2], (), x, (2, 3), dt)
    _same_built(builders._unary_tensor_py(*args), _graphc.unary_tensor(*args))


@needs_c
@pytest.mark.parametrize(
    "kinds",
    [
        ("leaf", "leaf"),
        ("leaf", "pending"),
        ("pending", "traced"),
        ("traced", "traced"),
        ("traced", "same trace"),
        ("batched", "leaf"),
        ("pending", "batched_traced"),
    ],
)
def test_compiled_pair_builder_matches_the_python_reference(kinds):
    """pair_tensor makes bind_pair's node, or answers NotImplemented where bind_pair needs
    Python (a batched input; inputs of two different traces), and the builder then takes the
    Python path."""
    from nablax.core.prims.elementwise import builders

    a = _impl_of(kinds[0])
    if kinds[1] == "same trace":
        b = _impl_of("traced", a.src[0].trace)
    else:
        b = _impl_of(kinds[1])
    args = (_PRIMS[4], (), a, b, (2, 3), np.dtype(np.float32))
    ref = builders._pair_tensor_py(*args)
    got = _graphc.pair_tensor(*args)
    batched = bool(a.batch_shape or b.batch_shape)
    two_traces = a.src is not None and b.src is not None and a.src[0].trace is not None
    two_traces = two_traces and b.src[0].trace is not None and a.src[0].trace is not b.src[0].trace
    if batched or two_traces:
        assert got is NotImplemented
    else:
        _same_built(ref, got)


@needs_c
def test_compiled_tensor_builder_errors_match_the_python_reference():
    from nablax.core.prims.elementwise import builders

    dt = np.dtype(np.float32)
    lit = Literal(1.5, dt, True)
    odd = _impl_of("pending")
    node = _copy(odd.src[0])
    del node.depth
    odd.src = new_var(Var, (node, 0))
    for x in (5, odd):
        for py, c, args in [
            (builders._scalar_tensor_py, _graphc.scalar_tensor, (_PRIMS[1], (), x, lit, False, dt)),
            (builders._unary_tensor_py, _graphc.unary_tensor, (_PRIMS[1], (), x, (2, 3), dt)),
            (builders._pair_tensor_py, _graphc.pair_tensor, (_PRIMS[1], (), x, x, (2, 3), dt)),
        ]:
            e_py, e_c = _error(py, *args), _error(c, *args)
            assert e_py is not None and e_c is e_py, (x, py, e_py, e_c)


@needs_c
def test_node1_realizes_a_too_deep_graph_like_the_python_reference():
    """Every 64 levels the depth is checked against ``max_graph_depth``: the compiled builder
    realizes the same nodes as the Python one, and the values are right."""
    from nablax.core import build

    x0 = np.linspace(0, 1, 4, dtype=np.float32)
    ref = x0.copy()
    for _ in range(300):
        ref = ref * np.float32(0.999) + np.float32(0.001)
    results = []
    from nablax.core.prims.elementwise import builders

    compiled = (_graphc.node1, _graphc.scalar_tensor)
    for node1, scalar_tensor in ((build._node1_py, builders._scalar_tensor_py), compiled):
        with nx.config.override(max_graph_depth=100):
            old = build._node1, builders.scalar_tensor
            build._node1, builders.scalar_tensor = node1, scalar_tensor
            try:
                x = nx.tensor(x0)
                depths = []
                for _ in range(300):
                    x = x * 0.999 + 0.001
                    depths.append(x._impl.depth)  # 0 once realized
            finally:
                build._node1, builders.scalar_tensor = old
        results.append((depths, x.numpy()))
    assert results[0][0] == results[1][0]
    assert 0 < results[1][0].count(0) and max(results[1][0]) < 200  # cut, and cut alike
    np.testing.assert_allclose(results[1][1], ref, rtol=1e-5)
    np.testing.assert_array_equal(results[0][1], results[1][1])


@needs_c
def test_node1_errors_match_the_python_reference():
    from nablax.core import build

    for bad in [dict(depth="5"), dict(bdims=(1,)), dict(bdims=5)]:
        kw = dict(
            prim=_PRIMS[0],
            params=(),
            inputs=(),
            depth=1,
            shape=(),
            dtype=np.dtype(np.float32),
            trace=None,
            bdims=None,
        )
        kw.update(bad)
        args = list(kw.values())
        e_py, e_c = _error(build._node1_py, *args), _error(_graphc.node1, *args)
        assert e_py is not None and e_c is e_py, (bad, e_py, e_c)


@needs_c
@pytest.mark.parametrize("n_out", [0, 1, 2, 3])
@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("bdims", [None, ((0,), (4,))])
def test_node_matches_the_python_reference(n_out, traced, bdims):
    """The general constructor (any number of outputs) against ``build._node_py``."""
    from nablax.core import build
    from nablax.core.context import CTX

    _graphc.setup_build(build.TensorImpl, graph._next_seq, CTX, build.note_pending, build._deep_cut)
    prim, params = _PRIMS[2], ()
    inputs = (Literal(3, np.int32, True),)
    avals = [((k + 1, 2), np.dtype(np.float32 if k % 2 else np.int32)) for k in range(n_out)]
    trace = graph.Trace(None) if traced else None
    a = build._node_py(prim, params, inputs, 7, avals, trace, bdims)
    b = _graphc.node(prim, params, inputs, 7, avals, trace, bdims)
    assert type(b) is list and len(a) == len(b) == n_out
    for j, (ia, ib) in enumerate(zip(a, b)):
        assert ib.src[1] == j and type(ib.src) is Var and ib.src[0] is b[0].src[0]
        assert ib.src[0].outs[j]() is ib
        for f in ("value", "lit", "sharding", "shape", "dtype", "batch_shape"):
            assert getattr(ia, f) == getattr(ib, f), f
    if n_out:
        na, nb = a[0].src[0], b[0].src[0]
        for f in ("prim", "params", "inputs", "values", "depth", "trace", "bdims"):
            assert getattr(na, f) is getattr(nb, f), f
        assert hasattr(nb, "avals") == traced
        if traced:
            assert nb.avals == tuple(avals) == na.avals
        assert nb.seq > na.seq
        pending = [wr() for wr in CTX.pending[-2 * n_out :]]
        assert all(i in pending for i in a + b)


@needs_c
def test_node_errors_match_the_python_reference():
    from nablax.core import build

    f32 = np.dtype(np.float32)
    for avals in [[((2,), f32, 1)], [((2,), f32), ((3,),)], [5], 7, [((2,), f32)] * 2]:
        for bdims in (None, (1,)):
            args = (_PRIMS[0], (), (), 1, avals, None, bdims)
            e_py, e_c = _error(build._node_py, *args), _error(_graphc.node, *args)
            if avals == [((2,), f32)] * 2 and bdims is None:
                assert e_py is e_c is None
            else:
                assert e_py is not None and e_c is e_py, (avals, bdims, e_py, e_c)


@needs_c
@pytest.mark.parametrize("kind", ["value_and_grad", "vjp"])
def test_plan_replay_matches_the_python_reference(monkeypatch, kind):
    """A backward plan replayed by the compiled loop builds the same graph (same structure
    key, same values) as the Python loop."""
    from nablax.core.transforms import plan

    x = nx.tensor(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3))
    w = nx.tensor(np.linspace(0.5, 1.5, 12, dtype=np.float32).reshape(3, 4))

    def loss(w):
        h = nx.tanh(x @ w)
        return (h * h).sum() + (h.max(axis=1) ** 3).sum() * 0.5

    def step():
        if kind == "vjp":
            _y, f_vjp = nx.vjp(lambda w: nx.tanh(x @ w) * 2.0, w)
            return f_vjp(nx.ones((2, 4)))[0]
        return nx.value_and_grad(loss)(w)[1]

    graphs = []
    for impl in (plan._replay_nodes_py, _graphc.replay):
        monkeypatch.setattr(plan, "_replay_nodes", impl)
        step().numpy()  # recorded (or replayed from an earlier test's recording)
        hits = plan.plan_info()[1]
        g = step()
        assert plan.plan_info()[1] > hits  # this one was replayed
        order = graph.toposort([g._impl.src[0]])
        steps, _n, ext = graph._encode_py(order, {})
        graphs.append((steps, [type(e) for e in ext], g.numpy()))
    assert graphs[0][0] == graphs[1][0] and graphs[0][1] == graphs[1][1]
    np.testing.assert_array_equal(graphs[0][2], graphs[1][2])


# ---- flat_key: structure keys as one flat tuple ----------------------------------------------


class _Eq:
    """A leaf with its own equality (a params object such as a kernel's CallSpec)."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _Eq) and self.v == other.v

    def __hash__(self):
        return hash(("eq", self.v))


class _Tup(tuple):
    """A tuple subclass: a leaf (only exact tuples are flattened)."""


def _random_key(rng, depth=0):
    r = rng.random()
    if depth < 4 and r < 0.35:
        n = rng.choice([0, 1, 2, 3, 5, 15, 16, 17, 40])
        return tuple(_random_key(rng, depth + 1) for _ in range(n))
    return rng.choice(
        [
            lambda: rng.randint(-3, 3),
            lambda: rng.randint(-40000, 40000),  # beyond the shared ints too
            lambda: rng.choice([2**70, -(2**70), 32767, 32768, -32768, -32769, -1, -2]),
            lambda: rng.choice([True, False, None, 1.0, -0.0, float("nan"), "a", "bb", np.float32]),
            lambda: rng.choice([Fraction(2), 2.0, 2, 1, 0]),  # equal across types
            lambda: _Eq(rng.randint(0, 2)),
            lambda: _Tup((rng.randint(0, 2),)),
        ]
    )()


def _mutate(rng, key):
    """``key`` with one leaf or one tuple's length changed (often equal to it anyway)."""
    if type(key) is not tuple or not key or rng.random() < 0.2:
        return _random_key(rng, 3)
    i = rng.randrange(len(key))
    if rng.random() < 0.2:
        return key[:i] + key[i + 1 :]  # a shorter tuple
    return key[:i] + (_mutate(rng, key[i]),) + key[i + 1 :]


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_flat_key_matches_the_python_reference(seed):
    rng = random.Random(seed)
    key = _random_key(rng)
    flat, h = _graphc.flat_key(key, graph.MARKS)
    ref_flat, ref_h = graph._flat_key_py(key)
    assert h == ref_h
    assert len(flat) == len(ref_flat)
    for a, b in zip(flat, ref_flat):
        # the same objects, except ints of the shared range (equal, maybe another object)
        assert a is b or (type(a) is int and type(b) is int and a == b)


@pytest.mark.parametrize("seed", range(60))
def test_flat_keys_are_equal_exactly_when_the_keys_are(seed):
    """The encoding is a bijection onto its image: equal nested keys give equal flat keys (and
    hashes), different ones different flat keys, including keys that differ only in a tuple
    boundary, a tuple's length past the marks, or a leaf that is a tuple subclass."""
    rng = random.Random(seed)
    fk = graph.flat_key
    for _ in range(30):
        a = _random_key(rng)
        b = _mutate(rng, a) if rng.random() < 0.8 else _random_key(rng)
        nan_free = "nan" not in repr((a, b))
        if nan_free:
            assert (fk(a)[0] == fk(b)[0]) == (a == b), (a, b)
        if a == b:
            assert fk(a)[1] == fk(b)[1]
        ka, kb = graph.FlatKey(a), graph.FlatKey(b)
        if nan_free:
            assert (ka == kb) == (a == b) and (ka != kb) == (a != b)
        assert ka == graph.FlatKey(a) or not nan_free
    # boundaries: the same leaves, grouped differently
    assert fk(((1, 2), 3))[0] != fk((1, (2, 3)))[0] != fk((1, 2, 3))[0]
    assert fk(((),))[0] != fk(((), ()))[0] != fk(())[0]
    assert fk((_Tup((1, 2)),))[0] != fk(((1, 2),))[0]
    long_a, long_b = tuple(range(16)), tuple(range(17))
    assert fk(long_a)[0] != fk(long_b)[0] and fk((long_a,))[0] != fk((long_a, 16))[0]


@needs_c
def test_flat_key_errors_match_hashing_the_nested_key():
    """A key nested past the interpreter's recursion limit raises RecursionError, and an
    unhashable leaf TypeError, as hashing the nested key (which a plan key always is) would;
    the Python reference raises the same TypeError."""
    deep: tuple = ()
    for _ in range(100_000):
        deep = (deep,)
    with pytest.raises(RecursionError):
        _graphc.flat_key(deep, graph.MARKS)
    for f in (lambda k: _graphc.flat_key(k, graph.MARKS), graph._flat_key_py, hash):
        with pytest.raises(TypeError, match="unhashable"):
            f(((1, [2]), 3))


@needs_c
def test_plan_keys_are_flat_when_compiled():
    """Compiled runs key the backward plan cache by FlatKey: a second call with the same
    structure replays the plan the first recorded (the keys are equal, the gradient right), and
    another structure records its own."""
    from nablax.core.transforms import plan

    if not graph.COMPILED:
        pytest.skip("this process runs the pure-Python walks")
    assert plan._make_key is graph.FlatKey
    nx.clear_caches()
    w = nx.arange(6.0).reshape(2, 3) * 0.1

    def f(w, k):
        return ((w * k).tanh() ** 2).sum()

    nx.grad(f)(w, 2.0)
    rec = plan._S.recordings
    g = nx.grad(f)(w + 1, 2.0)  # the same structure: replayed
    assert plan._S.recordings == rec
    t = np.tanh((np.arange(6.0).reshape(2, 3) * 0.1 + 1) * 2.0)
    np.testing.assert_allclose(g.numpy(), 2 * t * (1 - t * t) * 2.0, rtol=1e-5, atol=1e-6)
    nx.grad(lambda w: f(w, 2.0).sin())(w)  # another structure: recorded
    assert plan._S.recordings == rec + 1


@pytest.mark.parametrize("seed", range(20))
def test_realization_structure_keys_compare_as_their_parts(seed):
    """realize.StructureKey (flat when compiled, nested in pure Python) is equal to another
    exactly when their parts are, hashes alike when equal, and reads as its parts (unpacking,
    indexing: the compiler and the recompile report use them)."""
    from nablax.core import realize

    rng = random.Random(seed)
    for _ in range(20):
        a = tuple(_random_key(rng) for _ in range(4))
        b = _mutate(rng, a) if rng.random() < 0.8 else tuple(_random_key(rng) for _ in range(4))
        if type(b) is not tuple or len(b) != 4 or "nan" in repr((a, b)):
            continue
        ka, kb = realize.StructureKey(a), realize.StructureKey(b)
        assert (ka == kb) == (a == b) and (ka != kb) == (a != b)
        if a == b:
            assert hash(ka) == hash(kb)
        assert tuple(ka) == a and ka[0] == a[0] and len(ka) == 4
        assert ka != a  # never equal to a plain tuple: the program cache holds keys only


def test_a_cache_hit_never_makes_the_nested_steps(monkeypatch):
    """Compiled: a realization that hits the program cache compares the steps' flat key only.
    The nested steps are made for a miss (the compiler and the recompile report read them) and
    for the second program of a structure whose scalars changed, and the values are right."""
    from nablax.core import realize

    if not graph.COMPILED:
        pytest.skip("this process runs the pure-Python walks")
    made = []
    orig = realize.StructureKey.with_parts

    def spy(self, seen):
        made.append(self)
        return orig(self, seen)

    monkeypatch.setattr(realize.StructureKey, "with_parts", spy)
    nx.clear_caches()
    ys = [np.linspace(0, 1, 6, dtype=np.float32) + i for i in range(3)]

    def f(y, s):
        return ((nx.tensor(y) * s).sin() + 1).sum().item()

    def ref(y, s):
        return pytest.approx(float(np.sum(np.sin(y * np.float32(s)) + 1)), rel=1e-5)

    assert f(ys[0], 2.0) == ref(ys[0], 2.0)
    assert len(made) == 1 and made[0].parts is not None  # a miss: compiled from the steps
    assert f(ys[1], 2.0) == ref(ys[1], 2.0)
    assert len(made) == 1  # a hit: no steps made
    assert f(ys[2], 3.0) == ref(ys[2], 3.0)  # other scalars: the program that takes them
    assert len(made) == 2
    assert f(ys[0], 4.0) == ref(ys[0], 4.0)
    assert len(made) == 2 and nx.cache_info().compiles == 2


def test_a_program_is_compiled_once_per_structure():
    """The program cache hits for a second graph of the same structure (other input values) and
    misses for another structure: the keys compare through the flat form when compiled."""
    nx.clear_caches()
    f = lambda x: ((x * 2).sin() + 1).sum().item()  # noqa: E731
    f(nx.arange(6.0))
    before = nx.cache_info()
    y = np.linspace(0, 1, 6, dtype=np.float32)
    assert f(nx.tensor(y)) == pytest.approx(float(np.sum(np.sin(y * 2) + 1)), rel=1e-5)
    assert nx.cache_info().compiles == before.compiles  # the same structure: a hit
    assert nx.cache_info().hits == before.hits + 1
    ((nx.tensor(y) * 2).cos() + 1).sum().item()  # another primitive: a new program
    assert nx.cache_info().compiles == before.compiles + 1


def _aliased_ext():
    """External values where one array comes as a Literal and as an earlier program's Var (a
    parameter read through its marker and by the optimizer), another twice as a Var."""
    a, b = np.ones(3, np.float32), np.zeros((2, 2), np.float32)
    computed = Node()
    computed.values, computed.outs = [a, b], (None, None)
    return (
        a,
        b,
        [
            Literal(a, np.dtype(np.float32)),
            Literal(2.0, np.dtype(np.float32), True),
            new_var(Var, (computed, 1)),
            new_var(Var, (computed, 0)),
            Literal(b, np.dtype(np.float32)),
            new_var(Var, (computed, 1)),
        ],
    )


def test_describe_passes_an_array_read_twice_once():
    a, b, ext = _aliased_ext()
    desc, leaves, groups, pos = graph._describe_py(ext, POSITION)
    f32 = np.dtype(np.float32)
    assert desc == [((3,), f32), f32, ((2, 2), f32), 0, 1, 1]
    _same_objects(leaves, [a, b])
    assert list(groups) == [f32] and groups[f32] == [2.0] and pos == []


@needs_c
def test_describe_passes_an_array_read_twice_once_compiled():
    _a, _b, ext = _aliased_ext()
    desc_py, leaves_py, groups_py, _ = graph._describe_py(ext, POSITION)
    desc_c, leaves_c, groups_c, _ = _graphc.describe(ext, POSITION)
    assert desc_c == desc_py
    _same_objects(leaves_c, leaves_py)
    assert groups_c == groups_py
