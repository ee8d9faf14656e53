"""``nablax.xcs`` orchestration speed against a local OpenAI-compatible server.

Run from the repository root (needs the ``openai`` SDK of the ``test`` extra)::

    python bench/bench_xcs.py                 # about 95 s on 2 cores (--quick: about 45 s)
    python bench/bench_xcs.py --quick --out xcs.json

The server is :class:`nablax.xcs.loopback.LoopbackServer` on 127.0.0.1, in a child process so that
its CPU time and GIL are not charged to the client, as with a real API (``--server thread`` runs
it in this process). Calls come in three flavours: the stdlib ``loopback.chat`` helper, the
official sync SDK client, and ``time.sleep`` (no client CPU: the scheduler alone). Cases:

- **64 chat calls at 100 ms through** ``xcs.vmap`` (SDK and stdlib): wall time against the ideal
  ``latency x ceil(64 / workers)`` (workers: how many items the vmap runs at once, probed and
  reported). Target: <= 1.5x. References: the same calls on a hand-written
  ``ThreadPoolExecutor``, ``asyncio.gather`` of 64 ``openai.AsyncOpenAI`` calls in this process,
  and the client's CPU floor (64 sequential calls at latency 0: threads in one process cannot
  overlap that part, so it bounds any thread-based map).
- **3-level read-only pipeline under** ``xcs.jit`` (fan-out/fan-in): 1 call, 18 independent calls
  on its result, 1 call joining them (20 calls at 50 ms), in each flavour. Reported as ratios of
  its wall time to plain sequential Python (20 x 50 ms; ideal 0.15x) and to the critical path
  (3 x 50 ms). Target: wall <= 1.1x the critical path + 5 ms. Reference: the same graph written by
  hand on a thread pool.
- **cost of the sequential rule** (calls with effects wait for every earlier call; read-only calls
  start early): the read-only pipelines above (3x the rounds), and the same graph of no-op calls
  (latency 0, where scheduling is all there is; 200 single runs per round), with
  ``engine.SEQUENTIAL_RULE`` True (as shipped) and False (every call treated as read-only, as
  before the rule), taking turns each round. Target: the median of the per-round ratios on/off
  <= 1.05 for every pipeline.
- **pipeline with effects**: the fan-out's 18 reads, then 2 writes declared
  ``@xcs.mark_orchestration(effects=True)``, then a read of what they wrote (22 calls at 50 ms).
  Under the rule the reads overlap, each write starts after every earlier call and the read after
  the last write: critical path 5 x 50 ms. Target: wall <= 1.1x that + 5 ms; the result, and the
  order of the writes, equal plain Python's (also shown: the rule off returns a wrong result).
- **scheduling overhead**: the no-op graph (latency 0), per call, ``xcs.jit`` minus plain
  sequential Python. Target: <= 200 µs.

Contenders take turns each round (in an order rotated every round); medians reported; every result
of every timed run is checked against plain sequential Python.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

import openai

from _common import environment, verdict  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt
from nablax import xcs
from nablax.xcs import engine as xcs_engine
from nablax.xcs import scheduler as xcs_scheduler
from nablax.xcs.loopback import LoopbackServer, chat

N_MAP, MAP_LATENCY = 64, 0.100
N_BRANCH, FAN_LATENCY = 18, 0.050
RULE_TARGET = 1.05  # the sequential rule may cost at most 5% on read-only pipelines
USER = "user"


def _rounds(fns: dict, rounds: int) -> dict[str, list[float]]:
    """Wall seconds of each function per round; they take turns, one run each per round, in an
    order rotated every round (no contender always runs right after the same one)."""
    names = list(fns)
    walls: dict = {k: [] for k in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            fns[name]()
            walls[name].append(time.perf_counter() - t0)
    return walls


def _interleave(fns: dict, rounds: int) -> dict:
    """Median wall seconds of each function (see :func:`_rounds`)."""
    return {k: statistics.median(v) for k, v in _rounds(fns, rounds).items()}


def _median_ratio(walls: dict, a: str, b: str) -> float:
    """Median over rounds of ``walls[a][i] / walls[b][i]`` (the two ran in the same round)."""
    return statistics.median(x / y for x, y in zip(walls[a], walls[b]))


def _same(what: str, got, expected):
    """``got``, after checking that it equals plain sequential Python's ``expected``."""
    if got != expected:
        raise AssertionError(
            f"bench_xcs: {what}: the result differs from plain sequential Python: "
            f"{str(got)[:120]!r} != {str(expected)[:120]!r}"
        )
    return got


