"""``Classification.effects``: whether a call may change something outside the program (the
``xcs.jit`` scheduler starts read-only calls early and runs calls with effects in order).

Each case is real code (never run here: the analysis reads source); optional SDKs are imported
inside the functions, so nothing needs to be installed.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from nablax.xcs.classify.analysis import Classification, classify, clear_cache

log = logging.getLogger(__name__)
SELECT_USERS = "SELECT id, name FROM users"
DELETE_OLD = "DELETE FROM events WHERE ts < ?"


def _effects(fn) -> tuple[str, bool]:
    c = classify(fn)
    return c.kind, c.effects


def _why(fn) -> str:
    """The one reason about effects."""
    (why,) = [r for r in classify(fn).reasons if r.startswith(("effects", "read-only"))]
    return why


def test_classification_keeps_its_three_positional_fields():
    c = Classification("pure", ("x",), False)
    assert (c.kind, c.reasons, c.jax_traceable, c.effects) == ("pure", ("x",), False, False)
    assert Classification("orchestration", (), False, True).effects is True


# ---- HTTP: GET reads, other methods and request bodies write ---------------------------------


def get_user(uid):
    import requests

    return requests.get(f"https://api.test/users/{uid}", timeout=5).json()


def create_issue(title):
    import requests

    return requests.post("https://api.test/issues", json={"title": title}).json()


def drop_hook(session, hook):
    session.delete(f"https://api.test/hooks/{hook}").raise_for_status()


def generic(method_url):
    import httpx

    return httpx.request("PUT", method_url, json={}).status_code


def generic_get(url):
    import httpx

    return httpx.request("GET", url).text


def read_page(url):
    with urllib.request.urlopen(url) as resp:
        return resp.read()


def post_body(url, data: bytes):
    return urllib.request.urlopen(url, data).read()


def post_request(url, payload: bytes):
    req = urllib.request.Request(url, data=payload, headers={"Content-Type": "text/plain"})
    return urllib.request.urlopen(req).status


@pytest.mark.parametrize(
    "fn, effects, word",
    [
        (get_user, False, "requests.get"),
        (create_issue, True, "requests.post"),
        (drop_hook, True, "session.delete"),
        (generic, True, "method PUT"),
        (generic_get, False, "method GET"),
        (read_page, False, "urlopen"),
        (post_body, True, "request body"),
        (post_request, True, "request body"),
    ],
)
def test_http(fn, effects, word):
    assert _effects(fn) == ("orchestration", effects)
    assert word in _why(fn) and _why(fn).startswith("effects" if effects else "read-only")


# ---- SQL: the statement decides ---------------------------------------------------------------


def select_literal(conn, day):
    return conn.execute("SELECT * FROM orders WHERE day = ?", (day,)).fetchall()


def select_fstring(cursor, day):
    cursor.execute(f"SELECT COUNT(*) FROM orders WHERE day = '{day}'")
    return cursor.fetchone()[0]


def select_constant(db):
    return db.execute(SELECT_USERS).fetchall()


def delete_constant(db, cutoff):
    db.execute(DELETE_OLD, (cutoff,))


def insert_and_commit(path, row):
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO t VALUES (?, ?)", row)
    conn.commit()


def with_text(session):
    from sqlalchemy import text

    return session.execute(text("UPDATE users SET active = 0")).rowcount


def with_select(session, User):
    from sqlalchemy import select

    return session.execute(select(User).where(User.id == 1)).scalars().all()


def dynamic_sql(conn, statement):
    return conn.execute(statement)


@pytest.mark.parametrize(
    "fn, effects",
    [
        (select_literal, False),
        (select_fstring, False),
        (select_constant, False),
        (delete_constant, True),
        (insert_and_commit, True),
        (with_text, True),
        (with_select, False),
        (dynamic_sql, True),  # unknown statement: the safe route
    ],
)
def test_sql(fn, effects):
    assert _effects(fn) == ("orchestration", effects), classify(fn)
    assert ("SQL" in _why(fn)) or ("commit" in _why(fn))


def test_parameter_annotations_resolve_receivers():
    def rows(conn: sqlite3.Connection, day: str):
        return conn.execute("SELECT * FROM t WHERE day = ?", (day,)).fetchall()

    c = classify(rows)
    assert (c.kind, c.effects) == ("orchestration", False)
    assert "conn is annotated as sqlite3.Connection" in c.reasons[0]


# ---- files, processes, console ----------------------------------------------------------------


def read_default(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def read_binary(path):
    with open(path, "rb") as fh:
        return fh.read()


def write_text_file(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def append_line(path, line):
    with open(path, mode="a") as fh:
        fh.write(line)


def update_in_place(path):
    with open(path, "r+b") as fh:
        fh.write(b"\0")


def some_mode(path, mode):
    return open(path, mode)


def path_write(p: Path, text: str):
    p.write_text(text)


def path_read(p, name):
    return (p / name).read_text()


def remove(path):
    os.remove(path)


def wipe(folder):
    shutil.rmtree(folder)


def listing(folder):
    return sorted(os.listdir(folder))


def run_git():
    return subprocess.run(["git", "status"], capture_output=True).stdout


def shout(msg):
    print(msg.upper())


def prompt_user(q):
    return input(q)


@pytest.mark.parametrize(
    "fn, effects",
    [
        (read_default, False),
        (read_binary, False),
        (write_text_file, True),
        (append_line, True),
        (update_in_place, True),
        (some_mode, True),
        (path_write, True),
        (path_read, False),
        (remove, True),
        (wipe, True),
        (listing, False),
        (run_git, True),
        (shout, True),
        (prompt_user, True),
    ],
)
def test_files_processes_console(fn, effects):
    assert _effects(fn) == ("orchestration", effects), classify(fn)


def test_logging_is_not_an_effect():
    def chosen(choice):
        log.info("picked %s", choice)
        return choice

    assert _effects(chosen) == ("pure", False)


# ---- LLMs and waits read; agents and unknowns are the safe route ------------------------------


def complete(client, prompt):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])


def embed(client, texts):
    return client.embeddings.create(model="e", input=texts)


def via_keyword(llm, q):
    return llm.invoke(q).content


def upload(client, fh):
    return client.files.create(file=fh, purpose="batch")


def delegate(agent, task):
    return agent.run(task)


def nap():
    time.sleep(0.1)


def apply(fn, x):
    return fn(x)


@pytest.mark.parametrize(
    "fn, kind, effects, words",
    [
        (complete, "orchestration", False, "LLM completion"),
        (embed, "orchestration", False, "LLM embedding"),
        (via_keyword, "orchestration", False, "llm.invoke"),
        (upload, "orchestration", True, "client.files.create"),
        (delegate, "orchestration", True, "agent"),
        (nap, "orchestration", False, "a wait"),
        (apply, "hybrid", True, "effects: unknown"),
    ],
)
def test_llm_calls_waits_agents_unknowns(fn, kind, effects, words):
    assert _effects(fn) == (kind, effects), classify(fn)
    assert words in _why(fn)


def test_callables_chosen_at_run_time_are_unknown():
    class Agent:
        def __init__(self, llm, tools):
            self.llm, self.tools = llm, tools

        def act(self, task):
            plan = self.llm.invoke(task).content  # read-only
            return self.tools[plan](task)  # which tool runs is known only at run time

    def predict(predictor, question):
        return predictor(question=question).answer

    a = Agent(llm=None, tools={})
    assert _effects(a.act) == ("orchestration", True)
    assert "taken from self.tools" in _why(a.act)
    assert _effects(predict) == ("hybrid", True)


def test_no_source_means_effects():
    ns: dict = {}
    exec("def f(x):\n    return x + 1\n", ns)
    c = classify(ns["f"])
    assert (c.kind, c.effects) == ("hybrid", True)
    assert _why(ns["f"]).startswith("effects: unknown, no source code for f")


def test_waits_are_read_only_orchestration():
    import asyncio

    def pause(s):
        time.sleep(s)

    async def apause(s):
        await asyncio.sleep(s)

    for fn in (time.sleep, asyncio.sleep, pause, apause):
        c = classify(fn)
        assert (c.kind, c.effects) == ("orchestration", False), c

    def retry(times=3):  # a decorator factory: its wrapper sleeps, calling retry does not
        def deco(fn):
            @functools.wraps(fn)
            def wrapper(*a):
                time.sleep(0.1)
                return fn(*a)

            return wrapper

        return deco

    assert classify(retry).kind == "pure"


def test_exec_and_eval_are_unknown():
    def calc(expr):
        return eval(expr, {"__builtins__": {}})

    assert classify(calc).kind == "hybrid" and classify(calc).effects
    assert classify(exec).kind == "hybrid" and classify(exec).effects


# ---- bookkeeping, helpers, names --------------------------------------------------------------

_SEEN: list = []


class Crawler:
    def __init__(self):
        self.pages: dict = {}
        self.count = 0

    def crawl(self, url):
        import requests

        page = requests.get(url).text
        self.pages[url] = page  # in-memory bookkeeping: not an effect
        self.count += 1
        _SEEN.append(url)
        return page


def fetch_with_session(url, token):
    import requests

    s = requests.Session()
    s.headers.update({"Authorization": f"Bearer {token}"})  # a dict on the client
    return s.get(url).json()


def save_page(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def crawl_and_save(url, path):
    import requests

    save_page(path, requests.get(url).text)


def crawl_twice(url):
    return get_user(url), read_page(url)


def notify_owner(url):
    return urllib.request.urlopen(url).read()  # a GET, but the name says it notifies


def test_bookkeeping_helpers_and_names():
    assert _effects(Crawler().crawl) == ("orchestration", False)
    assert _effects(fetch_with_session) == ("orchestration", False)
    assert _effects(crawl_and_save) == ("orchestration", True)
    assert _why(crawl_and_save).startswith("effects: calls save_page at line")
    assert "which calls open" in _why(crawl_and_save) and "mode 'w'" in _why(crawl_and_save)
    assert _effects(crawl_twice) == ("orchestration", False)
    assert "+1 more read-only" in _why(crawl_twice)
    assert _effects(notify_owner) == ("orchestration", True)
    assert "its name notify_owner" in _why(notify_owner)


def test_tensor_and_pure_code_never_have_effects():
    cache: dict = {}

    def memo(x):
        cache[x] = jnp.tanh(x)  # mutates a closure dict: tensor, not traceable, no effects
        return cache[x]

    def count(words):
        out: dict = {}
        for w in words:
            out[w] = out.get(w, 0) + 1
        return out

    assert _effects(memo) == ("tensor", False) and not classify(memo).jax_traceable
    assert _effects(count) == ("pure", False)


# ---- library callables judged by themselves ---------------------------------------------------


@pytest.mark.parametrize(
    "obj, kind, effects",
    [
        (print, "orchestration", True),
        (open, "orchestration", True),  # conservatively: open may write
        (input, "orchestration", True),
        (exec, "hybrid", True),
        (os.system, "orchestration", True),
        (os.remove, "orchestration", True),
        (shutil.copy, "orchestration", True),
        (urllib.request.urlopen, "orchestration", True),  # may send a body
        (sqlite3.connect, "orchestration", False),
        (time.sleep, "orchestration", False),
        (os.listdir, "orchestration", False),
        (len, "pure", False),
        (sorted, "pure", False),
        (np.add, "tensor", False),
    ],
)
def test_library_callables(obj, kind, effects):
    assert _effects(obj) == (kind, effects)


def test_partials_and_bound_methods_carry_effects():
    class Repo:
        def __init__(self, path):
            self.path = path

        def add(self, row):
            conn = sqlite3.connect(self.path)
            conn.execute("INSERT INTO t VALUES (?)", (row,))
            conn.commit()

        def all(self):
            return sqlite3.connect(self.path).execute("SELECT * FROM t").fetchall()

    repo = Repo(":memory:")
    assert _effects(repo.add) == ("orchestration", True)
    assert _effects(repo.all) == ("orchestration", False)
    assert _effects(functools.partial(create_issue, "t")) == ("orchestration", True)
    assert _effects(functools.partial(get_user, 3)) == ("orchestration", False)


def test_effects_are_cached_with_the_classification():
    clear_cache()
    first = classify(create_issue)
    assert classify(create_issue) is first and first.effects
