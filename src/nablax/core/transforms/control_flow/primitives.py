"""The control-flow primitives: ``cond``, ``while_loop``, ``scan`` and ``checkpoint``, each one
record whose lowering is the matching ``jax.lax`` function of its staged bodies and whose rules are
JAX's derivatives of that lowering (after the checks that make them sound), plus the helper that
adds a ``cond``/``scan`` node with the residuals its backward pass needs (residuals.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ...graph import Literal
from ...primitive import primitive
from ...prims._rules import derived_from_jax, is_float_tensor
from ..subprogram import Body
from .residuals import Residuals, residuals_for, vjp_from_residuals, with_residuals
from .stage import add_node, fname, needs_residuals

# ---- the primitives ----------------------------------------------------------------------------


def _custom_inside(bodies) -> str | None:
    """The name of a custom_vjp function staged in ``bodies`` (nested bodies included), if any:
    JAX's derivative of the lowering would not call its ``bwd``."""
    for b in bodies:
        for step in b.steps:
            if step[0].name == "custom_vjp_call":
                return fname(step[1][2].obj.fn.fun)
            found = _custom_inside(_bodies(step[1]))
            if found:
                return found
    return None


def _bodies(params) -> list:
    return [p for p in params if isinstance(p, Body)] + [
        q for p in params if isinstance(p, tuple) for q in p if isinstance(q, Body)
    ]


def _rules(kind: str, reverse: bool = True):
    """JAX-derived rules, after the checks that make them sound for ``kind``."""

    def factory(prim) -> dict:
        base = derived_from_jax(prim)

        def check(params, mode):
            name = _custom_inside(_bodies(params))
            if name is not None:
                raise NotImplementedError(
                    f"nx.{kind}: differentiating through the custom_vjp function {name} inside "
                    f"nx.{kind} is not supported yet (its bwd would not be used). Fix: call it "
                    f"outside the {kind}, or differentiate the plain function"
                )

        def vjp(params, cts, primals, outs):
            if any(c is not None for c in cts) and any(is_float_tensor(p) for p in primals):
                if not reverse:
                    raise ValueError(
                        "nx.while_loop: reverse-mode differentiation (nx.grad, nx.vjp, "
                        "backward()) does not work through nx.while_loop, whose trip count is "
                        "only known at run time (as in JAX). Fix: use nx.fori_loop with "
                        "Python-int bounds or nx.scan with a fixed length, or forward mode "
                        "(nx.jvp, nx.jacfwd)"
                    )
                check(params, "vjp")
            if isinstance(params[-1], Residuals):  # built with its residuals
                got = vjp_from_residuals(params, cts, primals, outs)
                if got is not None:
                    return got
            return base["vjp"](params, cts, primals, outs)

        def jvp(params, tangents, primals, outs):
            if any(t is not None for t in tangents):
                check(params, "jvp")
            return base["jvp"](params, tangents, primals, outs)

        return {"vjp": vjp, "jvp": jvp, "batch": base["batch"], "shard": base["shard"]}

    return factory


def split_counts(xs, counts):
    out, k = [], 0
    for n in counts:
        out.append(tuple(xs[k : k + n]))
        k += n
    return out


def control_node(prim, base: tuple, refs, bshapes, in_avals, out_avals) -> list:
    """Add a scan/cond node (``base`` parameters); under a differentiation trace it also
    outputs the residuals its backward pass needs (residuals.py), which are not returned."""
    res = None
    if needs_residuals(refs):
        constant = [type(r) is Literal and r.is_scalar for r in refs]
        res = residuals_for(prim, base + (None,), in_avals, constant)
    avals = list(out_avals) + (list(res.avals) if res is not None else [])
    return add_node(prim, base + (res,), refs, bshapes, avals)[: len(out_avals)]


def res_avals(params) -> tuple:
    return params[-1].avals if params[-1] is not None else ()


def _cond_lower(params, index, *xs):
    bodies, counts = params[:2]
    segs = split_counts(xs, counts)
    if index.dtype == jnp.bool_:
        index = index.astype(jnp.int32)
    branches = [(lambda s, b=b, k=k: tuple(b.run(s[k]))) for k, b in enumerate(bodies)]
    return tuple(lax.switch(index, branches, segs))


cond_p = primitive(
    "cond",
    lambda params, *avals: tuple(params[0][0].out_avals) + res_avals(params),
    with_residuals(_cond_lower),
    rules=_rules("cond"),
    multiple_results=True,
    doc="One nx.cond / nx.switch call: the index, then each branch's inputs (lax.switch); "
    "under a differentiation trace, residual outputs follow.",
)


def _while_lower(params, *xs):
    cb, bb, nc, ncc = params
    cc, bc = tuple(xs[nc : nc + ncc]), tuple(xs[nc + ncc :])
    return tuple(
        lax.while_loop(lambda c: cb.run(c + cc)[0], lambda c: tuple(bb.run(c + bc)), tuple(xs[:nc]))
    )


while_p = primitive(
    "while_loop",
    lambda params, *avals: tuple(avals[: params[2]]),
    _while_lower,
    rules=_rules("while_loop", reverse=False),
    multiple_results=True,
    doc="One nx.while_loop call: the carry, then cond_fun's and body_fun's inputs.",
)


def scan_abstract(params, *avals):
    b, nc, _, length = params[:4]
    ys = tuple(((length,) + tuple(s), d) for s, d in b.out_avals[nc:])
    return tuple(b.out_avals[:nc]) + ys + res_avals(params)


def _scan_lower(params, *xs):
    b, nc, nxs, length, reverse, unroll = params[:6]
    consts = tuple(xs[nc + nxs :])

    def step(c, x):
        out = b.run(c + x + consts)
        return tuple(out[:nc]), tuple(out[nc:])

    c, ys = lax.scan(step, tuple(xs[:nc]), tuple(xs[nc : nc + nxs]), length, reverse, unroll)
    return tuple(c) + tuple(ys)


scan_p = primitive(
    "scan",
    scan_abstract,
    with_residuals(_scan_lower),
    rules=_rules("scan"),
    multiple_results=True,
    doc="One nx.scan / nx.fori_loop call: the carry, the scanned xs, then the body's inputs; "
    "under a differentiation trace, residual outputs follow.",
)


def _checkpoint_lower(params, *xs):
    body, prevent_cse = params
    return tuple(jax.checkpoint(lambda *a: tuple(body.run(a)), prevent_cse=prevent_cse)(*xs))


checkpoint_p = primitive(
    "checkpoint",
    lambda params, *avals: tuple(params[0].out_avals),
    _checkpoint_lower,
    rules=_rules("checkpoint"),
    multiple_results=True,
    doc="One call of an nx.checkpoint function (checkpoint.py): its body, recomputed in the "
    "backward pass (jax.checkpoint).",
)
