"""Helpers for differentiation rules, shared by the op families.

Rule signatures (``params`` is the node's static tuple; lists have one entry per input/output):

- ``jvp(params, tangents, primals, outs) -> tangents_out``
- ``vjp(params, cts, primals, outs) -> cts_in``

``primals``/``outs`` are Tensors (a Python scalar for a weakly typed scalar operand); a ``None``
tangent or cotangent means zero. Rules are written with nablax ops, so derivatives are lazy graphs
that can be differentiated again.

``rules=derived_from_jax`` gives a primitive rules by asking JAX for the derivative of its lowering:
the rule binds a new nablax primitive (``vjp[name]``/``jvp[name]``) whose lowering is ``jax.vjp``/
``jax.jvp`` of the original lowering, and whose own rules are derived the same way, so any order
works. The shape, reduce, index and linalg families have native rules; ``einsum`` keeps the derived
rule only for specs that repeat a label within one operand (diagonals, traces), and it remains the
quick way to give a new primitive correct derivatives.
"""

from __future__ import annotations

import jax

from ..build import TensorImpl, bind
from ..primitive import Primitive, RuleFactory, derived, zero_jvp, zero_vjp
from ..tensor import Tensor, to_impl
from ._batch import vmap_rule
from ._shard import replicated


def is_float_tensor(x) -> bool:
    return isinstance(x, Tensor) and (x.dtype.kind in "fc" or x.dtype == jax.numpy.bfloat16)


def unbroadcast(ct: Tensor, shape: tuple) -> Tensor:
    """Sum ``ct`` over the axes NumPy broadcasting added or stretched to reach ``ct.shape``."""
    if ct.shape == shape:
        return ct
    lead = len(ct.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and ct.shape[lead + i] != 1
    )
    out = ct.sum(axis=axes) if axes else ct
    return out.reshape(shape) if out.shape != shape else out


def cast_like(ct: Tensor, x) -> Tensor:
    """``ct`` in ``x``'s dtype (a mixed-precision input gets its cotangent in its own dtype)."""
    return ct if ct.dtype == x.dtype else ct.astype(x.dtype)


# Outputs that are integers, indices or random bits: zero derivative, as in JAX
# (``primitive(..., **NONDIFFERENTIABLE)``).
NONDIFFERENTIABLE = {"jvp": zero_jvp, "vjp": zero_vjp}


def linear(transpose) -> RuleFactory:
    """Rules of a primitive linear in its (only) tensor input: jvp applies it to the tangent,
    vjp applies ``transpose(params, ct, x)`` (``primitive(..., rules=linear(transpose))``)."""

    def rules(prim: Primitive) -> dict:
        def jvp(params, tangents, primals, outs):
            t = tangents[0]
            if t is None:
                return [None]
            return [Tensor._wrap(bind(prim, [t._impl], params)[0])]

        def vjp(params, cts, primals, outs):
            if cts[0] is None or not is_float_tensor(primals[0]):
                return [None]
            return [transpose(params, cts[0], primals[0])]

        return {"jvp": jvp, "vjp": vjp}

    return rules


# ---- rules derived from JAX ------------------------------------------------------------------


def _operand_impls(primals) -> list[TensorImpl]:
    return [x._impl if isinstance(x, Tensor) else to_impl(x) for x in primals]


def _restricted(prim: Primitive, params, primals: list, diff_in: tuple, diff_out: tuple):
    """``prim``'s lowering as a function of the inputs ``diff_in`` only (the others fixed to
    ``primals``), returning the outputs ``diff_out``: what jax.vjp / jax.jvp differentiate."""

    def f(*d):
        full = list(primals)
        for i, v in zip(diff_in, d):
            full[i] = v
        out = prim.lower(params, *full)
        outs = out if prim.multiple_results else (out,)
        return tuple(outs[j] for j in diff_out)

    return f


class _jax_derivative:
    """Turns an assertion JAX trips while differentiating ``prim``'s lowering (its internals, not
    the values: e.g. a Pallas kernel's ``pallas_call`` under a second derivative) into a
    NotImplementedError that names the primitive and the way out."""

    __slots__ = ("prim", "what", "params")

    def __init__(self, prim: Primitive, what: str, params) -> None:
        self.prim, self.what, self.params = prim, what, params

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None and issubclass(kind, AssertionError):
            detail = f": {exc}" if str(exc) else ""
            ps = self.params if type(self.params) is tuple else (self.params,)
            call = next((f" ({p!r})" for p in ps if hasattr(p, "kernel")), "")  # a kernel's call
            raise NotImplementedError(
                f"nablax: JAX could not take the {self.what} of {self.prim.name}{call}'s lowering (an "
                f"assertion inside JAX{detail}), as happens with a Pallas kernel under a second "
                f"derivative. Fix: take this derivative through an implementation written in JAX "
                f"operations (nablax's attention: AttentionCfg(impl='xla'), or the default off a "
                f"GPU)"
            ) from exc


