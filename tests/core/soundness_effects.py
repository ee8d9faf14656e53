"""State-change cases (see soundness_cases.py): environment variables, side effects, random
numbers and clocks, exceptions, iterators, interpreter state, Python scalars, newer syntax and
nx.compile helpers.
"""

from __future__ import annotations

import contextvars
import functools
import io
import itertools
import logging
import os
import random
import sys
import threading
import time
import weakref
from types import SimpleNamespace as NS

import numpy as np

import nablax as nx

try:
    from .soundness_cases import Built, Counter, case, quad
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    from soundness_cases import Built, Counter, case, quad


# ---- environment, side effects ---------------------------------------------------------------


@case()
def case_environ(env):
    var, tick = "NABLAX_SOUNDNESS_CENTER", env.tick
    env.mp.setenv(var, "0.0")

    def f(w):
        tick()
        return ((w - float(os.environ.get(var, "-1.0"))) ** 2).sum()

    muts = [lambda: env.mp.setenv(var, "1.5"), lambda: env.mp.delenv(var)]
    return quad(f, muts, m=lambda: float(os.environ.get(var, "-1.0")))


@case()
def case_print_fstring(env):
    stream, tick, st = io.StringIO(), env.tick, NS(m=0.0)

    def f(w):
        tick()
        print(f"center={st.m:+.2f} shape={w.shape}", file=stream)
        return ((w - st.m) ** 2).sum()

    def check():
        lines = stream.getvalue().splitlines()
        assert len(lines) == env.made
        assert lines[-1] == f"center={st.m:+.2f} shape=(3,)"

    muts = [lambda: setattr(st, "m", 0.75), lambda: setattr(st, "m", -1.25)]
    return quad(f, muts, m=lambda: st.m, check=check)


@case()
def case_logging(env):
    records = []
    log = logging.getLogger(f"nablax.soundness.{id(records)}")
    handler = logging.Handler()
    handler.emit = records.append
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.DEBUG)
    env.defer(log.removeHandler, handler)
    tick = env.tick

    def f(w):
        tick()
        log.warning("step at center %s", 0.0)
        out = (w**2).sum()
        if log.isEnabledFor(logging.DEBUG):
            out = out + w.sum()
        return out

    def check():
        assert [r.getMessage() for r in records] == ["step at center 0.0"] * env.made

    muts = [lambda: log.setLevel(logging.INFO), lambda: log.setLevel(logging.DEBUG)]
    b = lambda: 1.0 if log.isEnabledFor(logging.DEBUG) else 0.0
    return quad(f, muts, b=b, check=check)


@case()
def case_nonlocal_counter_value(env):
    """The value depends on how often the body ran: a skipped run shows up in the gradient."""
    tick = env.tick

    def factory():
        n = 0

        def f(w):
            nonlocal n
            tick()
            n += 1
            return (n * w**2).sum()

        def reset(v):
            nonlocal n
            n = v

        return f, reset, lambda: n

    f, reset, get_n = factory()
    return quad(f, [lambda: reset(10), lambda: reset(-3)], a=get_n)


_GLOBAL_RUNS = 0


def _global_counter_fn(w, tick):
    global _GLOBAL_RUNS
    tick()
    _GLOBAL_RUNS += 1
    return ((_GLOBAL_RUNS % 4) * w**2).sum()


def _set_global_runs(v):
    global _GLOBAL_RUNS
    _GLOBAL_RUNS = v


@case()
def case_global_statement_counter(env):
    env.defer(_set_global_runs, _GLOBAL_RUNS)

    def reset(v):
        _set_global_runs(v)

    muts = [lambda: reset(101), lambda: reset(6)]
    fn = functools.partial(_global_counter_fn, tick=env.tick)
    return quad(fn, muts, a=lambda: _GLOBAL_RUNS % 4)


@case()
def case_list_append_history(env):
    hist, tick = [], env.tick

    def f(w):
        tick()
        hist.append(len(hist))
        return (0.5 * len(hist) * w**2).sum()

    def refill():
        hist[:] = [0] * 5

    return quad(f, [hist.clear, refill], a=lambda: 0.5 * len(hist))


