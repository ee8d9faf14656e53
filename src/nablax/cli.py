"""The ``nablax`` command: ``demo``, ``bench``, ``tune``, ``cache``, ``classify``.

``main(argv)`` returns the process exit code (the console-script wrapper passes it to
``sys.exit``), so tests can call it directly.

>>> main(["tune", "--ops", "conv"])  # an unknown kernel: usage error, exit code 2
2
"""

from __future__ import annotations

import argparse
import math
import os
import runpy
import sys
from pathlib import Path
from typing import NoReturn

_BENCH_SCRIPT = Path("bench") / "bench_eager.py"


def _cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    demo.run(steps=args.steps, lr=args.lr, hidden=args.hidden, seed=args.seed)
    print()
    demo.run_dp_sgd(hidden=args.hidden, seed=args.seed)
    print()
    demo.run_compiled(steps=args.steps, lr=args.lr, hidden=args.hidden, seed=args.seed)
    print()
    demo.run_sharded(seed=args.seed)
    print()
    demo.run_kernels(seed=args.seed)
    print()
    from .xcs import demo as xcs_demo

    xcs_demo.run_pipeline()
    return 0


def _find_bench_script() -> Path | None:
    """``bench/bench_eager.py`` of a source checkout: the current directory's, or the one beside
    ``src/`` for an editable install. Wheels do not ship ``bench/``."""
    here = Path(__file__).resolve()
    for root in (Path.cwd(), here.parents[2]):
        candidate = root / _BENCH_SCRIPT
        if candidate.is_file():
            return candidate
    return None


def _cmd_bench(args: argparse.Namespace) -> int:
    script = _find_bench_script()
    if script is None:
        print(
            "nablax bench: the benchmarks live in bench/ of a source checkout, which this "
            "installation does not have. Fix: clone the repository, then run "
            "`python bench/bench_eager.py` (or `nablax bench`) from its root; "
            'install PyTorch for its column with `pip install -e ".[bench]"`.',
            file=sys.stderr,
        )
        return 2
    bench_args = ["--quick"] if args.quick else []
    bad_out = _unwritable(args.out) if args.out else None
    if bad_out:  # checked before the run, not after it
        print(f"nablax bench: --out {args.out!r}: {bad_out}", file=sys.stderr)
        return 2
    if args.out:
        bench_args += ["--out", args.out]
    sys.path.insert(0, str(script.parent))  # as `python bench/...` would: for bench/_common.py
    try:
        bench_main = runpy.run_path(str(script), run_name="nablax_bench")["main"]
        return int(bench_main(bench_args) or 0)
    finally:
        sys.path.remove(str(script.parent))


def _unwritable(out: str) -> str | None:
    """Why the file ``out`` cannot be written (a reason and a fix), or None if it can."""
    path = Path(out)
    folder = path.parent
    if path.is_dir():
        return "is a directory. Fix: give a file path such as DIR/results.json"
    if not folder.is_dir():
        return f"the folder {str(folder)!r} does not exist. Fix: create it, or pick another path"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "cannot be written (permission denied). Fix: pick a path you can write"
    return None


def _cmd_tune(args: argparse.Namespace) -> int:
    from .kernels import default_executor, policy_override
    from .kernels.tuning import common_calls, recorded_calls, tune_calls

    ex = default_executor()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - {"matmul", "attention"})
    if unknown:
        print(f"nablax tune: unknown op(s) {unknown}; bundled: matmul, attention", file=sys.stderr)
        return 2
    calls = common_calls(ops, quick=args.quick)
    if args.recorded:
        calls += recorded_calls(ex.chooser.persistent)
    store = ex.chooser.persistent
    where = "nowhere (no persistent cache)" if store is None else str(store.path)
    if store is not None and store.mode != "read-write":
        where += f" ({store.mode}: new configs stay in this process)"
    print(f"nablax tune: {len(calls)} call(s) on {_device()} -> {where}", flush=True)
    with policy_override(ex.chooser, allow_autotune=True, cache_miss_fallback="autotune"):
        tune_calls(ex, calls, force=args.force)
    return 0


def _device() -> str:
    from .kernels import device_fingerprint

    return device_fingerprint()