def _rule(flag: bool, fn):
    """``fn()`` with ``engine.SEQUENTIAL_RULE`` set to ``flag``; the previous value is restored."""
    saved = xcs_engine.SEQUENTIAL_RULE
    xcs_engine.SEQUENTIAL_RULE = flag
    try:
        return fn()
    finally:
        xcs_engine.SEQUENTIAL_RULE = saved


def _sdk_ask(client):
    def ask(prompt):
        r = client.chat.completions.create(
            model="loopback", messages=[{"role": USER, "content": prompt}]
        )
        return r.choices[0].message.content

    return ask


def _stdlib_ask(url):
    def ask(prompt):
        return chat(url, prompt)

    return ask


# ---- the server in a child process -------------------------------------------------------------

_CHILD = """
import sys
from nablax.xcs.loopback import LoopbackServer
with LoopbackServer(latency_s=0) as s:
    print(s.url, flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "latency":
            s.latency_s = float(arg)
        elif cmd == "reset":
            s.reset_stats()
        elif cmd == "stop":
            break
        print(s.requests, s.max_concurrency, flush=True)
"""


class ServerProcess:
    """A ``LoopbackServer`` in a child process, so that the server's CPU time and GIL are not
    charged to the client being measured (a real API runs elsewhere); same attributes as the
    in-process server that this bench uses."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        self.url = self._proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError(
                f"bench_xcs: the loopback server process did not start ({self.url!r})"
            )

    def _cmd(self, line: str) -> tuple[int, int]:
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        requests, concurrency = self._proc.stdout.readline().split()
        return int(requests), int(concurrency)

    latency_s = property(None, lambda self, v: self._cmd(f"latency {v!r}"))

    def reset_stats(self) -> None:
        self._cmd("reset")

    @property
    def max_concurrency(self) -> int:
        return self._cmd("stats")[1]

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.stdin.write("stop\n")
        self._proc.stdin.close()
        self._proc.wait(timeout=10)


# ---- case 1: xcs.vmap of 64 calls --------------------------------------------------------------


def vmap_workers(max_workers) -> int:
    """How many items ``xcs.vmap`` runs at once (up to 64): probed with sleeping items."""
    lock, state = threading.Lock(), {"active": 0, "peak": 0}

    def probe(i):
        with lock:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
        time.sleep(0.25)  # long enough for every worker thread to start, even on a busy machine
        with lock:
            state["active"] -= 1
        return i

    assert xcs.vmap(probe, max_workers=max_workers)(list(range(N_MAP))) == list(range(N_MAP))
    return state["peak"]


def _vmap_case(server, fn, rounds: int, max_workers, workers: int) -> tuple[dict, int]:
    """Median wall times of ``xcs.vmap(fn)`` over 64 prompts and of a hand-written
    ``ThreadPoolExecutor.map`` with ``workers`` threads, and the most requests the server saw at
    once (less than ``workers`` when the client's CPU work spreads the requests out)."""
    prompts = [f"prompt {i}" for i in range(N_MAP)]
    mapped = xcs.vmap(fn, max_workers=max_workers)
    server.latency_s = 0  # plain sequential Python's results (the latency does not change them)
    expected = [fn(p) for p in prompts]
    server.latency_s = MAP_LATENCY
    _same("xcs.vmap", mapped(prompts), expected)  # also warms threads and connections
    server.reset_stats()
    with cf.ThreadPoolExecutor(workers) as pool:
        walls = _interleave(
            {
                "xcs": lambda: _same("xcs.vmap", mapped(prompts), expected),
                "pool": lambda: _same("pool", list(pool.map(fn, prompts)), expected),
            },
            rounds,
        )
    return walls, server.max_concurrency


def _client_cost(server, fn, rounds: int) -> float:
    """Median seconds of 64 sequential calls at latency 0: the client's own CPU time (plus the
    loopback round trip), which threads in one process cannot overlap (the GIL)."""
    latency, server.latency_s = MAP_LATENCY, 0
    prompts = [f"prompt {i}" for i in range(N_MAP)]
    walls = _interleave({"seq": lambda: [fn(p) for p in prompts]}, rounds)
    server.latency_s = latency
    return walls["seq"]


def _gather_case(server, rounds: int) -> float:
    """Median wall time of ``asyncio.gather`` over 64 ``AsyncOpenAI`` calls (one client per run)."""

    async def run() -> float:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="bench", max_retries=0) as c:

            async def one(i):
                r = await c.chat.completions.create(
                    model="loopback", messages=[{"role": USER, "content": f"prompt {i}"}]
                )
                return r.choices[0].message.content

            await asyncio.gather(*(one(i) for i in range(N_MAP)))  # warm: 64 connections
            t0 = time.perf_counter()
            out = await asyncio.gather(*(one(i) for i in range(N_MAP)))
            wall = time.perf_counter() - t0
            assert out == [f"echo: prompt {i}" for i in range(N_MAP)]
            return wall

    return statistics.median(asyncio.run(run()) for _ in range(rounds))


