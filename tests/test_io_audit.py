"""Attacks on nx.save / nx.load (issue 35): every NumPy and ml_dtypes dtype, both byte orders,
scalars that Python floats cannot hold, malformed metadata at every level of the tree, files that
name one tensor many times, and what a save does to the file system (mode, symlinks, errors).

The contract (API.md section 10): ``save`` accepts only what ``load`` returns equal (dtype and
values) and otherwise raises naming the leaf; any malformed file raises ``ValueError`` naming it;
loading cannot use memory out of proportion to the file's size."""

from __future__ import annotations

import os
import stat

import pytest

import nablax as nx

# ---- save: the file system ----------------------------------------------------------------------


def test_new_files_honour_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    path = tmp_path / "m.safetensors"
    old = os.umask(0o027)
    try:
        nx.save(path, {"w": nx.ones(1)})
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        os.chmod(path, 0o604)
        nx.save(path, {"w": nx.ones(2)})
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o604
    finally:
        os.umask(old)
    assert nx.load(path)["w"].shape == (2,)


def test_saving_to_a_symlink_writes_through_to_its_target(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "ckpt.safetensors"
    link = tmp_path / "latest.safetensors"
    nx.save(target, {"w": nx.ones(1)})
    link.symlink_to(target)
    nx.save(link, {"w": nx.ones(3)})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert nx.load(target)["w"].shape == (3,)
    assert sorted(os.listdir(tmp_path / "real")) == ["ckpt.safetensors"]


def test_a_missing_directory_is_reported_with_the_users_path(tmp_path):
    path = str(tmp_path / "no" / "such" / "ckpt.safetensors")
    with pytest.raises(FileNotFoundError) as e:
        nx.save(path, {"w": nx.ones(1)})
    assert path in str(e.value) and ".nablax-save-" not in str(e.value)
    assert "Fix" in str(e.value)
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError) as e:
        nx.save(tmp_path / "d", {"w": nx.ones(1)})
    assert str(tmp_path / "d") in str(e.value) and ".nablax-save-" not in str(e.value)
    assert os.listdir(tmp_path / "d") == [] and sorted(os.listdir(tmp_path)) == ["d"]


def test_a_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"nx.load: .* is a directory"):
        nx.load(tmp_path)
