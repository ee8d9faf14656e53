"""Audit (issue 35, finding 10): ``xcs.vmap`` concurrency bounds and ``async def`` functions, the
classification of ``numpy.*`` functions and of SDK methods written directly in a jitted body,
and recursive ``xcs.jit`` functions. The oracle is plain sequential Python."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time
import warnings

import pytest

from nablax import xcs
from nablax.xcs.classify.analysis import clear_cache


class _Peak:
    """Counts how many calls run at the same time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = self.peak = 0

    def __call__(self, x):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.02)
        with self.lock:
            self.active -= 1
        return x * 2


@pytest.mark.parametrize("n", [1, 2, 3])
def test_vmap_max_workers_is_a_bound_on_running_items(n):
    # the waiting caller helps run queued items: it must count against max_workers too
    peak = _Peak()
    assert xcs.vmap(peak, max_workers=n)(list(range(4 * n + 3))) == [
        2 * i for i in range(4 * n + 3)
    ]
    assert 1 <= peak.peak <= n


def test_vmap_on_a_given_thread_pool_is_bounded_by_its_size():
    peak = _Peak()
    with cf.ThreadPoolExecutor(2) as pool:
        assert xcs.vmap(peak, executor=pool)(list(range(9))) == [2 * i for i in range(9)]
    assert peak.peak <= 2


def test_vmap_bounded_nested_maps_finish_and_stay_bounded():
    inner = _Peak()

    def row(k):
        return sum(xcs.vmap(inner, max_workers=2)(list(range(k, k + 4))))

    assert xcs.vmap(row, max_workers=2)([0, 10, 20]) == [
        sum(2 * i for i in range(k, k + 4)) for k in (0, 10, 20)
    ]


def test_vmap_bounded_stops_submitting_after_an_error():
    started = []

    def item(i):
        started.append(i)
        time.sleep(0.01)
        if i == 1:
            raise ValueError(f"bad {i}")
        return i

    with pytest.raises(ValueError, match="bad 1") as info:
        xcs.vmap(item, max_workers=2)(list(range(50)))
    assert info.value.xcs_index == 1
    assert len(started) <= 4  # plain Python would run 2; the window adds at most max_workers


def test_vmap_awaits_async_functions():
    async def twice(x, k=1):
        await asyncio.sleep(0.001)
        return x * 2 * k

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited"
        assert xcs.vmap(twice)([1, 2, 3]) == [2, 4, 6]
        assert xcs.vmap(twice, in_axes=(0, None))([1, 2], 3) == [6, 12]
        assert xcs.vmap(lambda x: twice(x))([5]) == [10]  # returns a coroutine: awaited too


def test_vmap_async_errors_carry_the_item_index():
    async def check(x):
        if x == 2:
            raise KeyError(x)
        return x

    with pytest.raises(KeyError) as info:
        xcs.vmap(check)([1, 2, 3])
    assert info.value.xcs_index == 1
    out = xcs.vmap(check, return_exceptions=True)([1, 2])
    assert out[0] == 1 and isinstance(out[1], KeyError)


def test_vmap_awaits_async_items_run_from_inside_an_event_loop():
    async def twice(x):
        await asyncio.sleep(0)
        return 2 * x

    async def main():
        return xcs.vmap(twice, max_workers=1)([1, 2, 3])  # the caller helps, inside a loop

    assert asyncio.run(main()) == [2, 4, 6]


@pytest.mark.parametrize("module", ["numpy.linalg", "numpy.fft.helper", "torch.nn.functional"])
def test_function_named_into_a_tensor_library_is_tensor(module):
    def op(x):
        return x

    op.__module__ = module
    clear_cache()
    assert xcs.classify(op).kind == "tensor"


def test_function_named_into_an_io_library_is_orchestration():
    def op(x):
        return x

    op.__module__ = "requests.api"
    assert xcs.classify(op).kind == "orchestration"


def test_sdk_create_methods_classify_as_in_source():
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")

    def helper(m):
        return client.chat.completions.create(model="m", messages=m)

    direct = xcs.classify(client.chat.completions.create)
    assert direct.kind == "orchestration" and direct.effects is False, direct
    assert xcs.classify(helper).effects is False
    assert xcs.classify(client.embeddings.create).effects is False
    assert xcs.classify(client.responses.create).effects is False
    assert xcs.classify(client.files.create).effects is True  # an upload stores a file


def test_sdk_create_written_in_the_jitted_body_starts_early():
    openai = pytest.importorskip("openai")
    from nablax.xcs.loopback import LoopbackServer

    with LoopbackServer(latency_s=0.05) as server:
        client = openai.OpenAI(base_url=server.url, api_key="t", max_retries=0)

        def helper(q):
            return client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": q}]
            )

        @xcs.jit
        def direct(a, b):
            x = client.chat.completions.create(model="m", messages=[{"role": "user", "content": a}])
            y = client.chat.completions.create(model="m", messages=[{"role": "user", "content": b}])
            return x.choices[0].message.content, y.choices[0].message.content

        @xcs.jit
        def via_helper(a, b):
            x, y = helper(a), helper(b)
            return x.choices[0].message.content, y.choices[0].message.content

        assert direct("p", "q") == ("echo: p", "echo: q")
        assert via_helper("p", "q") == ("echo: p", "echo: q")
        for f in (direct, via_helper):
            nodes = f.last_plan().nodes
            assert [n.effects for n in nodes] == [False, False], f.last_plan()
            assert nodes[1].after == () and nodes[1].start < nodes[0].end, f.last_plan()


@xcs.jit
def _countdown(n):
    return 0 if n == 0 else _countdown(n - 1) + 1


def test_recursive_jit_is_rewritten_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @xcs.jit
        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)

        def make():
            @xcs.jit
            def fib(n):  # recursive through its closure cell
                return n if n < 2 else fib(n - 1) + fib(n - 2)

            return fib

        fib = make()
        assert fact(5) == 120 and fib(10) == 55
    assert _countdown(4) == 4
    for f in (_countdown, fact, fib, _even):
        assert f._body is not f._fn  # rewritten, not run unmodified
    assert _even(6) is True and _odd(3) is True


@xcs.jit
def _even(n):
    return True if n == 0 else _odd(n - 1)


@xcs.jit
def _odd(n):
    return False if n == 0 else _even(n - 1)


def test_pmap_is_bounded_and_awaits_too():
    peak = _Peak()
    assert xcs.pmap(peak, max_workers=2)(list(range(7))) == [2 * i for i in range(7)]
    assert peak.peak <= 2

    class Doubler:
        async def __call__(self, x):
            await asyncio.sleep(0)
            return 2 * x

    assert xcs.pmap(Doubler())([1, 2]) == [2, 4]
    assert xcs.vmap(Doubler())([3]) == [6]
