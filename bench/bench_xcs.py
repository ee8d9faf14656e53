"""``nablax.xcs`` orchestration speed against a local OpenAI-compatible server.

Run from the repository root (needs the ``openai`` SDK of the ``test`` extra)::

    python bench/bench_xcs.py                 # about 45 s on 2 cores (--quick: 30 s)
    python bench/bench_xcs.py --quick --out xcs.json

The server is :class:`nablax.xcs.loopback.LoopbackServer` on 127.0.0.1, in a child process so that
its CPU time and GIL are not charged to the client, as with a real API (``--server thread`` runs
it in this process). Cases:

- **64 chat calls at 100 ms through** ``xcs.vmap``, with a function calling the official sync SDK
  client and with the stdlib ``loopback.chat`` helper: wall time against the ideal
  ``latency x ceil(64 / workers)`` (workers: how many items the vmap runs at once, probed and
  reported). Target: <= 1.5x. References: the same calls on a hand-written
  ``ThreadPoolExecutor``, ``asyncio.gather`` of 64 ``openai.AsyncOpenAI`` calls in this process,
  and the client's CPU floor (64 sequential calls at latency 0: threads in one process cannot
  overlap that part, so it bounds any thread-based map).
- **fan-out/fan-in under** ``xcs.jit``: 1 call, 18 independent calls on its result, 1 call joining
  them (20 calls at 50 ms): wall time against the critical path (3 x 50 ms). Target: <= 1.1x the
  critical path + 5 ms; with the stdlib helper, the sync SDK, and ``time.sleep`` calls (no client
  CPU: the scheduler alone). Reference: the same graph written by hand on a thread pool.
- **scheduling overhead**: the same graph of no-op orchestration functions (latency 0), per call,
  ``xcs.jit`` minus plain sequential Python. Target: <= 200 µs.

Contenders take turns each round; medians reported; every result is checked against plain
sequential Python.
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

from _common import environment  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt
from nablax import xcs
from nablax.xcs.loopback import LoopbackServer, chat

N_MAP, MAP_LATENCY = 64, 0.100
N_BRANCH, FAN_LATENCY = 18, 0.050
USER = "user"


def _interleave(fns: dict, rounds: int) -> dict:
    """Median wall seconds of each function; they take turns, one run each per round."""
    walls: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            walls[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in walls.items()}


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
        time.sleep(0.05)
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
    expected = [fn(p) for p in prompts]
    assert mapped(prompts) == expected  # also warms threads and connections
    server.reset_stats()
    with cf.ThreadPoolExecutor(workers) as pool:
        assert list(pool.map(fn, prompts)) == expected
        walls = _interleave(
            {"xcs": lambda: mapped(prompts), "pool": lambda: list(pool.map(fn, prompts))}, rounds
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


# ---- case 2: a fan-out/fan-in graph under xcs.jit ------------------------------------------------


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


def _fan_case(ask, rounds: int, max_workers) -> tuple[dict, object]:
    """Median wall times of the jitted fan graph and the hand-written one, and xcs.jit's stats."""
    plain = make_fan(ask)
    jitted = xcs.jit(plain, max_workers=max_workers)
    expected = plain("q")
    assert jitted("q") == expected, "xcs.jit result differs from plain Python"
    if jitted.stats().calls != N_BRANCH + 2:  # reported, not fatal: the timing shows the cost
        kind = xcs.classify(ask).kind
        print(
            f"- warning: xcs.jit ran {jitted.stats().calls} of {N_BRANCH + 2} calls of "
            f"{ask.__qualname__} as orchestration calls (xcs.classify says {kind!r})",
            flush=True,
        )
    with cf.ThreadPoolExecutor(N_BRANCH) as pool:
        by_hand = make_pool_fan(ask, pool)
        assert by_hand("q") == expected
        walls = _interleave({"xcs": lambda: jitted("q"), "pool": lambda: by_hand("q")}, rounds)
    return walls, jitted.stats()


@xcs.mark_orchestration
def noop(x):
    """An orchestration function that does nothing: what is left is scheduling."""
    return x