def vjp_prim(prim: Primitive, diff_in: tuple, diff_out: tuple) -> Primitive:
    """The derived primitive ``vjp[name]``: inputs ``prim``'s primals then the cotangents of its
    outputs ``diff_out``; outputs the cotangents of its inputs ``diff_in`` (``jax.vjp`` of the
    lowering). Its params are ``(prim's params,)``."""
    return derived(
        ("vjp", prim, diff_in, diff_out), lambda: _make_vjp_prim(prim, diff_in, diff_out)
    )


def _make_vjp_prim(prim: Primitive, diff_in: tuple, diff_out: tuple) -> Primitive:
    n_ct = len(diff_out)

    def aval(params, *avals):
        return tuple(avals[i] for i in diff_in)

    def lower(params, *xs):
        inner = params[0]
        primals, cts = list(xs[:-n_ct]), xs[-n_ct:]
        f = _restricted(prim, inner, primals, diff_in, diff_out)
        with _jax_derivative(prim, "VJP", inner):
            _, pull = jax.vjp(f, *[primals[i] for i in diff_in])
            return tuple(pull(tuple(cts)))

    def shard(params, in_layouts, in_avals, out_avals):
        return tuple(in_layouts[i] for i in diff_in)  # a cotangent is laid out as its primal

    return Primitive(
        f"vjp[{prim.name}]", aval, lower, multiple_results=True, rules=derived_from_jax, shard=shard
    )


def _jvp_prim(prim: Primitive, diff_in: tuple, diff_out: tuple) -> Primitive:
    return derived(
        ("jvp", prim, diff_in, diff_out), lambda: _make_jvp_prim(prim, diff_in, diff_out)
    )


def _make_jvp_prim(prim: Primitive, diff_in: tuple, diff_out: tuple) -> Primitive:
    n_t = len(diff_in)

    def aval(params, *avals):
        outs = prim.abstract_eval(params[0], *avals[:-n_t])
        return tuple(outs[j] for j in diff_out)

    def lower(params, *xs):
        inner = params[0]
        primals, tans = list(xs[:-n_t]), xs[-n_t:]
        f = _restricted(prim, inner, primals, diff_in, diff_out)
        with _jax_derivative(prim, "JVP", inner):
            _, t_out = jax.jvp(f, tuple(primals[i] for i in diff_in), tuple(tans))
            return tuple(t_out)

    def shard(params, in_layouts, in_avals, out_avals):
        # a tangent is laid out as its primal output: the original rule on the primal inputs
        if prim.shard is None:
            return replicated(params, in_layouts, in_avals, out_avals)
        avals = in_avals[:-n_t]
        outs = prim.shard(
            params[0], in_layouts[:-n_t], avals, prim.abstract_eval(params[0], *avals)
        )
        return tuple(outs[j] for j in diff_out)

    return Primitive(
        f"jvp[{prim.name}]", aval, lower, multiple_results=True, rules=derived_from_jax, shard=shard
    )


def _float_outputs(outs) -> tuple:
    return tuple(j for j, o in enumerate(outs) if is_float_tensor(o))


def derived_from_jax(prim: Primitive) -> dict:
    """Rules of ``prim`` derived from JAX's derivative of its lowering (``primitive(...,
    rules=derived_from_jax)``); batching through ``jax.vmap`` of the lowering and a replicated
    sharding unless the record gives its own. The derived ``vjp[...]``/``jvp[...]`` primitives lay
    a cotangent out as its primal input, a tangent as its primal output."""

    def vjp(params, cts, primals, outs):
        diff_in = tuple(i for i, x in enumerate(primals) if is_float_tensor(x))
        diff_out = tuple(j for j, c in enumerate(cts) if c is not None and is_float_tensor(outs[j]))
        res = [None] * len(primals)
        if not diff_in or not diff_out:
            return res
        dp = vjp_prim(prim, diff_in, diff_out)
        cts_in = [cast_like(cts[j], outs[j])._impl for j in diff_out]
        for i, r in zip(diff_in, bind(dp, _operand_impls(primals) + cts_in, (params,))):
            res[i] = Tensor._wrap(r)
        return res

    def jvp(params, tangents, primals, outs):
        diff_in = tuple(
            i
            for i, (x, t) in enumerate(zip(primals, tangents))
            if t is not None and is_float_tensor(x)
        )
        diff_out = _float_outputs(outs)
        res = [None] * len(outs)
        if not diff_in or not diff_out:
            return res
        jp = _jvp_prim(prim, diff_in, diff_out)
        tans = [cast_like(tangents[i], primals[i])._impl for i in diff_in]
        for j, r in zip(diff_out, bind(jp, _operand_impls(primals) + tans, (params,))):
            res[j] = Tensor._wrap(r)
        return res

    return {"jvp": jvp, "vjp": vjp, "batch": vmap_rule(prim), "shard": replicated}
