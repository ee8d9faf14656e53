"""nablax.optim (API.md section 10) against torch.optim: the same params and random gradients fed to
both for several steps and hyper-parameter sets, compared step by step in float32; then the
properties that make the optimizers usable in nablax programs (lazy, pytrees, compile, vmap,
shard_map, checkpoints) and the errors."""

from __future__ import annotations

import inspect
import os
import tempfile

import numpy as np
import pytest

try:
    import torch
except ImportError:  # no PyTorch (the Python 3.12 run installs none): only its comparisons skip
    torch = None

import nablax as nx
from nablax import optim

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

RTOL, ATOL = 1e-5, 1e-6
STEPS = 6


def _params_np(seed: int = 0) -> dict:
    r = np.random.RandomState(seed)
    return {
        "w": r.normal(size=(4, 3)).astype(np.float32),
        "b": r.normal(size=(3,)).astype(np.float32),
    }


def _grads_np(steps: int = STEPS, seed: int = 1, scale: float = 1.0) -> list[dict]:
    r = np.random.RandomState(seed)
    return [
        {
            "w": (scale * r.normal(size=(4, 3))).astype(np.float32),
            "b": (scale * r.normal(size=(3,))).astype(np.float32),
        }
        for _ in range(steps)
    ]


def _to_nx(tree: dict) -> dict:
    return {k: nx.tensor(v) for k, v in tree.items()}


def _run_nx(opt, params_np, grads_np) -> list[dict]:
    """The params after every step (realized each step, as an eager training loop does)."""
    params = _to_nx(params_np)
    state = opt.init(params)
    out = []
    for g in grads_np:
        updates, state = opt.update(_to_nx(g), state, params)
        params = optim.apply_updates(params, updates)
        nx.realize(params, state)
        out.append({k: v.numpy() for k, v in params.items()})
    return out


def _run_torch(make_opt, params_np, grads_np, make_sched=None, clip=None) -> list[dict]:
    tp = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params_np.items()}
    opt = make_opt(list(tp.values()))
    sched = make_sched(opt) if make_sched else None
    out = []
    for g in grads_np:
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        opt.step()
        if sched is not None:
            sched.step()
        out.append({k: p.detach().numpy().copy() for k, p in tp.items()})
    return out


def _assert_same(ours: list[dict], theirs: list[dict], rtol=RTOL, atol=ATOL) -> None:
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=f"step {step} {k}")


# ---- against torch.optim --------------------------------------------------------------------------

T = torch.optim if torch is not None else None
CASES = {
    "sgd-defaults": (lambda: optim.sgd(), lambda p: T.SGD(p)),
    "sgd-lr": (lambda: optim.sgd(0.1), lambda p: T.SGD(p, lr=0.1)),
    "sgd-momentum": (
        lambda: optim.sgd(0.05, momentum=0.9),
        lambda p: T.SGD(p, lr=0.05, momentum=0.9),
    ),
    "sgd-nesterov": (
        lambda: optim.sgd(0.05, momentum=0.8, nesterov=True),
        lambda p: T.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
    ),
    "adam-defaults": (lambda: optim.adam(), lambda p: T.Adam(p)),
    "adam-hyper": (
        lambda: optim.adam(0.05, b1=0.5, b2=0.9, eps=1e-3),
        lambda p: T.Adam(p, lr=0.05, betas=(0.5, 0.9), eps=1e-3),
    ),
    "adam-b1-zero": (
        lambda: optim.adam(0.01, b1=0.0),
        lambda p: T.Adam(p, lr=0.01, betas=(0.0, 0.999)),
    ),
    "adamw-defaults": (lambda: optim.adamw(), lambda p: T.AdamW(p)),
    "adamw-decay": (
        lambda: optim.adamw(0.05, b2=0.99, weight_decay=0.3),
        lambda p: T.AdamW(p, lr=0.05, betas=(0.9, 0.99), weight_decay=0.3),
    ),
    "rmsprop-defaults": (lambda: optim.rmsprop(), lambda p: T.RMSprop(p)),
    "rmsprop-momentum": (
        lambda: optim.rmsprop(0.02, alpha=0.9, momentum=0.7),
        lambda p: T.RMSprop(p, lr=0.02, alpha=0.9, momentum=0.7),
    ),
    "rmsprop-centered": (
        lambda: optim.rmsprop(0.02, centered=True),
        lambda p: T.RMSprop(p, lr=0.02, centered=True),
    ),
    "rmsprop-centered-momentum": (
        lambda: optim.rmsprop(0.01, alpha=0.8, eps=1e-4, momentum=0.5, centered=True),
        lambda p: T.RMSprop(p, lr=0.01, alpha=0.8, eps=1e-4, momentum=0.5, centered=True),
    ),
    "adagrad-defaults": (lambda: optim.adagrad(), lambda p: T.Adagrad(p)),
    "adagrad-accumulator": (
        lambda: optim.adagrad(0.1, initial_accumulator_value=0.5, eps=1e-6),
        lambda p: T.Adagrad(p, lr=0.1, initial_accumulator_value=0.5, eps=1e-6),
    ),
}


