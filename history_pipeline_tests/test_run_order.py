"""The order the suite runs in under pytest-xdist's worksteal scheduler (conftest's ``run_order``):
each worker's first share of the collection starts with its long tests, shares are the ones the
scheduler really sends, and a group (a module sharing a server) stays whole on one worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from history_pipeline_tests.conftest import _worksteal_shares, run_order


class _Worker:
    """What the scheduler needs of a worker: it records the tests sent to it."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices) -> None:
        self.sent.extend(indices)


def _first_shares(count: int, workers: int) -> list[list[int]]:
    """What pytest-xdist's worksteal scheduler first sends each of ``workers`` workers."""
    from xdist.scheduler.worksteal import WorkStealingScheduling

    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"])
    scheduler = WorkStealingScheduling(config)
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, [f"t{i}" for i in range(count)])
    scheduler.schedule()
    return [node.sent for node in nodes]


@pytest.mark.parametrize(("count", "workers"), [(1480, 3), (1480, 4), (7, 3), (10, 2)])
def test_the_shares_are_those_worksteal_first_sends(count, workers):
    sizes = _worksteal_shares(count, workers)
    starts = [sum(sizes[:i]) for i in range(workers)]
    assert _first_shares(count, workers) == [list(range(s, s + n)) for s, n in zip(starts, sizes, strict=True)]


def test_every_worker_starts_on_a_long_test_and_a_group_stays_whole():
    # three long tests, a module of four tests sharing a server, and pure tests: in collection
    # order the long ones and the module come last
    tests = [(f"pure{i}", 0.1) for i in range(20)]
    tests += [("server_module", 3.0)] * 4 + [("long_a", 50.0), ("long_b", 30.0), ("long_c", 40.0)]
    order = run_order(tests, 3)
    assert sorted(order) == list(range(len(tests)))
    sizes = _worksteal_shares(len(tests), 3)
    shares, start = [], 0
    for size in sizes:
        shares.append([tests[i][0] for i in order[start:start + size]])
        start += size
    assert {share[0] for share in shares} == {"long_a", "long_b", "long_c"}
    holding = [share for share in shares if "server_module" in share]
    assert len(holding) == 1 and holding[0].count("server_module") == 4
    # within a share the weights only fall: the short tests, handed over at the end, come last
    weights = dict(tests)
    assert all([weights[t] for t in share] == sorted((weights[t] for t in share), reverse=True) for share in shares)


def test_one_worker_runs_the_longest_first_and_keeps_group_order():
    tests = [("a", 1.0), ("b", 9.0), ("g", 2.0), ("g", 2.0), ("c", 9.0)]
    assert run_order(tests, 1) == [1, 4, 2, 3, 0]
