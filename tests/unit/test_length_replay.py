"""Forced-length replay of recorded lengths: the scaling onto our budget, the per-prompt draw, the config."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from services.common.config import ConfigError, load_config
from services.rollout.length_replay import ReplayLengths, scale_to_cap, summary
from tests.conftest import ROOT


def test_scale_to_cap_maps_the_source_budget_onto_ours_and_clips_the_overlong():
    # 2048-token budget onto 192: x 0.09375; over the source cap (chars / 4 overestimates) runs to the cap
    assert scale_to_cap([2048, 1024, 80.75, 3, 5000], 2048, 192) == [192, 96, 8, 1, 192]
    with pytest.raises(ValueError):
        scale_to_cap([10], 0, 192)


def test_summary_reports_the_tail():
    s = summary([1] * 98 + [192, 192], 192)
    assert s["p50"] == 1 and s["max"] == 192 and s["at_cap"] == pytest.approx(0.02)
    assert s["mean"] == pytest.approx((98 + 384) / 100)
    assert s["top20_token_share"] == pytest.approx((18 + 384) / (98 + 384))


def test_draw_is_stable_per_prompt_follows_the_list_and_changes_with_the_seed():
    replay = ReplayLengths(tuple([4] * 9 + [100]))
    ids = [f"p{i}" for i in range(4000)]
    drawn = [replay.length(i) for i in ids]
    assert drawn == [ReplayLengths(replay.lengths).length(i) for i in ids]  # another process draws the same
    share = Counter(drawn)[100] / len(ids)
    assert 0.08 < share < 0.12  # the list's 10% tail, not a fixed pick
    other = ReplayLengths(replay.lengths, seed=1)
    assert [other.length(i) for i in ids] != drawn


def test_load_refuses_lengths_over_the_cap_and_bad_files(tmp_path):
    f = tmp_path / "lengths.json"
    f.write_text(json.dumps([1, 50, 193]))
    with pytest.raises(ValueError, match=r"exceeds generation.max_new_tokens"):
        ReplayLengths.load(f, 192)
    assert ReplayLengths.load(f, 193, seed=2).lengths == (1, 50, 193)
    f.write_text(json.dumps([3, 0]))
    with pytest.raises(ValueError, match="integers >= 1"):
        ReplayLengths.load(f, 192)
    with pytest.raises(ValueError, match="no such file"):
        ReplayLengths.load(tmp_path / "missing.json", 192)


def test_recorded_and_oracle_estimates_follow_the_drawn_row(tmp_path):
    f = tmp_path / "pairs.json"
    rows = [{"length": 10 * (i + 1), "estimate": 1000.0 - i} for i in range(50)]
    f.write_text(json.dumps(rows))
    recorded = ReplayLengths.load(f, 500, seed=3, mode="recorded")
    oracle = ReplayLengths.load(f, 500, seed=3, mode="oracle")
    for pid in ("a", "b", "c", "q17"):
        n = recorded.length(pid)
        assert recorded.estimate(pid) == 1000.0 - (n // 10 - 1)  # the estimate recorded beside that length
        assert oracle.estimate(pid) == float(n) and oracle.length(pid) == n
    assert ReplayLengths.load(f, 500).estimate("a") is None  # mode none: the run's ranker, if any
    f.write_text(json.dumps([10, 20]))
    with pytest.raises(ValueError, match="recorded"):
        ReplayLengths.load(f, 500, mode="recorded")  # a plain list has no estimates to replay
    assert ReplayLengths.load(f, 500, mode="oracle").estimate("x") in (10.0, 20.0)
    f.write_text(json.dumps([{"length": 10, "estimate": 5}, 20]))
    with pytest.raises(ValueError, match="every entry"):
        ReplayLengths.load(f, 500)
    f.write_text(json.dumps([{"length": 10, "estimate": 0}]))
    with pytest.raises(ValueError, match="positive"):
        ReplayLengths.load(f, 500, mode="recorded")
    with pytest.raises(ConfigError, match=r"needs forced_length_replay\.file"):
        load_config(ROOT / "deploy/configs/default.yaml", ["forced_length_replay.estimates=oracle"])


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.mode=bounded"], "needs generation.forced_lengths"),
    (["generation.forced_lengths=true", "trainer.mode=bounded", "trainer.partial_rollout=true"], "partial_rollout"),
    (["generation.forced_lengths=true", "trainer.mode=bounded", "forced_length_ramp.start=8"], "exclusive"),
])
def test_replay_config_is_refused_where_it_does_not_apply(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "deploy/configs/default.yaml", ["forced_length_replay.file=x.json", *overrides])
    ok = ["forced_length_replay.file=x.json", "generation.forced_lengths=true", "trainer.mode=bounded"]
    assert load_config(ROOT / "deploy/configs/default.yaml", ok).forced_length_replay.file == "x.json"
    # every mode runs on the orchestrator: replay is not bounded-only
    assert load_config(ROOT / "deploy/configs/default.yaml", ok[:2]).trainer.mode == "one_step"


class _Draw:
    def __init__(self, pid: str, prompt: str) -> None:
        self.prompt_id, self.prompt = pid, prompt


def _trace(tmp_path, rows):
    import gzip

    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def test_a_visit_trace_replays_each_prompts_next_visit_one_length_per_sample(tmp_path):
    from services.rollout.length_replay import VisitReplay, load_replay

    path = _trace(tmp_path, [{"prompt": "A", "visit": 1, "lengths": [5, 9, 30, 40]},
                             {"prompt": "A", "visit": 0, "lengths": [1, 2, 3, 4]},
                             {"prompt": "B", "visit": 0, "lengths": [7, 7, 8, 100]}])
    cfg = load_config(ROOT / "deploy/configs/default.yaml", [f"forced_length_replay.file={path}",
                                                            "generation.forced_lengths=true",
                                                            "forced_length_replay.estimates=oracle"])
    replay = load_replay(cfg.forced_length_replay, 128)
    assert isinstance(replay, VisitReplay)
    a0, b0, a1, a2 = _Draw("p0", "A"), _Draw("p1", "B"), _Draw("p2", "A"), _Draw("p3", "A")
    assert replay.estimate_for(a0, 4) == 2.5  # the draw's mean length: asked first at placement
    assert replay.forced(a0, 4) == (0, (1, 2, 3, 4))  # the same draw at launch: the same visit
    assert replay.forced(b0, 4) == (0, (7, 7, 8, 100))
    assert replay.forced(a1, 4) == (0, (5, 9, 30, 40))  # A's second draw: its second visit
    assert replay.forced(a2, 4) == (0, (1, 2, 3, 4))  # past the last visit: from the first again
    sub = replay.lengths(_Draw("p9", "B"), 2)
    assert len(sub) == 2 and set(sub) <= {7, 8, 100} and replay.lengths(_Draw("p9", "B"), 2) == sub
    with pytest.raises(ValueError, match="not in the replayed trace"):
        replay.forced(_Draw("p4", "C"), 4)
    with pytest.raises(ValueError, match="recorded 4"):
        replay.forced(_Draw("p5", "B"), 5)
    with pytest.raises(ValueError, match="line 3"):
        VisitReplay.load(path, cap=50)  # B's 100 > the cap
    with pytest.raises(ValueError, match="records no estimate"):
        VisitReplay.load(path, cap=128, mode="recorded")  # no group carries an estimate of its prompt


def test_a_visit_trace_with_estimates_replays_each_prompts_recorded_estimate(tmp_path):
    from services.rollout.length_replay import VisitReplay, load_replay

    path = _trace(tmp_path, [{"prompt": "A", "visit": 0, "lengths": [1, 2], "estimate": 40.5},
                             {"prompt": "B", "visit": 0, "lengths": [7, 9], "estimate": 3}])
    cfg = load_config(ROOT / "deploy/configs/default.yaml", [f"forced_length_replay.file={path}",
                                                            "generation.forced_lengths=true",
                                                            "forced_length_replay.estimates=recorded"])
    replay = load_replay(cfg.forced_length_replay, 128)
    assert isinstance(replay, VisitReplay) and replay.mode == "recorded"
    assert replay.estimate_for(_Draw("p0", "B"), 2) == 3.0 and replay.estimate_for(_Draw("p1", "A"), 2) == 40.5
    assert replay.forced(_Draw("p1", "A"), 2) == (0, (1, 2))  # the lengths replay as without estimates
    assert VisitReplay.load(path, cap=128).estimate_for(_Draw("p0", "B"), 2) is None  # mode none
    bad = _trace(tmp_path, [{"prompt": "A", "visit": 0, "lengths": [1], "estimate": 0}])
    with pytest.raises(ValueError, match="positive number"):
        VisitReplay.load(bad, cap=128)
    partial = _trace(tmp_path, [{"prompt": "A", "visit": 0, "lengths": [1], "estimate": 5},
                                {"prompt": "B", "visit": 0, "lengths": [1]}])
    with pytest.raises(ValueError, match="no estimate for every prompt"):
        VisitReplay.load(partial, cap=128, mode="recorded")
