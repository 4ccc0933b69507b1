"""Rule-based answer checks for dataset tasks (``services.reward.dataset``); pure functions.

A number is compared exactly, as a ``Fraction``: ``0.5``, ``1/2`` and ``\\frac{1}{2}`` are the
same answer, so are ``72``, ``72.0`` and ``72.00``, and ``1,234`` and ``1234``. Nothing is
rounded and nothing goes through a float, so very large numbers compare exactly too.

``parse_number`` reads one number written as text: an optional sign (``-``, ``+`` or the
unicode minus), an integer (``1,234`` thousands separators allowed when every group has three
digits), a decimal (``0.5``, ``.5``), a simple fraction (``3/4``) or a LaTeX fraction
(``\\frac{3}{4}``, ``\\dfrac``, ``\\tfrac``). Around it, spaces, ``$`` (and LaTeX ``\\$``), a
trailing period, a trailing ``%`` and the LaTeX spacing ``\\,`` / ``\\!`` are ignored; the ``%``
is not part of the number (``50%`` reads as 50). Anything else is not a number (``None``).
Exponents (``1e5``) are not read; an integer part of over 4,300 digits (Python's limit on
converting text to an integer) is not a number either.

``extract_answer`` picks the substring that holds the answer, by mode:

- ``boxed``: the content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces
  allowed, e.g. ``\\boxed{\\frac{1}{2}}``);
- ``gsm8k``: the rest of the line after the last ``####``;
- ``last``: the last number in the text: a signed integer or decimal (thousands separators
  allowed), a simple fraction ``a/b`` or a LaTeX fraction. A ``-`` or ``+`` right after a letter,
  digit or closing bracket is an operator, not a sign (``10-3`` ends in 3);
- ``auto``: boxed if the text has a complete box, else gsm8k if it has ``####`` with something
  after it, else last.

``answer_value`` reads the extracted substring as a number; when it is not one number as a
whole (``\\boxed{x = 5}``, ``#### 72 dollars``) but holds exactly one number, that number counts
(``\\boxed{3, 4}`` holds two and counts as no answer).

``numeric_equal`` compares the completion's answer with the reference's. The reference goes
through the same extraction, and when that finds nothing (a plain ``72`` in mode ``gsm8k`` or
``boxed``) through ``auto``, so a reference may be a worked solution ending in ``#### 72`` or
just ``72``. The completion gets no such fallback: in mode ``gsm8k`` it must write ``####``, in
mode ``boxed`` a box. A side without a number is never equal, and nothing here raises on any
text.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

ExtractMode = Literal["auto", "last", "gsm8k", "boxed"]
EXTRACT_MODES: tuple[str, ...] = ("auto", "last", "gsm8k", "boxed")

_MINUS = "\u2212"
_INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
_DECIMAL = rf"(?:{_INT}(?:\.\d+)?|\.\d+)"
_PLAIN = re.compile(rf"[+-]?{_DECIMAL}")
_FRACTION = re.compile(rf"([+-]?)({_DECIMAL})/({_DECIMAL})")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_IN_TEXT = re.compile(
    r"(?:(?<![\w)\]}])[-+\u2212])?"
    r"(?:\\[dt]?frac\s*\{\s*[-\u2212]?\d+\s*\}\s*\{\s*\d+\s*\}"
    r"|(?<![\d/.])\d+/\d+(?![\d/])"
    r"|(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
    r"|(?<!\d)\.\d+)"
)


def parse_number(text: str) -> Fraction | None:
    """The number ``text`` spells (see the module docstring), or ``None`` when it is not one number."""
    s = _strip_decorations(text)
    if not s:
        return None
    try:
        if _PLAIN.fullmatch(s):
            return Fraction(s.replace(",", ""))
        for pattern in (_FRACTION, _LATEX_FRACTION):
            m = pattern.fullmatch(s)
            if m:
                return _ratio(m.group(1), m.group(2), m.group(3))
    except (ValueError, ZeroDivisionError):  # over Python's integer-digit limit; a zero denominator
        return None
    return None


def _strip_decorations(text: str) -> str:
    s = text.replace(_MINUS, "-").replace("\\$", "").replace("$", "").replace("\\,", "").replace("\\!", "")
    s = s.strip()
    s = s.removesuffix(".").rstrip()
    if s.endswith("\\%"):
        s = s[:-2].rstrip()
    elif s.endswith("%"):
        s = s[:-1].rstrip()
    return s


def _ratio(sign: str, numerator: str, denominator: str) -> Fraction | None:
    top, bottom = parse_number(numerator), parse_number(denominator)
    if top is None or bottom is None or bottom == 0:
        return None
    value = top / bottom
    return -value if sign == "-" else value


def extract_answer(text: str, mode: ExtractMode) -> str | None:
    """The substring of ``text`` that holds the answer, by ``mode`` (see the module docstring); ``None`` when none."""
    if mode == "boxed":
        return _last_boxed(text)
    if mode == "gsm8k":
        return _after_hashes(text)
    if mode == "last":
        return _last_number(text)
    if mode == "auto":
        for found in (_last_boxed(text), _after_hashes(text)):
            if found is not None:
                return found
        return _last_number(text)
    raise ValueError(f"extract mode {mode!r} is not one of {list(EXTRACT_MODES)}")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` whose brace is closed."""
    opens = list(_BOX_OPEN.finditer(text))
    if not opens:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
    for m in reversed(opens):
        start = m.end() - 1
        if start in closing:
            return text[start + 1:closing[start]]
    return None


def _after_hashes(text: str) -> str | None:
    at = text.rfind("####")
    if at < 0:
        return None
    line = text[at + 4:].split("\n", 1)[0].strip()
    return line or None


def _last_number(text: str) -> str | None:
    found = None
    for m in _NUMBER_IN_TEXT.finditer(text):
        found = m.group(0)
    return found


def answer_value(text: str, mode: ExtractMode) -> Fraction | None:
    """The number of ``text``'s answer: the extracted substring read as a number, or the one number it holds."""
    found = extract_answer(text, mode)
    if found is None:
        return None
    value = parse_number(found)
    if value is not None:
        return value
    numbers = _NUMBER_IN_TEXT.findall(found)
    return parse_number(numbers[0]) if len(numbers) == 1 else None


def numeric_equal(completion: str, reference: str, mode: ExtractMode = "auto") -> bool:
    """Whether the completion's answer equals the reference's, exactly as numbers."""
    expected = answer_value(reference, mode)
    if expected is None and mode != "auto":
        expected = answer_value(reference, "auto")
    if expected is None:
        return False
    got = answer_value(completion, mode)
    return got is not None and got == expected


def normalize_text(text: str) -> str:
    """``text`` stripped, internal whitespace collapsed to one space, case-folded."""
    return " ".join(text.split()).casefold()


def exact_equal(completion: str, reference: str) -> bool:
    """Whether the two texts are equal after ``normalize_text``."""
    return normalize_text(completion) == normalize_text(reference)


def format_match(completion: str, pattern: re.Pattern[str]) -> bool:
    """Whether ``pattern`` occurs anywhere in the completion (``re.search``; compile it with ``re.DOTALL``)."""
    return pattern.search(completion) is not None


def compile_format(pattern: str) -> re.Pattern[str]:
    """A format term's pattern, compiled the way ``format_match`` expects (``re.DOTALL``)."""
    return re.compile(pattern, re.DOTALL)