# ---- randomness, clocks: each call draws anew -----------------------------------------------


def _draws_differ(seen):
    def check():
        if len(seen) >= 2:
            assert not np.array_equal(seen[-1], seen[-2]), "a call reused the previous draw"

    return check


@case()
def case_python_random(env):
    env.defer(random.setstate, random.getstate())
    seen, tick = [], env.tick

    def f(w):
        tick()
        r = random.random()
        seen.append(r)
        return (r * (w - 1.0) ** 2).sum()

    muts = [lambda: random.seed(1234), lambda: random.seed(1234)]
    return quad(f, muts, a=lambda: seen[-1], m=lambda: 1.0, check=_draws_differ(seen))


@case()
def case_numpy_rng(env):
    st, seen, tick = NS(rng=np.random.default_rng(0)), [], env.tick

    def f(w):
        tick()
        v = st.rng.standard_normal(3)
        seen.append(v)
        return (w**2 * v).sum()

    muts = [lambda: setattr(st, "rng", np.random.default_rng(7)), lambda: st.rng.standard_normal(5)]
    return quad(f, muts, a=lambda: seen[-1], check=_draws_differ(seen))


@case()
def case_nx_random_global_key(env):
    env.defer(nx.random.seed, 0)
    seen, tick = [], env.tick

    def f(w):
        tick()
        z = nx.random.normal(shape=(3,))
        seen.append(z)
        return ((w - z) ** 2).sum()

    draws = []

    def check():
        draws.append(seen[-1].numpy())
        _draws_differ(draws)()

    muts = [lambda: nx.random.seed(11), lambda: nx.random.seed(11)]
    return quad(f, muts, m=lambda: seen[-1].numpy(), check=check)


@case()
def case_time_counter(env):
    clock = itertools.count(100)
    env.mp.setattr(time, "time", lambda: next(clock) * 0.5)
    seen, tick = [], env.tick

    def f(w):
        tick()
        t = time.time()
        seen.append(t)
        return ((t % 4.0) * w**2).sum()

    def jump():
        for _ in range(7):
            next(clock)

    return quad(f, [jump, jump], a=lambda: seen[-1] % 4.0, check=_draws_differ(seen))


# ---- exceptions, iterators, interpreter state -------------------------------------------------


@case()
def case_raise_on_state(env):
    st, tick = NS(bad=False, m=0.0), env.tick

    def f(w):
        tick()
        out = ((w - st.m) ** 2).sum()
        if st.bad:
            raise ValueError("state says stop")
        return out

    def recover():
        st.bad, st.m = False, 2.0

    muts = [lambda: setattr(st, "bad", True), recover]
    return quad(f, muts, m=lambda: st.m, raises=lambda: ValueError if st.bad else None)


@case()
def case_keyerror_fallback(env):
    table, tick = {}, env.tick

    def f(w):
        tick()
        try:
            m = table["m"]
        except KeyError:
            m = -1.0
        return ((w - m) ** 2).sum()

    muts = [lambda: table.update(m=2.0), table.clear]
    return quad(f, muts, m=lambda: table.get("m", -1.0))


@case()
def case_generator_next(env):
    st, seen, tick = NS(it=(0.5 * k for k in itertools.count(1))), [], env.tick

    def f(w):
        tick()
        a = next(st.it)
        seen.append(a)
        return (a * w**2).sum()

    muts = [lambda: setattr(st, "it", iter([3.0, -1.0] * 4)), lambda: next(st.it)]
    return quad(f, muts, a=lambda: seen[-1])


@case()
def case_genexpr_over_state(env):
    coefs, tick = [1.0, -5.0], env.tick

    def f(w):
        tick()
        a = sum(x for x in coefs if x > 0)
        return (a * w**2).sum()

    muts = [lambda: coefs.append(2.0), lambda: coefs.__setitem__(0, 0.25)]
    return quad(f, muts, a=lambda: sum(x for x in coefs if x > 0))


