"""Sharding rules: how each primitive's output is laid out given its inputs' layouts.

``nx.shard_map`` (core/sharding.py) propagates layouts through the traced graph with these rules
to build the *sharding plan* it shows as ``.sharding`` and asks XLA to produce. A layout is a tuple
with one entry per dimension, each a tuple of mesh axis names splitting that dimension (``()``:
replicated along it)::

    shard(params, in_layouts, in_avals, out_avals) -> tuple of output layouts

``in_avals``/``out_avals`` are logical ``(shape, dtype)`` pairs. Rules only *propose* layouts; the
caller drops axes that do not divide a dimension or that repeat. Where a rule cannot say anything
useful (gathers, random bits) it replicates: always correct, XLA then moves data as needed.
"""

from __future__ import annotations


def replicated(params, in_layouts, in_avals, out_avals):
    return tuple(((),) * len(shape) for shape, _ in out_avals)


def same_as_input(params, in_layouts, in_avals, out_avals):
    return (in_layouts[0],) * len(out_avals)


def elementwise(params, in_layouts, in_avals, out_avals):
    """NumPy broadcasting: an output dimension takes the axes of an input dimension of the same
    size (inputs aligned at the right); the first input that splits it wins."""
    (out_shape, _), *_ = out_avals
    rank = len(out_shape)
    out = [()] * rank
    for lay, (shape, _) in zip(in_layouts, in_avals):
        off = rank - len(shape)
        for d, axes in enumerate(lay):
            if axes and not out[d + off] and shape[d] == out_shape[d + off]:
                out[d + off] = axes
    return (tuple(out),)


def drop_dims(dims_of):
    """Rule of a reduction: the reduced dimensions (``dims_of(params)``) disappear."""

    def rule(params, in_layouts, in_avals, out_avals):
        gone = set(dims_of(params))
        lay = in_layouts[0]
        kept = tuple(a for d, a in enumerate(lay) if d not in gone)
        return (kept,) * len(out_avals)

    return rule


def replicate_dims(dims_of):
    """Rule of an op along some dimensions (sort, cumsum, ...): those become replicated."""

    def rule(params, in_layouts, in_avals, out_avals):
        along = set(dims_of(params, in_avals))
        lay = tuple(() if d in along else a for d, a in enumerate(in_layouts[0]))
        return (lay,) * len(out_avals)

    return rule


def unchanged_dims(params, in_layouts, in_avals, out_avals):
    """Shape-changing ops of equal rank (slice, pad): dimensions whose size is unchanged keep
    their axes, the others are replicated."""
    (in_shape, _), (out_shape, _) = in_avals[0], out_avals[0]
    lay = in_layouts[0]
    return (tuple(a if i == o else () for a, i, o in zip(lay, in_shape, out_shape)),)


def reshape(params, in_layouts, in_avals, out_avals):
    """Dimensions are matched in groups whose sizes multiply to the same number (size-1
    dimensions aside): a group's leading input dimension passes its axes to the group's leading
    output dimension (kept, merged into a larger one, or split into a leading factor: contiguous
    blocks either way), unless a later dimension of the input group is split too (replicated)."""
    (in_shape, _), (out_shape, _) = in_avals[0], out_avals[0]
    lay = in_layouts[0]
    out = [()] * len(out_shape)
    ins = [d for d, n in enumerate(in_shape) if n != 1]
    outs = [d for d, n in enumerate(out_shape) if n != 1]
    i = o = 0
    while i < len(ins) and o < len(outs):
        gi, go = [ins[i]], [outs[o]]
        pi, po = in_shape[ins[i]], out_shape[outs[o]]
        i, o = i + 1, o + 1
        while pi != po:
            if pi < po and i < len(ins):
                gi.append(ins[i])
                pi *= in_shape[ins[i]]
                i += 1
            elif po < pi and o < len(outs):
                go.append(outs[o])
                po *= out_shape[outs[o]]
                o += 1
            else:
                return (tuple(out),)  # sizes that do not line up (symbolic): nothing is kept
        if all(not lay[d] for d in gi[1:]):
            out[go[0]] = lay[gi[0]]
    return (tuple(out),)


def transpose(params, in_layouts, in_avals, out_avals):
    lay = in_layouts[0]
    return (tuple(lay[p] for p in params[0]),)


def broadcast_in_dim(params, in_layouts, in_avals, out_avals):
    shape, dims = params[0], params[1]
    in_shape = in_avals[0][0]
    out = [()] * len(shape)
    for i, d in enumerate(dims):
        if in_shape[i] == shape[d]:
            out[d] = in_layouts[0][i]
    return (tuple(out),)


def concatenate(params, in_layouts, in_avals, out_avals):
    (lay,) = elementwise(params, in_layouts, in_avals, out_avals)
    lay = list(lay)
    lay[params[0]] = ()
    return (tuple(lay),)


def _labels(term: str, rank: int, n_ell: int) -> list:
    """The labels of an einsum operand, ``...`` expanded to its share of the ``n_ell`` broadcast
    dimensions (right-aligned, as NumPy broadcasting does)."""
    if "..." not in term:
        return list(term)
    pre, post = term.split("...")
    k = rank - len(pre) - len(post)
    return list(pre) + [f"...{i}" for i in range(n_ell - k, n_ell)] + list(post)


def einsum(params, in_layouts, in_avals, out_avals):
    """A label keeps the axes it has in the first operand that splits it (at full size);
    contracted labels vanish (XLA sums the partial products across their axes)."""
    ins, out = params[0].split("->")
    terms = ins.split(",")
    n_ell = max(
        (len(a[0]) - len(t.replace("...", "")) for t, a in zip(terms, in_avals) if "..." in t),
        default=0,
    )
    out_shape = out_avals[0][0]
    out_labels = _labels(out, len(out_shape), n_ell)
    size = dict(zip(out_labels, out_shape))
    axes_of: dict = {}
    for term, lay, (shape, _) in zip(terms, in_layouts, in_avals):
        for label, axes, n in zip(_labels(term, len(shape), n_ell), lay, shape):
            if axes and label not in axes_of and size.get(label, n) == n:
                axes_of[label] = axes
    return (tuple(axes_of.get(label, ()) for label in out_labels),)


def fit(layout, shape, mesh_sizes: dict) -> tuple:
    """``layout`` made valid for ``shape``: axes that do not divide their dimension, are unknown
    or repeat are dropped."""
    used: set = set()
    out = []
    for d, axes in enumerate(layout):
        keep = []
        parts = 1
        for a in axes:
            if a in used or a not in mesh_sizes:
                continue
            if shape[d] % (parts * mesh_sizes[a]):
                continue
            parts *= mesh_sizes[a]
            keep.append(a)
            used.add(a)
        out.append(tuple(keep))
    return tuple(out)