@needs_torch
@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_optim(name):
    ours, theirs = CASES[name]
    p, g = _params_np(), _grads_np()
    _assert_same(_run_nx(ours(), p, g), _run_torch(theirs, p, g))


@needs_torch
def test_defaults_are_torchs():
    pairs = [
        (optim.sgd, T.SGD, {"lr": "lr", "momentum": "momentum", "nesterov": "nesterov"}),
        (optim.adam, T.Adam, {"lr": "lr", "eps": "eps"}),
        (optim.adamw, T.AdamW, {"lr": "lr", "eps": "eps", "weight_decay": "weight_decay"}),
        (optim.rmsprop, T.RMSprop, {k: k for k in ("lr", "alpha", "eps", "momentum", "centered")}),
        (optim.adagrad, T.Adagrad, {k: k for k in ("lr", "initial_accumulator_value", "eps")}),
    ]
    for ours, theirs, names in pairs:
        mine = inspect.signature(ours).parameters
        ref = inspect.signature(theirs).parameters
        assert list(mine)[0] == "lr"
        for a, b in names.items():
            assert mine[a].default == ref[b].default, (ours.__name__, a)
        if "betas" in ref:
            assert (mine["b1"].default, mine["b2"].default) == ref["betas"].default


def _warmup_cosine():
    return optim.join_schedules(
        [optim.linear_warmup(0.0, 0.05, 2), optim.cosine_decay_schedule(0.05, 4, alpha=0.1)], [2]
    )


@needs_torch
def test_adam_with_schedule_matches_torch_lambda_lr():
    sched = _warmup_cosine()
    p, g = _params_np(), _grads_np(8)
    theirs = _run_torch(
        lambda ps: T.Adam(ps, lr=1.0),
        p,
        g,
        make_sched=lambda o: T.lr_scheduler.LambdaLR(o, lambda k: sched(k)),
    )
    _assert_same(_run_nx(optim.adam(sched), p, g), theirs)
    # the schedule starts at 0: the first update must not move the params
    np.testing.assert_array_equal(_run_nx(optim.adam(sched), p, g[:1])[0]["w"], p["w"])


@needs_torch
def test_adamw_and_sgd_with_schedules_match_torch_lambda_lr():
    sched = optim.exponential_decay(0.1, transition_steps=2, decay_rate=0.5, end_value=0.02)
    lambda_lr = lambda o: T.lr_scheduler.LambdaLR(o, sched)  # torch lr = 1.0 * sched(k)
    p, g = _params_np(), _grads_np()
    for ours, theirs in [
        (optim.adamw(sched, weight_decay=0.2), lambda ps: T.AdamW(ps, lr=1.0, weight_decay=0.2)),
        (optim.sgd(sched, momentum=0.9), lambda ps: T.SGD(ps, lr=1.0, momentum=0.9)),
        (optim.rmsprop(sched, centered=True), lambda ps: T.RMSprop(ps, lr=1.0, centered=True)),
    ]:
        _assert_same(_run_nx(ours, p, g), _run_torch(theirs, p, g, make_sched=lambda_lr))