@xcs.mark_orchestration
def sleepy(x):
    """A 50 ms call that costs no CPU: the fan graph without any client's own overhead."""
    time.sleep(FAN_LATENCY)
    return x


def _overhead_case(rounds: int, max_workers) -> tuple[float, float]:
    """Seconds per call of the no-op fan graph: plain sequential Python and ``xcs.jit``."""
    plain = make_fan(noop)
    jitted = xcs.jit(plain, max_workers=max_workers)
    assert jitted("q") == plain("q")
    calls, reps = N_BRANCH + 2, 100
    for _ in range(10):  # warm
        jitted("q")
    walls = _interleave(
        {
            "plain": lambda: [plain("q") for _ in range(reps)],
            "jit": lambda: [jitted("q") for _ in range(reps)],
        },
        rounds,
    )
    return walls["plain"] / (reps * calls), walls["jit"] / (reps * calls)


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


def _print_table(rows: list[dict]) -> None:
    print("| case | measured | reference | ratio | target | verdict |")
    print("|---|---:|---:|---:|---|---|")
    for r in rows:
        unit = "ms" if "measured_ms" in r else "us"
        m, ref = r[f"measured_{unit}"], r[f"reference_{unit}"]
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        target = "—" if r["target"] is None else f"<= {r['target']:.3g}x"
        verdict = "—" if r["ok"] is None else ("ok" if r["ok"] else "MISS")
        unit_s = "µs" if unit == "us" else unit
        print(
            f"| {r['case']} | {_fmt(m)} {unit_s} | {_fmt(ref)} {unit_s} | {ratio} | {target} "
            f"| {verdict} |"
        )


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


def run_fan(server, rounds: int, max_workers) -> tuple[list[dict], dict]:
    server.latency_s = FAN_LATENCY
    client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
    crit = 3 * FAN_LATENCY
    target = 1.1 + 0.005 / crit  # <= 1.1 x critical path + 5 ms
    std, std_stats = _fan_case(_stdlib_ask(server.url), rounds, max_workers)
    sdk, sdk_stats = _fan_case(_sdk_ask(client), rounds, max_workers)
    slp, _ = _fan_case(sleepy, rounds, max_workers)
    plain_s, jit_s = _overhead_case(rounds, max_workers)
    fan, by_hand = (
        "xcs.jit fan-out/fan-in, 20 {} @50 ms",
        "same graph by hand on a thread pool ({})",
    )
    rows = [
        _row(fan.format("stdlib calls"), std["xcs"], crit, target),
        _row(by_hand.format("stdlib"), std["pool"], crit),
        _row(fan.format("SDK calls"), sdk["xcs"], crit, target),
        _row(by_hand.format("SDK"), sdk["pool"], crit),
        _row(fan.format("time.sleep calls (no client CPU)"), slp["xcs"], crit, target),
        _row(by_hand.format("time.sleep"), slp["pool"], crit),
        _row("xcs.jit scheduling overhead per call (no-op, latency 0) vs 200 µs budget",
             jit_s - plain_s, 200e-6, 1.0, 1e6, "us"),
    ]  # fmt: skip
    extra = {
        "fan_stats_stdlib": str(std_stats),
        "fan_stats_sdk": str(sdk_stats),
        "noop_plain_us_per_call": plain_s * 1e6,
        "noop_jit_us_per_call": jit_s * 1e6,
    }
    return rows, extra


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
    print(f"{env}, openai {openai.__version__}", flush=True)
    server = LoopbackServer(latency_s=0) if args.server == "thread" else ServerProcess()
    print(f"- loopback server: {args.server} ({type(server).__name__})", flush=True)
    with server:
        map_rows, map_extra = run_map(server, rounds, args.workers)
        fan_rows, fan_extra = run_fan(server, rounds, args.workers)
    rows, extra = map_rows + fan_rows, {**map_extra, **fan_extra}
    print()
    _print_table(rows)
    print()
    for k, v in extra.items():
        print(f"- {k}: {_fmt(v) if isinstance(v, float) else v}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(f"- warning: load average {load:.1f} on {os.cpu_count()} cores: timings are noisy")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "rows": rows, **extra}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
