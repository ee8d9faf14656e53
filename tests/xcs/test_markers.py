"""xcs markers: nablax's ``mark_*`` (with ``effects=``), the seed's ``_xcs_is_*`` attributes,
seen through wrappers, partials, bound methods and callable objects; how they drive
``classify`` and ``analyze_operations``."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from nablax.xcs.classify.analysis import OperationSummary, analyze_operations, classify, clear_cache
from nablax.xcs.markers import (
    effects_of,
    mark_hybrid,
    mark_orchestration,
    mark_pytree_safe,
    mark_tensor,
    marker_of,
    pytree_safe,
)

# ---- markers --------------------------------------------------------------------------------


def _deco(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class _Model:
    @mark_tensor
    def forward(self, x):
        return x

    def plain(self, x):
        return x


def test_markers_through_wraps_partial_bound_and_objects():
    @_deco
    @_deco
    @mark_orchestration
    def fetch(url, timeout=1.0):
        return url

    assert marker_of(fetch) == "orchestration"
    assert marker_of(functools.partial(fetch, timeout=3)) == "orchestration"
    assert marker_of(_Model().forward) == "tensor" and marker_of(_Model().plain) is None
    bound = mark_hybrid(_Model().plain)  # a bound method takes no attributes: a wrapper does
    assert marker_of(bound) == "hybrid" and bound(3) == 3
    assert marker_of(mark_orchestration(len)) == "orchestration" and marker_of(len) is None

    @mark_hybrid
    class Agent:
        def __call__(self, q):
            return q

    assert marker_of(Agent) == marker_of(Agent()) == "hybrid"
    assert mark_tensor()(lambda x: x).__xcs_kind__ == "tensor"  # @mark_tensor() works too


def test_marker_cycles_and_pytree_flag():
    def f(x):
        return x

    f.__wrapped__ = f  # a cycle must not hang
    assert marker_of(f) is None
    assert pytree_safe(mark_pytree_safe(f)) is True
    assert pytree_safe(mark_pytree_safe(False)(_deco(len))) is False
    assert pytree_safe(_deco(f)) is True  # seen through the wraps chain
    with pytest.raises(TypeError, match=r"xcs.mark_pytree_safe: argument `flag`"):
        mark_pytree_safe("yes")
    with pytest.raises(TypeError, match=r"xcs.mark_tensor: .*must be callable"):
        mark_tensor(3)


def test_markers_override_the_analysis():
    @mark_orchestration
    def sums(x):
        return jnp.sum(x)

    c = classify(sums)
    assert c.kind == "orchestration" and c.reasons[0] == "marked with @mark_orchestration"
    assert classify(mark_tensor(lambda x: jnp.tanh(x))).jax_traceable
    assert not classify(mark_tensor(lambda x: np.tanh(x))).jax_traceable
    assert classify(_deco(mark_hybrid(lambda x: x))).kind == "hybrid"


def test_marking_after_classifying_is_seen():
    def step(x):
        return jnp.tanh(x)

    assert classify(step).kind == "tensor"
    mark_orchestration(step)
    assert classify(step).kind == "orchestration"


# ---- the seed's attributes ------------------------------------------------------------------


def _seeded(**flags):
    def fn(x):
        return jnp.tanh(x)  # the source says tensor: the attributes must win

    for name, value in flags.items():
        setattr(fn, f"_xcs_is_{name}", value)
    return fn


@pytest.mark.parametrize(
    "flags, kind",
    [
        ({"orchestration": True, "tensor": False}, "orchestration"),  # Ember's mark_orchestration
        ({"tensor": True, "orchestration": False}, "tensor"),
        ({"tensor": True, "orchestration": True}, "hybrid"),  # Ember's mark_hybrid
        ({"hybrid": True}, "hybrid"),
        ({"orchestration": True}, "orchestration"),  # set by hand, alone
        ({"tensor": False, "orchestration": False}, "pure"),  # the seed: neutral
    ],
)
def test_seed_attributes_decide_the_kind(flags, kind):
    fn = _seeded(**flags)
    assert marker_of(fn) == kind
    c = classify(fn)
    assert c.kind == kind and c.reasons[0].startswith("marked with @mark_")
    s = analyze_operations(fn)  # the seed reports {"marked"} for the marked kind(s)
    assert s.has_tensor_ops == (kind in ("tensor", "hybrid"))
    assert s.has_orchestration_ops == (kind in ("orchestration", "hybrid"))
    assert set(s.tensor_ops) | set(s.orchestration_ops) <= {"marked"}


def test_seed_attributes_through_wrappers_partials_and_bound_methods():
    def ask(prompt, temperature=0.0):
        return prompt

    ask._xcs_is_orchestration = True

    class Agent:
        def run(self, q):
            return q

    Agent.run._xcs_is_orchestration = True
    assert marker_of(_deco(ask)) == "orchestration"
    assert marker_of(functools.partial(ask, temperature=1.0)) == "orchestration"
    assert classify(Agent().run).kind == "orchestration"
    ours = mark_tensor(_seeded(orchestration=True))  # nablax's own marker is read first
    assert marker_of(ours) == "tensor"


def test_seed_pytree_attribute():
    def f(x):
        return x

    f._xcs_is_pytree_safe = False
    assert pytree_safe(f) is False and pytree_safe(_deco(f)) is False


def test_seed_attribute_set_after_classifying_is_seen():
    def g(x):
        return jnp.tanh(x)

    assert classify(g).kind == "tensor"
    g._xcs_is_orchestration = True  # by hand, no nablax marker: the cache must notice
    assert classify(g).kind == "orchestration"


# ---- effects= -------------------------------------------------------------------------------


def test_effects_keyword_is_recorded_and_seen_through_wrappers():
    @mark_orchestration(effects=True)
    def send(message, channel="ops"):
        return message

    @mark_hybrid(effects=False)
    def score(prompt):
        return prompt

    class Mailer:
        def deliver(self, to):
            return to

    assert (marker_of(send), effects_of(send)) == ("orchestration", True)
    assert effects_of(_deco(send)) is True
    assert effects_of(functools.partial(send, channel="x")) is True
    assert (marker_of(score), effects_of(score)) == ("hybrid", False)
    bound = mark_orchestration(effects=True)(Mailer().deliver)  # a wrapper carries both
    assert marker_of(bound) == "orchestration" and effects_of(bound) is True
    assert bound("a@b.test") == "a@b.test"
    assert effects_of(mark_orchestration(lambda u: u)) is None  # undeclared


def test_declared_effects_win_over_inference():
    @mark_orchestration(effects=False)
    def post_event(event):
        import requests

        return requests.post("https://x.test/events", json=event)  # inferred: effects

    @mark_orchestration(effects=True)
    def quiet(url):
        return url  # inferred: nothing external

    a, b = classify(post_event), classify(quiet)
    assert (a.kind, a.effects) == ("orchestration", False)
    assert a.reasons[-1] == "read-only: declared by @mark_orchestration(effects=False)"
    assert (b.effects, b.reasons[-1]) == (
        True,
        "effects: declared by @mark_orchestration(effects=True)",
    )
    assert classify(functools.partial(quiet, "u")).effects is True  # through a partial


def test_undeclared_marked_effects_are_inferred_from_the_body():
    @mark_orchestration
    def fetch(url):
        import requests

        return requests.get(url).text

    @mark_hybrid
    def store(path, x):
        np.save(path, x)

    assert classify(fetch).effects is False
    assert classify(fetch).reasons[-1].startswith("read-only: calls requests.get")
    assert classify(store).effects is True
    assert classify(mark_orchestration(len)).effects is False  # a builtin without I/O

    outbox: list = []

    @mark_orchestration
    def send_email(body):  # a stand-in: the marker says I/O, the name says it sends
        outbox.append(body)

    @mark_orchestration
    def lookup(key):
        return outbox[key]

    assert classify(send_email).effects is True
    assert classify(send_email).reasons[-1] == (
        "effects: its name send_email says it has effects (`send`)"
    )
    assert classify(lookup).effects is False
    assert classify(mark_tensor(print)).effects is False  # tensor: False unless declared


def test_marker_option_errors_name_the_api_and_fix():
    with pytest.raises(TypeError, match=r"xcs.mark_orchestration: argument `effects` .*Fix"):
        mark_orchestration(effects="yes")
    with pytest.raises(TypeError, match=r"xcs.mark_tensor: unexpected keyword .*effects.*Fix"):
        mark_tensor(effects=True)
    with pytest.raises(TypeError, match=r"xcs.mark_hybrid: unexpected keyword argument `speed`"):
        mark_hybrid(speed=3)


def test_analyze_operations_of_marked_functions():
    @mark_orchestration
    def ask(prompt):
        return jnp.sum(jnp.ones(3))

    clear_cache()
    assert analyze_operations(ask) == OperationSummary(frozenset(), frozenset({"marked"}))
    assert analyze_operations(mark_hybrid(lambda x: x)).is_hybrid
    assert analyze_operations(mark_tensor(lambda x: x)).only_tensor_ops