# ---- case 2: a 3-level read-only pipeline under xcs.jit, with the sequential rule on and off ----


def make_fan(ask):
    """1 call, ``N_BRANCH`` independent calls on its result, 1 call joining them."""

    def fan(q):
        a = ask(q)
        parts = [ask(f"branch {i}: {a}") for i in range(N_BRANCH)]
        return ask("join: " + " | ".join(parts))

    return fan


def make_pool_fan(ask, pool):
    """The same graph written by hand with a thread pool (the reference for xcs.jit)."""

    def fan(q):
        a = ask(q)
        parts = list(pool.map(lambda i: ask(f"branch {i}: {a}"), range(N_BRANCH)))
        return ask("join: " + " | ".join(parts))

    return fan


def _fan_case(ask, rounds: int, max_workers) -> tuple[dict, dict, object]:
    """Wall times per round of plain Python, the jitted fan graph with the sequential rule on and
    off, and the hand-written one; the rule on and off over 3x as many rounds; xcs.jit's stats."""
    plain = make_fan(ask)
    jitted = xcs.jit(plain, max_workers=max_workers)
    expected = plain("q")
    _same("xcs.jit", jitted("q"), expected)
    early = sum(n.early for n in jitted.last_plan().nodes)
    if jitted.stats().calls != N_BRANCH + 2 or early != N_BRANCH + 2:  # reported, not fatal
        c = xcs.classify(ask)
        print(
            f"- warning: xcs.jit ran {jitted.stats().calls} of {N_BRANCH + 2} calls of "
            f"{ask.__qualname__} as orchestration calls, {early} started early (xcs.classify "
            f"says {c.kind!r}, effects={c.effects}): not the read-only pipeline intended",
            flush=True,
        )
    rule_on_off = {
        "xcs": lambda: _same("xcs.jit", jitted("q"), expected),
        "rule_off": lambda: _same("rule off", _rule(False, lambda: jitted("q")), expected),
    }
    rule_on_off["rule_off"]()
    with cf.ThreadPoolExecutor(N_BRANCH) as pool:
        by_hand = make_pool_fan(ask, pool)
        _same("thread pool", by_hand("q"), expected)
        walls = _rounds(
            {
                "plain": lambda: _same("plain", plain("q"), expected),
                **rule_on_off,
                "pool": lambda: _same("thread pool", by_hand("q"), expected),
            },
            rounds,
        )
    # the rule costs little: more rounds of the two runs that compare it
    more = _rounds(rule_on_off, 2 * rounds)
    rule = {k: walls[k] + more[k] for k in more}
    return walls, rule, jitted.stats()


@xcs.mark_orchestration
def noop(x):
    """An orchestration function that does nothing: what is left is scheduling."""
    return x


@xcs.mark_orchestration
def sleepy(x):
    """A 50 ms call that costs no CPU: the fan graph without any client's own overhead."""
    time.sleep(FAN_LATENCY)
    return x


