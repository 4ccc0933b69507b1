import gzip
import json
import pickle
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.common.task_config import MAX_DATASET_TEXT_CHARS, DatasetConfig
from services.tasks.dataset import (
    DatasetError,
    DatasetExhausted,
    DatasetItem,
    DatasetSampler,
    fingerprint,
    load_dataset,
    prompts_needed_check,
    read_rows,
)

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(path: Path, **kw) -> DatasetConfig:
    return DatasetConfig(train=str(path), **kw)


def _rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"prompt": f"{prefix}{i}", "answer": str(i)} for i in range(n)]


def _same(item) -> tuple:
    return item.prompt, item.answer, item.row_json, item.task, item.system, item.difficulty


# --- formats and field mapping -------------------------------------------------------------------


def test_jsonl_json_parquet_and_gzip_load_to_the_same_items(tmp_path):
    rows = [
        {"q": "How many {legs} does a cat have?", "a": "4", "meta": {"src": "zoo"}, "n": 1},
        {"q": "Größe von π?", "a": "3.14159", "meta": {"src": "math"}, "n": 2},
    ]
    kw = {"prompt_field": "q", "answer_field": "a", "template": "Solve {\"x\": {prompt}}", "system_prompt": "Be terse.",
          "name": "zoo"}
    jsonl = _jsonl(tmp_path / "d.jsonl", rows)
    _jsonl(tmp_path / "d.ndjson", rows)
    (tmp_path / "d.json").write_text(json.dumps(rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(jsonl.read_bytes()))
    loaded = {p: read_rows(tmp_path / p, _cfg(tmp_path / p, **kw))
              for p in ["d.jsonl", "d.ndjson", "d.json", "d.parquet", "d.jsonl.gz"]}
    first = loaded["d.jsonl"]
    assert first[0].prompt == 'Solve {"x": How many {legs} does a cat have?}'  # only {prompt} is interpreted
    assert first[1].prompt == 'Solve {"x": Größe von π?}'
    assert [i.answer for i in first] == ["4", "3.14159"]
    assert first[0].system == "Be terse." and first[0].task == "zoo" and first[0].prompt_id == ""
    assert json.loads(first[0].row_json) == rows[0] and "π" in first[1].row_json
    assert [i.source for i in first] == [f"{jsonl}:1", f"{jsonl}:2"]
    assert loaded["d.json"][1].source == f"{tmp_path / 'd.json'}:row 1"
    assert loaded["d.parquet"][0].source == f"{tmp_path / 'd.parquet'}:row 0"
    for items in loaded.values():
        assert [_same(i) for i in items] == [_same(i) for i in first]


def test_numbers_as_answers_blank_lines_and_bom(tmp_path):
    path = tmp_path / "n.jsonl"
    path.write_text('\ufeff{"prompt":"a","answer":3}\n\n  \n{"prompt":"b","answer":2.5}\n{"prompt":"c","answer":-7}\n',
                    encoding="utf-8")
    items = read_rows(path, _cfg(path))
    assert [i.answer for i in items] == ["3", "2.5", "-7"]
    assert [i.source for i in items] == [f"{path}:1", f"{path}:4", f"{path}:5"]
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": pa.array([3, 12], pa.int64())}), tmp_path / "n.parquet")
    assert [i.answer for i in read_rows(tmp_path / "n.parquet", _cfg(path))] == ["3", "12"]


# --- refusals ------------------------------------------------------------------------------------


BAD_LINES = [
    ('{"prompt": "x", "answer": "1"', ["not valid JSON"], None),
    ("[1, 2]", ["expected a JSON object", "array"], None),
    ('{"question": "x", "answer": "1"}', ["prompt field 'prompt' is missing", "row keys: 'question', 'answer'"], None),
    ('{"prompt": "   ", "answer": "1"}', ["prompt field 'prompt'", "empty string"], None),
    ('{"prompt": 5, "answer": "1"}', ["prompt field 'prompt'", "got number"], None),
    ('{"prompt": "x"}', ["answer field 'answer' is missing", "row keys: 'prompt'"], None),
    ('{"prompt": "x", "answer": [1]}', ["answer field 'answer'", "got array"], None),
    ('{"prompt": "x", "answer": null}', ["answer field 'answer'", "got null"], None),
    ('{"prompt": "x", "answer": true}', ["answer field 'answer'", "got boolean"], None),
    ('{"prompt": "x", "answer": {"v": 1}}', ["answer field 'answer'", "got object"], None),
    ('{"prompt": "x", "answer": NaN}', ["answer field 'answer'", "finite", "nan"], None),
    (json.dumps({"prompt": "x" * 5000, "answer": "1"}), ["prompt field 'prompt'", "5000 characters", "4096"], None),
    (json.dumps({"prompt": "x" * 4000, "answer": "1"}), ["4102 characters", "field 4000", "4096"], "y" * 100),
    (json.dumps({"prompt": "x", "answer": "9" * 4097}), ["answer field 'answer' is 4097 characters", "4096"], None),
    (json.dumps({"prompt": "x", "answer": "1", "blob": "z" * 70000}), ["row is 70037 characters", "65536"], None),
]


@pytest.mark.parametrize("line,expected,system", BAD_LINES)
def test_bad_rows_are_refused_naming_file_line_and_field(tmp_path, line, expected, system):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine", "answer": "1"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as err:
        read_rows(path, _cfg(path, system_prompt=system))
    message = str(err.value)
    assert message.startswith(f"{path}:3: ")
    for part in expected:
        assert part in message, message


def test_limits_are_inclusive(tmp_path):
    limit = MAX_DATASET_TEXT_CHARS
    path = _jsonl(tmp_path / "ok.jsonl", [{"prompt": "x" * limit, "answer": "9" * limit}])
    assert len(read_rows(path, _cfg(path))[0].prompt) == MAX_DATASET_TEXT_CHARS


def test_non_utf8_jsonl_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DatasetError, match=rf"^{path}:2: not UTF-8"):
        read_rows(path, _cfg(path))


