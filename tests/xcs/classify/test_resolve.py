"""``classify/resolve.py``: names resolved to the objects they denote (import aliases, closures,
globals, instance attributes, annotations)."""

from __future__ import annotations

import sqlite3

import numpy as np

from nablax.xcs.classify.analysis import classify

xp = np


def test_aliases_at_module_level_and_inside_the_function():
    def a(x):
        return xp.tanh(x)  # xp = np at module level

    def b(x):
        from jax import numpy as jnumpy

        return jnumpy.tanh(x)

    def c(path):
        from os.path import exists as there

        return there(path)

    def d(x):
        import jax.lax as L

        return L.cumsum(x)

    assert (classify(a).kind, classify(a).jax_traceable) == ("tensor", False)
    assert (classify(b).kind, classify(b).jax_traceable) == ("tensor", True)
    assert classify(c).kind == "orchestration"
    assert classify(d).jax_traceable
    assert "(JAX)" in classify(b).reasons[0]


def test_closures_globals_and_instance_attributes():
    conn = sqlite3.connect(":memory:")

    def count_rows():
        return conn.execute("SELECT 1").fetchall()

    class Repo:
        def __init__(self, db):
            self.db = db

        def rows(self):
            return self.db.execute("SELECT 1").fetchall()

    try:
        assert classify(count_rows).kind == "orchestration"
        c = classify(Repo(conn).rows)
        assert c.kind == "orchestration" and "sqlite3" in " ".join(c.reasons)
    finally:
        conn.close()


def test_annotations_are_the_last_resort():
    import jax

    def total(x: jax.Array) -> jax.Array:
        return x.sum()

    def rows(conn: sqlite3.Connection):
        return conn.cursor()

    def described(x: np.ndarray):
        """Annotations lose to the source: this one calls print."""
        print(x)

    assert (
        classify(total).kind == "tensor" and "annotated as jax.Array" in classify(total).reasons[0]
    )
    assert classify(rows).kind == "orchestration"
    assert classify(described).kind == "orchestration"
