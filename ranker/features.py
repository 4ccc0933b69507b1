"""Generic text features of a prompt for output-length ranking (no dataset-specific rules).

What makes a response long is mostly what the prompt asks for: a computation (numbers, units,
formulas, "calculate"), an explanation (long options to weigh one by one), a listing, code. The
features measure that from the raw text only, so the same extractor works on any prompt set:

- size: characters, words, lines, mean word length, the longest line;
- numbers: count of numbers, digits, decimals, scientific notation, fractions, percentages,
  math operators and symbols, LaTeX-ish markup, Greek letters, parentheses, share of digits;
- structure: enumerated lines (``A. ...``/``1) ...``/``- ...``: a choice list or steps), their
  count, mean/max/min length and how many are numeric (choices that are numbers = a calculation);
  question marks, blank-line blocks;
- vocabulary cues: how many words come from small generic lists of calculation verbs,
  explanation verbs, unit symbols, code tokens (lists below; all lower case, language-level, not
  tied to any dataset).

``PREFIX``/``SUFFIX`` handling: a prompt set often shares a template; ``common_affixes`` finds
the longest prefix and suffix shared by (almost) all training prompts, and ``strip_affixes``
removes them so that features and the transformer's token budget go to what differs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

_NUM = re.compile(r"(?<![A-Za-z])[-+]?\d+(?:[.,]\d+)*(?:\s*[eE×x]\s*10\^?[-+]?\d+)?")
_DEC = re.compile(r"\d+\.\d+")
_SCI = re.compile(r"(?:10\^|[eE][-+]?\d|×\s*10|x\s*10\^)")
_FRAC = re.compile(r"\d+\s*/\s*\d+")
_PCT = re.compile(r"\d\s*%")
_OPS = re.compile(r"[=+*/^<>≤≥≈∑∫√±−×÷]")
_LATEX = re.compile(r"\\[a-zA-Z]+|\$|_\{|\^\{")
_GREEK = re.compile(r"[α-ωΑ-Ω]|\\(?:alpha|beta|gamma|delta|theta|lambda|mu|pi|sigma|omega)")
_ENUM = re.compile(r"^\s*(?:\(?[A-Za-z]\)|[A-Za-z][.:]|\(?\d{1,2}[.)]|[-*•])\s+(.*)$")
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")

CALC_WORDS = frozenset(
    ["calculate", "compute", "determine", "find", "evaluate", "estimate", "solve", "how", "many", "much", "value",
     "total", "sum", "product", "rate", "speed", "velocity", "average", "probability", "percent", "ratio", "volume",
     "area", "energy", "force", "mass", "pressure", "temperature", "concentration", "frequency", "current", "voltage",
     "resistance", "interest", "cost", "price", "equation", "integral", "derivative", "maximum", "minimum"]
)
EXPLAIN_WORDS = frozenset(
    ["explain", "why", "describe", "discuss", "compare", "contrast", "analyze", "argue", "justify", "evaluate", "which",
     "best", "most", "least", "except", "not", "true", "false", "statement", "following", "correct", "incorrect",
     "reason", "because"]
)
UNIT_WORDS = frozenset(
    ["m", "cm", "mm", "km", "kg", "g", "mg", "s", "ms", "min", "h", "hr", "hz", "khz", "mhz", "j", "kj", "kw", "w",
     "mw", "v", "mv", "a", "ma", "n", "kn", "pa", "kpa", "atm", "mol", "k", "l", "ml", "ft", "in", "lb", "lbm", "lbf",
     "psi", "btu", "rpm", "ev", "kev", "mev", "nm", "cal", "kcal", "ohm", "ohms", "db", "°c", "°f"]
)
CODE_WORDS = frozenset(["def", "return", "print", "function", "class", "import", "int", "float", "array", "loop",
                        "while", "for", "if", "else"])

FEATURE_NAMES: tuple[str, ...] = (
    "chars", "log_chars", "words", "lines", "mean_word_len", "max_line_len",
    "numbers", "digits", "digit_share", "decimals", "sci", "fractions", "percents", "ops", "latex",
    "greek", "parens", "questions", "blocks",
    "enum_lines", "enum_mean_len", "enum_max_len", "enum_min_len", "enum_numeric", "enum_numeric_share",
    "body_chars", "body_numbers", "body_words",
    "calc_words", "explain_words", "unit_words", "code_words", "calc_share", "unit_share",
)


def _enum_stats(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    items, body = [], []
    for line in lines:
        m = _ENUM.match(line)
        (items if m else body).append(m.group(1) if m else line)
    return items, body


def text_features(text: str) -> list[float]:
    """One feature vector (order: ``FEATURE_NAMES``)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    words = _WORD.findall(text)
    lower = [w.lower() for w in words]
    nums = _NUM.findall(text)
    digits = sum(c.isdigit() for c in text)
    items, body = _enum_stats(lines)
    item_lens = [len(x) for x in items] or [0]
    numeric_items = sum(1 for x in items if _NUM.search(x) and sum(c.isalpha() for c in x) <= 6)
    body_text = "\n".join(body)
    nw = max(1, len(words))
    calc = sum(w in CALC_WORDS for w in lower)
    units = sum(w in UNIT_WORDS for w in lower)
    return [
        len(text), np.log1p(len(text)), len(words), len(lines), sum(map(len, words)) / nw,
        max((len(ln) for ln in lines), default=0),
        len(nums), digits, digits / max(1, len(text)), len(_DEC.findall(text)), len(_SCI.findall(text)),
        len(_FRAC.findall(text)), len(_PCT.findall(text)), len(_OPS.findall(text)), len(_LATEX.findall(text)),
        len(_GREEK.findall(text)), text.count("("), text.count("?"), len(re.split(r"\n\s*\n", text.strip())),
        len(items), float(np.mean(item_lens)), max(item_lens), min(item_lens), numeric_items,
        numeric_items / max(1, len(items)),
        len(body_text), len(_NUM.findall(body_text)), len(_WORD.findall(body_text)),
        calc, sum(w in EXPLAIN_WORDS for w in lower), units, sum(w in CODE_WORDS for w in lower),
        calc / nw, units / nw,
    ]


