"""``nablax demo``: train a small neural network with autodiff, in plain eager nablax.

A 2-hidden-layer MLP (tanh) learns to tell apart the three arms of a 2-D spiral (generated with
NumPy from a fixed seed, no downloads) by full-batch gradient descent with momentum. The training
step is ordinary imperative code::

    loss, grads = nx.value_and_grad(loss_fn)(params, x, y)
    velocity = nx.tree.map(lambda v, g: momentum * v + g, velocity, grads)
    params = nx.tree.map(lambda p, v: p - lr * v, params, velocity)
    loss.item()

``params`` is a pytree (a list of ``{"w": ..., "b": ...}`` dicts) and so is the optimizer state.
Nothing runs until ``loss.item()``: reading the loss realizes the whole step. What the loss needs
(the forward pass) runs as one XLA program; the rest (backward pass, the new ``velocity`` and
``params``, which are live tensors connected to the loss) runs as a second program that JAX
executes asynchronously while Python builds the next step. Every step builds graphs of the same
*structure*, so both programs are compiled once and every later step is two cache hits (see
:func:`nablax.cache_info`). The learning rate and momentum are Python scalars: a loop that changed
them would compile at most once more per program.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import nablax as nx


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run` measured.

    ``losses`` has one entry per step (the loss *before* that step's update); ``accuracy`` is the
    final training accuracy; ``compiles`` and ``hits`` count realization-cache events during the
    training loop only.
    """

    losses: list[float]
    accuracy: float
    compiles: int
    hits: int
    seconds: float
    cache: object  # nx.cache_info() at the end of the run


