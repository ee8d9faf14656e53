"""``Module``: frozen dataclasses that are pytrees (equinox-style).

Subclassing ``Module`` makes the class a dataclass whose fields are either *children* (tensors,
sub-modules, lists and dicts of them: the leaves transforms see, so ``nx.grad(loss)(model, ...)``
returns a gradient of the model's type) or *static* configuration (``field(static=True)``: sizes,
strides, activation functions), kept in the pytree's structure so ``nx.compile`` specializes on
them. Instances are frozen once ``__init__`` returns; ``replace`` makes a changed copy.

Rebuilding a module from its leaves (what every transform does) never calls ``__init__``, so an
initializer that draws random weights runs only when the user constructs the module. For the same
reason an attribute ``__init__`` (or ``__post_init__``) sets without declaring a field would be
lost by the first transform: construction refuses it, naming the class, the attribute and the
field declaration to write.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable
from functools import cached_property
from typing import Any

import jax

from .. import tree as _tree
from ..core.tensor import Tensor
from ..errors import NablaxError

_STATIC = "nablax.static"


def field(*, static: bool = False, **kwargs: Any) -> Any:
    """A dataclass field of a ``Module``; ``static=True`` marks configuration, not a child.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> class Scale(nn.Module):
    ...     factor: float = nn.field(static=True)
    ...     def __call__(self, x):
    ...         return x * self.factor
    >>> Scale(3.0)(nx.ones(2)).tolist()
    [3.0, 3.0]
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata[_STATIC] = static
    return dataclasses.field(metadata=metadata, **kwargs)


class FrozenModuleError(NablaxError, AttributeError):
    """A field of a constructed module was assigned; modules are immutable pytrees."""


class _ModuleMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = cls.__new__(cls)
        object.__setattr__(obj, "_nx_initializing", True)
        try:
            obj.__init__(*args, **kwargs)
        finally:
            object.__delattr__(obj, "_nx_initializing")
        fields = cls.__dict__.get("_nx_fields")
        if fields is None:  # Module itself
            fields = frozenset(f.name for f in dataclasses.fields(obj))
        d = obj.__dict__
        missing = [n for n in fields if n not in d]
        if missing:
            raise TypeError(
                f"{cls.__name__}.__init__ did not set the field(s) {', '.join(missing)}; "
                f"assign every field (self.{missing[0]} = ...) in __init__"
            )
        if len(d) != len(fields):
            _refuse_extra(cls, obj, fields)
        return obj


def _refuse_extra(cls: type, obj: Any, fields: frozenset) -> None:
    """Raise for an attribute ``__init__`` (or ``__post_init__``) set without declaring a field:
    every transform rebuilds a module from its fields alone, so it would vanish at the first
    ``nx.grad`` or ``nx.compile``. Values of ``functools.cached_property`` are recomputed, so kept."""
    extra = [
        n
        for n in obj.__dict__
        if n not in fields and not isinstance(inspect.getattr_static(cls, n, None), cached_property)
    ]
    if not extra:
        return
    name = extra[0]
    value = obj.__dict__[name]
    kind = _annotation(value)
    leafy = isinstance(value, (Tensor, Module, list, tuple, dict)) or hasattr(value, "shape")
    decl = f"{name}: {kind}" if leafy else f"{name}: {kind} = nn.field(static=True)"
    raise TypeError(
        f"{cls.__name__}.__init__ set self.{name} ({type(value).__name__}), which is not a field of "
        f"{cls.__name__}: transforms (nx.grad, nx.compile, optimizers) rebuild a module from its "
        f"fields only, so it would be dropped"
        + (f" (also not fields: {', '.join(extra[1:])})" if len(extra) > 1 else "")
        + f". Fix: declare it in the class body, `{decl}`"
        + (
            " (a parameter or sub-module the transforms see; `nn.field(static=True)` for "
            "configuration)"
            if leafy
            else " (configuration); a tensor or sub-module is declared without static=True"
        )
    )


def _annotation(value: Any) -> str:
    """The annotation to suggest for a field holding ``value``."""
    t = type(value)
    if t is Tensor:
        return "nx.Tensor"
    if isinstance(value, Module) and t.__module__.startswith("nablax.nn"):
        return f"nn.{t.__name__}"
    if callable(value) and not isinstance(value, type):
        return "Callable"
    return t.__name__


def _tuple_getter(names: tuple) -> Callable[[dict], tuple]:
    """``d -> tuple(d[n] for n in names)`` as one C call (``itemgetter`` of one name returns the
    value itself, not a 1-tuple)."""
    if not names:
        return lambda d: ()
    if len(names) == 1:
        get = operator.itemgetter(names[0])
        return lambda d: (get(d),)
    return operator.itemgetter(*names)


def _make_unflatten(cls: type, children: tuple, static: tuple) -> Callable[[Any, Any], Any]:
    """``unflatten(aux, leaves)`` of a module class: a new instance whose ``__dict__`` gets the
    fields by one unpacking assignment per group (generated for the class, as dataclasses
    generate ``__init__``; about 2x a loop over the names, and every transform and optimizer
    call unflattens each module of the model). A wrong leaf count raises ``ValueError``."""
    lines = ["def unflatten(aux, leaves):", "    m = new(cls)", "    d = m.__dict__"]
    for group, arg in ((children, "leaves"), (static, "aux")):
        if group:
            lines.append("    " + "".join(f"d[{n!r}], " for n in group) + f"= {arg}")
    lines.append("    return m")
    scope: dict = {"new": object.__new__, "cls": cls}
    exec("\n".join(lines), scope)  # noqa: S102 - field names of a dataclass, quoted with repr
    return scope["unflatten"]


