"""Audit (issue 35, finding 1): a call made under ``xcs.jit`` sees its arguments as they were when
the program made it, whatever the program does to them afterwards, and a function that changes
its arguments changes the program's objects. The oracle is the same program run as plain
sequential Python: results and what every call received must be equal."""

from __future__ import annotations

import collections
import copy
import dataclasses
import threading
import time

import numpy as np
import pytest

from nablax import xcs

SEEN: list = []  # (call, what it received), in the order the calls ran
_lock = threading.Lock()


def _record(name, value):
    with _lock:
        SEEN.append((name, repr(value)))


@xcs.mark_orchestration(effects=False)
def create(messages, model="m", delay=0.03):
    time.sleep(delay)  # runs after the program has moved on
    _record("create", messages)
    return f"reply to {len(messages)}"


@xcs.mark_orchestration(effects=True)
def write(path, lines, delay=0.03):
    time.sleep(delay)
    _record("write", (path, lines))
    return len(lines)


@xcs.mark_orchestration(effects=False)
def look(value, delay=0.03):
    time.sleep(delay)
    _record("look", value)
    return repr(value)


@xcs.mark_orchestration(effects=False)
def produce(n, delay=0.05):
    time.sleep(delay)
    return [f"item{i}" for i in range(n)]


def run_both(program, *args):
    """(plain result, what the calls saw) == (jitted result, what the calls saw), as sets of
    calls (the jitted calls may run in another order, never with other arguments)."""
    SEEN.clear()
    plain = program(*copy.deepcopy(args))  # each run gets its own arguments
    plain_seen = sorted(SEEN)
    SEEN.clear()
    jitted = xcs.jit(program)(*copy.deepcopy(args))
    jit_seen = sorted(SEEN)
    assert jitted == plain
    assert jit_seen == plain_seen
    return plain


def p_agent_history(q):
    messages = [{"role": "user", "content": q}]
    replies = []
    for turn in range(3):
        r = create(messages=messages)
        replies.append(r)
        messages.append({"role": "assistant", "content": f"turn {turn}"})
    return replies


def test_appended_history_never_reaches_an_earlier_call():
    assert run_both(p_agent_history, "hi") == ["reply to 1", "reply to 2", "reply to 3"]


def p_write_then_clear(lines):
    write("report.txt", lines)
    lines.clear()
    lines.append("next")
    return write("next.txt", lines)


def test_effectful_call_writes_the_lines_it_was_given():
    run_both(p_write_then_clear, ["a", "b"])


def p_nested(cfg):
    a = look(cfg)
    cfg["tags"].append("late")
    cfg["inner"]["k"] = 2
    b = look(cfg)
    return a, b


def test_nested_containers_are_snapshotted():
    run_both(p_nested, {"tags": ["x"], "inner": {"k": 1}})


@dataclasses.dataclass
class Doc:
    title: str
    words: list


def p_containers():
    s, ba, dq, od = {1}, bytearray(b"ab"), collections.deque([1]), collections.OrderedDict(a=1)
    dd, arr, doc = collections.defaultdict(list, k=[1]), np.arange(3), Doc("t", ["w"])
    outs = [look(v) for v in (s, ba, dq, od, dd, arr, doc)]
    s.add(2)
    ba.extend(b"cd")
    dq.append(2)
    od["b"] = 2
    dd["k"].append(2)
    arr[0] = 99
    doc.words.append("late")
    doc.title = "changed"
    return outs


def test_every_mutable_kind_is_seen_as_it_was():
    run_both(p_containers)


def p_aliases():
    shared = ["x"]
    r = look([shared, shared])
    shared.append("y")
    return r


def test_aliasing_and_cycles_survive_the_copy():
    run_both(p_aliases)
    cyc: list = [1]
    cyc.append(cyc)

    @xcs.jit
    def f(v):
        r = look(v)
        v.append(2)
        return r

    assert f(cyc) == "[1, [...]]"