def make_spirals(
    n: int = 300, classes: int = 3, noise: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``classes`` interleaved spiral arms in 2-D, ``n // classes`` points each, shuffled.

    Returns ``(X, y)`` with ``X`` float32 of shape ``(m, 2)`` inside the unit disc and ``y`` int32
    class ids in ``[0, classes)``, where ``m = classes * (n // classes)``. ``noise`` jitters each
    point's angle (radians). The classes are not linearly separable: a linear model gets about a
    third of them right, a small MLP all of them.

    >>> X, y = make_spirals(9)
    >>> X.shape, X.dtype.name, sorted(set(y.tolist()))
    ((9, 2), 'float32', [0, 1, 2])
    """
    rng = np.random.default_rng(seed)
    per = n // classes
    radius = np.linspace(0.05, 1.0, per)
    xs, ys = [], []
    for c in range(classes):
        start = 2 * np.pi * c / classes
        angle = np.linspace(start, start + 1.75 * np.pi, per) + noise * rng.standard_normal(per)
        xs.append(np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1))
        ys.append(np.full(per, c))
    X = np.concatenate(xs).astype(np.float32)
    y = np.concatenate(ys).astype(np.int32)
    perm = rng.permutation(len(X))
    return X[perm], y[perm]


def init_params(sizes: tuple[int, ...], seed: int = 0) -> list[dict[str, nx.Tensor]]:
    """One ``{"w", "b"}`` dict per layer: ``w`` normal with variance ``1 / fan_in``, ``b`` zero.

    >>> [tuple(layer["w"].shape) for layer in init_params((2, 8, 3))]
    [(2, 8), (8, 3)]
    """
    rng = np.random.default_rng(seed)
    return [
        {
            "w": nx.tensor((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)),
            "b": nx.tensor(np.zeros(b, np.float32)),
        }
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def forward(params, x):
    """Logits of the MLP: ``tanh`` on every hidden layer, linear output layer."""
    h = x
    for layer in params[:-1]:
        h = nx.tanh(h @ layer["w"] + layer["b"])
    return h @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    """Mean softmax cross-entropy of the logits against integer labels ``y``."""
    logp = nx.log_softmax(forward(params, x), axis=-1)
    return -nx.mean(nx.take_along_axis(logp, y[:, None], axis=1))


_loss_and_grad = nx.value_and_grad(loss_fn)


def train_step(params, velocity, x, y, lr: float, momentum: float):
    """One step of gradient descent with momentum; returns lazy ``(params, velocity, loss)``."""
    loss, grads = _loss_and_grad(params, x, y)
    velocity = nx.tree.map(lambda v, g: momentum * v + g, velocity, grads)
    params = nx.tree.map(lambda p, v: p - lr * v, params, velocity)
    return params, velocity, loss


def run(
    steps: int = 300,
    print_fn: Callable[[str], object] | None = print,
    *,
    lr: float = 0.1,
    momentum: float = 0.9,
    hidden: int = 32,
    n: int = 300,
    seed: int = 0,
    print_every: int | None = None,
) -> DemoResult:
    """Train the MLP on the spirals; report the loss, the final accuracy and the cache stats.

    ``print_fn`` receives each line of the report (``None`` silences it). Each step is realized
    by reading its loss (``loss.item()``), which also computes the new parameters and velocity
    (in a second, asynchronous program); all steps share one graph structure (also from the third
    step on, when the call cache replays the gradient's graph): two compiles, then cache hits.

    >>> r = run(steps=5, print_fn=None)
    >>> len(r.losses), r.losses[-1] < r.losses[0], r.compiles <= 2, r.compiles + r.hits
    (5, True, True, 10)
    """
    say = print_fn if print_fn is not None else (lambda _line: None)
    if print_every is None:
        print_every = max(1, steps // 10)
    X_np, y_np = make_spirals(n, seed=seed)
    x, y = nx.tensor(X_np), nx.tensor(y_np)
    sizes = (2, hidden, hidden, 3)
    params = init_params(sizes, seed)
    # realized zeros (not lazy ones), so that step 1 has the same graph structure as step 2
    velocity = [{k: nx.tensor(np.zeros(v.shape, np.float32)) for k, v in d.items()} for d in params]

    say(
        f"MLP {'-'.join(map(str, sizes))} (tanh) on {len(X_np)} spiral points, 3 classes: "
        f"{steps} steps of nx.value_and_grad + momentum SGD (lr={lr}, momentum={momentum})"
    )
    before = nx.cache_info()
    t0 = time.perf_counter()
    losses: list[float] = []
    for i in range(steps):
        params, velocity, loss = train_step(params, velocity, x, y, lr, momentum)
        losses.append(loss.item())  # realizes the step: the loss, then new params and velocity
        if i % print_every == 0 or i == steps - 1:
            say(f"  step {i:4d}  loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - t0
    after = nx.cache_info()

    predicted = nx.argmax(forward(params, x), axis=-1)
    accuracy = float((predicted == y).astype(nx.float32).mean().item())
    compiles, hits = after.compiles - before.compiles, after.hits - before.hits
    say(
        f"final train accuracy {accuracy:.3f}   ({steps} steps in {seconds:.2f} s, "
        f"{seconds / max(steps, 1) * 1e3:.2f} ms/step)"
    )
    say(f"training loop: {compiles} compile(s), {hits} cache hit(s)")
    info = nx.cache_info()
    say(f"nx.cache_info() = {info}")
    return DemoResult(losses, accuracy, compiles, hits, seconds, info)


# ---- DP-SGD: per-example gradient clipping with nx.vmap(nx.grad(...)) -------------------------


@dataclass(frozen=True)
class DPResult:
    """What :func:`run_dp_sgd` measured: the loss before each step, the final training accuracy,
    and the fraction of per-example gradients the clipping shortened (over all steps)."""

    losses: list[float]
    accuracy: float
    clipped_fraction: float
    seconds: float


def example_loss(params, x, y):
    """Softmax cross-entropy of ONE example: ``x`` of shape ``(2,)``, ``y`` a 0-d class id."""
    logp = nx.log_softmax(forward(params, x[None]), axis=-1)
    return -nx.take_along_axis(logp, y.reshape(1, 1), axis=1).sum()


_per_example_grads = nx.vmap(nx.grad(example_loss), in_axes=(None, 0, 0))


def dp_sgd_step(params, x, y, key, *, lr: float, clip: float, noise: float):
    """One DP-SGD step (Abadi et al. 2016): per-example gradients, each clipped to L2 norm
    ``clip``, summed, Gaussian noise of standard deviation ``noise * clip`` added, averaged.

    Returns lazy ``(params, clipped_count)``.
    """
    grads = _per_example_grads(params, x, y)  # every leaf has a leading batch axis
    leaves, treedef = nx.tree.flatten(grads)
    sq = sum((g.reshape(g.shape[0], -1) ** 2).sum(axis=1) for g in leaves)
    norms = nx.sqrt(sq)  # (batch,)
    scale = nx.minimum(1.0, clip / (norms + 1e-12))
    keys = nx.random.split(key, len(leaves))
    batch = x.shape[0]
    noisy = []
    for i, g in enumerate(leaves):
        summed = (g * scale.reshape((batch,) + (1,) * (g.ndim - 1))).sum(axis=0)
        noisy.append((summed + noise * clip * nx.random.normal(keys[i], summed.shape)) / batch)
    update = nx.tree.unflatten(treedef, noisy)
    params = nx.tree.map(lambda p, u: p - lr * u, params, update)
    return params, (norms > clip).astype(nx.int32).sum()


def run_dp_sgd(
    steps: int = 300,
    print_fn: Callable[[str], object] | None = print,
    *,
    lr: float = 4.0,
    clip: float = 1.0,
    noise: float = 0.3,
    batch: int = 60,
    hidden: int = 32,
    n: int = 300,
    seed: int = 0,
) -> DPResult:
    """Train the MLP on the spirals with DP-SGD (per-example clipping via ``nx.vmap(nx.grad(...))``).

    >>> r = run_dp_sgd(steps=3, print_fn=None)
    >>> len(r.losses), 0.0 <= r.clipped_fraction <= 1.0
    (3, True)
    """
    say = print_fn if print_fn is not None else (lambda _line: None)
    X_np, y_np = make_spirals(n, seed=seed)
    x_all, y_all = nx.tensor(X_np), nx.tensor(y_np)
    params = init_params((2, hidden, hidden, 3), seed)
    key = nx.random.key(seed)
    rng = np.random.default_rng(seed)
    say(
        f"DP-SGD: {steps} steps, batch {batch}, per-example gradients clipped to norm {clip} "
        f"(nx.vmap(nx.grad(example_loss))), Gaussian noise {noise} x clip, lr={lr}"
    )
    losses: list[float] = []
    clipped = 0
    t0 = time.perf_counter()
    print_every = max(1, steps // 5)
    for i in range(steps):
        idx = rng.choice(len(X_np), batch, replace=False)
        x, y = nx.tensor(X_np[idx]), nx.tensor(y_np[idx])
        key, sub = nx.random.split(key)
        losses.append(loss_fn(params, x, y).item())
        params, n_clipped = dp_sgd_step(params, x, y, sub, lr=lr, clip=clip, noise=noise)
        clipped += int(n_clipped.item())
        if i % print_every == 0 or i == steps - 1:
            say(f"  step {i:4d}  loss {losses[-1]:.4f}  clipped {int(n_clipped.item())}/{batch}")
    seconds = time.perf_counter() - t0
    predicted = nx.argmax(forward(params, x_all), axis=-1)
    accuracy = float((predicted == y_all).astype(nx.float32).mean().item())
    fraction = clipped / max(1, steps * batch)
    say(
        f"DP-SGD final train accuracy {accuracy:.3f}, {fraction:.0%} of per-example gradients "
        f"clipped ({steps} steps in {seconds:.2f} s)"
    )
    return DPResult(losses, accuracy, fraction, seconds)


# ---- nx.compile and nx.shard_map -------------------------------------------------------------


@dataclass(frozen=True)
class CompiledResult:
    """What :func:`run_compiled` measured: losses, final accuracy, per-step times (compiled and
    eager, same steps) and the compiled function's cache counters."""

    losses: list[float]
    accuracy: float
    ms_per_step: float
    eager_ms_per_step: float
    cache: object


def run_compiled(
    steps: int = 300,
    print_fn: Callable[[str], object] | None = print,
    *,
    lr: float = 0.1,
    momentum: float = 0.9,
    hidden: int = 32,
    n: int = 300,
    seed: int = 0,
) -> CompiledResult:
    """The training loop of :func:`run` with ``train_step`` under ``nx.compile``: traced once,
    then every step calls the cached executable directly.

    >>> r = run_compiled(steps=5, print_fn=None)
    >>> len(r.losses), r.cache.traces, r.cache.hits
    (5, 1, 4)
    """
    say = print_fn if print_fn is not None else (lambda _line: None)
    X_np, y_np = make_spirals(n, seed=seed)
    x, y = nx.tensor(X_np), nx.tensor(y_np)
    compiled_step = nx.compile(train_step, static_argnums=(4, 5))

    def loop(step_fn):
        params = init_params((2, hidden, hidden, 3), seed)
        velocity = [
            {k: nx.tensor(np.zeros(v.shape, np.float32)) for k, v in d.items()} for d in params
        ]
        losses = []
        t0 = time.perf_counter()
        for i in range(steps):
            if i == 1:  # steady state: the first step pays tracing and compilation
                t0 = time.perf_counter()
            params, velocity, loss = step_fn(params, velocity, x, y, lr, momentum)
            losses.append(loss.item())
        return params, losses, time.perf_counter() - t0

    params, losses, seconds = loop(compiled_step)
    _, eager_losses, eager_seconds = loop(train_step)
    predicted = nx.argmax(forward(params, x), axis=-1)
    accuracy = float((predicted == y).astype(nx.float32).mean().item())
    timed = max(steps - 1, 1)
    ms, eager_ms = seconds / timed * 1e3, eager_seconds / timed * 1e3
    info = compiled_step.cache_info()
    say(
        f"nx.compile(train_step): {steps} steps, {ms:.2f} ms/step after the first (eager: "
        f"{eager_ms:.2f} ms/step), final loss {losses[-1]:.4f} (eager {eager_losses[-1]:.4f}), accuracy "
        f"{accuracy:.3f}; {info}"
    )
    return CompiledResult(losses, accuracy, ms, eager_ms, info)


def run_sharded(print_fn: Callable[[str], object] | None = print, *, seed: int = 0) -> dict:
    """One data-parallel training step with ``nx.shard_map`` over every device (the batch split
    over a ``dp`` mesh axis, parameters replicated); prints the sharding plan. Returns
    ``{"loss": float, "plan": {name: ShardingSpec}}``.

    >>> r = run_sharded(print_fn=None)
    >>> sorted(r["plan"])
    ['loss', 'new w1', 'x', 'y']
    """
    say = print_fn if print_fn is not None else (lambda _line: None)
    devs = nx.devices()
    n_dev = len(devs)
    X_np, y_np = make_spirals(300, seed=seed)
    m = (len(X_np) // n_dev) * n_dev
    mesh = nx.DeviceMesh((n_dev,), ("dp",))
    xs = nx.tensor(X_np[:m]).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    ys = nx.tensor(y_np[:m]).shard(mesh, [nx.DimSpec(["dp"])])
    params = init_params((2, 16, 16, 3), seed)

    def step(w1, b1, w2, b2, w3, b3, x, y):
        p = [{"w": w1, "b": b1}, {"w": w2, "b": b2}, {"w": w3, "b": b3}]
        loss, grads = _loss_and_grad(p, x, y)
        new = [layer[k] - 0.1 * g[k] for layer, g in zip(p, grads) for k in ("w", "b")]
        return (*new, loss)

    flat = [layer[k] for layer in params for k in ("w", "b")]
    *new, loss = nx.shard_map(step, mesh)(*flat, xs, ys)
    plan = {"x": xs.sharding, "y": ys.sharding, "new w1": new[0].sharding, "loss": loss.sharding}
    say(
        f"nx.shard_map data-parallel step on {n_dev} {devs[0].platform} device(s), loss "
        f"{loss.item():.4f}; sharding plan:"
    )
    for name, spec in plan.items():
        say(f"  {name:7s} {spec}")
    return {"loss": loss.item(), "plan": plan}


def _attention_model(p, x):
    """Logits of a one-layer attention classifier built from the tuned bundled kernels."""
    from .kernels import library

    b, s, d = x.shape
    h, hd = p["heads"], p["wq"].shape[1] // p["heads"]
    flat = x.reshape(b * s, d)
    q, k, v = (library.matmul(flat, p[w]).reshape(b, s, h, hd) for w in ("wq", "wk", "wv"))
    a = library.attention(q, k, v, causal=True)  # (b, s, h, hd): blockwise, custom vjp
    pooled = nx.tanh(a.reshape(b, s, h * hd).mean(axis=1))
    return library.matmul(pooled, p["wo"])


def run_kernels(
    steps: int = 30,
    lr: float = 0.5,
    print_fn: Callable[[str], object] | None = print,
    *,
    seed: int = 0,
) -> dict:
    """Train a small attention classifier whose projections and attention are the bundled
    ``nablax.kernels.library`` kernels on nablax Tensors: each call picks its config through the
    selection chain (autotuned on first use on this device, then read from the persistent
    database), and ``nx.value_and_grad`` flows through the kernels' custom VJPs. Returns the
    losses and the chosen configs with their source.

    >>> r = run_kernels(steps=2, print_fn=None)
    >>> len(r["losses"]), sorted({c["op"] for c in r["configs"]})
    (2, ['attention@v1', 'matmul@v1'])
    """
    from .kernels import default_executor, device_fingerprint, library

    say = print_fn if print_fn is not None else (lambda _line: None)
    rng = np.random.default_rng(seed)
    n, s, d, heads, hd = 64, 32, 16, 2, 8
    X_np = rng.standard_normal((n, s, d)).astype(np.float32)
    y_np = np.argmax(X_np[..., :3].mean(axis=1), axis=-1).astype(np.int32)
    x, y = nx.tensor(X_np), nx.tensor(y_np)

    def w(a, b):
        return nx.tensor((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))

    params = {"wq": w(d, heads * hd), "wk": w(d, heads * hd), "wv": w(d, heads * hd)}
    params["wo"] = w(heads * hd, 3)

    def loss_fn(p, x, y):
        logp = nx.log_softmax(_attention_model({**p, "heads": heads}, x), axis=-1)
        return -nx.mean(nx.take_along_axis(logp, y[:, None], axis=1))

    grad_fn = nx.value_and_grad(loss_fn)
    store = default_executor().chooser.persistent
    before = {(e.op_id, e.call_key) for e in store.entries()} if store is not None else set()
    t0 = time.perf_counter()
    losses = []
    for _ in range(steps):
        loss, grads = grad_fn(params, x, y)
        params = nx.tree.map(lambda p, g: p - lr * g, params, grads)
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    configs = _kernel_configs(store, device_fingerprint(), before, library, n, s, d, heads, hd)
    say(
        f"attention classifier on tuned kernels ({library.MATMUL.versioned_id}, "
        f"{library.ATTENTION.versioned_id}): loss {losses[0]:.4f} -> {losses[-1]:.4f} in "
        f"{steps} steps, {seconds:.2f} s (first use of a shape includes autotuning)"
    )
    for c in configs:
        say(f"  {c['op']:<13} {c['call'][:58]:<58} {c['cfg']}  [{c['source']}]")
    return {"losses": losses, "configs": configs, "seconds": seconds}


def _kernel_configs(store, device: str, before: set, library, n, s, d, heads, hd) -> list[dict]:
    """The configs the demo's kernel calls use (looked up by their call keys), and whether this
    run tuned them."""
    import jax

    from .kernels import Invocation

    def f32(*shape):
        return jax.ShapeDtypeStruct(shape, np.float32)

    calls = [
        (library.MATMUL, (f32(n * s, d), f32(d, heads * hd)), {}),
        (library.ATTENTION, (f32(n, s, heads, hd),) * 3, {"causal": True, "scale": None}),
        (library.MATMUL, (f32(n, heads * hd), f32(heads * hd, 3)), {}),
    ]
    out = []
    for kernel, args, kw in calls:
        args, kw = kernel.prepare(*args, **kw)
        inv = Invocation(kernel.versioned_id, tuple(args), kw)
        # every call runs under nx.value_and_grad: a kernel tuned on forward plus backward
        # (attention) stored its training choice under the call key + ":fwd+bwd"
        key = inv.call_key + (":fwd+bwd" if getattr(kernel, "tune_grad", False) else "")
        e = store.get_entry(device, inv.op_id, key) if store is not None else None
        if e is None:
            continue
        fresh = (e.op_id, e.call_key) not in before
        where = "tuned in this run" if fresh else "already in the database"
        out.append(
            {
                "op": e.op_id,
                "call": e.signature,
                "cfg": repr(e.cfg),
                "source": f"{e.source}, {where}",
            }
        )
    return out