def test_bad_files_are_refused_naming_the_file(tmp_path):
    cases = {
        tmp_path / "d.csv": ["unsupported file type", ".jsonl", ".parquet"],
        tmp_path / "absent.jsonl": ["no such file"],
        tmp_path / "dir.jsonl": ["is a directory"],
        tmp_path / "empty.jsonl": ["no rows"],
        tmp_path / "blank.jsonl": ["no rows"],
        tmp_path / "empty.json": ["no rows"],
        tmp_path / "obj.json": ["expected a JSON array of objects, got object"],
        tmp_path / "broken.json": [":3: not valid JSON"],
        tmp_path / "fake.parquet": ["not a readable Parquet file"],
        tmp_path / "broken.jsonl.gz": ["cannot read the file"],
    }
    (tmp_path / "d.csv").write_text("prompt,answer\nx,1\n")
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n\n")
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "obj.json").write_text('{"prompt": "x", "answer": "1"}')
    (tmp_path / "broken.json").write_text('[\n{"prompt": "x", "answer": "1"},\n{"prompt": }\n]\n')
    (tmp_path / "fake.parquet").write_text("not parquet")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"\x1f\x8b not really gzip")
    for path, expected in cases.items():
        with pytest.raises(DatasetError) as err:
            read_rows(path, _cfg(path))
        assert str(err.value).startswith(str(path)), err.value
        for part in expected:
            assert part in str(err.value), err.value


def test_json_array_rows_are_named_by_index(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"prompt": "x", "answer": "1"}, "nope"]))
    with pytest.raises(DatasetError, match=rf"^{path}:row 1: expected a JSON object, got string"):
        read_rows(path, _cfg(path))


def test_parquet_missing_column_and_bad_row(tmp_path):
    path = tmp_path / "m.parquet"
    pq.write_table(pa.table({"q": ["x"], "answer": ["1"]}), path)
    with pytest.raises(DatasetError) as err:
        read_rows(path, _cfg(path))
    assert str(err.value) == f"{path}: no column 'prompt' (columns: 'q', 'answer')"
    pq.write_table(pa.table({"prompt": ["x", None], "answer": ["1", "2"]}), path)
    with pytest.raises(DatasetError, match=rf"^{path}:row 1: prompt field 'prompt' must be a non-empty .*, got null"):
        read_rows(path, _cfg(path))
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    with pytest.raises(DatasetError, match="no rows"):
        read_rows(path, _cfg(path))


