"""Values, dtypes and shapes of every public op, generated from the spec table in ``op_specs.py``,
plus the registry checks: every primitive is exercised, and every primitive's shape/dtype rule agrees
with ``jax.eval_shape`` of its lowering."""

from __future__ import annotations

import functools
import pathlib
import warnings
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core.graph import SCALAR_TYPES, Literal, Var, toposort
from nablax.core.primitive import REGISTRY

SRC_ROOT = pathlib.Path(__file__).resolve().parents[2]

try:
    from . import op_specs as S
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    import op_specs as S


def _params():
    out = []
    for spec in S.SPECS:
        for dt in spec.dtypes:
            for i, case in enumerate(spec.cases(dt)):
                label = f"-{case.label}" if case.label else ""
                marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
                pid = f"{spec.name}-{dt}-{i}{label}"
                out.append(pytest.param(spec, dt, case, id=pid, marks=marks))
    return out


VALUE_PARAMS = _params()


def _realizations() -> int:
    return nx.cache_info().realizations


def _build(spec, case):
    return spec.fn(*S.to_nx(case.args), **S.to_nx(case.kwargs))


@pytest.mark.parametrize("spec,dt,case", VALUE_PARAMS)
def test_matches_reference(spec, dt, case):
    before = _realizations()
    out = _build(spec, case)
    if spec.lazy:
        assert _realizations() == before, f"{spec.name}: building the op realized something"
    ref = spec.ref(*S.to_jnp(case.args), **S.to_jnp(case.kwargs))
    outs, refs = S.outputs(out), S.outputs(ref)
    assert len(outs) == len(refs), f"{spec.name}: {len(outs)} outputs, reference has {len(refs)}"
    assert all(isinstance(o, nx.Tensor) for o in outs), [type(o) for o in outs]
    # shape and dtype are known when the op is built, before any value exists
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == tuple(r.shape), f"output {k}: shape {o.shape} != reference {r.shape}"
        assert o.dtype == r.dtype, f"output {k}: dtype {o.dtype} != jax.numpy's {r.dtype}"
    nx.realize(*outs)
    for k, (o, r) in enumerate(zip(outs, refs)):
        v = o.numpy()
        assert v.dtype == r.dtype and v.shape == tuple(r.shape), (k, v.dtype, v.shape)
        rtol, atol = S.tolerance(r.dtype, spec.tol_scale)
        S.assert_close(v, np.asarray(r), rtol, atol, f"{spec.name} output {k} vs reference")
    if spec.np_ref is not None and dt in (S.F32, S.I32, S.BOOL):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # mean of an empty slice, ...
            nref = S.outputs(spec.np_ref(*S.to_np(case.args), **S.to_np(case.kwargs)))
        assert len(nref) == len(outs)
        for k, (o, r) in enumerate(zip(outs, nref)):
            rtol, atol = S.tolerance(o.dtype, spec.tol_scale)
            r = np.asarray(r)
            if (
                o.dtype.kind == "b" and r.dtype.kind != "b"
            ):  # NumPy keeps 0/1 ints where jnp has bool
                r = r.astype(bool)
            S.assert_close(o.numpy(), r, rtol, atol, f"{spec.name} output {k} vs NumPy")


def _graph_nodes(out) -> list:
    roots = [
        t._impl.src[0] for t in S.outputs(out) if isinstance(t, nx.Tensor) and not t.is_realized
    ]
    return toposort(roots)


def test_every_primitive_is_covered():
    covered = S.primitives_covered()
    for name, where in S.STAGING_ONLY.items():
        assert name in REGISTRY and (SRC_ROOT / where).read_text().count(f'"{name}"'), (name, where)
    missing = sorted(set(REGISTRY) - covered - set(S.STAGING_ONLY))
    assert not missing, (
        f"primitives without an OpSpec that exercises them: {missing}. "
        "Add a spec to tests/core/op_specs.py"
    )
    unknown = sorted(covered - set(REGISTRY))
    assert not unknown, f"op_specs names primitives that are not registered: {unknown}"


def test_declared_primitives_are_built():
    """The ``prims`` of each spec are really in the graphs its cases build (keeps the table honest)."""
    bad = []
    for spec in S.SPECS:
        built: set = set()
        for dt in spec.dtypes:
            for case in spec.cases(dt):
                if case.xfail is None:
                    built |= {n.prim.name for n in _graph_nodes(_build(spec, case))}
        if not spec.prims <= built:
            bad.append(
                f"{spec.name}: declares {sorted(spec.prims - built)}, builds {sorted(built)}"
            )
    assert not bad, "\n".join(bad)


