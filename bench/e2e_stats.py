"""Convergence statistics of ``bench/e2e.py`` (pure): paired differences of held-out accuracy and
a non-inferiority test of every async mode against sync, with a negative control it must flag.

Every checkpoint compared is scored on the same ``n`` held-out prompts with ``k`` sampled
completions each and the same random stream per chunk of prompts (``eval_checkpoints.prompt_scores``),
so the comparison is *paired*: per prompt, the difference of the two checkpoints' mean rewards.
Prompt difficulty, which dominates the variance of an unpaired comparison, cancels.

- ``paired(a, b)``: mean of ``a_i - b_i``, its standard error ``sd / sqrt(n)``, the 95% interval
  (normal; n is in the thousands) and the number of standard errors;
- sync's gain = ``paired(sync_final, warm_start)``; the test has power when the gain is at least
  ``MIN_GAIN_SE`` standard errors;
- margin = ``MARGIN_FRACTION`` x sync's gain: an async mode may lose at most a quarter of what sync
  learned;
- verdict of a mode (``paired(mode_final, sync_final)``): *non-inferior* when the interval's lower
  end is above ``-margin``; *inferior* when its upper end is below ``-margin``; otherwise
  *inconclusive*. Only *non-inferior* is a pass;
- negative controls (at least the untrained warm start, which the old "within 2 standard errors"
  check passed) must not pass: ``negative_control_flagged`` is true when none of them is judged
  non-inferior;
- a *declared* control (``expected``: its name and the verdict declared for it before the run,
  ``e2e_core.CONTROLS_EXPECTED``) must get exactly that verdict: ``declared_controls`` says for each
  whether it ``met`` it (a control declared *inferior* but judged *non-inferior* or *inconclusive*,
  or one that did not run, has failed), and ``declared_controls_met`` whether all of them did.
"""

from __future__ import annotations

import math
import statistics

Z95 = 1.959963984540054
MARGIN_FRACTION = 0.25  # an async mode may lose at most 25% of sync's gain over the warm start
MIN_GAIN_SE = 5.0  # sync's gain must be this many standard errors for the test to have power
UNTRAINED = "untrained"  # the warm start scored as a mode: the control every run has


def paired(a: list[float], b: list[float]) -> dict:
    """Mean paired difference ``a - b`` with its standard error and 95% interval."""
    if len(a) != len(b):
        raise ValueError(f"paired scores differ in length: {len(a)} vs {len(b)}")
    if len(a) < 2:
        raise ValueError("at least two paired prompts are needed")
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(len(d))
    return {"diff": mean, "se": se, "ci95": [mean - Z95 * se, mean + Z95 * se], "n": len(d),
            "z": mean / se if se > 0 else (math.inf if mean > 0 else -math.inf if mean < 0 else 0.0)}


def verdict(ci95: list[float], margin: float | None) -> str:
    """Non-inferiority of a difference to sync (mode - sync) with margin ``margin`` (> 0)."""
    if margin is None or margin <= 0:
        return "no margin (sync did not improve on the warm start)"
    lo, hi = ci95
    if lo > -margin:
        return "non-inferior"
    if hi < -margin:
        return "inferior"
    return "inconclusive"


def declared_outcomes(judged: dict[str, dict], expected: dict[str, str]) -> dict[str, dict]:
    """Each declared control's verdict against the one declared for it; a control that was not
    judged (it did not run, or failed) has not met its declaration."""
    out = {}
    for name, want in expected.items():
        c = judged.get(name)
        if c is None:
            out[name] = {"expected": want, "verdict": None, "met": False, "note": "not judged: the control did not run"}
            continue
        out[name] = {"expected": want, "verdict": c["verdict"], "met": c["verdict"] == want, "diff": c["diff"],
                     "ci95": c["ci95"]}
    return out


def convergence(warm: list[float], sync: list[float], modes: dict[str, list[float]],
                controls: dict[str, list[float]], *, expected: dict[str, str] | None = None,
                fraction: float = MARGIN_FRACTION, min_gain_se: float = MIN_GAIN_SE) -> dict:
    """The non-inferiority report: sync's gain (and whether it has power), the margin, one verdict
    per async mode and per negative control, whether every control was flagged, and whether each
    declared control (``expected``: name -> the verdict it must get) got its verdict."""
    gain = paired(sync, warm)
    margin = fraction * gain["diff"] if gain["diff"] > 0 else None

    def judged(scores: list[float]) -> dict:
        p = paired(scores, sync)
        return {"diff": p["diff"], "se": p["se"], "ci95": p["ci95"], "margin": margin,
                "verdict": verdict(p["ci95"], margin), "mean_accuracy": statistics.fmean(scores)}

    ctrl = {name: judged(scores) for name, scores in controls.items()}
    for c in ctrl.values():
        c["flagged"] = c["verdict"] != "non-inferior"
    declared = declared_outcomes(ctrl, expected or {})
    return {
        "sync_gain": gain,
        "sync_gain_se": gain["z"],
        "powered": gain["z"] >= min_gain_se,
        "min_gain_se": min_gain_se,
        "margin": margin,
        "margin_rule": f"{fraction:g} x sync's paired gain over the warm start",
        "noninferiority": {m: judged(s) for m, s in modes.items()},
        "negative_control": ctrl,
        "negative_control_flagged": bool(ctrl) and all(c["flagged"] for c in ctrl.values()),
        "declared_controls": declared,
        "declared_controls_met": all(d["met"] for d in declared.values()) if declared else None,
        "warm_accuracy": statistics.fmean(warm),
        "sync_accuracy": statistics.fmean(sync),
    }
