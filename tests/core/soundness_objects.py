"""State-change cases (see soundness_cases.py): class and instance attributes, properties,
setattr, closures, defaults and redefined functions.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace as NS

import numpy as np

try:
    from .soundness_cases import Built, case, quad
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    from soundness_cases import Built, case, quad


# ---- class attributes, instances, properties, setattr ------------------------------------


@case()
def case_class_attr(env):
    """The issue's repro: a class attribute read by the function."""

    class Norm:
        mean = 0.0

    tick = env.tick

    def f(w):
        tick()
        return ((w - Norm.mean) ** 2).sum()

    def to_five():
        Norm.mean = 5.0

    def to_negative():
        Norm.mean = -2.5

    return quad(f, [to_five, to_negative], m=lambda: Norm.mean)


@case()
def case_class_attr_inherited(env):
    class Base:  # attribute names that are also Tensor methods (`std`, `max`, `mean`) defeat
        std = 2.0  # a bytecode guess that reads `x.<tensor method>` as harmless

    class Child(Base):
        pass

    tick = env.tick

    def f(w):
        tick()
        return (Child.std * w**2).sum()

    def change_base():
        Base.std = 3.0

    def shadow_on_child():
        Child.std = 0.5

    return quad(f, [change_base, shadow_on_child], a=lambda: Child.std)


@case()
def case_class_attr_via_instance(env):
    class Cfg:
        center = 0.0

    cfg, tick = Cfg(), env.tick

    def f(w):
        tick()
        return ((w - cfg.center) ** 2).sum()

    def change_class():
        Cfg.center = 1.5

    def shadow_on_instance():
        cfg.center = -0.5

    return quad(f, [change_class, shadow_on_instance], m=lambda: cfg.center)


@case()
def case_metaclass_attr(env):
    class Meta(type):
        max = 1.0

    class C(metaclass=Meta):
        pass

    tick = env.tick

    def f(w):
        tick()
        return (C.max * w**2).sum()

    def change_meta():
        Meta.max = 4.0

    def shadow_on_class():
        C.max = 0.25

    return quad(f, [change_meta, shadow_on_class], a=lambda: C.max)


@case()
def case_classmethod_exponent(env):
    class Poly:
        p = 2

        @classmethod
        def energy(cls, w):
            return (w**cls.p).sum()

    tick = env.tick

    def f(w):
        tick()
        return Poly.energy(w)

    def cube():
        Poly.p = 3

    def fourth():
        Poly.p = 4

    p = lambda: Poly.p
    return Built(
        f,
        lambda w: float(np.sum(w ** p())),
        lambda w: p() * w ** (p() - 1),
        lambda w: np.diag(p() * (p() - 1) * w ** (p() - 2)),
        (cube, fourth),
    )


@case()
def case_staticmethod_replaced(env):
    class Ops:
        @staticmethod
        def act(w):
            return w * w

    tick = env.tick

    def f(w):
        tick()
        return Ops.act(w).sum()

    st = NS(a=1.0)

    def replace():
        Ops.act = staticmethod(lambda w: 3.0 * w * w)
        st.a = 3.0

    def replace_again():
        Ops.act = staticmethod(lambda w: 0.5 * w * w)
        st.a = 0.5

    return quad(f, [replace, replace_again], a=lambda: st.a)


@case()
def case_instance_attr(env):
    m, tick = NS(scale=1.0, center=0.0), env.tick

    def f(w):
        tick()
        return (m.scale * (w - m.center) ** 2).sum()

    def first():
        m.scale, m.center = 2.0, -1.0

    def second():
        m.scale = 0.5

    return quad(f, [first, second], a=lambda: m.scale, m=lambda: m.center)


@case()
def case_instance_dict_write(env):
    class Obj:
        def __init__(self):
            self.center = 0.0

    o, tick = Obj(), env.tick

    def f(w):
        tick()
        return ((w - o.center) ** 2).sum()

    return quad(
        f,
        [lambda: o.__dict__.__setitem__("center", 3.0), lambda: vars(o).update(center=-0.5)],
        m=lambda: o.center,
    )