@case()
def case_recursion_limit(env):
    old, tick = sys.getrecursionlimit(), env.tick
    env.defer(sys.setrecursionlimit, old)

    def f(w):
        tick()
        return (sys.getrecursionlimit() / old * w**2).sum()

    muts = [lambda: sys.setrecursionlimit(old + old // 2), lambda: sys.setrecursionlimit(old * 2)]
    return quad(f, muts, a=lambda: sys.getrecursionlimit() / old)


@case()
def case_numpy_printoptions(env):
    old, tick = np.get_printoptions()["precision"], env.tick
    env.defer(lambda: np.set_printoptions(precision=old))

    def f(w):
        tick()
        return (np.get_printoptions()["precision"] / 8 * w**2).sum()

    muts = [lambda: np.set_printoptions(precision=4), lambda: np.set_printoptions(precision=12)]
    return quad(f, muts, a=lambda: np.get_printoptions()["precision"] / 8)


@case()
def case_contextvar(env):
    var, tick = contextvars.ContextVar("nablax_soundness_m", default=0.0), env.tick

    def f(w):
        tick()
        return ((w - var.get()) ** 2).sum()

    return quad(f, [lambda: var.set(2.0), lambda: var.set(-1.0)], m=var.get)


@case()
def case_thread_local(env):
    tl, tick = threading.local(), env.tick
    tl.a = 1.0

    def f(w):
        tick()
        return (getattr(tl, "a", 0.25) * w**2).sum()

    muts = [lambda: setattr(tl, "a", 3.0), lambda: delattr(tl, "a")]
    return quad(f, muts, a=lambda: getattr(tl, "a", 0.25))


@case()
def case_weakref_target(env):
    class Anchor:
        m = 1.0

    st, tick = NS(strong=Anchor()), env.tick
    ref = weakref.ref(st.strong)

    def f(w):
        tick()
        target = ref()
        return ((w - (target.m if target is not None else -2.0)) ** 2).sum()

    def move():
        st.strong.m = 3.0

    def drop():
        st.strong = None  # the last strong reference: the weakref dies

    return quad(f, [move, drop], m=lambda: ref().m if ref() is not None else -2.0)


# ---- Python scalars (baked constants), control flow on realized values ------------------------


@case()
def case_scalar_argument(env):
    st, tick = NS(s=2.0), env.tick

    def f(w, s):
        tick()
        return (s * (w - 1.0) ** 2).sum()

    muts = [lambda: setattr(st, "s", -0.5), lambda: setattr(st, "s", 3)]
    return quad(f, muts, a=lambda: st.s, m=lambda: 1.0, args=lambda: (st.s,))


@case()
def case_scalar_exponent(env):
    st, tick = NS(p=2), env.tick

    def f(w, p):
        tick()
        return (w**p).sum()

    p = lambda: st.p
    return Built(
        f,
        lambda w: float(np.sum(w ** p())),
        lambda w: p() * w ** (p() - 1),
        lambda w: np.diag(p() * (p() - 1) * w ** (p() - 2)),
        (lambda: setattr(st, "p", 3), lambda: setattr(st, "p", 2.0)),
        args=lambda: (st.p,),
    )


@case()
def case_scalar_in_creation_op(env):
    st, tick = NS(m=0.0), env.tick

    def f(w):
        tick()
        return ((w - nx.full((3,), st.m)) ** 2).sum()

    muts = [lambda: setattr(st, "m", 1.25), lambda: setattr(st, "m", -0.0)]
    return quad(f, muts, m=lambda: st.m)


@case()
def case_item_branch_on_captured_tensor(env):
    st, tick = NS(gate=nx.tensor([1.0, 1.0, 1.0])), env.tick

    def f(w):
        tick()
        if st.gate.sum().item() > 0:
            return ((w - 1.0) ** 2).sum()
        return (2.0 * w**2).sum()

    def flip():
        st.gate = nx.tensor([-1.0, 0.0, 0.0])

    def flip_back_pending():
        st.gate = st.gate * -3.0  # a pending tensor, realized by .item() inside f

    pos = lambda: float(st.gate.numpy().sum()) > 0
    a, m = lambda: 1.0 if pos() else 2.0, lambda: 1.0 if pos() else 0.0
    return quad(f, [flip, flip_back_pending], a=a, m=m)


@case(no_vmap="a Python `if` on a per-example value cannot run under vmap")
def case_item_branch_on_input(env):
    st, tick = NS(threshold=0.0), env.tick

    def f(w):
        tick()
        if w.sum().item() > st.threshold:
            return ((w - 1.0) ** 2).sum()
        return (0.5 * w**2).sum()

    muts = [lambda: setattr(st, "threshold", 1.1), lambda: setattr(st, "threshold", 5.0)]
    built = quad(f, muts)
    above = lambda w: w.sum() > st.threshold
    built.value = lambda w: float(np.sum((w - 1.0) ** 2 if above(w) else 0.5 * w**2))
    built.grad = lambda w: 2.0 * (w - 1.0) if above(w) else w
    built.hess = lambda w: np.diag((2.0 if above(w) else 1.0) * np.ones_like(w))
    return built


@case()
def case_realized_intermediate(env):
    """Realizing an intermediate inside ``f`` (state-dependent) changes which forward nodes hold
    values: the backward plan must not mix the two structures."""
    st, tick = NS(peek=False, a=1.0), env.tick

    def f(w):
        tick()
        h = st.a * w
        if st.peek:
            nx.realize(h)
        return (h * w).sum()

    def peek():
        st.peek = True

    def both():
        st.peek, st.a = False, 2.0

    return quad(f, [peek, both], a=lambda: st.a)


# ---- newer syntax and opcodes ------------------------------------------------------------------


@case()
def case_walrus(env):
    st, tick = NS(k=0.5), env.tick

    def f(w):
        tick()
        if (k := st.k) > 1.0:
            return (k * w**2).sum()
        return ((w - k) ** 2).sum()

    muts = [lambda: setattr(st, "k", 2.0), lambda: setattr(st, "k", -1.0)]
    big = lambda: st.k > 1.0
    a, m = lambda: st.k if big() else 1.0, lambda: 0.0 if big() else st.k
    return quad(f, muts, a=a, m=m)


@case()
def case_match_statement(env):
    st, tick = NS(mode="plain", want=(1.0, 0.0)), env.tick

    def f(w):
        tick()
        match st.mode:
            case "plain":
                a, m = 1.0, 0.0
            case ("scaled", s):
                a, m = s, 0.0
            case {"center": m0}:
                a, m = 1.0, m0
        return (a * (w - m) ** 2).sum()

    def scaled():
        st.mode, st.want = ("scaled", 2.5), (2.5, 0.0)

    def centered():
        st.mode, st.want = {"center": -1.5}, (1.0, -1.5)

    return quad(f, [scaled, centered], a=lambda: st.want[0], m=lambda: st.want[1])


@case()
def case_fstring_roundtrip(env):
    st, tick = NS(m=0.0), env.tick

    def f(w):
        tick()
        return ((w - float(f"{st.m:.1f}")) ** 2).sum()

    muts = [lambda: setattr(st, "m", 1.26), lambda: setattr(st, "m", -0.74)]
    return quad(f, muts, m=lambda: {0.0: 0.0, 1.26: 1.3, -0.74: -0.7}[st.m])


@case()
def case_list_comprehension(env):
    coefs, tick = [0.5, -1.0], env.tick

    def f(w):
        tick()
        a = sum([x for x in coefs if x > 0])
        return (a * w**2).sum()

    muts = [lambda: coefs.append(1.5), lambda: coefs.__setitem__(slice(None), [-2.0, 0.25])]
    return quad(f, muts, a=lambda: sum(x for x in coefs if x > 0))


# ---- nx.compile helper inside eager transforms ---------------------------------------------------


@case()
def case_compiled_helper_inline(env):
    """A compiled helper called on differentiated/vmapped tensors runs inline: its body (and the
    state it reads) runs on every call."""

    class Cfg:
        m = 0.0

    tick, inner = env.tick, Counter()

    @nx.compile
    def sq(w):
        inner.tick()
        return (w - Cfg.m) ** 2

    def f(w):
        tick()
        return sq(w).sum()

    def check():
        assert inner.n == env.made

    def move():
        Cfg.m = 1.5

    def move_again():
        Cfg.m = -0.5

    return quad(f, [move, move_again], m=lambda: Cfg.m, check=check)
