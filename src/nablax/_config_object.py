"""``nx.config``: the public face of the options of :mod:`nablax._config` (which holds them, with
their values, sources, environment variables and checks)."""

from __future__ import annotations

import contextlib
from typing import Any

from ._config import _OPTIONS, _unknown, describe, get, override, reload, update


class Config:
    """nablax's options, as ``nx.config`` (also ``from nablax import config``).

    Read an option as an attribute (``nx.config.max_graph_depth``) or with :meth:`get`; set it
    for the whole process with :meth:`update` or for a block of code with :meth:`override`;
    re-read the ``NABLAX_*`` environment variables with :meth:`reload`; ``print(nx.config)``
    (:meth:`describe`) lists every option with its value, where the value came from (default,
    env, update or override), its variable, the accepted values and what it does.

    >>> import nablax as nx
    >>> nx.config.async_rest_min_nodes
    16
    >>> print(nx.config.describe("ops_stamp"))  # doctest: +ELLIPSIS
    ops_stamp = 'hash'  [default]
        accepts one of 'hash', 'json', 'none'; default 'hash'
        variable NABLAX_OPS_STAMP: one of 'hash', 'json', 'none'
        How kernel calls are named in lowered HLO and profiles: ...
    >>> nx.config.max_graph_dept
    Traceback (most recent call last):
    ...
    nablax.errors.UnknownOptionError: nx.config: unknown option 'max_graph_dept' (did you mean 'max_graph_depth'?). ...
    """

    __slots__ = ()

    def get(self, name: str) -> Any:
        """The current value of option ``name`` in this context (same as ``nx.config.<name>``).

        >>> import nablax as nx
        >>> nx.config.get("backward_plans")
        True
        """
        return get(name)

    def update(self, name: str, value: Any) -> None:
        """Set option ``name`` to ``value`` for the whole process (every thread and task), until
        the next ``update`` or :meth:`reload`. A scoped :meth:`override` still wins inside its
        block. The value is checked now: a wrong type or range raises ``ConfigError`` naming the
        option, its variable and the accepted values.

        >>> import nablax as nx
        >>> nx.config.update("max_executables", 512)
        >>> nx.config.max_executables
        512
        >>> nx.config.update("max_executables", "big")
        Traceback (most recent call last):
        ...
        nablax.errors.ConfigError: nx.config.update: option 'max_executables' (variable NABLAX_MAX_EXECUTABLES) must be an integer >= 0; got str 'big'. ...
        >>> nx.config.reload()  # back to the NABLAX_* variables and defaults
        >>> nx.config.max_executables
        256
        """
        update(name, value)

    def override(self, **values: Any) -> contextlib.AbstractContextManager[None]:
        """Set options for a block of code, in this thread or async task only: the values live
        in a ``contextvars`` variable, so other threads keep theirs, and a task started inside
        the block keeps them. Overrides nest; leaving the block restores the previous values.
        Names and values are checked by this call (``UnknownOptionError``, ``ConfigError``).

        >>> import nablax as nx
        >>> with nx.config.override(max_graph_depth=100, backward_plans=False):
        ...     nx.config.max_graph_depth, nx.config.backward_plans
        (100, False)
        >>> nx.config.max_graph_depth
        2048
        """
        return override(**values)

    def reload(self) -> None:
        """Re-read the ``NABLAX_*`` environment variables (as at import): every option gets its
        variable's value, or its default when the variable is unset or empty, and values set by
        :meth:`update` are dropped. Scoped overrides stay in force in their blocks. If a
        variable cannot be parsed, ``ConfigError`` names it with the accepted values and nothing
        changes.

        >>> import os, nablax as nx
        >>> os.environ["NABLAX_ASYNC_REST_MIN_NODES"] = "64"
        >>> nx.config.reload()
        >>> nx.config.async_rest_min_nodes
        64
        >>> del os.environ["NABLAX_ASYNC_REST_MIN_NODES"]
        >>> nx.config.reload()
        >>> nx.config.async_rest_min_nodes
        16
        """
        reload()

    def describe(self, *names: str) -> str:
        """Text listing the options ``names`` (all by default): for each, ``name = value
        [source]`` with source one of default / env / update / override, then its environment
        variable, accepted values, default and docstring. ``str(nx.config)`` is ``describe()``.

        >>> import nablax as nx
        >>> with nx.config.override(autotune=False):
        ...     print(nx.config.describe("autotune"))  # doctest: +ELLIPSIS
        autotune = False  [override]
            accepts True or False; default True
            variable NABLAX_AUTOTUNE: 1/0, true/false, yes/no, on/off
            Default of AutotunePolicy.allow_autotune ...
        """
        return describe(*names)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocols (copy, pickle, ...) probe dunders
            raise AttributeError(name)
        opt = _OPTIONS.get(name)
        if opt is None:
            raise _unknown("nx.config", name)
        return get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"nx.config.{name} = ... does not set options. Fix: nx.config.update({name!r}, "
            f"{value!r:.40}) for the whole process, or `with nx.config.override({name}=...):` "
            f"for a block of code."
        )

    def __dir__(self) -> list[str]:
        return sorted({*object.__dir__(self), *_OPTIONS})

    def __str__(self) -> str:
        return describe()

    def __repr__(self) -> str:
        return "nx.config(" + ", ".join(f"{n}={get(n)!r}" for n in _OPTIONS) + ")"


for _name in _OPTIONS:  # an option named like a method would be unreachable as an attribute
    assert not hasattr(Config, _name), _name

config = Config()