def _overhead_case(rounds: int, max_workers) -> dict:
    """Wall seconds of single runs of the no-op fan graph, 200 rounds per round asked for: plain
    sequential Python and ``xcs.jit`` with the sequential rule on and off. A run takes ~2 ms whose
    thread hand-offs vary a lot; many short rounds make the median ratio on/off steady."""
    plain = make_fan(noop)
    jitted = xcs.jit(plain, max_workers=max_workers)
    expected = plain("q")
    _same("xcs.jit (no-op)", jitted("q"), expected)
    for _ in range(50):  # warm
        _same("xcs.jit (no-op)", jitted("q"), expected)
        _same("rule off (no-op)", _rule(False, lambda: jitted("q")), expected)
    return _rounds(
        {
            "plain": lambda: _same("plain (no-op)", plain("q"), expected),
            "xcs": lambda: _same("xcs.jit (no-op)", jitted("q"), expected),
            "rule_off": lambda: _same("rule off", _rule(False, lambda: jitted("q")), expected),
        },
        rounds * 200,
    )


# ---- case 3: a pipeline with effects ------------------------------------------------------------


def make_effects(ask):
    """The fan-out's reads, 2 writes (declared with effects) to ``log``, a read of what they wrote;
    every call takes one ``ask`` (a write is a send of the same latency)."""

    @xcs.mark_orchestration(effects=True)
    def write(log, key, value):
        ask(f"write {key}")
        log.append((key, value))
        return key

    @xcs.mark_orchestration(effects=False)
    def lookup(log, key):
        ask(f"read {key}")
        return dict(log).get(key)

    def pipeline(q, log):
        a = ask(q)
        parts = [ask(f"branch {i}: {a}") for i in range(N_BRANCH)]
        write(log, "draft", a)  # needs only `a`: waits for the 18 reads by the rule alone
        write(log, "summary", " | ".join(parts))
        return lookup(log, "summary")  # no data dependency: waits for the writes by the rule

    return pipeline


def _check_effect_plan(plan) -> None:
    """Under the rule: the 19 reads start early, each write after every earlier call ended, the
    last read after the last write (it waits for nothing else)."""
    nodes, n = plan.nodes, N_BRANCH + 1
    ok = (
        len(nodes) == n + 3
        and all(x.early for x in nodes[:n])
        and all(nodes[i].effects and nodes[i].after == tuple(range(i)) for i in (n, n + 1))
        and not nodes[n + 2].effects
        and nodes[n + 2].after == (n + 1,)
        and all(nodes[i].start >= max(x.end for x in nodes[:i]) for i in (n, n + 1, n + 2))
    )
    if not ok:
        raise AssertionError(f"bench_xcs: the effects pipeline broke the sequential rule\n{plan}")


def _effects_case(ask, rounds: int, max_workers) -> tuple[dict, dict]:
    """Wall times per round of the effects pipeline under xcs.jit and as plain Python, each run
    checked (result, order of the writes, plan); and one run with the rule off, for contrast."""
    plain = make_effects(ask)
    jitted = xcs.jit(plain, max_workers=max_workers)
    plain_log: list = []
    expected = plain("q", plain_log)

    def run(fn, what):
        log: list = []
        _same(what, fn("q", log), expected)
        _same(f"{what}: order of the writes", log, plain_log)
        if fn is jitted:
            _check_effect_plan(jitted.last_plan())

    run(jitted, "xcs.jit with effects")
    walls = _rounds(
        {"plain": lambda: run(plain, "plain"), "xcs": lambda: run(jitted, "xcs.jit")}, rounds
    )
    off_log: list = []
    t0 = time.perf_counter()
    off = _rule(False, lambda: jitted("q", off_log))
    wall = time.perf_counter() - t0
    return walls, dict(wall_s=wall, same_result=off == expected, same_writes=off_log == plain_log)


# ---- report --------------------------------------------------------------------------------------


def _row(case, measured_s, reference_s, target=None, scale=1e3, unit="ms") -> dict:
    ratio = measured_s / reference_s if reference_s else None
    ok = None if target is None else ratio <= target
    return {
        "case": case,
        f"measured_{unit}": measured_s * scale,
        f"reference_{unit}": reference_s * scale,
        "ratio": ratio,
        "target": target,
        "ok": ok,
    }


def _cell(ok) -> str:
    return "—" if ok is None else verdict(ok)