@needs_torch
def test_clip_by_global_norm_then_adam_matches_torch_clip_grad_norm():
    # torch scales by max_norm / (norm + 1e-6), optax (and we) by max_norm / norm: with norms
    # around 3-7 the clipped grads differ by < 1e-6 relative, inside RTOL (Adam's direction is
    # nearly scale-invariant, which shrinks the difference further)
    p, g = _params_np(), _grads_np(scale=1.5)
    g[2] = {k: v * 0.05 for k, v in g[2].items()}  # one step under the threshold: not clipped
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.adam(0.05))
    theirs = _run_torch(lambda ps: T.Adam(ps, lr=0.05), p, g, clip=1.0)
    _assert_same(_run_nx(opt, p, g), theirs)


def test_clip_by_global_norm_is_optaxs_formula():
    for scale in (0.1, 3.0):
        (g,) = _grads_np(1, seed=7, scale=scale)
        norm = np.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in g.values()))
        assert optim.global_norm(_to_nx(g)).item() == pytest.approx(norm, rel=1e-6)
        clip = optim.clip_by_global_norm(2.0)
        out, state = clip.update(_to_nx(g), clip.init(None))
        assert state == optim.EmptyState()
        for k, v in g.items():
            want = v if norm < 2.0 else (v / np.float32(norm)) * np.float32(2.0)
            np.testing.assert_allclose(out[k].numpy(), want, rtol=1e-6, atol=1e-7)
    assert optim.global_norm({}).item() == 0.0


def test_building_blocks_compose_into_the_optimizers():
    p, g = _params_np(), _grads_np(4)
    adamw = optim.chain(
        optim.scale_by_adam(b1=0.8),
        optim.add_decayed_weights(0.1),
        optim.scale_by_learning_rate(0.01),
    )
    _assert_same(
        _run_nx(adamw, p, g), _run_nx(optim.adamw(0.01, b1=0.8, weight_decay=0.1), p, g), 0, 0
    )
    momentum = optim.chain(optim.trace(0.9, nesterov=True), optim.scale(-0.1))
    _assert_same(
        _run_nx(momentum, p, g), _run_nx(optim.sgd(0.1, momentum=0.9, nesterov=True), p, g), 0, 0
    )
    up = optim.scale_by_learning_rate(0.5, flip_sign=False)
    assert up.update({"a": nx.ones(1)}, up.init(None))[0]["a"].tolist() == [0.5]


def test_lr_may_be_a_tensor():
    p, g = _params_np(), _grads_np(3)
    _assert_same(_run_nx(optim.adam(nx.tensor(0.01)), p, g), _run_nx(optim.adam(0.01), p, g))


# ---- state, dtypes and trees --------------------------------------------------------------------


def test_sgd_without_momentum_keeps_no_state_tensors():
    params = _to_nx(_params_np())
    assert nx.tree.leaves(optim.sgd(0.1).init(params)) == []
    assert len(nx.tree.leaves(optim.sgd(0.1, momentum=0.5).init(params))) == 2
    # a schedule needs the step count, and only it
    (count,) = nx.tree.leaves(optim.sgd(optim.linear_warmup(0.0, 1.0, 3)).init(params))
    assert count.dtype == nx.int32 and count.shape == ()


def test_apply_updates_keeps_each_params_dtype_and_bf16_updates_stay_bf16():
    params = {"h": nx.ones(3, dtype=nx.bfloat16), "f": nx.ones(2)}
    opt = optim.adam(optim.cosine_decay_schedule(0.1, 10))
    grads = {"h": nx.full((3,), 0.5, dtype=nx.bfloat16), "f": nx.full((2,), 0.5)}
    updates, state = opt.update(grads, opt.init(params), params)
    assert updates["h"].dtype == nx.bfloat16 and updates["f"].dtype == nx.float32
    new = optim.apply_updates(params, updates)
    assert new["h"].dtype == nx.bfloat16 and new["f"].dtype == nx.float32
    np.testing.assert_allclose(new["h"].numpy().astype(np.float32), new["f"].numpy()[0], rtol=1e-2)


def _loss(params, x, y):
    pred = x @ params["w"] + params["b"]
    return ((pred - y) ** 2).mean()


