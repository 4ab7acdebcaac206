"""The supervised worker pool: deadlines, kills, crashes, confinement, threads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from postrl.rewards.workers.pool import WorkerPool

HERE = Path(__file__).parent


@pytest.fixture
def handlers_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(HERE))


def test_map_keeps_order_and_values(handlers_on_path):
    with WorkerPool("pool_handlers:echo", workers=2, timeout_s=5) as pool:
        out = pool.map([[i, "x"] for i in range(20)])
    assert [o.value for o in out] == [[i, "x"] for i in range(20)]
    assert {o.status for o in out} == {"ok"}


def test_hang_the_worker_cannot_interrupt_is_killed_and_replaced(handlers_on_path):
    with WorkerPool("pool_handlers:spin_deaf", workers=1, timeout_s=1.0) as pool:
        first = pool.call(None)
        assert (first.status, first.value) == ("timeout", None)
        assert "killed" in first.detail
        assert pool.stats["respawns"] == 1
        second = pool.call(None)  # a fresh worker took its place and hangs (and dies) the same way
        assert second.status == "timeout" and pool.stats["respawns"] == 2


def test_python_level_hang_is_interrupted_without_losing_the_worker(handlers_on_path):
    with WorkerPool("pool_handlers:sleep_forever", workers=1, timeout_s=1.0) as pool:
        out = pool.call(None)
        assert out.status == "timeout" and "interrupted" in out.detail
        assert pool.stats["respawns"] == 0


def test_crashed_worker_is_an_error_and_is_replaced(handlers_on_path):
    with WorkerPool("pool_handlers:crash", workers=1, timeout_s=5) as pool:
        out = pool.call(None)
        assert out.status == "error" and "exited" in out.detail
        assert pool.stats["respawns"] == 1


def test_confined_worker_cannot_create_files(handlers_on_path, tmp_path):
    target = tmp_path / "pwned.txt"
    with WorkerPool("pool_handlers:write_file", workers=1, timeout_s=5) as pool:
        out = pool.call(str(target))
        assert out.status == "error" and "PermissionError" in out.detail
        assert pool.isolation in ("seccomp", "rlimits+audit")
    assert not target.exists()
    # control: the same handler without confinement does write, so the check above can fail
    with WorkerPool("pool_handlers:write_file", workers=1, timeout_s=5, confine=False) as pool:
        assert pool.call(str(target)).value == "written"
    assert target.exists()


def test_callable_from_many_threads(handlers_on_path):
    results = {}
    with WorkerPool("pool_handlers:echo", workers=2, timeout_s=5) as pool:
        def work(k):
            results[k] = [o.value for o in pool.map(list(range(k, k + 5)))]

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {k: list(range(k, k + 5)) for k in range(4)}


def test_closed_pool_kills_workers_and_refuses_calls(handlers_on_path):
    pool = WorkerPool("pool_handlers:echo", workers=2, timeout_s=5)
    pool.map([1, 2])
    procs = list(pool._procs)
    pool.close()
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(RuntimeError, match="closed"):
        pool.call(1)


def test_unknown_handler_fails_loudly():
    with WorkerPool("postrl.rewards.nonexistent:f", workers=1, timeout_s=5) as pool:
        with pytest.raises(RuntimeError, match="failed to start"):
            pool.call(1)


def test_a_hang_inside_a_pipelined_chunk_costs_only_that_job(handlers_on_path):
    jobs = [f"j{i}" for i in range(40)]
    jobs[5] = "hang"
    with WorkerPool("pool_handlers:echo_or_hang", workers=2, timeout_s=1.0) as pool:
        outcomes = pool.map(jobs)
        assert [o.status for o in outcomes] == ["ok"] * 5 + ["timeout"] + ["ok"] * 34
        assert [o.value for i, o in enumerate(outcomes) if i != 5] == [j for i, j in enumerate(jobs) if i != 5]
        assert pool.stats["respawns"] == 1 and pool.stats["calls"] == 40


def test_cursor_hands_out_every_job_once_in_shrinking_runs():
    from postrl.rewards.workers.pool import _CHUNK, _Cursor

    for n, workers in [(1, 2), (7, 2), (100, 2), (1000, 4), (33, 1)]:
        cursor, spans = _Cursor(n, workers), []
        while (span := cursor.take()) is not None:
            spans.append(span)
        assert [i for a, b in spans for i in range(a, b)] == list(range(n))
        sizes = [b - a for a, b in spans]
        assert sizes == sorted(sizes, reverse=True) and max(sizes) <= _CHUNK and min(sizes) >= 1
    assert _Cursor(100, 2).take() == (0, 16) and _Cursor(10, 2).take() == (0, 3)


def test_map_spreads_jobs_over_all_workers(handlers_on_path):
    with WorkerPool("pool_handlers:nap_pid", workers=2, timeout_s=5) as pool:
        out = pool.map(list(range(64)))
        assert len({o.value for o in out}) == 2 and pool.stats["calls"] == 64


def test_options_reach_the_handler_modules_warmup(handlers_on_path):
    with WorkerPool("pool_handlers:options", workers=1, timeout_s=5, options={"size": 7}) as pool:
        assert pool.call(None).value == {"size": 7}


# ---------------------------------------------------------------------------- the messages


def test_messages_round_trip_as_one_json_line_each():
    from postrl.rewards.workers.messages import Answer, Job, Ready, StartFailed, WorkerSpec, decode, encode

    for msg in [WorkerSpec("m:f", 0.8, 512, False, {"size": 7}), Ready("seccomp", 42), StartFailed("ImportError: x"),
                Job(3, ["1/2", "\\boxed{0.5}"]), Answer(3, "ok", {"v": [1, None]}, "", 0.25)]:
        line = encode(msg)
        assert "\n" not in line and decode(line, type(msg)) == msg and decode(line.encode(), type(msg)) == msg
    assert decode(encode(Ready("none", 1)), Ready, StartFailed) == Ready("none", 1)


@pytest.mark.parametrize("line, why", [
    ('{"type": "answer", "id": 1, "status": "ok", "value": 2}', "expected Ready or StartFailed"),  # not the greeting
    ('{"type": "ready", "isolation": "none"}', "Ready: .*pid"),  # a field missing
    ('{"type": "ready", "isolation": "none", "pid": 1, "extra": 0}', "Ready: .*extra"),  # a field unknown
    ('{"type": "nonsense"}', "expected Ready or StartFailed"),
    ('[1, 2]', "expected Ready or StartFailed"),
    ('not json', "Expecting value"),
])
def test_a_line_that_is_not_the_expected_message_is_refused(line, why):
    from postrl.rewards.workers.messages import Ready, StartFailed, decode

    with pytest.raises(ValueError, match=why):
        decode(line, Ready, StartFailed)


def test_an_answer_has_one_of_the_three_statuses():
    from postrl.rewards.workers.messages import Answer, decode

    with pytest.raises(ValueError, match="answer status 'maybe'"):
        decode('{"type": "answer", "id": 1, "status": "maybe"}', Answer)
    assert decode('{"type": "answer", "id": 1, "status": "timeout"}', Answer) == Answer(1, "timeout")


def test_a_non_json_result_is_an_error_answer(handlers_on_path):
    with WorkerPool("pool_handlers:not_json", workers=1, timeout_s=5) as pool:
        out = pool.call(None)
        assert (out.status, out.value, out.detail) == ("error", None, "result is not JSON")
        assert pool.call(None).status == "error" and pool.stats["respawns"] == 0  # the worker goes on
