"""Ranker hot swap (RankerStore, RankerWatcher) and the ``braid ranker`` commands."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main as braid
from ranker.base import MANIFEST, RankerFormatError, create
from ranker.store import RankerStore, RankerWatcher

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ranker_small.jsonl"


def _trained(path: Path, kind: str = "prompt_length", scale: float = 1.0) -> Path:
    return create(kind).fit(["short", "a longer prompt here"], [10 * scale, 40 * scale]).save(path)


def test_publish_switches_current_atomically_and_prunes(tmp_path):
    store = RankerStore(tmp_path / "store", keep=2)
    assert store.current() is None
    names = [store.publish(_trained(tmp_path / f"t{i}")) for i in range(3)]
    assert store.current() == tmp_path / "store" / names[-1]
    assert (tmp_path / "store" / "CURRENT").read_text().strip() == names[-1]
    assert [p.name for p in store.versions()] == names[1:]  # keep=2: the oldest is gone
    assert not list((tmp_path / "store").glob("*.tmp*")) and not list((tmp_path / "store").glob(".*partial"))
    with pytest.raises(RankerFormatError, match=r"ranker.json: missing"):
        store.publish(tmp_path)  # not a ranker: refused, CURRENT untouched
    assert store.current() == tmp_path / "store" / names[-1]


def test_watcher_reloads_on_change_and_keeps_previous_on_broken(tmp_path, caplog):
    store = RankerStore(tmp_path / "store")
    watcher = RankerWatcher(tmp_path / "store")
    assert watcher.get() is None
    first = store.publish(_trained(tmp_path / "a", scale=1.0))
    r1 = watcher.get()
    assert r1 is not None and watcher.name == first and watcher.get() is r1  # no reload without a change
    second = store.publish(_trained(tmp_path / "b", scale=3.0))
    r2 = watcher.get()
    assert watcher.name == second and r2 is not r1
    np.testing.assert_allclose(r2.predict(["xyz"]), 3 * r1.predict(["xyz"]))

    broken = _trained(tmp_path / "c")
    third = store.publish(broken)
    manifest = tmp_path / "store" / third / MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format_version": 999}))
    with caplog.at_level(logging.ERROR, logger="ranker.store"):
        assert watcher.get() is r2  # the broken one is logged, the previous one kept
    assert "format_version" in caplog.text and watcher.failures == 1 and watcher.name == second


def test_watcher_is_thread_safe_under_concurrent_publishes(tmp_path):
    store = RankerStore(tmp_path / "store", keep=50)
    store.publish(_trained(tmp_path / "init"))
    watcher = RankerWatcher(tmp_path / "store")
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                r = watcher.get()
                assert r is not None and r.predict(["a b c"])[0] > 0
        except BaseException as err:  # noqa: BLE001  (surfaced below)
            errors.append(err)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    last = None
    for i in range(8):
        last = store.publish(_trained(tmp_path / f"p{i}", scale=i + 1))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    watcher.get()
    assert watcher.name == last and watcher.failures == 0


# --- CLI ----------------------------------------------------------------------------------------

def test_cli_train_eval_annotate(tmp_path, capsys):
    out = tmp_path / "r"
    assert braid(["ranker", "train", "--data", str(FIXTURE), "--out", str(out), "--kind", "tfidf_linear",
                  "--unit", "characters"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "tfidf_linear"
    assert braid(["ranker", "eval", "--ranker", str(out), "--data", str(FIXTURE), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 160 and result["unit"] == "characters"
    assert {"recall_at_20", "recall_at_10", "recall_at_5", "spearman"} <= set(result) and result["spearman"] > 0.5
    assert braid(["ranker", "annotate", "--ranker", str(out), "--prompts", str(FIXTURE), "--out",
                  str(tmp_path / "ann.jsonl")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "ann.jsonl").read_text().splitlines()]
    src = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    assert len(rows) == 160 and all(r["estimated_length"] > 0 for r in rows)
    assert all({k: r[k] for k in s} == s for r, s in zip(rows, src, strict=True))  # other fields kept


def test_cli_bad_input_exits_2_naming_file_line_field(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response_length": 3}\n{"prompt": "b", "response_length": -1}\n')
    assert braid(["ranker", "train", "--data", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert f"{bad}:2: field 'response_length' must be > 0, got -1" in capsys.readouterr().err
    assert braid(["ranker", "eval", "--ranker", str(tmp_path), "--data", str(FIXTURE)]) == 2
    assert "ranker.json: missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        braid(["ranker", "train", "--data", str(FIXTURE), "--out", str(tmp_path / "r"), "--kind", "forest"])


def test_cli_eval_takes_a_store_and_says_which_version(tmp_path, capsys):
    """What retrain_ranker publishes to (a store root) evaluates as its CURRENT version."""
    store = RankerStore(tmp_path / "store")
    store.publish(_trained(tmp_path / "old"))
    name = store.publish(create("tfidf_linear").fit(*_fixture_rows(), unit="characters").save(tmp_path / "new"))
    assert braid(["ranker", "eval", "--ranker", str(tmp_path / "store"), "--data", str(FIXTURE), "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["ranker"] == str(tmp_path / "store" / name) and result["kind"] == "tfidf_linear"
    assert f"is a ranker store: using its current version {name}" in out.err
    (tmp_path / "store" / "CURRENT").unlink()  # no pointer: the newest version
    assert braid(["ranker", "annotate", "--ranker", str(tmp_path / "store"), "--prompts", str(FIXTURE),
                  "--out", str(tmp_path / "ann.jsonl")]) == 0
    assert f"without CURRENT: using its newest version {name}" in capsys.readouterr().err
    assert braid(["ranker", "eval", "--ranker", str(tmp_path / "empty"), "--data", str(FIXTURE)]) == 2
    assert "not a directory" in capsys.readouterr().err


def _fixture_rows() -> tuple[list[str], list[float]]:
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    return [r["prompt"] for r in rows], [r["response_length"] for r in rows]


@pytest.mark.parametrize("ranker_unit, data_unit, warned", [
    ("characters", "tokens", True), ("tokens", "characters", True), ("tokens", "tokens", False),
    ("characters", None, False), ("unknown", "tokens", False),
])
def test_cli_eval_warns_when_ranker_and_data_units_differ(tmp_path, capsys, ranker_unit, data_unit, warned):
    from ranker.train import write_unit

    data = tmp_path / "data.jsonl"
    data.write_text(FIXTURE.read_text())
    if data_unit is not None:
        write_unit(data, data_unit)
    ranker = create("prompt_length").fit(*_fixture_rows(), unit=ranker_unit).save(tmp_path / "r")
    assert braid(["ranker", "eval", "--ranker", str(ranker), "--data", str(data), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["data_unit"] == (data_unit or "unknown")
    expected = f"warning: the ranker was trained on response lengths in {ranker_unit}, the data's are in {data_unit}"
    assert (expected in out.err) is warned and ("warning" in out.err) is warned