def _data(seed=3):
    r = np.random.RandomState(seed)
    return nx.tensor(r.normal(size=(8, 4)).astype(np.float32)), nx.tensor(
        r.normal(size=(8, 3)).astype(np.float32)
    )


def _train(opt, params, state, steps, x, y):
    for _ in range(steps):
        loss, grads = nx.value_and_grad(_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        params = optim.apply_updates(params, updates)
        loss.item()
    return params, state


def test_state_saves_and_loads_and_training_continues_identically():
    x, y = _data()
    opt = optim.adamw(_warmup_cosine(), weight_decay=0.05)
    params = _to_nx(_params_np())
    params, state = _train(opt, params, opt.init(params), 3, x, y)
    path = os.path.join(tempfile.mkdtemp(), "opt.safetensors")
    nx.save(path, {"params": params, "state": state})
    back = nx.load(path, like={"params": params, "state": state})
    assert type(back["state"][0]) is optim.ScaleByAdamState
    assert back["state"][0].count.shape == () and int(back["state"][0].count) == 3
    a = _train(opt, params, state, 3, x, y)[0]
    b = _train(opt, back["params"], back["state"], 3, x, y)[0]
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    for make in (optim.rmsprop, optim.adagrad, lambda: optim.sgd(0.1, momentum=0.9)):
        s = make().init(params)  # states with None and empty entries round-trip too
        nx.save(path, s)
        assert nx.tree.structure(nx.load(path, like=s)) == nx.tree.structure(s)


@nx.tree.register_dataclass
class _Layer:
    weight: nx.Tensor
    bias: nx.Tensor | None


@needs_torch
def test_registered_dataclass_params_with_a_none_leaf():
    p = _params_np()
    params = _Layer(nx.tensor(p["w"]), None)
    opt = optim.adam(0.05)
    state = opt.init(params)
    for g in _grads_np(3):
        updates, state = opt.update(_Layer(nx.tensor(g["w"]), None), state, params)
        params = optim.apply_updates(params, updates)
    assert isinstance(params, _Layer) and params.bias is None
    assert isinstance(state[0].mu, _Layer)
    want = _run_torch(lambda ps: T.Adam(ps, lr=0.05), {"w": p["w"]}, _grads_np(3))[-1]["w"]
    np.testing.assert_allclose(params.weight.numpy(), want, rtol=RTOL, atol=ATOL)


@needs_torch
def test_nn_module_trains_like_the_same_torch_module():
    from nablax import nn

    model = nn.Sequential(
        nn.Linear(4, 6, key=nx.random.key(0)), nn.Linear(6, 3, bias=False, key=nx.random.key(1))
    )
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3, bias=False))
    with torch.no_grad():  # the same weights: nablax uses torch's layouts
        ref[0].weight.copy_(torch.tensor(model.layers[0].weight.numpy()))
        ref[0].bias.copy_(torch.tensor(model.layers[0].bias.numpy()))
        ref[1].weight.copy_(torch.tensor(model.layers[1].weight.numpy()))
    x, y = _data()
    opt, topt = (
        optim.adamw(0.01, weight_decay=0.1),
        T.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1),
    )
    state = opt.init(model)
    loss_fn = lambda m: ((m(x) - y) ** 2).mean()
    for _ in range(3):
        loss, grads = nx.value_and_grad(loss_fn)(model)
        updates, state = opt.update(grads, state, model)
        model = optim.apply_updates(model, updates)
        topt.zero_grad()
        tloss = ((ref(torch.tensor(x.numpy())) - torch.tensor(y.numpy())) ** 2).mean()
        tloss.backward()
        topt.step()
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
    assert type(model) is nn.Sequential and model.layers[1].bias is None
    np.testing.assert_allclose(
        model.layers[0].weight.numpy(), ref[0].weight.detach().numpy(), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        model.layers[1].weight.numpy(), ref[1].weight.detach().numpy(), rtol=1e-5, atol=1e-5
    )