# ---- abstract_eval vs the lowering -----------------------------------------------------------


def _aval_of(x):
    return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype))


@functools.cache
def _records() -> dict:
    """prim name -> {(params, input avals): (claimed avals | error, true avals | error, where)}."""
    recs: dict = defaultdict(dict)
    for spec in S.SPECS:
        for dt in spec.dtypes:
            for case in spec.cases(dt):
                _record_graph(_graph_nodes(_build(spec, case)), recs, f"{spec.name}[{dt}]")
    return recs


def _record_graph(nodes, recs, where) -> None:
    true: dict = {}  # node -> list of ShapeDtypeStruct (from the lowering)
    for node in nodes:
        ins = []
        for inp in node.inputs:
            # the graph IR: every node input is a Var or a Literal (see core/graph.py)
            assert type(inp) in (Var, Literal), f"{where}: {node} has an input {inp!r}"
            if type(inp) is Var:
                m, j = inp
                ins.append(true[m][j] if m in true else _aval_of(m.values[j]))
            elif type(inp.value) in SCALAR_TYPES:  # a scalar Literal: materialized in its dtype
                ins.append(jax.ShapeDtypeStruct((), np.dtype(inp.dtype)))
            else:
                ins.append(_aval_of(inp.value))
        prim, params = node.prim, node.params
        bds = node.bdims[0] if node.bdims is not None else None
        key = (params, tuple((s.shape, s.dtype) for s in ins), bds)
        try:
            if bds is None:
                claimed = prim.abstract_eval(params, *[(s.shape, s.dtype) for s in ins])
            else:  # vmap-batched: the rule sees logical shapes; compare physical ones
                logical = [(s.shape[b:], s.dtype) for s, b in zip(ins, bds)]
                claimed = [
                    (node.bdims[1] + tuple(sh), d) for sh, d in prim.abstract_eval(params, *logical)
                ]
        except Exception as e:  # noqa: BLE001 - reported by the test
            claimed = e
        try:
            if bds is None:
                got = jax.eval_shape(functools.partial(prim.lower, params), *ins)
            else:
                got = jax.eval_shape(functools.partial(prim.batch, params, bds), *ins)
            got = list(got) if prim.multiple_results else [got]
        except Exception as e:  # noqa: BLE001 - reported by the test
            got = e
        recs[prim.name].setdefault(key, (claimed, got, where))
        if isinstance(got, Exception):
            if isinstance(claimed, Exception):
                return  # nothing downstream can be checked
            got = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d)) for s, d in claimed]
        true[node] = got


@pytest.mark.parametrize("name", sorted(set(REGISTRY) - set(S.STAGING_ONLY)))
def test_abstract_eval_matches_lowering(name):
    recs = _records().get(name)
    assert recs, f"primitive {name!r} is not built by any OpSpec case"
    bad = []
    for (params, in_avals, _bds), (claimed, got, where) in recs.items():
        if isinstance(claimed, Exception) or isinstance(got, Exception):
            bad.append(f"{where} params={params} in={in_avals}: {claimed!r} / {got!r}")
            continue
        claimed = [(tuple(s), np.dtype(d)) for s, d in claimed]
        true = [(tuple(g.shape), np.dtype(g.dtype)) for g in got]
        if claimed != true:
            bad.append(f"{where} params={params} in={in_avals}: rule {claimed} != lowering {true}")
    assert not bad, "\n".join(bad[:10])


# ---- things the table does not express ---------------------------------------------------------


def test_random_global_key_is_seeded_and_advances():
    nx.random.seed(3)
    a = nx.random.normal(shape=(4,)).numpy()
    b = nx.random.normal(shape=(4,)).numpy()
    nx.random.seed(3)
    a2 = nx.random.normal(shape=(4,)).numpy()
    np.testing.assert_array_equal(a, a2)
    assert not np.array_equal(a, b)
    # the global key is split per call: the sample comes from some split of key(3), not key(3)
    assert not np.array_equal(a, np.asarray(jax.random.normal(jax.random.PRNGKey(3), (4,))))


