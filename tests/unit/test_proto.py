import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_stubs_match_the_proto():
    proc = subprocess.run([sys.executable, "-m", "services.proto.regen", "--check"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_prompt_round_trips_with_its_forced_lengths():
    """One forced length for the whole group, or one per sample: both cross the wire unchanged."""
    from services.common.types import GenerateParams, PromptSpec
    from services.generation import convert

    specs = [PromptSpec("a", (1, 2), "g", 3.5, 0, "t", (7, 3, 11)), PromptSpec("b", (4,), forced_length=9)]
    back, params = convert.request_from_pb(convert.request_to_pb(specs, GenerateParams(samples_per_prompt=3)))
    assert back == specs and params.samples_per_prompt == 3
    assert [back[0].forced_for(i) for i in range(3)] == [7, 3, 11] and back[1].forced_for(2) == 9
