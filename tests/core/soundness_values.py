"""State-change cases (see soundness_cases.py): modules and globals, containers, NumPy arrays
and tensors, partials, bound methods and callable objects.
"""

from __future__ import annotations

import builtins
import functools
import sys
import types
from types import SimpleNamespace as NS

import numpy as np

import nablax as nx

try:
    from .soundness_cases import CASES, Case, _aligned, case, quad
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    from soundness_cases import CASES, Case, _aligned, case, quad


# ---- modules and globals ---------------------------------------------------------------------

MODULE_CENTER = 0.0
GLOBAL_SCALE = 1.0
_THIS = sys.modules[__name__]


def _set_global_scale(v):
    global GLOBAL_SCALE
    GLOBAL_SCALE = v


@case()
def case_module_type_attr(env):
    mod, tick = types.ModuleType("nablax_soundness_cfg"), env.tick
    mod.scale = 1.0

    def f(w):
        tick()
        return (mod.scale * w**2).sum()

    def set_attr():
        mod.scale = 2.0

    return quad(f, [set_attr, lambda: mod.__dict__.update(scale=0.25)], a=lambda: mod.scale)


@case()
def case_module_hasattr_flag(env):
    mod, tick = types.ModuleType("nablax_soundness_flags"), env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if hasattr(mod, "flag"):
            out = out + (3.0 * w).sum()
        return out

    def add():
        mod.flag = True

    def remove():
        del mod.flag

    return quad(f, [add, remove], b=lambda: 3.0 if hasattr(mod, "flag") else 0.0)


@case()
def case_import_statement(env):
    name = "nablax_soundness_imported"
    first, tick = types.ModuleType(name), env.tick
    first.center = 1.0
    env.mp.setitem(sys.modules, name, first)

    def f(w):
        tick()
        import nablax_soundness_imported as cfg

        return ((w - cfg.center) ** 2).sum()

    def replace_module():
        second = types.ModuleType(name)
        second.center = -1.0
        sys.modules[name] = second

    def change_attr():
        sys.modules[name].center = 2.0

    return quad(f, [replace_module, change_attr], m=lambda: sys.modules[name].center)


@case()
def case_real_module_attr(env):
    tick = env.tick
    env.mp.setattr(_THIS, "MODULE_CENTER", 0.0)

    def f(w):
        tick()
        return ((w - _THIS.MODULE_CENTER) ** 2).sum()

    muts = [
        lambda: env.mp.setattr(_THIS, "MODULE_CENTER", 1.0),
        lambda: env.mp.setattr(_THIS, "MODULE_CENTER", -3.0),
    ]
    return quad(f, muts, m=lambda: MODULE_CENTER)


@case()
def case_global_statement_rebind(env):
    tick = env.tick
    env.defer(_set_global_scale, GLOBAL_SCALE)

    def f(w):
        tick()
        return (GLOBAL_SCALE * w**2).sum()

    muts = [lambda: _set_global_scale(2.0), lambda: _set_global_scale(-0.5)]
    return quad(f, muts, a=lambda: GLOBAL_SCALE)


@case()
def case_builtin_then_global_shadow(env):
    tick = env.tick
    ns = {"tick": tick}
    exec("def f(w):\n    tick()\n    return (NX_SOUND_K * w ** 2).sum()\n", ns)
    env.mp.setattr(builtins, "NX_SOUND_K", 1.0, raising=False)

    def change_builtin():
        builtins.NX_SOUND_K = 2.0

    def shadow_with_global():
        ns["NX_SOUND_K"] = -0.5

    muts = [change_builtin, shadow_with_global]
    return quad(ns["f"], muts, a=lambda: ns.get("NX_SOUND_K", builtins.NX_SOUND_K))


# ---- containers, NumPy arrays, tensors -------------------------------------------------------


@case()
def case_dict_item(env):
    cfg, tick = {"a": 1.0, "m": 0.0}, env.tick

    def f(w):
        tick()
        return (cfg["a"] * (w - cfg["m"]) ** 2).sum()

    def set_item():
        cfg["m"] = 2.0

    muts = [set_item, lambda: cfg.update(a=0.5, m=-1.0)]
    return quad(f, muts, a=lambda: cfg["a"], m=lambda: cfg["m"])


@case()
def case_list_slices(env):
    coefs, tick = [1.0, 0.0, 99.0], env.tick

    def f(w):
        tick()
        a, m = coefs[0:2]
        return (a * (w - m) ** 2).sum()

    def slice_assign():
        coefs[0:2] = [2.0, 1.5]

    def slice_insert():
        coefs[:0] = [0.5, -1.0]

    return quad(f, [slice_assign, slice_insert], a=lambda: coefs[0], m=lambda: coefs[1])


