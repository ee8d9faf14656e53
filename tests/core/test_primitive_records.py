"""Every primitive is one frozen record, created with all of its rules in one module (issue 17,
point 3): no module attaches a rule later, and the rules a record holds are written in the module
that creates it or in the shared rule builders of ``nablax.core.prims``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nablax  # noqa: F401  (registers every primitive)
from nablax.core.primitive import REGISTRY, Primitive

SRC = Path(__file__).resolve().parents[2] / "src" / "nablax"
RULE_KINDS = ("jvp", "vjp", "batch", "shard")
SHARED = {
    "nablax.core.prims._rules",  # linear(...), derived_from_jax, NONDIFFERENTIABLE
    "nablax.core.prims._batch",  # elementwise / unary / jax.vmap batch rules
    "nablax.core.prims._shard",  # sharding rules shared by families
    "nablax.core.primitive",  # zero_jvp / zero_vjp (the zero derivative, NONDIFFERENTIABLE)
}


def test_records_are_frozen():
    p = REGISTRY["exp"]
    with pytest.raises(AttributeError, match="frozen record"):
        p.jvp = None
    with pytest.raises(AttributeError, match="frozen record"):
        p.batch = lambda *a: None
    assert REGISTRY["exp"].jvp is not None


def test_no_module_attaches_rules_after_creation():
    """No assignment ``<anything>.jvp = ...`` (or vjp/batch/shard) anywhere in src/nablax."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                for e in ast.walk(t):
                    if isinstance(e, ast.Attribute) and e.attr in RULE_KINDS:
                        found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    assert not found, "rules must be given to primitive(...):\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_rules_written_beside_the_record(name):
    p = REGISTRY[name]
    assert p.module.startswith("nablax."), p.module
    for kind in RULE_KINDS:
        rule = getattr(p, kind)
        if rule is None:
            continue
        where = getattr(rule, "__module__", None)
        assert where == p.module or where in SHARED, (
            f"{name}.{kind} is written in {where}, not beside the record in {p.module}"
        )


def test_array_primitives_live_in_prims():
    """The array primitives are in the prims layer; the others belong to one transform each
    (as JAX's custom_vjp_call_p and pjit_p do)."""
    outside = {
        n: p.module for n, p in REGISTRY.items() if not p.module.startswith("nablax.core.prims.")
    }
    assert outside == {
        "cf_pullback": "nablax.core.transforms.control_flow.residuals",
        "checkpoint": "nablax.core.transforms.control_flow.primitives",
        "compile_input": "nablax.core.transforms.staging",
        "cond": "nablax.core.transforms.control_flow.primitives",
        "custom_vjp_call": "nablax.core.transforms.custom",
        "decr_batch_dims": "nablax.core.transforms.vmap",
        "dimension_value": "nablax.core.build",
        "incr_batch_dims": "nablax.core.transforms.vmap",
        "kernel_call": "nablax.core.ops.kernel_call",
        "scan": "nablax.core.transforms.control_flow.primitives",
        "shard_map_call": "nablax.core.transforms.shard_map",
        "sharding_constraint": "nablax.core.sharding",
        "trace_input": "nablax.core.transforms.trace",
        "while_loop": "nablax.core.transforms.control_flow.primitives",
    }


def test_rule_factory_given_rule_wins_and_unknown_kind_raises():
    def mine(params, tangents, primals, outs):
        return [None]

    p = Primitive(
        "test_only",
        lambda params, x: (x,),
        lambda params, x: x,
        jvp=mine,
        rules=lambda prim: {"jvp": None, "batch": ("made for", prim.name)},
    )
    assert p.jvp is mine and p.batch == ("made for", "test_only")
    assert p.module == __name__
    with pytest.raises(TypeError, match="unknown rule kind 'transpose'"):
        Primitive(
            "bad",
            lambda params, x: (x,),
            lambda params, x: x,
            rules=lambda prim: {"transpose": mine},
        )


def test_every_record_is_registered_or_derived_through_the_store():
    """``Primitive(...)`` is called only by ``primitive()`` (the registry) and by the ``_make_*``
    factories that ``primitive.derived`` calls (the bounded store of derived records): no record
    lives in a private dict that the registry-generated tests never see."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "primitive.py" and path.parent.name == "core":
            continue
        tree = ast.parse(path.read_text())
        makers = [
            (n.lineno, n.end_lineno or n.lineno)
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name.startswith("_make_")
        ]
        for call in ast.walk(tree):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "Primitive"
            ):
                continue
            if not any(lo <= call.lineno <= hi for lo, hi in makers):
                bad.append(f"{path.relative_to(SRC.parent)}:{call.lineno}")
    assert not bad, "Primitive(...) outside primitive() and derived()'s factories: " + str(bad)