@case()
def case_hasattr_instance(env):
    o, tick = NS(), env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if hasattr(o, "extra"):
            out = out + (o.extra * w).sum()
        return out

    def add():
        o.extra = 2.0

    def remove():
        del o.extra

    return quad(f, [add, remove], b=lambda: getattr(o, "extra", 0.0))


@case()
def case_hasattr_class(env):
    class Flags:
        pass

    tick = env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if hasattr(Flags, "tilt"):
            out = out + (2.0 * w).sum()
        return out

    def add():
        Flags.tilt = True

    def remove():
        del Flags.tilt

    return quad(f, [add, remove], b=lambda: 2.0 if hasattr(Flags, "tilt") else 0.0)


@case()
def case_class_bases_changed(env):
    class Fast:
        pass

    class Plain:
        pass

    class Impl(Plain):
        pass

    tick = env.tick

    def f(w):
        tick()
        if issubclass(Impl, Fast):
            return (4.0 * w**2).sum()
        return (w**2).sum()

    def rebase():
        Impl.__bases__ = (Fast,)

    def rebase_back():
        Impl.__bases__ = (Plain,)

    return quad(f, [rebase, rebase_back], a=lambda: 4.0 if issubclass(Impl, Fast) else 1.0)


@case()
def case_property(env):
    class Cfg:
        def __init__(self):
            self._s = 1.0

        @property
        def s(self):
            return 2.0 * self._s

    cfg, tick = Cfg(), env.tick

    def f(w):
        tick()
        return (cfg.s * w**2).sum()

    def backing_field():
        cfg._s = 3.0

    def replace_property():
        Cfg.s = property(lambda self: -0.5)

    return quad(f, [backing_field, replace_property], a=lambda: cfg.s)


@case()
def case_getattr_hook(env):
    class Table:
        def __init__(self, d):
            self.d = d

        def __getattr__(self, name):
            return self.d[name]

    t, tick = Table({"center": 1.0}), env.tick

    def f(w):
        tick()
        return ((w - t.center) ** 2).sum()

    def new_table():
        t.d = {"center": 0.5}

    return quad(f, [lambda: t.d.update(center=-2.0), new_table], m=lambda: t.d["center"])


@case()
def case_type_setattr(env):
    class K:
        mean = 0.0

    tick = env.tick

    def f(w):
        tick()
        return ((w - K.mean) ** 2).sum()

    muts = [lambda: type.__setattr__(K, "mean", 1.5), lambda: type.__setattr__(K, "mean", -1.0)]
    return quad(f, muts, m=lambda: K.mean)


@case()
def case_setattr_computed_name(env):
    o, tick = NS(scale=1.0), env.tick

    def f(w):
        tick()
        return (getattr(o, "sca" + "le") * w**2).sum()

    muts = [lambda: setattr(o, "sc" + "ale", 2.5), lambda: setattr(o, "scale", 0.25)]
    return quad(f, muts, a=lambda: o.scale)


@case()
def case_object_setattr_frozen(env):
    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: float = 1.0
        m: float = 0.0

    fz, tick = Frozen(), env.tick

    def f(w):
        tick()
        return (fz.a * (w - fz.m) ** 2).sum()

    muts = [lambda: object.__setattr__(fz, "m", 2.0), lambda: object.__setattr__(fz, "a", 3.0)]
    return quad(f, muts, a=lambda: fz.a, m=lambda: fz.m)


@case()
def case_slots(env):
    class S:
        __slots__ = ("a",)

    s, tick = S(), env.tick
    s.a = 1.0

    def f(w):
        tick()
        return (s.a * w**2).sum()

    def assign():
        s.a = 2.5

    def through_descriptor():
        S.a.__set__(s, 0.5)

    return quad(f, [assign, through_descriptor], a=lambda: s.a)


# ---- closures, defaults, redefinition --------------------------------------------------------