@case()
def case_nested_containers(env):
    cfg, tick = {"layers": [{"scale": 1.0}], "center": (0.0,)}, env.tick

    def f(w):
        tick()
        return (cfg["layers"][0]["scale"] * (w - cfg["center"][0]) ** 2).sum()

    def deep_write():
        cfg["layers"][0]["scale"] = 2.0

    def replace_inner():
        cfg["layers"][0] = {"scale": 0.5}
        cfg["center"] = (1.5,)

    a, m = lambda: cfg["layers"][0]["scale"], lambda: cfg["center"][0]
    return quad(f, [deep_write, replace_inner], a=a, m=m)


@case()
def case_set_membership(env):
    modes, tick = set(), env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if "tilt" in modes:
            out = out + (2.0 * w).sum()
        return out

    muts = [lambda: modes.add("tilt"), lambda: modes.symmetric_difference_update({"tilt", "x"})]
    return quad(f, muts, b=lambda: 2.0 if "tilt" in modes else 0.0)


@case()
def case_numpy_captured_inplace(env):
    center, tick = np.zeros(3, np.float32), env.tick

    def f(w):
        tick()
        return ((w - center) ** 2).sum()

    def write():
        center[:] = [1.0, -1.0, 0.5]

    def add_in_place():
        np.add(center, 2.0, out=center)

    return quad(f, [write, add_in_place], m=lambda: center.copy())


@case()
def case_numpy_argument_inplace(env):
    scale, tick = np.ones(3, np.float32), env.tick

    def f(w, s):
        tick()
        return (w**2 * s).sum()

    def scale_up():
        scale[...] *= 2.0

    def write_one():
        scale[1] = -1.0

    return quad(f, [scale_up, write_one], a=lambda: scale.copy(), args=lambda: (scale,))


def _tensor_before_mutation(offset_bytes):
    def make(env):
        src, tick = _aligned(3, offset_bytes), env.tick
        src[:] = [1.0, -2.0, 0.5]
        old = src.astype(np.float64)
        t = nx.tensor(src)  # copies: later writes to src must not reach t

        def f(w):
            tick()
            return ((w - t) ** 2).sum()

        def fill():
            src[:] = 9.0

        def add_in_place():
            src[...] += 1.0

        return quad(f, [fill, add_in_place], m=lambda: old)

    return make


CASES["tensor_copies_aligned_numpy"] = Case(
    "tensor_copies_aligned_numpy", _tensor_before_mutation(0)
)
CASES["tensor_copies_unaligned_numpy"] = Case(
    "tensor_copies_unaligned_numpy", _tensor_before_mutation(16)
)


# ---- callables: partial, bound methods, __call__ ---------------------------------------------


@case()
def case_partial_mutable_arg(env):
    cfg, tick = {"a": 1.0, "m": 0.0}, env.tick

    def loss(cfg, w):
        tick()
        return (cfg["a"] * (w - cfg["m"]) ** 2).sum()

    muts = [lambda: cfg.update(a=2.0), lambda: cfg.update(m=1.0)]
    fn = functools.partial(loss, cfg)
    return quad(fn, muts, a=lambda: cfg["a"], m=lambda: cfg["m"])


@case()
def case_partial_keywords(env):
    tick = env.tick

    def loss(w, *, m):
        tick()
        return ((w - m) ** 2).sum()

    p = functools.partial(loss, m=0.0)
    muts = [lambda: p.keywords.update(m=1.0), lambda: p.keywords.update(m=-2.0)]
    return quad(p, muts, m=lambda: p.keywords["m"])


@case()
def case_bound_method(env):
    tick = env.tick

    class Model:
        def __init__(self):
            self.center = 0.0

        def loss(self, w):
            tick()
            return ((w - self.center) ** 2).sum()

    model = Model()

    def move():
        model.center = 1.0

    def move_again():
        model.center = -2.0

    return quad(model.loss, [move, move_again], m=lambda: model.center)


@case()
def case_method_replaced(env):
    class Model:
        def penalty(self, w):
            return (w**2).sum()

        def loss(self, w):
            tick()
            return self.penalty(w)

    model, tick, st = Model(), env.tick, NS(a=1.0, m=0.0)

    def on_class():
        Model.penalty = lambda self, w: ((w - 1.0) ** 2).sum()
        st.m = 1.0

    def on_instance():
        model.penalty = lambda w: (3.0 * w**2).sum()
        st.a, st.m = 3.0, 0.0

    return quad(model.loss, [on_class, on_instance], a=lambda: st.a, m=lambda: st.m)


@case()
def case_callable_object(env):
    tick = env.tick

    class Loss:
        def __init__(self):
            self.m, self.a = 0.0, 1.0

        def __call__(self, w):
            tick()
            return (self.a * (w - self.m) ** 2).sum()

    obj = Loss()

    def state():
        obj.m = 2.0

    def new_call(self, w):
        tick()
        return (3.0 * (w - self.m) ** 2).sum()

    def replace_dunder():
        Loss.__call__ = new_call
        obj.a = 3.0

    return quad(obj, [state, replace_dunder], a=lambda: obj.a, m=lambda: obj.m)