class Module(metaclass=_ModuleMeta):
    """Base class of layers and models: a frozen dataclass registered as a pytree.

    Declare fields with annotations; write ``__init__`` to build them (assigning ``self.x = ...``
    is allowed until it returns) or let the dataclass write it. Mark configuration with
    ``nn.field(static=True)``.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> class Affine(nn.Module):
    ...     w: nx.Tensor
    ...     b: nx.Tensor
    ...     def __call__(self, x):
    ...         return x * self.w + self.b
    >>> m = Affine(nx.tensor([2.0]), nx.tensor([1.0]))
    >>> g = nx.grad(lambda m, x: m(x).sum())(m, nx.tensor([3.0]))
    >>> type(g).__name__, g.w.tolist(), g.b.tolist()
    ('Affine', [3.0], [1.0])
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(eq=False, repr=False)(cls)
        # the metaclass's __call__(*args, **kwargs) would hide __init__'s parameters from
        # inspect.signature (help(), IDEs, docs)
        init = inspect.signature(cls.__init__)
        cls.__signature__ = init.replace(parameters=list(init.parameters.values())[1:])
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        cls._nx_fields = frozenset(f.name for f in fields)
        children = tuple(f.name for f in fields if not f.metadata.get(_STATIC, False))
        static = tuple(f.name for f in fields if f.metadata.get(_STATIC, False))
        keys = tuple(jax.tree_util.GetAttrKey(n) for n in children)

        def flatten_with_keys(m):
            d = m.__dict__
            return [(k, d[n]) for k, n in zip(keys, children)], tuple(d[n] for n in static)

        # flatten/unflatten run on every tree walk (each transform and optimizer call): built
        # from C-level getters, with no per-field Python loop
        get_children = _tuple_getter(children)
        get_static = _tuple_getter(static)

        def flatten(m):
            d = m.__dict__
            return get_children(d), get_static(d)

        unflatten = _make_unflatten(cls, children, static)

        jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
        if cls.__setattr__ is Module.__setattr__ and cls.__delattr__ is Module.__delattr__:
            # immutable instances: their trees' flattens are memoized (nablax/tree.py)
            _tree._register_module(cls, children, static, Tensor)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_nx_initializing"):
            object.__setattr__(self, name, value)
            return
        raise FrozenModuleError(
            f"{type(self).__name__}.{name}: modules are immutable pytrees; make a changed copy "
            f"with model.replace({name}=...)"
        )

    def __delattr__(self, name: str) -> None:
        raise FrozenModuleError(f"{type(self).__name__}.{name}: modules are immutable")

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (``dataclasses.replace`` without calling ``__init__``).

        >>> from nablax import nn
        >>> lin = nn.Linear(2, 3, key=nx.random.key(0))
        >>> lin.replace(bias=None).bias is None
        True
        """
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.replace: no field named {unknown[0]!r}; "
                f"fields are {', '.join(sorted(names))}"
            )
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def __repr__(self) -> str:
        return _format(self, 0)


# ---- printing ----------------------------------------------------------------------------------

_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int32": "i32",
    "int8": "i8",
    "int16": "i16",
    "uint8": "u8",
    "uint32": "u32",
    "bool": "bool",
    "complex64": "c64",
}


def _leaf(v: Any) -> str:
    if isinstance(v, Tensor) or (hasattr(v, "shape") and hasattr(v, "dtype")):
        dt = str(v.dtype)
        return f"{_SHORT.get(dt, dt)}[{','.join(str(d) for d in v.shape)}]"
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    return repr(v)


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    """A static field still at its declared default is left out of the printout."""
    if not f.metadata.get(_STATIC) or f.default is dataclasses.MISSING:
        return False
    try:
        return bool(value == f.default)
    except Exception:  # noqa: BLE001 - a value that does not compare is printed
        return False


def _format(v: Any, indent: int) -> str:
    pad = "  " * (indent + 1)
    if isinstance(v, Module):
        parts = [
            (f.name, v.__dict__[f.name])
            for f in dataclasses.fields(v)  # type: ignore[arg-type]
            if not _is_default(f, v.__dict__[f.name])
        ]
        items = [f"{n}={_format(x, indent + 1)}" for n, x in parts]
        head = type(v).__name__
    elif isinstance(v, (list, tuple)) and any(isinstance(x, Module) for x in v):
        items = [_format(x, indent + 1) for x in v]
        head = ""
        open_, close = ("[", "]") if isinstance(v, list) else ("(", ")")
        return open_ + "\n" + "".join(f"{pad}{i},\n" for i in items) + "  " * indent + close
    elif isinstance(v, dict) and any(isinstance(x, Module) for x in v.values()):
        items = [f"{k!r}: {_format(x, indent + 1)}" for k, x in v.items()]
        return "{\n" + "".join(f"{pad}{i},\n" for i in items) + "  " * indent + "}"
    else:
        return _leaf(v)
    one_line = f"{head}({', '.join(items)})"
    if "\n" not in one_line and len(one_line) + 2 * indent <= 100:
        return one_line
    return head + "(\n" + "".join(f"{pad}{i},\n" for i in items) + "  " * indent + ")"
