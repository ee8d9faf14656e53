"""``classify/objects.py``: objects are read statically (no property, ``__getattr__`` or
descriptor of the user's runs), named by their public dotted name, and told apart as library or
user code."""

from __future__ import annotations

import functools
import json
import os
import types

import numpy as np

from nablax.xcs.classify import objects
from nablax.xcs.classify.records import MISSING


class _Probe:
    runs = 0
    kind = "class attribute"

    def __init__(self):
        self.value = 1

    @property
    def prop(self):
        type(self).runs += 1
        return "ran"

    def __getattr__(self, name):
        type(self).runs += 1
        return "ran"

    def method(self):
        return self.value

    @staticmethod
    def helper():
        return 2


def test_static_attr_runs_no_user_code():
    p = _Probe()
    assert objects.static_attr(p, "prop") is MISSING
    assert objects.static_attr(p, "missing") is MISSING
    assert objects.static_attr(p, "value") == 1
    assert objects.static_attr(p, "kind") == "class attribute"
    bound = objects.static_attr(p, "method")
    assert isinstance(bound, types.MethodType) and bound.__self__ is p and bound() == 1
    assert objects.static_attr(_Probe, "helper") is _Probe.__dict__["helper"].__func__
    assert objects.static_attr(json, "dumps") is json.dumps
    assert _Probe.runs == 0


def test_describe_gives_public_dotted_names():
    assert objects.describe(json.dumps) == "json.dumps"
    assert objects.describe(np.add) == "numpy.ufunc"  # an object, not a function: its class
    assert objects.describe(os.path.join) == "os.path.join"  # not posixpath.join
    assert objects.describe(json) == "json"
    assert objects.describe(_Probe().method) == f"{__name__}._Probe.method"
    assert objects.describe("abc".upper) == "builtins.str.upper"
    assert objects.describe(functools.partial(len)) == "functools.partial"


def test_library_and_user_code():
    def mine():
        return 1

    assert objects.is_library(json.dumps) and objects.is_library(len)
    assert not objects.is_library(mine)
    assert objects.user_callable(mine) and not objects.user_callable(json.dumps)
    assert objects.is_user_class(_Probe) and not objects.is_user_class(dict)
    assert objects.is_user_instance(_Probe()) and not objects.is_user_instance([1])
    assert objects.rule_for(np.add, "numpy.add").kind == "tensor"
    assert objects.rule_for(mine, None) is None


def test_owner_class_of_a_method():
    assert objects.owner_class(_Probe.method, MISSING) is _Probe
    assert objects.owner_class(_Probe.helper, MISSING) is None  # a staticmethod has no self
    assert objects.owner_class(_Probe.method, _Probe()) is _Probe
