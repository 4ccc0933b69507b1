"""Every config and data file the ``braid`` CLI reads, broken by hypothesis (``bench/fuzz_files.py``):
each broken file is accepted (and then loads back where services read it) or refused with exit
status 2 and a message, never a traceback. ``bench/fuzz.py`` runs many more examples."""

from __future__ import annotations

import pytest

from bench.fuzz_files import KINDS, FileTally, run_kind

EXAMPLES = 25


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_broken_file_is_refused_with_a_message(kind, tmp_path):
    tally = FileTally()
    run_kind(kind, tmp_path, EXAMPLES, tally)
    assert sum(tally.counts[kind.name].values()) >= EXAMPLES and not tally.failures
