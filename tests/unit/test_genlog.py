import multiprocessing as mp

import pytest

from ranker.genlog import GenerationLog, GenerationLogError, GenRecord


def _rec(i: int, length: int = 5) -> GenRecord:
    return GenRecord(f"p{i}", f"prompt {i}", length, i // 10, i % 2, 1000.0 + i)


def test_append_and_recent_oldest_first(tmp_path):
    with GenerationLog(tmp_path / "gen.sqlite") as log:
        assert log.append(_rec(i, i + 1) for i in range(25)) == 25
        assert log.count() == 25
        last = log.recent(3)
        assert [r.prompt_id for r in last] == ["p22", "p23", "p24"]
        assert last[0] == _rec(22, 23)
        assert len(log.recent(100)) == 25


def test_non_positive_length_rejected_and_nothing_written(tmp_path):
    with GenerationLog(tmp_path / "gen.sqlite") as log:
        with pytest.raises(GenerationLogError, match="prompt_id 'p1' has 0"):
            log.append([_rec(0), _rec(1, 0)])
        assert log.count() == 0


def test_not_a_log_names_the_file(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(GenerationLogError, match=r"bad.sqlite: not a generation log"):
        GenerationLog(bad)


def _writer(path: str, start: int) -> None:
    with GenerationLog(path) as log:
        for i in range(start, start + 50):
            log.append([_rec(i)])


def test_several_processes_append_to_one_log(tmp_path):
    path = str(tmp_path / "gen.sqlite")
    GenerationLog(path).close()
    procs = [mp.get_context("spawn").Process(target=_writer, args=(path, k * 1000)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with GenerationLog(path) as log:
        assert log.count() == 150


def _open_and_append(path: str, i: int, start) -> str:
    start.wait()
    try:
        with GenerationLog(path) as log:
            log.append([GenRecord(f"p{i}", "x", 3, 0, i, 1.0)])
        return "ok"
    except GenerationLogError as err:
        return str(err)


def test_processes_that_open_one_new_log_at_once_all_get_it(tmp_path):
    """Every SGS of a run opens the same new file when it starts; switching it to WAL can be refused
    'database is locked' without SQLite's busy handler being asked (seen in make test: an SGS died)."""
    ctx = mp.get_context("fork")
    path = str(tmp_path / "gen.sqlite")
    for attempt in range(3):  # a fresh file each time: the race is in creating it
        p = f"{path}.{attempt}"
        with ctx.Manager() as manager:
            start = manager.Barrier(6)
            with ctx.Pool(6) as pool:
                outcomes = pool.starmap(_open_and_append, [(p, i, start) for i in range(6)])
        assert outcomes == ["ok"] * 6
        with GenerationLog(p) as log:
            assert log.count() == 6