def _cmd_cache(args: argparse.Namespace) -> int:
    from .kernels.cache import CacheFileError, PersistentCache
    from .kernels.store.arguments import resolve_path
    from .kernels.store.schema import inspect
    from .kernels.tuning import describe_entry, entry_row

    # A path, never ejKernel's op name: a Path object is not mistaken for one.
    try:
        path = resolve_path(None if args.path is None else Path(args.path))
    except (ValueError, TypeError) as e:  # a folder given as --path, an unusable cache dir
        print(f"nablax cache {args.action}: --path: {e}", file=sys.stderr)
        return 2
    store = None
    try:
        if args.action == "clear":
            if inspect(path).kind in ("missing", "empty"):
                print(f"nablax cache: no kernel database at {path}; nothing to clear")
                return 0
            store = PersistentCache(path, fallback=False)  # refuses instead of degrading
        else:  # list and show only read: nothing is created, renamed or written
            store = PersistentCache(path, read_only=True)
        if args.action == "clear":
            n = store.delete(args.op)
            print(f"nablax cache: removed {n} entr{'y' if n == 1 else 'ies'} from {store.path}")
            return 0
        entries = store.entries(args.op, resolve=False)  # shown as text: no class is rebuilt
    except CacheFileError as e:
        print(str(e), file=sys.stderr)
        return 2
    finally:
        if store is not None:
            store.close()
    if args.action == "show":
        if not args.key:
            print("nablax cache show: give a call key (or its prefix) or an op id", file=sys.stderr)
            return 2
        hits = [e for e in entries if e.call_key.startswith(args.key) or e.op_id == args.key]
        if not hits:
            print(f"nablax cache show: nothing matches {args.key!r} in {path}", file=sys.stderr)
            return 1
        print("\n\n".join(describe_entry(e) for e in hits))
        return 0
    print(f"{path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    for e in entries:
        r = entry_row(e)
        print(
            f"  {r['op']:<14} {r['key']}  {r['source']:<9} {r['best_ms']:9.4f} ms  {r['cfg']}  "
            f"[{r['call']}]  {r['when']}"
        )
    return 0


def _cmd_classify(args: argparse.Namespace) -> int:
    from .xcs.classify.analysis import classify_target, format_table

    target = Path(args.target)
    if target.is_dir():
        print(
            f"nablax classify: {args.target!r} is a directory; nothing was classified. Fix: give "
            "one .py file of it, or the package's module name (e.g. pkg.module)",
            file=sys.stderr,
        )
        return 2
    if target.is_file() and target.suffix != ".py":  # no Python importer would load it
        print(
            f"nablax classify: {args.target!r} is not a Python source file (.py); nothing was "
            "classified. Fix: give a .py file or an importable module name",
            file=sys.stderr,
        )
        return 2
    try:
        rows = classify_target(args.target)
    except (OSError, SyntaxError) as e:
        print(f"nablax classify: can't read {args.target!r}: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as e:
        if str(e).startswith("xcs.classify_target"):  # no such file or module: a usage error
            print(f"nablax classify: {e}", file=sys.stderr)
            return 2
        print(_top_level_failure(args.target, e), file=sys.stderr)
        return 1
    except SystemExit as e:  # the file's top-level code called sys.exit
        code = e.code
        print(
            f"nablax classify: importing {args.target} runs its top-level code, which called "
            f"sys.exit({code!r}); nothing was classified. Fix: put the script part of the file "
            f'under `if __name__ == "__main__":` so that importing it only defines functions.',
            file=sys.stderr,
        )
        return 1
    except Exception as e:  # noqa: BLE001 - any error of the user's top-level code
        print(_top_level_failure(args.target, e), file=sys.stderr)
        return 1
    print(format_table(rows))
    return 0


def _top_level_failure(target: str, e: BaseException) -> str:
    """One line: which exception the target's top-level code raised, and where."""
    where = ""
    tb = e.__traceback__
    full = str(Path(target).resolve()) if Path(target).exists() else None
    while tb is not None:  # the innermost frame in the target file, else the innermost one
        name = tb.tb_frame.f_code.co_filename
        if full is None or str(Path(name).resolve()) == full:
            where = f" at {name}, line {tb.tb_lineno}"
        tb = tb.tb_next
    return (
        f"nablax classify: importing {target} runs its top-level code, which raised "
        f"{type(e).__name__}: {e}{where}; nothing was classified. Fix: correct that code, or put "
        f'the script part of the file under `if __name__ == "__main__":`.'
    )


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``nablax demo: argument --steps: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _number(kind: type, low: float, high: float, what: str, low_open: bool = False):
    """An argparse type: ``kind`` (int or float) within [low, high] (low excluded if
    ``low_open``), finite; the error names the range."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="nablax",
        description="nablax: lazy-eager tensors on XLA, tunable kernels, and orchestration.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    d = sub.add_parser(
        "demo", help="train a small MLP with nx.value_and_grad in eager nablax (a few seconds)"
    )
    d.add_argument(
        "--steps",
        type=_number(int, 1, 1_000_000, "an integer from 1 to 1000000"),
        default=300,
        help="gradient steps, 1 to 1000000 (default 300)",
    )
    d.add_argument(
        "--lr",
        type=_number(float, 0.0, 100.0, "a number > 0 and <= 100", low_open=True),
        default=0.1,
        help="learning rate, > 0 and <= 100 (default 0.1)",
    )
    d.add_argument(
        "--hidden",
        type=_number(int, 1, 4096, "an integer from 1 to 4096"),
        default=32,
        help="units per hidden layer, 1 to 4096 (default 32)",
    )
    d.add_argument(
        "--seed",
        type=_number(int, 0, 2**32 - 1, "an integer from 0 to 2**32-1"),
        default=0,
        help="data and init seed, 0 to 2**32-1 (default 0)",
    )
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("bench", help="eager-overhead benchmark vs NumPy / JAX / PyTorch")
    b.add_argument("--quick", action="store_true", help="fewer repetitions")
    b.add_argument("--out", metavar="PATH", help="also write the results as JSON")
    b.set_defaults(func=_cmd_bench)

    t = sub.add_parser(
        "tune", help="autotune the bundled kernels (matmul, attention) for common shapes here"
    )
    t.add_argument("--ops", default="matmul,attention", help="comma-separated kernels to tune")
    t.add_argument("--quick", action="store_true", help="fewer shapes")
    t.add_argument("--force", action="store_true", help="tune again calls already tuned")
    t.add_argument(
        "--recorded", action="store_true", help="also tune calls recorded with NABLAX_OPS_RECORD=1"
    )
    t.set_defaults(func=_cmd_tune)

    c = sub.add_parser(
        "cache",
        help="list, show or clear the persistent kernel config database",
        description="list and show only read the database (nothing is created, renamed or "
        "written); clear removes entries. A path that is not a nablax kernel database, or a "
        "cache folder that cannot be used, is reported with exit code 2.",
    )
    c.add_argument("action", nargs="?", choices=["list", "show", "clear"], default="list")
    c.add_argument("key", nargs="?", help="show: a call key (prefix) or op id")
    c.add_argument("--op", help="only entries of this versioned op id (e.g. matmul@v1)")
    c.add_argument("--path", help="database file (default: NABLAX_CACHE_DIR or the user cache)")
    c.set_defaults(func=_cmd_cache)

    k = sub.add_parser(
        "classify",
        help="classify the functions of a .py file or module for nablax.xcs (imports it: its "
        "top-level code runs)",
        description="Classify every function and class of a .py file or module for nablax.xcs. "
        "The target is imported, so its top-level code RUNS, as with `python FILE` or `import "
        'module`; keep script code under `if __name__ == "__main__":`. An exception or '
        "sys.exit in that code is reported in one line (exit code 1).",
    )
    k.add_argument(
        "target",
        metavar="PATH_OR_MODULE",
        help="a .py file or an importable module (imported: its top-level code runs)",
    )
    k.set_defaults(func=_cmd_classify)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``nablax`` command line with ``argv`` (default ``sys.argv[1:]``); return the exit
    code. Usage errors (an unknown command, a number out of range) print one line and exit
    through ``SystemExit`` with code 2.

    >>> main(["cache", "list", "--path", "/no/such/folder/kernels.sqlite"])  # nothing is created
    2
    """
    args = _parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
