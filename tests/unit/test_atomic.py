"""services.common.atomic: a reader sees the old file or the new one, never a part, and no
temporary file outlives a write, whether it succeeded or failed."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from services.common import atomic
from services.common.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic


def test_writes_and_replaces_leaving_only_the_target(tmp_path: Path):
    path = tmp_path / "state.json"
    write_text_atomic(path, "one\n")
    write_text_atomic(str(path), "two\n")  # a str path as well
    assert path.read_text() == "two\n"
    assert os.listdir(tmp_path) == ["state.json"]


def test_json_has_a_final_newline_and_the_given_indent(tmp_path: Path):
    write_json_atomic(tmp_path / "a.json", {"version": 3, "workers": ["h:1"]})
    assert (tmp_path / "a.json").read_text() == '{"version": 3, "workers": ["h:1"]}\n'
    write_json_atomic(tmp_path / "b.json", {"x": 1}, indent=2)
    assert (tmp_path / "b.json").read_text() == '{\n  "x": 1\n}\n'


def test_permissions_are_those_of_a_plain_write(tmp_path: Path):
    (tmp_path / "plain").write_text("x")
    write_text_atomic(tmp_path / "atomic", "x")
    assert (tmp_path / "atomic").stat().st_mode == (tmp_path / "plain").stat().st_mode


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path, monkeypatch, step):
    path = tmp_path / "port"
    write_text_atomic(path, "1234")

    def fail(*_args):
        raise OSError(f"{step} failed")

    monkeypatch.setattr(atomic.os, step, fail)
    with pytest.raises(OSError, match=f"{step} failed"):
        write_text_atomic(path, "5678")
    assert path.read_text() == "1234"
    assert os.listdir(tmp_path) == ["port"]


def test_a_concurrent_reader_never_sees_a_half_file(tmp_path: Path):
    path = tmp_path / "big.json"
    versions = [json.dumps({"v": v, "pad": str(v) * 200_000}) + "\n" for v in range(2)]
    write_text_atomic(path, versions[0])
    done = threading.Event()

    def writer() -> None:
        for i in range(60):
            write_bytes_atomic(path, versions[i % 2].encode())
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not done.is_set() or reads == 0:
        assert path.read_text() in versions
        reads += 1
    thread.join()
    assert os.listdir(tmp_path) == ["big.json"]
