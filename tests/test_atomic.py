"""learner/run/atomic.py: a file or a directory appears complete or not at all, and a failure leaves no temp behind."""

from __future__ import annotations

import os

import pytest

from learner.run.atomic import (ASIDE_PREFIX, TEMP_PREFIX, atomic_directory, atomic_write_bytes, atomic_write_text,
                            fsync_path, restore_set_aside)


def _temps(directory):
    return [p.name for p in directory.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_write_bytes_and_text_replace_the_file(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_bytes(target, b"old")
    atomic_write_text(target, "néw\n")
    assert target.read_bytes() == "néw\n".encode() and not _temps(tmp_path)
    fsync_path(target)
    fsync_path(tmp_path)


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "a.json"
    target.write_text("old")

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and not _temps(tmp_path)


def test_directory_replaces_the_old_one(tmp_path):
    final = tmp_path / "set"
    for text in ("one", "two"):
        with atomic_directory(final) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(TEMP_PREFIX)
            (tmp / "f.txt").write_text(text)
    assert (final / "f.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_a_failed_directory_leaves_the_old_one_and_no_temp(tmp_path):
    final = tmp_path / "set"
    with atomic_directory(final) as tmp:
        (tmp / "f.txt").write_text("one")
    with pytest.raises(KeyboardInterrupt), atomic_directory(final) as tmp:
        (tmp / "f.txt").write_text("half")
        raise KeyboardInterrupt
    assert (final / "f.txt").read_text() == "one" and sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_a_crash_between_the_renames_is_restored(tmp_path, monkeypatch):
    final = tmp_path / "set"
    with atomic_directory(final) as tmp:
        (tmp / "f.txt").write_text("one")
    real_rename, calls = os.rename, []

    def crash_on_second(*args):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        real_rename(*args)

    monkeypatch.setattr(os, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt), atomic_directory(final) as tmp:
        (tmp / "f.txt").write_text("two")
    monkeypatch.undo()
    assert not final.exists() and (tmp_path / f"{ASIDE_PREFIX}set").is_dir()
    restore_set_aside(tmp_path)
    assert (final / "f.txt").read_text() == "one" and sorted(p.name for p in tmp_path.iterdir()) == ["set"]
