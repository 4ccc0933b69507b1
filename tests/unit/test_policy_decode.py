"""``Policy.decode``: EOS tokens dropped, the tokenizer's EOS looked up once per call (it ran per token
on the orchestrator's thread: ~70% of its per-sample time in a 16-instance emulated run)."""

from __future__ import annotations

from services.policy.model import Policy


class _Tokenizer:
    pad_token_id = None

    def __init__(self) -> None:
        self.eos_lookups = 0
        self.decoded: list[int] = []

    @property
    def eos_token_id(self) -> int:
        self.eos_lookups += 1
        return 2

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        self.decoded = list(ids)
        return "".join(chr(ord("a") + i) for i in ids)


def test_decode_drops_eos_and_looks_it_up_once():
    tok = _Tokenizer()
    policy = Policy(model=None, tokenizer=tok)
    assert policy.decode([0, 2, 1, 3, 2, 2]) == "abd"
    assert tok.decoded == [0, 1, 3] and tok.eos_lookups == 1