def test_random_split_unpacks_into_keys():
    k1, k2 = nx.random.split(nx.random.key(5))
    j1, j2 = jax.random.split(jax.random.PRNGKey(5))
    np.testing.assert_array_equal(nx.random.uniform(k2, (3,)).numpy(), jax.random.uniform(j2, (3,)))
    np.testing.assert_array_equal(k1.numpy(), np.asarray(j1))


def test_random_accepts_jax_keys():
    jk = jax.random.key(9)
    got = nx.random.normal(jk, (3,)).numpy()
    np.testing.assert_array_equal(got, jax.random.normal(jax.random.PRNGKey(9), (3,)))


def test_asarray_shares_jax_buffer():
    j = jnp.arange(4.0)
    t = nx.asarray(j)
    assert t.is_realized
    assert t.to_jax().unsafe_buffer_pointer() == j.unsafe_buffer_pointer()


def test_tensor_attributes():
    x = nx.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert (x.shape, x.dtype, x.ndim, x.size) == ((2, 3), nx.float32, 2, 6)
    assert x.is_realized and x.sharding is None
    y = x.T + 1
    assert not y.is_realized and y.shape == (3, 2)
    assert y.tolist() == (np.arange(6).reshape(2, 3).T + 1).tolist() and y.is_realized
    assert nx.tensor(1.5).ndim == 0 and nx.tensor(1.5).size == 1
    assert nx.zeros((0, 4)).size == 0


def test_realization_points_agree():
    x = nx.tensor([[1.0, 2.0], [3.0, 4.0]]) * 2
    s = x.sum()
    assert s.item() == 20.0 and float(s) == 20.0 and int(s) == 20 and bool(s)
    np.testing.assert_array_equal(np.asarray(x), [[2.0, 4.0], [6.0, 8.0]])
    assert [r.tolist() for r in x] == [[2.0, 4.0], [6.0, 8.0]]
    assert "8." in repr(x) and "8." in str(x)
    a, b = x * 3, x + 1
    nx.realize(a, b)
    assert a.is_realized and b.is_realized
    assert a.tolist() == [[6.0, 12.0], [18.0, 24.0]]


def test_realize_runs_one_program():
    x = nx.arange(4.0)
    a, b, c = x * 2, x + 1, (x * 2).sum()
    before = nx.cache_info().realizations
    nx.realize(a, b, c)
    assert nx.cache_info().realizations == before + 1
    assert (a.tolist(), b.tolist(), c.item()) == ([0, 2, 4, 6], [1, 2, 3, 4], 12.0)


def test_reflected_operators_with_numpy_on_the_left_return_tensors():
    x = nx.tensor(np.arange(1, 5, dtype=np.float32))
    a = np.full(4, 2.0, np.float32)
    for r in (a + x, a - x, a * x, a / x, a // x, a % x, a**x, a < x, a == x, a @ x):
        assert isinstance(r, nx.Tensor), type(r)
    i = nx.arange(4)
    m = np.array([1, 2, 3, 4], np.int32)
    for r in (m & i, m | i, m ^ i):
        assert isinstance(r, nx.Tensor), type(r)
    assert (a - x).tolist() == [1.0, 0.0, -1.0, -2.0]


# ---- known bugs (strict xfail: the lead removes the mark with the fix) --------------------------


def test_all_any_of_empty():
    e = np.zeros((0, 3), dtype=bool)
    np.testing.assert_array_equal(nx.all(nx.tensor(e), axis=0).numpy(), np.all(e, axis=0))
    np.testing.assert_array_equal(nx.any(nx.tensor(e), axis=0).numpy(), np.any(e, axis=0))
    assert nx.all(nx.zeros((0,), dtype=nx.bool_)).item() is True
    assert nx.any(nx.zeros((0,), dtype=nx.bool_)).item() is False


def test_log_softmax_large_inputs():
    x = np.array([1000.0, 1000.0, -1000.0], np.float32)
    np.testing.assert_allclose(
        nx.log_softmax(nx.tensor(x)).numpy(), jax.nn.log_softmax(x), rtol=1e-6, atol=1e-6
    )


def test_logsumexp_of_empty():
    got = nx.logsumexp(nx.zeros((0,)))
    assert got.item() == float(jax.nn.logsumexp(jnp.zeros((0,)))) == -np.inf