class Opaque:
    """Neither a container nor a dataclass: cannot be copied safely."""

    def __init__(self) -> None:
        self.items = ["a"]

    def __repr__(self) -> str:
        return f"Opaque({self.items})"


def p_opaque():
    o = Opaque()
    r = look(o)
    o.items.append("late")
    return r


def test_uncopyable_argument_makes_the_program_wait_for_the_call():
    run_both(p_opaque)
    f = xcs.jit(p_opaque)
    f()
    assert "waited" in f.last_plan().nodes[0].schedule


def p_result_changed_after_use():
    r = produce(2)
    a = look(r)  # submitted before r is ready: gets r as produce returned it
    r.append("mine")  # the program changes its own copy afterwards
    return a, len(r)


def p_result_changed_before_use():
    r = produce(2)
    r.append("mine")
    return look(r)  # plain Python passes the changed list


def test_results_reach_later_calls_as_they_were_when_passed():
    run_both(p_result_changed_after_use)
    run_both(p_result_changed_before_use)


def p_add_then_append():
    a = produce(2)
    b = produce(1, delay=0.02)
    c = a + b  # two pending lists: added later, lazily
    a.append("late")  # the program's own list afterwards
    return c


def p_join_then_append():
    parts = [create(["q"])]
    text = " / ".join(parts)
    parts.append("late")
    return text


def test_lazy_join_uses_the_parts_as_they_were():
    run_both(p_join_then_append)
    run_both(p_add_then_append)


def add_reply(history):
    """Changes its argument: the program must see the change (it runs while the program waits)."""
    history.append(create(list(history)))
    return len(history)


def p_callee_mutates():
    history = [create(["system"])]
    n = add_reply(history)
    return n, list(history)


def test_a_function_that_changes_its_argument_changes_the_programs():
    run_both(p_callee_mutates)


def p_vmap_items():
    qs = ["a", "b"]
    out = xcs.vmap(look)(qs)
    qs.append("c")
    return out


def test_vmap_inside_jit_gets_the_items_as_they_were():
    run_both(p_vmap_items)


def test_openai_sdk_messages_list_is_sent_as_it_was():
    openai = pytest.importorskip("openai")
    from nablax.xcs.loopback import LoopbackServer

    received = []

    def responder(messages, model):
        received.append(len(messages))
        return "echo: " + messages[-1]["content"]

    with LoopbackServer(latency_s=0.05, responder=responder) as server:
        client = openai.OpenAI(base_url=server.url, api_key="t", max_retries=0)

        def chat(m):
            out = []
            for q in ("one", "two"):
                m.append({"role": "user", "content": q})
                r = client.chat.completions.create(model="m", messages=m)
                out.append(r)
                m.append({"role": "assistant", "content": "later"})
            return [x.choices[0].message.content for x in out]

        plain = chat([])
        jitted = xcs.jit(chat)([])
        assert jitted == plain == ["echo: one", "echo: two"]
        # as plain Python sent them (the jitted calls may arrive in either order), not [3, 4]
        assert received[:2] == [1, 3] and sorted(received[2:]) == [1, 3]


class Agent:
    def __init__(self) -> None:
        self.history: list = []

    def ask(self, q):
        """Changes its object: the program reads self.history right after."""
        self.history.append(create([q]))
        return len(self.history)

    def peek(self, q):
        return look((q, len(self.history)))


def p_method_changes_its_object():
    agent = Agent()
    agent.ask("a")
    seen = list(agent.history)
    agent.ask("b")
    return seen, agent.history, agent.peek("c")


def test_a_method_that_changes_its_object_runs_in_order():
    run_both(p_method_changes_its_object)


@xcs.mark_orchestration(effects=False)
def make_opaque(delay=0.05):
    time.sleep(delay)
    return Opaque()


def p_uncopyable_result_changed_after_use():
    o = make_opaque()
    r = look(o)  # submitted before o exists; o cannot be copied
    o.items.append("late")  # the program's read waits until look has what it needs
    return r


def test_uncopyable_result_reaches_its_consumers_before_the_program_changes_it():
    run_both(p_uncopyable_result_changed_after_use)