# --- held-out split ------------------------------------------------------------------------------


def test_heldout_split_is_seeded_disjoint_and_complete(tmp_path):
    cfg = _cfg(_jsonl(tmp_path / "t.jsonl", _rows(40)))
    train, held = load_dataset(cfg, 10, eval_seed=7)
    again_train, again_held = load_dataset(cfg, 10, eval_seed=7)
    assert held == again_held and train == again_train
    assert [i.prompt_id for i in held] == [f"e{i}" for i in range(10)]
    assert len(train) == 30 and not {i.prompt for i in train} & {i.prompt for i in held}
    assert sorted(i.prompt for i in train + held) == sorted(f"q{i}" for i in range(40))
    assert {i.prompt for i in load_dataset(cfg, 10, eval_seed=8)[1]} != {i.prompt for i in held}
    smaller = load_dataset(cfg, 4, eval_seed=7)[1]
    assert smaller == held[:4]  # a smaller eval set is a prefix of a larger one


def test_duplicated_rows_do_not_leak_the_heldout_set(tmp_path):
    rows = [{"prompt": "dup", "answer": "1"}] * 3 + _rows(7)
    cfg = _cfg(_jsonl(tmp_path / "t.jsonl", rows))
    seeds_holding_dup = 0
    for seed in range(20):
        train, held = load_dataset(cfg, 3, seed)
        assert not {i.prompt for i in train} & {i.prompt for i in held}
        if "dup" in {i.prompt for i in held}:
            seeds_holding_dup += 1
            held_dups = sum(i.prompt == "dup" for i in held)
            assert len(train) == 7 - (3 - held_dups)  # the unique rows not held out; every "dup" row is gone
            assert all(i.prompt != "dup" for i in train)
    assert seeds_holding_dup > 0


def test_heldout_file(tmp_path):
    train_path = _jsonl(tmp_path / "t.jsonl", _rows(10))
    held_path = _jsonl(tmp_path / "h.jsonl", [*_rows(6, prefix="h"), {"prompt": "q3", "answer": "3"}])
    cfg = DatasetConfig(train=str(train_path), heldout=str(held_path))
    train, held = load_dataset(cfg, 100, eval_seed=1)
    assert len(held) == 7 and all(i.source.startswith(str(held_path)) for i in held)
    assert [i.prompt_id for i in held] == [f"e{i}" for i in range(7)]
    assert [i.prompt for i in train] == [f"q{i}" for i in range(10) if i != 3]  # q3 is held out
    small_train, small_held = load_dataset(cfg, 3, eval_seed=1)
    assert len(small_held) == 3 and small_held == load_dataset(cfg, 3, eval_seed=1)[1]
    assert len(small_train) >= 9


def test_too_small_dataset_is_refused(tmp_path):
    cfg = _cfg(_jsonl(tmp_path / "t.jsonl", _rows(5)))
    with pytest.raises(DatasetError) as err:
        load_dataset(cfg, 5, eval_seed=0)
    assert "5 rows" in str(err.value) and "eval.prompts asks for 5" in str(err.value)
    train, held = load_dataset(cfg, 4, eval_seed=0)
    assert len(train) == 1 and len(held) == 4
    same = DatasetConfig(train=cfg.train, heldout=cfg.train)
    with pytest.raises(DatasetError, match="all 5 training rows repeat a held-out prompt"):
        load_dataset(same, 5, eval_seed=0)


# --- sampler -------------------------------------------------------------------------------------


def _items(n: int) -> list[DatasetItem]:
    return [DatasetItem("", f"q{i}", str(i), "{}", f"f:{i + 1}", "t") for i in range(n)]


def test_sampler_covers_every_row_once_per_epoch_in_a_new_order():
    rows = _items(50)
    sampler = DatasetSampler(rows, seed=3)
    epochs = [[i.prompt for i in sampler.batch(50)] for _ in range(3)]
    for order in epochs:
        assert sorted(order) == sorted(r.prompt for r in rows)
    assert len({tuple(o) for o in epochs}) == 3 and epochs[0] != [r.prompt for r in rows]
    assert sampler.epoch == 3 and sampler.rows_per_epoch == 50 and sampler.remaining is None
    again = DatasetSampler(rows, seed=3).batch(150)
    assert [i.prompt for i in again] == [p for o in epochs for p in o]
    assert [i.prompt_id for i in again[:3]] == ["d0", "d1", "d2"] and again[-1].prompt_id == "d149"
    assert [i.prompt for i in DatasetSampler(rows, seed=4).batch(50)] != epochs[0]
    plain = DatasetSampler(rows, seed=3, shuffle=False, prefix="x").batch(100)
    assert [i.prompt for i in plain] == [r.prompt for r in rows] * 2 and plain[0].prompt_id == "x0"