@case()
def case_closure_nonlocal(env):
    tick = env.tick

    def factory():
        m = 0.0

        def f(w):
            tick()
            return ((w - m) ** 2).sum()

        def set_m(v):
            nonlocal m
            m = v

        return f, set_m, lambda: m

    f, set_m, get_m = factory()
    return quad(f, [lambda: set_m(2.0), lambda: set_m(-1.5)], m=get_m)


@case()
def case_closure_cell_write(env):
    tick = env.tick

    def make_f(m):
        def f(w):
            tick()
            return ((w - m) ** 2).sum()

        return f

    f = make_f(1.0)
    cell = f.__closure__[f.__code__.co_freevars.index("m")]

    def write(v):
        cell.cell_contents = v

    return quad(f, [lambda: write(4.0), lambda: write(-1.0)], m=lambda: cell.cell_contents)


@case()
def case_closure_list(env):
    coef, tick = [1.0], env.tick

    def f(w):
        tick()
        return (coef[0] * w**2).sum()

    def set_item():
        coef[0] = 3.0

    return quad(f, [set_item, lambda: coef.insert(0, 0.5)], a=lambda: coef[0])


@case()
def case_closure_nested(env):
    tick = env.tick

    def outer():
        m = 0.0

        def middle():
            def f(w):
                tick()
                return ((w - m) ** 2).sum()

            def bump():
                nonlocal m
                m += 1.5

            return f, bump

        return middle(), lambda: m

    (f, bump), get_m = outer()
    return quad(f, [bump, bump], m=get_m)


@case()
def case_defaults(env):
    tick = env.tick

    def f(w, m=0.0):
        tick()
        return ((w - m) ** 2).sum()

    def first():
        f.__defaults__ = (2.0,)

    def second():
        f.__defaults__ = (-1.0,)

    return quad(f, [first, second], m=lambda: f.__defaults__[0])


@case()
def case_kwdefaults(env):
    tick = env.tick

    def f(w, *, a=1.0):
        tick()
        return (a * w**2).sum()

    def replace():
        f.__kwdefaults__ = {"a": 2.0}

    def in_place():
        f.__kwdefaults__["a"] = 0.5

    return quad(f, [replace, in_place], a=lambda: f.__kwdefaults__["a"])


@case()
def case_mutable_default(env):
    tick = env.tick

    def f(w, cfg=[0.0]):  # noqa: B006 - the shared default list is the state under test
        tick()
        return ((w - cfg[0]) ** 2).sum()

    muts = [
        lambda: f.__defaults__[0].__setitem__(0, 1.0),
        lambda: f.__defaults__[0].insert(0, -2.0),
    ]
    return quad(f, muts, m=lambda: f.__defaults__[0][0])


@case()
def case_helper_redefined(env):
    """A global helper redefined under the same name (the function looks it up each call)."""
    tick = env.tick
    ns = {"tick": tick}
    exec("def helper(w):\n    return (w ** 2).sum()\n", ns)
    exec("def f(w):\n    tick()\n    return helper(w)\n", ns)
    st = NS(a=1.0, m=0.0)

    def redefine():
        exec("def helper(w):\n    return (3.0 * (w - 1.0) ** 2).sum()\n", ns)
        st.a, st.m = 3.0, 1.0

    def redefine_again():
        exec("def helper(w):\n    return (0.5 * (w + 2.0) ** 2).sum()\n", ns)
        st.a, st.m = 0.5, -2.0

    return quad(ns["f"], [redefine, redefine_again], a=lambda: st.a, m=lambda: st.m)


@case()
def case_code_swapped(env):
    tick = env.tick

    def f(w):
        tick()
        return (w * w).sum()

    def g(w):
        tick()
        return (2.0 * (w - 1.0) ** 2).sum()

    def h(w):
        tick()
        return (0.25 * (w + 3.0) ** 2).sum()

    st = NS(a=1.0, m=0.0)

    def swap(other, a, m):
        f.__code__ = other.__code__
        st.a, st.m = a, m

    muts = [lambda: swap(g, 2.0, 1.0), lambda: swap(h, 0.25, -3.0)]
    return quad(f, muts, a=lambda: st.a, m=lambda: st.m)
