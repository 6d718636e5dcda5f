"""A closed-loop worker's requests depend on who it is, not on when other requests finish."""

import os
import subprocess
import sys

from testbed.request_stream import WORDS, WorkerStream


def _take(stream: WorkerStream, n: int) -> list[tuple[str, int]]:
    return [(r.prompt, r.max_tokens) for r in (stream.next() for _ in range(n))]


def test_one_worker_sends_the_same_requests_whatever_else_was_drawn():
    a = WorkerStream(7, "greedy", 3, 64)
    _take(WorkerStream(7, "greedy", 0, 64), 50)  # another worker drawing in between changes nothing
    b = WorkerStream(7, "greedy", 3, 64)
    assert _take(a, 20) == _take(b, 20)


def test_workers_tenants_and_seeds_each_have_their_own_stream():
    base = _take(WorkerStream(7, "greedy", 3, 64), 10)
    for other in (WorkerStream(7, "greedy", 4, 64), WorkerStream(7, "temp1", 3, 64), WorkerStream(8, "greedy", 3, 64)):
        assert _take(other, 10) != base


def test_the_first_request_has_a_random_length_and_the_rest_the_full_one():
    firsts = set()
    for number in range(40):
        requests = _take(WorkerStream(0, "greedy", number, 64), 5)
        firsts.add(requests[0][1])
        assert all(1 <= length <= 64 for _, length in requests)
        assert [length for _, length in requests[1:]] == [64] * 4
        for text, _ in requests:
            assert 3 <= len(text.split()) <= 8 and set(text.split()) <= set(WORDS)
    assert len(firsts) > 10  # the first lengths spread the workers' phases


def test_the_stream_is_the_same_in_another_process():
    """Both sides' loads run in one process today; a seed that hashed per process
    (PYTHONHASHSEED) would silently pair nothing if they ever ran in two."""
    code = ("from testbed.request_stream import WorkerStream; s = WorkerStream(7, 'greedy', 3, 64); "
            "print([s.next().prompt for _ in range(5)])")
    here = repr([r[0] for r in _take(WorkerStream(7, "greedy", 3, 64), 5)])
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed}).stdout.strip()
        assert out == here
