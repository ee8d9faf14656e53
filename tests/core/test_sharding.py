"""Sharding (API.md §5). The multi-device checks run in a fresh process with 8 virtual CPU devices
(``tests/core/sharding_cases.py``): XLA_FLAGS must be set before JAX starts, so they cannot run in
this process. In-process tests use the one real device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nablax as nx


def test_eight_virtual_devices_data_and_tensor_parallel():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    script = Path(__file__).with_name("sharding_cases.py")
    r = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("data_parallel_mlp_step", "tensor_parallel_matmul", "errors"):
        assert f"ok {name}" in r.stdout


def test_one_device_mesh_shard_and_shard_map():
    mesh = nx.DeviceMesh((1,), ("dp",))
    x = nx.tensor(np.arange(8, dtype=np.float32).reshape(4, 2))
    xs = x.shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    assert xs.sharding == nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    f = nx.shard_map(lambda a: (a * 2).sum(0), mesh)
    assert f(xs).tolist() == [24.0, 32.0]
    with pytest.raises(ValueError, match="rank"):
        x.shard(mesh, [nx.DimSpec(["dp"])])


# ---- the sharding rules, generated from the registry and the op table ----------------------------

try:
    from . import op_specs as S
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    import op_specs as S

from nablax.core.primitive import REGISTRY  # noqa: E402
from nablax.core.sharding import infer_plan  # noqa: E402
from nablax.core.transforms.staging import make_placeholder, trace_graph  # noqa: E402


def test_every_primitive_has_a_sharding_rule():
    missing = sorted(n for n, p in REGISTRY.items() if p.shard is None)
    assert not missing, f"primitives without a shard rule: {missing}"


def _plan_of(fn, arrays, layouts, mesh):
    made = [make_placeholder(nx.tensor(a), k) for k, a in enumerate(arrays)]
    nodes = [n for n, _ in made]
    out = trace_graph(fn, [t for _, t in made], nodes)
    outs = S.outputs(out)
    return outs, infer_plan([o._impl for o in outs], nodes, layouts, mesh)


@pytest.mark.parametrize("spec", [s for s in S.SPECS if s.lazy], ids=lambda s: s.name)
def test_rules_give_valid_layouts_for_every_op(spec):
    """Every op of the table, its array arguments split along dimension 0: each output gets a
    layout of its rank that names only mesh axes, each at most once."""
    mesh = nx.DeviceMesh((1,), ("dp",))
    case = spec.cases(spec.dtypes[0])[0]
    slots = [k for k, a in enumerate(case.args) if isinstance(a, np.ndarray)]
    if not slots:
        pytest.skip("no array argument")

    def fn(*ts):
        args = list(S.to_nx(case.args))
        for k, t in zip(slots, ts):
            args[k] = t
        return spec.fn(*args, **S.to_nx(case.kwargs))

    arrays = [case.args[k] for k in slots]
    layouts = [(("dp",),) + ((),) * (a.ndim - 1) if a.ndim else () for a in arrays]
    outs, plan = _plan_of(fn, arrays, layouts, mesh)
    for o, lay in zip(outs, plan):
        assert len(lay) == o.ndim, (spec.name, lay, o.shape)
        named = [a for axes in lay for a in axes]
        assert set(named) <= {"dp"} and len(named) == len(set(named)), lay


def test_inferred_plans_follow_the_rules():
    mesh = nx.DeviceMesh((1, 1), ("dp", "tp"))
    a, b = np.ones((4, 6), np.float32), np.ones((6, 8), np.float32)
    row, col = (("dp",), ()), ((), ("tp",))
    cases = [
        (lambda x, y: x @ y, [row, col], [(("dp",), ("tp",))]),  # matmul: rows x columns
        (lambda x, y: x @ y, [((), ("tp",)), (("tp",), ())], [((), ())]),  # contracted: summed
        (lambda x, y: (nx.exp(x) * 2).T, [row, col], [((), ("dp",))]),  # transpose
        (lambda x, y: x.sum(axis=1), [row, col], [(("dp",),)]),  # reduction drops the dim
        (lambda x, y: x.sum(axis=0), [row, col], [((),)]),
        (lambda x, y: x + x[0], [row, col], [(("dp",), ())]),  # broadcasting
        (lambda x, y: x.reshape(4, 3, 2), [row, col], [(("dp",), (), ())]),  # prefix kept
        (lambda x, y: nx.concatenate([x, x], axis=0), [row, col], [((), ())]),
        (lambda x, y: nx.sort(x, axis=0), [row, col], [((), ())]),
        (lambda x, y: x[:, 1:], [row, col], [(("dp",), ())]),  # sliced dim replicated
        (lambda x, y: x.at[1].set(0.0), [row, col], [(("dp",), ())]),  # scatter: the operand's
        # vmap: the mapped dimension becomes a batch axis (unsharded), the others keep theirs
        (lambda x, y: nx.vmap(lambda r: r * 2, in_axes=1)(x), [row, col], [((), ("dp",))]),
        (lambda x, y: nx.vmap(nx.exp)(x), [row, col], [((), ())]),
    ]
    for fn, lays, want in cases:
        _, plan = _plan_of(fn, [a, b], lays, mesh)
        assert plan == want, (lays, plan, want)


def test_fused_cross_entropy_and_its_derived_backward_keep_a_split_batch():
    """cross_entropy is one node whose backward is one derived ``vjp[...]`` node: the unreduced
    loss keeps the logits' batch split, and the logits' cotangent is laid out as the logits (a
    replicated proposal would make XLA gather the batch onto every device each step)."""
    mesh = nx.DeviceMesh((1, 1), ("dp", "tp"))
    F = nx.nn.functional
    logits = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    labels = nx.tensor(np.arange(8, dtype=np.int32) % 5)
    rows = (("dp",), ())
    _, plan = _plan_of(
        lambda z: F.cross_entropy(z, labels, reduction="none"), [logits], [rows], mesh
    )
    assert plan == [(("dp",),)]
    _, plan = _plan_of(
        lambda z: nx.grad(lambda z: F.cross_entropy(z, labels))(z), [logits], [rows], mesh
    )
    assert plan == [rows]
    # forward mode: the tangent is laid out as the primal output
    jvp = lambda z: nx.jvp(lambda z: F.cross_entropy(z, labels, reduction="none"), (z,), (z,))[1]
    _, plan = _plan_of(jvp, [logits], [rows], mesh)
    assert plan == [(("dp",),)]


def test_in_specs_none_replicates_and_unmentioned_arguments_keep_their_sharding():
    mesh = nx.DeviceMesh((1,), ("dp",))
    rows = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    xs = nx.ones((4, 2)).shard(mesh, rows)
    keep = nx.shard_map(lambda x: x * 2, mesh)(xs)
    assert keep.sharding == rows  # not mentioned: its own sharding, propagated
    rep = nx.shard_map(lambda x: x * 2, mesh, in_specs={0: None})(xs)
    assert rep.sharding.dims == [nx.DimSpec([]), nx.DimSpec([])]  # None: replicated
    assert rep.tolist() == keep.tolist() == [[2.0, 2.0]] * 4


# ---- Tensor.shard on pending tensors and the intrinsic .sharding (one device) ---------------------

MESH1 = nx.DeviceMesh((1,), ("dp",))
ROWS = [nx.DimSpec(["dp"]), nx.DimSpec([])]


def test_sharding_is_none_without_a_mesh_and_propagates_from_sharded_leaves():
    x = nx.tensor(np.arange(8, dtype=np.float32).reshape(4, 2))
    assert x.sharding is None and (x * 2).sum(0).sharding is None
    xs = x.shard(MESH1, ROWS)
    assert xs.is_realized and xs.to_jax().sharding.spec[0] == "dp"  # placed at once
    y = (nx.exp(xs) * 2).sum(axis=1)  # pending: the plan shard_map would infer
    assert not y.is_realized and y.sharding == nx.ShardingSpec(MESH1, [nx.DimSpec(["dp"])])
    assert nx.split(xs, 2)[0].sharding.dims == [nx.DimSpec([]), nx.DimSpec([])]
    z = xs.T @ xs
    assert z.sharding.dims == [nx.DimSpec([]), nx.DimSpec([])]
    np.testing.assert_allclose(y.numpy(), (np.exp(x.numpy()) * 2).sum(1), rtol=1e-6)
    # realized: where XLA put the data (on one device it says "replicated")
    assert y.sharding == nx.ShardingSpec.from_named(MESH1, y.to_jax().sharding, 1)


def test_shard_of_a_pending_tensor_is_a_lazy_differentiable_node():
    x = nx.tensor(np.arange(8, dtype=np.float32).reshape(4, 2))
    y = (x * 3).shard(MESH1, ROWS)
    assert not y.is_realized and y.sharding == nx.ShardingSpec(MESH1, ROWS)
    assert y.tolist() == (x.numpy() * 3).tolist()
    g = nx.grad(lambda t: (t.shard(MESH1, ROWS) ** 2).sum())(x)
    assert g.tolist() == (2 * x.numpy()).tolist()  # the placement does not cut the gradient
    # under vmap: the spec is for the logical dimensions, the batch axis is not split
    seen = []

    def per_row(r):
        out = (r + 1).shard(MESH1, [nx.DimSpec(["dp"])])
        seen.append(out.sharding)
        return out

    v = nx.vmap(per_row)(x)
    assert v.tolist() == (x.numpy() + 1).tolist()
    assert seen == [nx.ShardingSpec(MESH1, [nx.DimSpec(["dp"])])]
    with pytest.raises(ValueError, match="rank"):
        nx.vmap(lambda r: r.shard(MESH1, ROWS))(x)  # logical rank 1


def test_shard_map_is_one_lazy_node_recorded_by_compile():
    import warnings

    rows = nx.ShardingSpec(MESH1, ROWS)
    f = nx.shard_map(lambda a, b: (a @ b, a.sum()), MESH1, in_specs={0: rows})
    a, b = nx.ones((4, 3)), nx.ones((3, 2))
    y, s = f(a, b)
    assert not y.is_realized and y._impl.src[0] is s._impl.src[0]
    assert y._impl.src[0].prim.name == "shard_map_call"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cf = nx.compile(f)
        for _ in range(2):
            y2, s2 = cf(a, b)
    assert y2.tolist() == [[3.0, 3.0]] * 4 and s2.item() == 12.0
    assert cf.cache_info().traces == 1


def test_shard_map_errors_name_the_argument():
    rows = nx.ShardingSpec(MESH1, ROWS)
    x = nx.ones((4, 2))
    with pytest.raises(ValueError, match=r"in_specs for args\[0\]\['w'\].*rank"):
        nx.shard_map(lambda p: p["w"], MESH1, in_specs={0: {"w": nx.ShardingSpec(MESH1, [])}})(
            {"w": x}
        )
    with pytest.raises(TypeError, match="keyword"):
        nx.shard_map(lambda x: x, MESH1)(x=x)
    with pytest.raises(ValueError, match=r"out_specs for output\[1\]"):
        nx.shard_map(lambda x: (x, x.sum()), MESH1, out_specs=(rows, rows))(x)
    with pytest.raises(nx.errors.GraphBreakError, match="nx.shard_map"):
        nx.shard_map(lambda x: x * float(x.sum()), MESH1)(x)