def test_vmap_of_an_update_equals_a_python_loop():
    opt = optim.adam(optim.cosine_decay_schedule(0.1, 5))
    batch = [_params_np(seed) for seed in range(3)]
    grads = [_grads_np(1, seed=10 + s)[0] for s in range(3)]
    stack = lambda trees: {k: nx.tensor(np.stack([t[k] for t in trees])) for k in trees[0]}

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optim.apply_updates(p, u), s

    ps = stack(batch)
    states = nx.vmap(opt.init)(ps)
    for _ in range(2):
        ps, states = nx.vmap(step)(ps, states, stack(grads))
    for i, (p, g) in enumerate(zip(batch, grads)):
        want = _run_nx(opt, p, [g, g])[-1]
        for k in want:
            np.testing.assert_allclose(ps[k].numpy()[i], want[k], rtol=RTOL, atol=ATOL)
    assert states[0].count.tolist() == [2, 2, 2]


def test_compile_traces_a_whole_step_once():
    x, y = _data()
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.adam(_warmup_cosine()))

    def step(params, state, x, y):
        loss, grads = nx.value_and_grad(_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    compiled = nx.compile(step, fullgraph=True)
    p0 = _to_nx(_params_np())
    params, state = p0, opt.init(p0)
    ref_params, ref_state = p0, opt.init(p0)
    for _ in range(10):
        params, state, _ = compiled(params, state, x, y)
        ref_params, ref_state, _ = step(ref_params, ref_state, x, y)
    assert compiled.cache_info().traces == 1
    for k in params:
        np.testing.assert_allclose(params[k].numpy(), ref_params[k].numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("read", ["loss", "params_and_state"])
def test_eager_loop_compiles_no_new_executable_per_step(read):
    x, y = _data()
    opt = optim.adam(_warmup_cosine())
    params = _to_nx(_params_np())
    state = opt.init(params)
    nx.clear_caches()
    compiles = []
    for _ in range(10):
        loss, grads = nx.value_and_grad(_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        params = optim.apply_updates(params, updates)
        if read == "loss":
            loss.item()  # also runs the connected update, the step counters included
        else:
            nx.realize(params, state)
        compiles.append(nx.cache_info().compiles)
    # the first steps differ (the state starts as fresh zeros); from the third on, one structure
    assert compiles[2] == compiles[-1], compiles
    assert compiles[-1] <= 6
    assert int(state[1].count) == 10 and state[1].count.is_realized


def test_shard_map_runs_a_step_unchanged():
    mesh = nx.DeviceMesh((1,), ("dp",))
    opt = optim.sgd(0.1, momentum=0.9)
    p, (g,) = _params_np(), _grads_np(1)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state

    params = _to_nx(p)
    out, _ = nx.shard_map(step, mesh)(params, opt.init(params), _to_nx(g))
    want = _run_nx(opt, p, [g])[0]
    for k in want:
        np.testing.assert_allclose(out[k].numpy(), want[k], rtol=RTOL, atol=ATOL)


# ---- errors -------------------------------------------------------------------------------------

BAD = [
    (lambda: optim.adam(-0.1), lambda p: T.Adam(p, lr=-0.1), "lr"),
    (lambda: optim.adam(b1=1.0), lambda p: T.Adam(p, betas=(1.0, 0.999)), "b1"),
    (lambda: optim.adam(b1=-0.1), lambda p: T.Adam(p, betas=(-0.1, 0.999)), "b1"),
    (lambda: optim.adamw(b2=1.5), lambda p: T.AdamW(p, betas=(0.9, 1.5)), "b2"),
    (lambda: optim.adam(eps=-1.0), lambda p: T.Adam(p, eps=-1.0), "eps"),
    (lambda: optim.adamw(weight_decay=-1), lambda p: T.AdamW(p, weight_decay=-1), "weight_decay"),
    (lambda: optim.sgd(0.1, momentum=-0.5), lambda p: T.SGD(p, momentum=-0.5), "momentum"),
    (lambda: optim.sgd(0.1, nesterov=True), lambda p: T.SGD(p, nesterov=True), "nesterov"),
    (lambda: optim.rmsprop(alpha=-0.1), lambda p: T.RMSprop(p, alpha=-0.1), "alpha"),
    (lambda: optim.rmsprop(momentum=-1), lambda p: T.RMSprop(p, momentum=-1), "momentum"),
    (
        lambda: optim.adagrad(initial_accumulator_value=-1.0),
        lambda p: T.Adagrad(p, initial_accumulator_value=-1.0),
        "initial_accumulator_value",
    ),
]


@needs_torch
@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_hyper_parameters_raise_as_torch_does(k):
    ours, theirs, arg = BAD[k]
    with pytest.raises(ValueError):
        theirs([torch.zeros(1, requires_grad=True)])
    with pytest.raises(ValueError, match=rf"nx\.optim\.\w+: .*{arg}.*Fix: ") as e:
        ours()
    assert "optim." in str(e.value)


def test_bad_arguments_name_the_function():
    with pytest.raises(TypeError, match=r"optim\.adam: lr='0\.1' is a str"):
        optim.adam("0.1")
    with pytest.raises(ValueError, match=r"optim\.clip_by_global_norm: invalid max_norm"):
        optim.clip_by_global_norm(0.0)
    with pytest.raises(TypeError, match=r"optim\.chain: transforms\[1\] is a int"):
        optim.chain(optim.sgd(), 3)
    with pytest.raises(TypeError, match=r"optim\.scale_by_schedule: step_size_fn"):
        optim.scale_by_schedule(0.1)


def test_adamw_update_without_params_names_adamw():
    params = _to_nx(_params_np())
    opt = optim.adamw()
    with pytest.raises(ValueError, match=r"nx\.optim\.adamw: update needs the current params"):
        opt.update(params, opt.init(params))


def test_grads_of_another_structure_name_the_first_differing_path():
    params = _to_nx(_params_np())
    opt = optim.adam()
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"optim\.adam: grads has no leaf at state\.mu\['b'\]"):
        opt.update({"w": params["w"]}, state)
    extra = dict(params, z=nx.ones(1))
    with pytest.raises(ValueError, match=r"optim\.adam: grads\['z'\] is not a leaf"):
        opt.update(extra, state)
    bad = dict(params, b=nx.ones(5))
    with pytest.raises(ValueError, match=r"grads\['b'\] has shape \(5,\) but state\.mu"):
        opt.update(bad, state)
    with pytest.raises(ValueError, match=r"optim\.sgd: .*params\['b'\]"):
        optim.sgd(0.1).update({"w": params["w"]}, optim.sgd(0.1).init(params), params)
    with pytest.raises(ValueError, match=r"optim\.apply_updates: .*params\['b'\]"):
        optim.apply_updates(params, {"w": params["w"]})
    with pytest.raises(ValueError, match=r"optim\.adam: grads has no leaf at state\.mu\['b'\]"):
        opt.update({"w": params["w"], "b": None}, state)
    lst = [params["w"], params["b"]]
    with pytest.raises(ValueError, match=r"optim\.rmsprop: grads is structured as .* but"):
        optim.rmsprop().update(tuple(lst), optim.rmsprop().init(lst))


def test_second_moments_of_another_structure_are_named():
    """``state.nu`` is checked like ``state.mu`` (a state edited or loaded from another model
    must not be zipped leaf by leaf against the grads), and adamw checks grads against params
    once for its three stages."""
    params = _to_nx(_params_np())
    for opt in (optim.adam(), optim.adamw()):
        state = opt.init(params)
        first = state[0]
        bad = first._replace(nu={"w": first.nu["w"]})
        state = (bad, *state[1:])
        with pytest.raises(ValueError, match=r"grads\['b'\] is not a leaf of state\.nu"):
            opt.update(params, state, params)
        shaped = first._replace(nu=dict(first.nu, b=nx.zeros(7)))
        state = (shaped, *state[1:])
        with pytest.raises(ValueError, match=r"grads\['b'\] has shape \(\d+,\) but state\.nu"):
            opt.update(params, state, params)
    opt = optim.adamw()
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"optim\.adamw: grads\['b'\] is not a leaf of params"):
        opt.update(params, state, {"w": params["w"]})
    with pytest.raises(ValueError, match=r"optim\.adamw: grads\['b'\] has shape .* params"):
        opt.update(params, state, dict(params, b=nx.zeros(9)))


def test_module_trees_sharing_a_structure_still_have_their_shapes_checked():
    """Module trees of one model share one memoized structure, so adamw and apply_updates check
    shapes inside their fused node's checks: a state or update rebuilt on that structure with a
    leaf of another shape is still refused, naming its path, and a well-shaped one matches the
    per-leaf reference."""
    from nablax import nn

    model = nn.Sequential(
        nn.Linear(3, 4, key=nx.random.key(0)), nn.Linear(4, 2, key=nx.random.key(1))
    )
    leaves, treedef = nx.tree.flatten(model)
    grads = nx.tree.unflatten(treedef, [nx.full(leaf.shape, 0.5) for leaf in leaves])
    opt = optim.adamw(0.1, weight_decay=0.1)
    _, state = opt.update(grads, opt.init(model), model)  # a state built on the structure
    assert nx.tree.flatten(state[0].mu)[1] is treedef and nx.tree.flatten(grads)[1] is treedef
    wrong = [nx.zeros((7,)) if i == 1 else nx.zeros(leaf.shape) for i, leaf in enumerate(leaves)]
    for field in ("mu", "nu"):
        bad = (state[0]._replace(**{field: nx.tree.unflatten(treedef, wrong)}), *state[1:])
        assert nx.tree.flatten(getattr(bad[0], field))[1] is treedef
        with pytest.raises(
            ValueError, match=rf"optim\.adamw: grads.*has shape \(4,\) but state\.{field}"
        ):
            opt.update(grads, bad, model)
    with pytest.raises(ValueError, match=r"optim\.apply_updates: .*has shape \(7,\)"):
        optim.apply_updates(model, nx.tree.unflatten(treedef, wrong))
    updates, _ = opt.update(grads, opt.init(model), model)  # the first step, on the fast path
    new = optim.apply_updates(model, updates)
    # the first AdamW step: p * (1 - lr * wd) - lr * sign(g)
    for p, q in zip(leaves, nx.tree.leaves(new)):
        np.testing.assert_allclose(q.numpy(), p.numpy() * (1 - 0.01) - 0.1, rtol=1e-5, atol=1e-6)


def test_a_state_from_another_optimizer_is_refused():
    params = _to_nx(_params_np())
    with pytest.raises(TypeError, match=r"optim\.adam: update: state is a TraceState"):
        optim.adam().update(params, optim.sgd(0.1, momentum=0.9).init(params))
    with pytest.raises(ValueError, match=r"optim\.adamw: update: state is a tuple of 2"):
        optim.adamw().update(params, optim.adam().init(params), params)


# ---- the fused update (core/prims/fused.py) ------------------------------------------------------


def _graph_prims(tree) -> list:
    from nablax.core.graph import toposort

    roots = [t._impl.src[0] for t in nx.tree.leaves(tree) if not t.is_realized]
    return [n.prim.name for n in toposort(roots)]


def test_adam_builds_one_fused_node_per_parameter():
    """An eager step builds its optimizer update every iteration: Adam is one node per leaf (plus
    the shared step counter and the learning rate), not a dozen."""
    params = {"w": nx.ones((3, 2)), "b": nx.zeros(2), "s": nx.tensor(1.5)}
    grads = nx.block_until_ready({k: nx.full(v.shape, 0.5) for k, v in params.items()})
    opt = optim.adam(1e-2)
    state = nx.block_until_ready(opt.init(params))
    updates, state = opt.update(grads, state, params)
    prims = _graph_prims((updates, state))
    assert prims.count("adam_update") == 3
    # a constant lr is folded into the fused node: no separate products
    assert sorted(prims) == sorted(["adam_update"] * 3 + ["minimum", "add"]), prims


def test_adam_with_a_folded_lr_equals_the_separate_scale_and_keeps_optax_states():
    """``adam(lr)`` multiplies by ``-lr`` inside the fused node; the result is bit-identical to
    ``chain(scale_by_adam(), scale(-lr))`` (the same float32 product), and the state keeps the
    ``(ScaleByAdamState, EmptyState)`` structure, so checkpoints do not change."""
    rng = np.random.default_rng(1)
    params = {"w": nx.tensor(rng.standard_normal((4, 3)).astype(np.float32))}
    fused_opt = optim.adam(3e-3)
    plain_opt = optim.chain(optim.scale_by_adam(), optim.scale(-3e-3))
    s1, s2 = fused_opt.init(params), plain_opt.init(params)
    assert nx.tree.structure(s1) == nx.tree.structure(s2)
    p1 = p2 = params
    for step in range(4):
        g = {"w": nx.tensor(rng.standard_normal((4, 3)).astype(np.float32))}
        u1, s1 = fused_opt.update(g, s1, p1)
        u2, s2 = plain_opt.update(g, s2, p2)
        assert "multiply" not in _graph_prims(u1)
        p1, p2 = optim.apply_updates(p1, u1), optim.apply_updates(p2, u2)
        np.testing.assert_array_equal(p1["w"].numpy(), p2["w"].numpy(), err_msg=f"step {step}")
    for a, b in zip(nx.tree.leaves(s1), nx.tree.leaves(s2)):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    # NumPy scalars and ints fold too, as Python floats: float32 updates equal to the plain chain's
    for lr in (np.float64(3e-3), np.float32(3e-3), 1):
        u1, _ = optim.adam(lr).update(g, fused_opt.init(params), params)
        u2, _ = optim.chain(optim.scale_by_adam(), optim.scale(-float(lr))).update(
            g, plain_opt.init(params), params
        )
        assert "multiply" not in _graph_prims(u1) and u1["w"].dtype == nx.float32
        np.testing.assert_array_equal(u1["w"].numpy(), u2["w"].numpy(), err_msg=repr(lr))
    # a schedule or a tensor lr keeps the separate scaling stage
    sched = optim.adam(lambda count: 1e-3)
    u, _ = sched.update(g, sched.init(params), params)
    assert "multiply" in _graph_prims(u)


@pytest.mark.parametrize(
    "g_dtype, m_dtype",
    [("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16"), ("int32", "int32")],
)
def test_fused_adam_equals_its_formula_and_falls_back_for_other_dtypes(g_dtype, m_dtype):
    """The one-node update equals Adam's formula written with JAX; moments narrower than the
    gradient or integer dtypes take the element-wise fallback, with the dtypes the separate ops
    always gave."""
    import jax.numpy as jnp

    from nablax.core.prims import fused

    rng = np.random.default_rng(0)
    g = rng.standard_normal((4, 3)).astype(np.float32) * 3
    m = rng.standard_normal((4, 3)).astype(np.float32)
    v = np.abs(rng.standard_normal((4, 3))).astype(np.float32)
    count = np.array(3, np.int32)
    gx = nx.tensor(g).astype(g_dtype)
    mx, vx = nx.tensor(m).astype(m_dtype), nx.tensor(v).astype(m_dtype)
    outs = fused.adam_update(gx, mx, vx, nx.tensor(count), 0.9, 0.999, 1e-8)
    graph = _graph_prims(outs)
    fused_path = (g_dtype, m_dtype) in {("float32", "float32"), ("bfloat16", "float32")}
    assert ("adam_update" in graph) == fused_path, graph
    cast = lambda s, x: s.astype(x.dtype)
    want = fused.adam_formula(
        jnp.asarray(gx.numpy()),
        jnp.asarray(mx.numpy()),
        jnp.asarray(vx.numpy()),
        jnp.float32(3),
        0.9,
        0.999,
        1e-8,
        (jnp.expm1, jnp.sqrt, cast),
    )
    for got, ref in zip(outs, want):
        assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
        np.testing.assert_allclose(
            got.astype(nx.float32).numpy(), np.asarray(ref, np.float32), rtol=1e-2, atol=1e-5
        )


def test_step_counter_saturates_at_the_int32_maximum():
    from nablax.optim._base import increment

    top = np.iinfo(np.int32).max
    assert increment(nx.tensor(np.int32(top - 1))).item() == top
    assert increment(nx.tensor(np.int32(top))).item() == top
    assert increment(nx.tensor(np.int32(0))).item() == 1