def _markdown(header: list[str], lines: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for cells in lines:
        print("| " + " | ".join(cells) + " |")


def _print_tables(rows: list[dict], pipelines: list[dict], rule: list[dict]) -> None:
    lines = []
    for r in rows:
        unit = "ms" if "measured_ms" in r else "us"
        m, ref, u = r[f"measured_{unit}"], r[f"reference_{unit}"], " µs" if unit == "us" else " ms"
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        target = "—" if r["target"] is None else f"<= {r['target']:.3g}x"
        lines.append([r["case"], _fmt(m) + u, _fmt(ref) + u, ratio, target, _cell(r["ok"])])
    _markdown(["case", "measured", "reference", "ratio", "target", "verdict"], lines)
    print()
    _markdown(
        ["xcs.jit pipeline", "wall", "plain Python", "wall/plain", "critical path", "wall/crit",
         "target", "verdict", "thread pool by hand"],
        [[r["case"], f"{_fmt(r['wall_ms'])} ms", f"{_fmt(r['plain_ms'])} ms",
          f"{r['vs_plain']:.3f}x", f"{_fmt(r['critical_ms'])} ms", f"{r['vs_critical']:.2f}x",
          f"<= {r['target']:.3g}x", _cell(r["ok"]),
          "—" if r["pool_ms"] is None else f"{_fmt(r['pool_ms'])} ms"] for r in pipelines],
    )  # fmt: skip
    print()
    _markdown(
        ["read-only pipeline", "rule on (shipped)", "rule off", "median ratio on/off per round",
         "target", "verdict"],
        [[r["case"], f"{_fmt(r['on_ms'])} ms", f"{_fmt(r['off_ms'])} ms", f"{r['ratio']:.3f}x",
          f"<= {r['target']:.3g}x", _cell(r["ok"])] for r in rule],
    )  # fmt: skip


def run_map(server, rounds: int, max_workers) -> tuple[list[dict], dict]:
    server.latency_s = MAP_LATENCY
    client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
    w = vmap_workers(max_workers)
    sdk, sdk_seen = _vmap_case(server, _sdk_ask(client), rounds, max_workers, w)
    std, std_seen = _vmap_case(server, _stdlib_ask(server.url), rounds, max_workers, w)
    gathered = _gather_case(server, rounds)
    sdk_cost = _client_cost(server, _sdk_ask(client), rounds)
    std_cost = _client_cost(server, _stdlib_ask(server.url), rounds)
    ideal = MAP_LATENCY * math.ceil(N_MAP / w)
    rows = [
        _row(f"xcs.vmap, 64 SDK calls @100 ms ({w} workers) vs ideal", sdk["xcs"], ideal, 1.5),
        _row(f"ThreadPoolExecutor.map, same SDK calls ({w} threads)", sdk["pool"], ideal),
        _row(f"xcs.vmap, 64 stdlib chat @100 ms ({w} workers) vs ideal", std["xcs"], ideal, 1.5),
        _row(f"ThreadPoolExecutor.map, same stdlib calls ({w} threads)", std["pool"], ideal),
        _row("asyncio.gather, 64 AsyncOpenAI calls @100 ms vs ideal", gathered, MAP_LATENCY),
        _row("xcs.vmap (SDK) vs asyncio.gather (AsyncOpenAI)", sdk["xcs"], gathered),
        _row("client CPU floor: 64 sequential SDK calls @0 ms vs ideal", sdk_cost, ideal),
        _row("client CPU floor: 64 sequential stdlib calls @0 ms vs ideal", std_cost, ideal),
    ]
    extra = {
        "vmap_workers": w,
        "server_max_concurrency_sdk": sdk_seen,
        "server_max_concurrency_stdlib": std_seen,
    }
    return rows, extra


def _pipeline_row(case, walls: dict, critical_s: float) -> dict:
    """Wall/plain and wall/critical path; target: <= 1.1 x the critical path + 5 ms."""
    wall, plain = statistics.median(walls["xcs"]), statistics.median(walls["plain"])
    target = 1.1 + 0.005 / critical_s
    pool = statistics.median(walls["pool"]) * 1e3 if "pool" in walls else None
    return dict(case=case, wall_ms=wall * 1e3, plain_ms=plain * 1e3, vs_plain=wall / plain,
                critical_ms=critical_s * 1e3, vs_critical=wall / critical_s, target=target,
                ok=wall / critical_s <= target, pool_ms=pool)  # fmt: skip


def _rule_row(case, walls: dict) -> dict:
    """Rule on vs off: the median over rounds of the ratio of the two runs of the round."""
    on, off = (statistics.median(walls[k]) * 1e3 for k in ("xcs", "rule_off"))
    ratio = _median_ratio(walls, "xcs", "rule_off")
    return dict(case=case, on_ms=on, off_ms=off, ratio=ratio, target=RULE_TARGET,
                ok=ratio <= RULE_TARGET)  # fmt: skip


def run_fan(server, rounds: int, max_workers) -> tuple[list[dict], list[dict], list[dict], dict]:
    server.latency_s = FAN_LATENCY
    client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
    flavours = {
        "stdlib calls": _stdlib_ask(server.url),
        "SDK calls": _sdk_ask(client),
        "time.sleep calls": sleepy,
    }
    pipelines, rule, extra = [], [], {}
    for name, ask in flavours.items():
        walls, rule_walls, stats = _fan_case(ask, rounds, max_workers)
        case = f"fan-out/fan-in, 20 {name} @50 ms"
        pipelines.append(_pipeline_row(case, walls, 3 * FAN_LATENCY))
        rule.append(_rule_row(case, rule_walls))
        extra[f"fan_stats_{name.split()[0]}"] = str(stats)
    noop_walls = _overhead_case(rounds, max_workers)
    rule.append(_rule_row("no-op fan-out/fan-in (latency 0)", noop_walls))
    calls = N_BRANCH + 2
    plain_s = statistics.median(noop_walls["plain"]) / calls
    jit_s = statistics.median(noop_walls["xcs"]) / calls
    overhead = [
        _row("xcs.jit scheduling overhead per call (no-op, latency 0) vs 200 µs budget",
             jit_s - plain_s, 200e-6, 1.0, 1e6, "us"),
    ]  # fmt: skip
    extra.update(noop_plain_us_per_call=plain_s * 1e6, noop_jit_us_per_call=jit_s * 1e6)
    for name in ("stdlib calls", "time.sleep calls"):
        walls, off = _effects_case(flavours[name], rounds, max_workers)
        case = f"18 reads, 2 writes (effects), 1 read; {name.split()[0]} @50 ms"
        pipelines.append(_pipeline_row(case, walls, 5 * FAN_LATENCY))
        extra[f"effects_rule_off_{name.split()[0]}"] = (
            f"{off['wall_s'] * 1e3:.0f} ms, result equals plain Python: {off['same_result']}, "
            f"writes equal: {off['same_writes']} (the read no longer waits for the writes)"
        )
    return pipelines, rule, overhead, extra


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--out", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument(
        "--workers", type=int, default=None, help="max_workers for xcs (default: its own)"
    )
    p.add_argument(
        "--server", choices=("process", "thread"), default="process",
        help="run the loopback server in a child process (default) or in this process",
    )  # fmt: skip
    args = p.parse_args(argv)
    rounds = 3 if args.quick else 7
    t_start = time.perf_counter()
    env = environment(None)
    workers = args.workers or xcs_scheduler.DEFAULT_WORKERS
    print(f"{env}, openai {openai.__version__}", flush=True)
    print(f"- threads: xcs pool max_workers {workers}, {threading.active_count()} at start; "
          f"rounds {rounds}", flush=True)  # fmt: skip
    server = LoopbackServer(latency_s=0) if args.server == "thread" else ServerProcess()
    print(f"- loopback server: {args.server} ({type(server).__name__})", flush=True)
    try:
        with server:
            map_rows, map_extra = run_map(server, rounds, args.workers)
            pipelines, rule, overhead, fan_extra = run_fan(server, rounds, args.workers)
    finally:
        xcs_engine.SEQUENTIAL_RULE = True  # never left off, whatever failed
    rows, extra = map_rows + overhead, {**map_extra, **fan_extra}
    print()
    _print_tables(rows, pipelines, rule)
    print()
    for k, v in extra.items():
        print(f"- {k}: {_fmt(v) if isinstance(v, float) else v}")
    checked = [r for r in rows + pipelines + rule if r["ok"] is not None]
    misses = [r["case"] for r in checked if not r["ok"]]
    print(f"- targets: {len(checked) - len(misses)} PASS, {len(misses)} MISS {misses or ''}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    print(f"- threads at end {threading.active_count()}; load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")  # fmt: skip
    if load[0] > (os.cpu_count() or 1):
        print(f"- warning: load average {load[0]:.1f} on {os.cpu_count()} cores: timings are noisy")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"environment": env, "rows": rows, "pipelines": pipelines, "rule": rule, **extra},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