def feature_matrix(texts: Sequence[str]) -> np.ndarray:
    return np.array([text_features(t) for t in texts], dtype=np.float64).reshape(len(texts), len(FEATURE_NAMES))


def common_affixes(texts: Sequence[str], coverage: float = 0.95, max_len: int = 2000) -> tuple[str, str]:
    """The longest prefix and suffix shared by at least ``coverage`` of ``texts`` (word-aligned)."""
    if not texts:
        return "", ""

    def longest(items: Sequence[str]) -> str:
        need = int(np.ceil(coverage * len(items)))
        best = ""
        lo, hi = 0, min(max_len, max(len(t) for t in items))
        while lo < hi:  # binary search on the length whose most common prefix still covers `need`
            mid = (lo + hi + 1) // 2
            counts: dict[str, int] = {}
            for t in items:
                if len(t) >= mid:
                    counts[t[:mid]] = counts.get(t[:mid], 0) + 1
            top = max(counts.items(), key=lambda kv: kv[1], default=("", 0))
            if top[1] >= need:
                lo, best = mid, top[0]
            else:
                hi = mid - 1
        cut = max(best.rfind(" "), best.rfind("\n"))  # do not cut a word in half
        return best if len(best) == lo and (lo == 0 or best[-1].isspace()) else best[: cut + 1] if cut >= 0 else ""

    prefix = longest(texts)
    suffix = longest([t[::-1] for t in texts])[::-1]
    return prefix, suffix


def strip_affixes(text: str, prefix: str, suffix: str) -> str:
    if prefix and text.startswith(prefix):
        text = text[len(prefix):]
    if suffix and text.endswith(suffix) and len(text) > len(suffix):
        text = text[: -len(suffix)]
    return text


_SENT = re.compile(r"(?<=[.!?])\s+")


class TemplateStripper:
    """Removes what a prompt set shares: the common prefix/suffix and frequent template segments.

    A segment is a sentence within a line. Segments found in at least ``min_share`` of the
    training prompts (instructions, field labels such as ``Question:``) carry no per-prompt
    information; dropping them leaves the token budget to the question itself. Learned from the
    training prompts only, stored as JSON with the ranker.
    """

    def __init__(self, prefix: str = "", suffix: str = "", frequent: Sequence[str] = ()) -> None:
        self.prefix, self.suffix, self.frequent = prefix, suffix, frozenset(frequent)

    @staticmethod
    def _segments(line: str) -> list[str]:
        return [s for s in _SENT.split(line.strip()) if s]

    def fit(self, texts: Sequence[str], min_share: float = 0.3) -> TemplateStripper:
        self.prefix, self.suffix = common_affixes(texts)
        counts: dict[str, int] = {}
        for t in texts:
            seen = {s for line in strip_affixes(t, self.prefix, self.suffix).splitlines() for s in self._segments(line)}
            for s in seen:
                counts[s] = counts.get(s, 0) + 1
        need = max(2, int(np.ceil(min_share * len(texts))))
        self.frequent = frozenset(s for s, c in counts.items() if c >= need)
        return self

    def __call__(self, text: str) -> str:
        lines = []
        for line in strip_affixes(text, self.prefix, self.suffix).splitlines():
            kept = [s for s in self._segments(line) if s not in self.frequent]
            if kept:
                lines.append(" ".join(kept))
        return "\n".join(lines) or text

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "suffix": self.suffix, "frequent": sorted(self.frequent)}

    @classmethod
    def from_json(cls, obj: dict) -> TemplateStripper:
        return cls(obj["prefix"], obj["suffix"], obj["frequent"])