@pytest.mark.parametrize("k", [0, 1, 17, 29, 30, 31, 59, 60, 75])
def test_restore_continues_the_identical_stream(k):
    rows = _items(30)
    reference = [(i.prompt_id, i.prompt) for i in DatasetSampler(rows, seed=11).batch(90)]
    first = DatasetSampler(rows, seed=11)
    drawn = first.batch(k)
    state = pickle.loads(pickle.dumps(first.state()))
    assert state == (k // 30, k % 30, k)
    resumed = DatasetSampler(rows, seed=11)
    resumed.restore(state)
    rest = resumed.batch(90 - k)
    assert [(i.prompt_id, i.prompt) for i in drawn + rest] == reference
    assert resumed.state() == (3, 0, 90)


def test_restore_refuses_a_state_that_does_not_fit():
    sampler = DatasetSampler(_items(10), seed=0)
    for bad in [(0, 10, 10), (1, 2, 5), (0, -1, 0), (0, 1), "x", (0, True, 1)]:
        with pytest.raises(DatasetError):
            sampler.restore(bad)  # type: ignore[arg-type]
    assert sampler.state() == (0, 0, 0)


def test_epochs_limit_and_all_or_nothing_batches():
    sampler = DatasetSampler(_items(5), seed=0, epochs=2)
    assert sampler.remaining == 10
    sampler.batch(8)
    with pytest.raises(DatasetExhausted, match="asked for 3 more prompt"):
        sampler.batch(3)
    assert sampler.state() == (1, 3, 8)  # nothing drawn by the refused batch
    sampler.batch(2)
    assert sampler.remaining == 0 and sampler.epoch == 2
    with pytest.raises(DatasetExhausted):
        sampler.sample()
    with pytest.raises(ValueError):
        DatasetSampler(_items(5), seed=0, epochs=0)
    with pytest.raises(DatasetError):
        DatasetSampler([], seed=0)


def test_prompts_needed_check():
    prompts_needed_check(5, None, 10**9, "task.dataset")
    prompts_needed_check(5, 2, 10, "task.dataset")
    with pytest.raises(DatasetError) as err:
        prompts_needed_check(5, 2, 11, "task.dataset")
    assert str(err.value).startswith("task.dataset: the run needs 11 prompts")
    assert "epochs >= 3" in str(err.value)


def test_fingerprint():
    rows = _items(4)
    assert len(fingerprint(rows)) == 16 and fingerprint(rows) == fingerprint(list(rows))
    assert fingerprint(rows) != fingerprint([replace(rows[0], answer="x"), *rows[1:]])
    assert fingerprint(rows) != fingerprint(rows[::-1])


# --- GSM8K ---------------------------------------------------------------------------------------


def test_gsm8k_loads():
    if not (GSM8K / "train.jsonl.gz").exists():
        pytest.skip(f"GSM8K data not found at {GSM8K} (the ../shared checkout is absent)")
    cfg = DatasetConfig(
        train=str(GSM8K / "train.jsonl.gz"), heldout=str(GSM8K / "test.jsonl.gz"),
        prompt_field="question", answer_field="answer", name="gsm8k",
    )
    train = read_rows(cfg.train, cfg)
    test = read_rows(cfg.heldout, cfg)
    assert (len(train), len(test)) == (7473, 1319)
    assert train[0].prompt.startswith("Natalia sold clips") and train[0].answer.endswith("#### 72")
    assert all("####" in i.answer for i in train + test)
    kept, held = load_dataset(cfg, 500, eval_seed=12345)
    assert len(held) == 500 and held[0].prompt_id == "e0"
    assert 7400 <= len(kept) <= 7473 and not {i.prompt for i in kept} & {i.prompt for i in held}
