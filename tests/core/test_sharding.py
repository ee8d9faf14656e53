"""Sharding (API.md §5). The multi-device checks run in a fresh process with 8 virtual CPU devices
(``tests/core/sharding_cases.py``): XLA_FLAGS must be set before JAX starts, so they cannot run in
this process. In-process tests use the one real device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nablax as nx


def test_eight_virtual_devices_data_and_tensor_parallel():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    script = Path(__file__).with_name("sharding_cases.py")
    r = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("data_parallel_mlp_step", "tensor_parallel_matmul", "errors"):
        assert f"ok {name}" in r.stdout


def test_one_device_mesh_shard_and_shard_map():
    mesh = nx.DeviceMesh((1,), ("dp",))
    x = nx.tensor(np.arange(8, dtype=np.float32).reshape(4, 2))
    xs = x.shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    assert xs.sharding == nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    f = nx.shard_map(lambda a: (a * 2).sum(0), mesh)
    assert f(xs).tolist() == [24.0, 32.0]
    with pytest.raises(ValueError, match="rank"):
        x.shard(mesh, [nx.DimSpec(["dp"])])
