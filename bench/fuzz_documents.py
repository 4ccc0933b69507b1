"""Broken documents for property-based fuzzing (``bench/fuzz_files.py``): hypothesis strategies that
take a good config or data document and break it, structurally (values of the wrong type, out of
range, NaN/inf, huge integers, unknown and missing keys), at the byte level (truncation, flipped and
inserted bytes), or replace it whole with a random value, text or bytes."""

from __future__ import annotations

import json

import yaml
from hypothesis import strategies as st

SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(["", "0x10", "1e999", "~"]),
)
VALUE = st.recursive(SCALAR,
                     lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
                     max_leaves=6)
POS = st.integers(0, 10**6)  # a position, taken modulo the document's length


def key_paths(doc, prefix=()) -> list[tuple]:
    """Every key path of a nested dict/list document (sections and leaves)."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for k, v in items:
        out.append((*prefix, k))
        out.extend(key_paths(v, (*prefix, k)))
    return out


def _apply(doc, op):
    """Apply one structural mutation to a deep copy of ``doc``."""
    doc = json.loads(json.dumps(doc))
    paths = key_paths(doc)
    if not paths:
        return doc
    path = paths[op[1] % len(paths)]
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if op[0] == "set":
        parent[path[-1]] = op[2]
    elif op[0] == "delete":
        del parent[path[-1]]
    elif op[0] == "add" and isinstance(parent, dict):
        parent[op[2]] = op[3]
    return doc


DOC_OP = st.one_of(
    st.tuples(st.just("set"), POS, VALUE), st.tuples(st.just("delete"), POS),
    st.tuples(st.just("add"), POS, st.text(max_size=8), VALUE),
)
BYTE_OP = st.one_of(
    st.tuples(st.just("truncate"), POS), st.tuples(st.just("flip"), POS, st.integers(1, 255)),
    st.tuples(st.just("insert"), POS, st.binary(min_size=1, max_size=8)),
)


def damage(data: bytes, ops) -> bytes:
    """``data`` with the byte operations ``ops`` (``BYTE_OP``) applied in turn."""
    for op in ops:
        n = max(len(data), 1)
        i = op[1] % n
        if op[0] == "truncate":
            data = data[:i]
        elif op[0] == "flip" and data:
            data = data[:i] + bytes([data[i] ^ op[2]]) + data[i + 1:]
        elif op[0] == "insert":
            data = data[:i] + op[2] + data[i:]
    return data


def document(seeds: list, dump) -> st.SearchStrategy[bytes]:
    """Bytes of a broken document: a seed with structural mutations and maybe byte damage, or a
    random value, text or bytes. ``dump(doc) -> str`` serializes (YAML, JSON, JSONL)."""
    def mutated(s, ops, byte_ops):
        doc = s
        for op in ops:
            doc = _apply(doc, op)
        try:
            text = dump(doc).encode()
        except (ValueError, TypeError, OverflowError):  # e.g. a key JSON cannot hold: write the seed
            text = dump(s).encode()
        return damage(text, byte_ops)

    return st.one_of(
        st.builds(mutated, st.sampled_from(seeds), st.lists(DOC_OP, min_size=1, max_size=3), st.just([])),
        st.builds(mutated, st.sampled_from(seeds), st.lists(DOC_OP, max_size=2),
                  st.lists(BYTE_OP, min_size=1, max_size=2)),
        st.builds(lambda v: _safe_dump(dump, v), VALUE),
        st.text(max_size=200).map(str.encode),
        st.binary(max_size=200),
    )


def _safe_dump(dump, value) -> bytes:
    try:
        return dump(value).encode()
    except (ValueError, TypeError, OverflowError):
        return repr(value).encode()


def yaml_dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def jsonl_dump(rows) -> str:
    rows = rows if isinstance(rows, list) else [rows]
    return "".join(json.dumps(r) + "\n" for r in rows)
