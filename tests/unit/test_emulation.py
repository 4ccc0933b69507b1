"""The pure parts of the emulated engine: the instance model driven segment by segment with cuts
and removals (``SteppedInstance.open/steps_done/close/remove``), output lengths from traces and
declared distributions, synthetic tokens, seeded generators, and the ``generation.emulation``
schema."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from pydantic import ValidationError

from services.common.config import GenerationConfig
from services.common.emulation_config import DeclaredLengths, EmulationConfig
from services.generation.emulation import (
    LengthSampler,
    TraceError,
    load_lengths,
    read_trace,
    request_rng,
    synthetic_tokens,
)
from services.generation.scheduling.cost import InstanceSpec, StepCost
from services.generation.scheduling.instance_model import Job, SteppedInstance, run_instance

COST = StepCost(k1=1e-9, k2=5e-3, k3=1e-4, k4=2e-3, kv_bytes_per_token=1000.0, prefill_per_token=1e-4,
                per_sequence=1e-3)
JOBS = [Job(f"j{i}", 5 + i, n) for i, n in enumerate([40, 7, 25, 13, 60, 3])]


def spec(capacity: int = 10_000, batch: int = 8) -> InstanceSpec:
    return InstanceSpec(COST, capacity, batch)


def drive(inst: SteppedInstance, cut_every: int | None = None) -> dict[str, float]:
    """Run to the end with open/close, cutting each segment after ``cut_every`` steps; finish times."""
    finish: dict[str, float] = {}
    while (seg := inst.open()) is not None:
        k = None if cut_every is None or seg.steps <= cut_every else cut_every
        for sid in inst.close(k):
            finish[sid] = inst.work_s
    return finish


@pytest.mark.parametrize("capacity", [10_000, 80])  # 80 tokens: the KV cache runs out, sequences are preempted
def test_open_and_close_run_the_same_model_as_run_instance(capacity):
    ref = run_instance(JOBS, spec(capacity), "fcfs")
    inst = SteppedInstance(spec(capacity), "fcfs")
    inst.push(JOBS)
    assert drive(inst) == pytest.approx(ref.finish_s)
    assert inst.run.preemptions == ref.preemptions and (capacity > 1000) == (ref.preemptions == 0)


def test_cutting_segments_short_changes_no_finish_time():
    """Step costs add up (``StepCost.steps`` is additive over consecutive runs), so a segment closed
    after k steps and reopened finishes everything when the uncut run does."""
    ref = run_instance(JOBS, spec(), "fcfs")
    inst = SteppedInstance(spec(), "fcfs")
    inst.push(JOBS)
    assert drive(inst, cut_every=3) == pytest.approx(ref.finish_s)


def test_steps_done_counts_finished_steps_or_the_one_in_progress():
    inst = SteppedInstance(spec(), "fcfs")
    inst.push([Job("a", 4, 10)])
    seg = inst.open()
    assert seg is not None and seg.steps == 10 and not seg.preempts
    assert seg.start_s == pytest.approx(COST.prefill(4, 1))
    assert seg.end_s == pytest.approx(seg.start_s + COST.steps(1, 4, 10))
    two = seg.start_s + inst.step_time(2)
    assert inst.steps_done(two) == 2 and inst.steps_done(two, round_up=True) == 2
    assert inst.steps_done(two + 1e-6) == 2 and inst.steps_done(two + 1e-6, round_up=True) == 3
    assert inst.steps_done(0.0) == 0 and inst.steps_done(1e9) == 10
    assert inst.open() is seg  # open while open: the same segment
    with pytest.raises(RuntimeError, match="close it first"):
        inst.remove("a")


def test_remove_takes_out_a_running_or_queued_sequence_with_its_progress():
    inst = SteppedInstance(spec(batch=1), "fcfs")
    inst.push([Job("run", 4, 10), Job("wait", 4, 5)])
    inst.open()
    assert inst.close(3) == []
    assert inst.remove("run") == 3 and inst.running == 0 and inst.kv_tokens == 0
    assert inst.remove("nobody") is None
    seg = inst.open()  # the queued one is admitted at once
    assert seg is not None and seg.steps == 5 and inst.running == 1
    inst.close()
    assert inst.open() is None and inst.remove("wait") is None
    inst.push([Job("q1", 4, 5), Job("q2", 4, 5)])
    inst.open()
    inst.close(1)
    assert inst.remove("q2") == 0 and inst.queued == 0


def test_close_refuses_more_steps_than_planned():
    inst = SteppedInstance(spec(), "fcfs")
    inst.push([Job("a", 4, 10)])
    inst.open()
    with pytest.raises(ValueError, match="has 10 steps"):
        inst.close(11)


# --- lengths -------------------------------------------------------------------------------------

def test_declared_distributions_draw_in_range():
    rng = random.Random(0)
    fixed = LengthSampler(declared=DeclaredLengths(distribution="fixed", tokens=17))
    uniform = LengthSampler(declared=DeclaredLengths(distribution="uniform", low=3, high=9))
    lognormal = LengthSampler(declared=DeclaredLengths(distribution="lognormal", median=100, sigma=1.0))
    assert {fixed.draw(rng) for _ in range(20)} == {17}
    assert {uniform.draw(rng) for _ in range(500)} == set(range(3, 10))
    draws = sorted(lognormal.draw(rng) for _ in range(2001))
    assert draws[0] >= 1 and 70 < draws[1000] < 140 and draws[-1] > 400


def test_traces_in_every_format(tmp_path):
    mmlu = tmp_path / "mmlu.jsonl.gz"
    with gzip.open(mmlu, "wt") as f:
        for chars in (400, 41, 0):
            f.write(json.dumps({"question_id": 1, "resp_chars": {"m": chars, "other": 9}}) + "\n")
    assert read_trace(mmlu, "m", 4.0) == [100, 10]  # empty responses left out
    ranker = tmp_path / "train.jsonl"
    ranker.write_text('{"prompt": "x", "response_length": 12}\n\n{"prompt": "y", "response_length": 3}\n')
    assert read_trace(ranker, "m", 4.0) == [12, 3]
    plain = tmp_path / "lengths.txt"
    plain.write_text("5 6\n7\n")
    assert read_trace(plain, "m", 4.0) == [5, 6, 7]
    (tmp_path / "l.json").write_text("[8, 9]")
    assert read_trace(tmp_path / "l.json", "m", 4.0) == [8, 9]
    sampler = load_lengths(EmulationConfig(profile="p", lengths=str(plain)))
    assert {sampler.draw(random.Random(s)) for s in range(50)} == {5, 6, 7}


def test_a_generation_log_is_a_trace(tmp_path):
    from ranker.genlog import GenerationLog, GenRecord

    path = tmp_path / "gen.sqlite"
    with GenerationLog(path) as log:
        log.append([GenRecord(f"p{i}", "x", n, 0, i, 1.0) for i, n in enumerate((30, 4, 11))])
    assert read_trace(path, "m", 4.0) == [30, 4, 11]


@pytest.mark.parametrize("text, fragment", [
    ("12 x", "not a JSON list or whitespace-separated integers"),
    ("[1, -2]", "positive integer"),
    ("", "holds no lengths"),
])
def test_a_broken_trace_names_the_file(tmp_path, text, fragment):
    path = tmp_path / "t.txt"
    path.write_text(text)
    with pytest.raises(TraceError, match=fragment):
        read_trace(path, "m", 4.0)
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "none.txt", "m", 4.0)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"q": 1}\n')
    with pytest.raises(TraceError, match=r"b.jsonl:1: neither resp_chars"):
        read_trace(bad, "m", 4.0)
    bad.write_text('{"resp_chars": {"x": 5}}\n')
    with pytest.raises(TraceError, match="no lengths of model 'm'"):
        read_trace(bad, "m", 4.0)


# --- synthetic tokens and generators -------------------------------------------------------------

def test_synthetic_tokens_are_valid_ids_that_avoid_eos_until_a_stop():
    tokens, logprobs = synthetic_tokens(random.Random(1), 500, 19, [2], stop=True)
    assert tokens[-1] == 2 and 2 not in tokens[:-1] and all(0 <= t < 19 for t in tokens)
    assert len(logprobs) == 500 and all(lp <= 0 for lp in logprobs)
    tokens, _ = synthetic_tokens(random.Random(1), 200, 100_000, [7, 9], stop=False)
    assert not {7, 9} & set(tokens) and all(0 <= t < 100_000 for t in tokens)


def test_a_request_generator_depends_on_its_seed_and_prompt_only():
    draw = [request_rng(5, [1, 2, 3]).random() for _ in range(2)]
    assert draw[0] == draw[1]
    assert request_rng(5, [1, 2, 4]).random() != draw[0] and request_rng(6, [1, 2, 3]).random() != draw[0]


# --- configuration --------------------------------------------------------------------------------

def test_the_emulation_section_goes_with_the_emulated_engine_only():
    emu = {"profile": "H20-qwen2.5-7b", "lengths": {"distribution": "fixed", "tokens": 5}}
    assert GenerationConfig(engine="emulated", emulation=emu).emulation.time_scale == 1.0
    with pytest.raises(ValidationError, match=r"needs generation\.emulation"):
        GenerationConfig(engine="emulated")
    with pytest.raises(ValidationError, match=r"read only by generation\.engine 'emulated'"):
        GenerationConfig(engine="hf", emulation=emu)


@pytest.mark.parametrize("lengths, fragment", [
    ({"distribution": "fixed"}, r"takes exactly \['tokens'\]; missing \['tokens'\]"),
    ({"distribution": "uniform", "low": 5, "high": 2}, "low 5 > high 2"),
    ({"distribution": "lognormal", "median": 50, "sigma": 1, "tokens": 3}, r"not used \['tokens'\]"),
    ({"distribution": "zipf"}, "distribution"),
])
def test_a_declared_distribution_is_validated(lengths, fragment):
    with pytest.raises(ValidationError, match=fragment):
        EmulationConfig(profile="p", lengths=lengths)


def test_time_scale_must_be_positive():
    with pytest.raises(ValidationError, match="time_scale"):
        EmulationConfig(profile="p", lengths="t.txt", time_scale=0)


def test_the_mmlu_pro_cot_trace_reads_as_its_source_describes():
    """SOURCE.md: Llama-3.1-8B-Instruct answered all 12,032 questions, P50 323 characters (~81 tokens)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2].parent / "shared/data/mmlu-pro-cot/mmlu_pro_cot_lengths.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    lengths = sorted(read_trace(path, "Meta-Llama-3_1-8B-Instruct", 4.0))
    assert len(lengths) == 12032 and 78 <= lengths[len(lengths) // 2] <= 84
