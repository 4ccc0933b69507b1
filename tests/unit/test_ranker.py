"""Ranker: metrics on hand-made cases, data validation, features, models' save/load round trip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from ranker.base import FORMAT_VERSION, MANIFEST, RankerFormatError, create, kinds, load_ranker
from ranker.data import DataError, convert_log, convert_mmlu, load_dataset, load_prompts, mmlu_prompt, split_indices
from ranker.features import FEATURE_NAMES, TemplateStripper, common_affixes, feature_matrix, text_features
from ranker.genlog import GenerationLog, GenRecord
from ranker.metrics import evaluate, recall_at, spearman

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ranker_small.jsonl"


# --- metrics ------------------------------------------------------------------------------------

def test_recall_hand_cases():
    true = np.arange(10, dtype=float)  # the longest are indices 9, 8, ...
    assert recall_at(true, true, 0.2) == 1.0
    assert recall_at(-true, true, 0.2) == 0.0
    pred = np.array([0, 1, 2, 3, 4, 5, 6, 7, 100, 0.5])  # predicted top-2 {8, 7}; true top-2 {9, 8}
    assert recall_at(pred, true, 0.2) == 0.5
    assert recall_at(pred, true, 0.05) == 0.0  # k = max(1, round(0.5)) = 1: predicted {8}, true {9}
    assert recall_at(pred, true, 0.3) == pytest.approx(2 / 3)  # k = 3: {8, 7, 6} vs {9, 8, 7}
    assert recall_at(pred, true, 1.0) == 1.0


def test_recall_is_symmetric_in_k_and_needs_matching_shapes():
    rng = np.random.default_rng(0)
    a, b = rng.random(200), rng.random(200)
    assert recall_at(a, b, 0.2) == recall_at(b, a, 0.2)  # equal-size sets: recall == precision
    with pytest.raises(ValueError, match="equal length"):
        recall_at(a, b[:10], 0.2)
    with pytest.raises(ValueError, match="tail rate"):
        recall_at(a, b, 0.0)


def test_spearman_matches_scipy_with_ties():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 20, 300).astype(float), rng.integers(0, 20, 300).astype(float)
    assert spearman(a, b) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)
    assert spearman(np.ones(5), np.arange(5.0)) == 0.0
    m = evaluate(np.arange(50.0), np.arange(50.0))
    assert m == {"n": 50, "recall_at_20": 1.0, "recall_at_10": 1.0, "recall_at_5": 1.0, "spearman": 1.0}


# --- data ---------------------------------------------------------------------------------------

def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_dataset_reads_valid_rows(tmp_path):
    ds = load_dataset(FIXTURE)
    assert len(ds) == 160 and ds.lengths.min() > 0 and ds.examples[0].id == "s0"
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(json.dumps({"prompt": "p", "response_length": 3}) + "\n\n")
    assert load_dataset(gz).examples[0].response_length == 3


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x", "response_length": 0}', "line 2|:2: field 'response_length' must be > 0, got 0"),
    ('{"prompt": "x", "response_length": -4}', ":2: field 'response_length' must be > 0"),
    ('{"prompt": "x"}', ":2: field 'response_length' is missing"),
    ('{"prompt": "x", "response_length": "12"}', ":2: field 'response_length' must be an integer"),
    ('{"prompt": "x", "response_length": 1.5}', ":2: field 'response_length' must be an integer"),
    ('{"prompt": "x", "response_length": true}', ":2: field 'response_length' must be an integer"),
    ('{"response_length": 5}', ":2: field 'prompt' is missing"),
    ('{"prompt": "", "response_length": 5}', ":2: field 'prompt' must be a non-empty string"),
    ('{"prompt": "x", "response_length": 5, "id": [1]}', ":2: field 'id' must be a string"),
    ('{"prompt": "x", "response_length": 5', ":2: not valid JSON"),
    ('[1, 2]', ":2: expected a JSON object"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, line, message):
    path = _write(tmp_path / "bad.jsonl", ['{"prompt": "ok", "response_length": 5}', line])
    with pytest.raises(DataError) as err:
        load_dataset(path)
    text = str(err.value)
    assert str(path) in text
    assert any(part in text for part in message.split("|"))


def test_empty_and_missing_files(tmp_path):
    empty = _write(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataError, match=r"empty.jsonl: empty file"):
        load_dataset(empty)
    with pytest.raises(DataError, match=r"nope.jsonl: no such file"):
        load_dataset(tmp_path / "nope.jsonl")
    bad = _write(tmp_path / "p.jsonl", ['{"prompt": "a"}', '{"text": "b"}'])
    with pytest.raises(DataError, match=r"p.jsonl:2: field 'prompt' is missing"):
        load_prompts(bad)


def test_split_is_deterministic_disjoint_and_7_2_1():
    tr, va, te = split_indices(1000, seed=3)
    assert (len(tr), len(va), len(te)) == (700, 200, 100)
    assert set(tr) | set(va) | set(te) == set(range(1000)) and not set(tr) & set(va)
    assert split_indices(1000, seed=3) == (tr, va, te) and split_indices(1000, seed=4)[0] != tr


def test_mmlu_prompt_format_and_convert(tmp_path):
    p = mmlu_prompt("physics", "How fast?", ["1 m/s", "N/A", "2 m/s"])
    assert p.startswith("The following are multiple choice questions (with answers) about physics. Think step by step")
    assert p.endswith("Question:\nHow fast?\nOptions:\nA. 1 m/s\nB. 2 m/s\nAnswer: Let's think step by step.")
    src = tmp_path / "mmlu.jsonl.gz"
    with gzip.open(src, "wt") as fh:
        for i in range(40):
            lengths = {"M": 10 + i, "Other": 5} if i != 3 else {"Other": 5}  # question 3 lacks model M
            fh.write(json.dumps({"question_id": i, "category": "math", "question": f"q{i}", "options": ["a", "b"],
                                 "resp_chars": lengths}) + "\n")
    counts = convert_mmlu(src, tmp_path / "out", model="M", seed=0)
    assert counts == {"train": 27, "val": 8, "test": 4}
    ids = [e.id for s in ("train", "val", "test") for e in load_dataset(tmp_path / "out" / f"{s}.jsonl").examples]
    assert sorted(ids, key=int) == [str(i) for i in range(40) if i != 3]
    with pytest.raises(DataError, match=r"no response lengths for model 'X'.*'M', 'Other'"):
        convert_mmlu(src, tmp_path / "out2", model="X")


def test_convert_log_takes_the_most_recent(tmp_path):
    with GenerationLog(tmp_path / "gen.sqlite") as log:
        log.append(GenRecord(f"p{i}", f"prompt {i}", i + 1, 0, 0, float(i)) for i in range(30))
    n = convert_log(tmp_path / "gen.sqlite", tmp_path / "log.jsonl", n=10)
    rows = load_dataset(tmp_path / "log.jsonl").examples
    assert n == 10 and [r.id for r in rows] == [f"p{i}" for i in range(20, 30)] and rows[-1].response_length == 30
    with pytest.raises(DataError, match="no such generation log"):
        convert_log(tmp_path / "missing.sqlite", tmp_path / "x.jsonl")


# --- features -----------------------------------------------------------------------------------

def test_text_features_see_numbers_and_choices():
    calc = "Calculate the force on a 3.5 kg mass at 2 m/s^2.\nA. 7.0 N\nB. 5.5 N\nC. 1.2 N"
    words = "Which is a mammal?\nA. a whale swimming\nB. a shark hunting\nC. a trout resting"
    f = dict(zip(FEATURE_NAMES, text_features(calc), strict=True))
    g = dict(zip(FEATURE_NAMES, text_features(words), strict=True))
    assert len(text_features(calc)) == len(FEATURE_NAMES) == feature_matrix([calc, words]).shape[1]
    assert f["enum_lines"] == g["enum_lines"] == 3
    assert f["enum_numeric"] == 3 and g["enum_numeric"] == 0
    assert f["decimals"] == 4 and f["calc_words"] >= 1 and f["unit_words"] >= 2
    assert g["questions"] == 1 and g["numbers"] == 0


def test_template_stripper_drops_shared_text():
    things, money = ["apple", "pear", "fig", "plum"], ["dollars?", "euros?", "yen?"]
    texts = [f"You are helpful. Solve this.\nQuestion:\n{things[i % 4]} {i} costs {i * 3} {money[i % 3]}\nAnswer:"
             for i in range(20)]
    prefix, suffix = common_affixes(texts)
    assert prefix.startswith("You are helpful. Solve this.") and suffix.endswith("Answer:")
    t = TemplateStripper().fit(texts)
    assert t(texts[4]) == "apple 4 costs 12 euros?"
    assert TemplateStripper.from_json(json.loads(json.dumps(t.to_json())))(texts[7]) == t(texts[7])


# --- models -------------------------------------------------------------------------------------

def test_registry_lists_every_kind():
    assert set(kinds()) >= {"prompt_length", "tfidf_linear", "lightgbm", "transformer", "ensemble"}
    with pytest.raises(ValueError, match="unknown ranker kind 'nope'"):
        create("nope")


@pytest.mark.parametrize("kind, params", [
    ("prompt_length", {}),
    ("tfidf_linear", {}),
    ("lightgbm", {"max_rounds": 200, "threads": 1}),
    ("lightgbm", {"objective": "lambdarank", "query_size": 16, "max_rounds": 100, "threads": 1}),
])
def test_fit_save_load_round_trip(tmp_path, kind, params):
    ds = load_dataset(FIXTURE)
    train, test = ds.subset(range(120)), ds.subset(range(120, 160))
    model = create(kind, **params).fit(train.prompts, train.lengths, unit="characters", source=str(FIXTURE))
    before = model.predict(test.prompts)
    loaded = load_ranker(model.save(tmp_path / kind))
    assert loaded.kind == kind and loaded.unit == "characters" and loaded.train_info["n"] == 120
    np.testing.assert_allclose(loaded.predict(test.prompts), before, rtol=1e-9)
    assert before.shape == (40,) and np.all(before > 0) and loaded.predict([]).shape == (0,)
    if kind != "prompt_length":  # the fixture's length depends on the kind of question
        assert spearman(before, test.lengths) > 0.5
        assert 10 < float(np.median(before)) < 2000  # an estimate in the training unit


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="positive"):
        create("tfidf_linear").fit(["a", "b"], [1, 0])
    with pytest.raises(ValueError, match="2 prompts but 1 lengths"):
        create("tfidf_linear").fit(["a", "b"], [1])
    with pytest.raises(ValueError, match="objective"):
        create("lightgbm", objective="poisson")


def test_load_errors_name_file_and_field(tmp_path):
    model = create("prompt_length").fit(["aa", "bbbb"], [3, 5])
    d = model.save(tmp_path / "r")
    manifest = json.loads((d / MANIFEST).read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["kind"] == "prompt_length"

    (d / MANIFEST).write_text(json.dumps({**manifest, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(RankerFormatError, match=rf"{d / MANIFEST}: field 'format_version' is {FORMAT_VERSION + 1}"):
        load_ranker(d)
    (d / MANIFEST).write_text(json.dumps({**manifest, "format": "something-else"}))
    with pytest.raises(RankerFormatError, match="field 'format' is 'something-else'"):
        load_ranker(d)
    (d / MANIFEST).write_text(json.dumps({**manifest, "kind": "forest"}))
    with pytest.raises(RankerFormatError, match="field 'kind' is 'forest'"):
        load_ranker(d)
    (d / MANIFEST).write_text("{not json")
    with pytest.raises(RankerFormatError, match=r"ranker.json: not valid JSON"):
        load_ranker(d)
    with pytest.raises(RankerFormatError, match=r"ranker.json: missing; .* is not a saved ranker"):
        load_ranker(tmp_path)
    with pytest.raises(RankerFormatError, match="not a directory"):
        load_ranker(tmp_path / "absent")
    (d / MANIFEST).write_text(json.dumps(manifest))
    (d / "prompt_length.json").unlink()
    with pytest.raises(RankerFormatError, match="incomplete ranker"):
        load_ranker(d)


def test_import_ranker_is_cheap():
    import subprocess
    import sys

    code = "import sys, ranker; print(any(m in sys.modules for m in ('torch', 'lightgbm', 'sklearn', 'numpy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
