"""The sandbox fleet of engine: ray on a local two-node Ray cluster (head 1 CPU, second node 2 CPUs;
one per module, shut down at its end): bursts of runs from several threads add actors while runs
queue, on both nodes, one that finds no free CPU is cancelled, the extra ones go after an idle
spell, every result is right and delivered once, and every size change is recorded; an actor
killed mid-burst loses no run."""

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray>=2.30')")

from ray.cluster_utils import Cluster  # noqa: E402
from test_ray import needs_sandbox  # noqa: E402

from postrl.engines.ray_sandbox import FleetSpec, RaySandbox, describe, start_sandbox_fleet  # noqa: E402
from postrl.sandbox.runs import RunRequest, SandboxConfig  # noqa: E402

ONE_WORKER = SandboxConfig(workers=1)  # each actor takes one run at a time: a burst queues at once


@pytest.fixture(scope="module")
def cluster():
    needs_sandbox()
    if ray.is_initialized():  # another module's cluster (each shuts its own down; this is a guard)
        ray.shutdown()
    nodes = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=2)
    nodes.wait_for_nodes()
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture
def fleet(cluster):
    started = []

    def start(spec: FleetSpec):
        handle, info = start_sandbox_fleet(ONE_WORKER, spec)
        started.append(handle)
        return handle, RaySandbox(handle, info, spec.max_restarts)

    yield start
    for handle in started:
        ray.get(handle.close.remote())
        ray.kill(handle)


def burst(backend, threads: int, calls: int, runs: int, sleep_s: float) -> list:
    """Each thread makes `calls` run_many calls of `runs` programs that sleep and print their name."""
    def caller(t: int) -> list:
        out = []
        for c in range(calls):
            reqs = [RunRequest(f"import time; time.sleep({sleep_s}); print('{t}-{c}-{r}')") for r in range(runs)]
            out.append([(res.status, res.stdout.strip()) for res in backend.run_many(reqs)])
        return out

    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(caller, range(threads)))


def expected(threads: int, calls: int, runs: int) -> list:
    return [[[("finished", f"{t}-{c}-{r}") for r in range(runs)] for c in range(calls)] for t in range(threads)]


def watch(handle, work, until):
    """Run `work` in a thread; poll the fleet's info every 0.1 s (calling `until(info)`, which may
    act) until `work` is done. Returns its result and the infos seen."""
    seen = []
    with ThreadPoolExecutor(1) as ex:
        future = ex.submit(work)
        while not future.done():
            seen.append(ray.get(handle.info.remote()))
            until(seen[-1])
            time.sleep(0.1)
        return future.result(), seen


def check_records(changes: list[dict], start: int) -> None:
    """Each record's count follows from the one before and its kind; times do not go back."""
    n = start
    for c in changes:
        n += {"added": 1, "started": 1, "removed": -1, "lost": -1, "cancelled": 0, "failed": 0}[c["change"]]
        assert c["actors"] == n, "\n".join(describe(x) for x in changes)
    assert [c["t"] for c in changes] == sorted(c["t"] for c in changes)


def test_fleet_grows_on_both_nodes_while_runs_queue_and_shrinks_when_idle(fleet):
    # up to 5 actors: the first asks for no CPU, the 4 extra for one each, and only 3 CPUs exist
    handle, backend = fleet(FleetSpec("code", min_actors=1, max_actors=5, idle_s=2.0, max_restarts=1))
    results, seen = watch(handle, lambda: burst(backend, threads=4, calls=5, runs=3, sleep_s=0.4), lambda i: None)
    assert results == expected(4, 5, 3)  # every run's own output, in order: none lost, none swapped
    assert max(i["queued"] for i in seen) > 0 and max(i["actors"] for i in seen) >= 3

    busy = ray.get(handle.info.remote())  # before the idle spell: every actor that ran is still there
    assert busy["runs"] == 60 and sum(p["runs"] for p in busy["pools"]) == 60  # each run ran once
    added = [c for c in busy["changes"] if c["change"] == "added"]
    assert 2 <= len(added) <= 3 and all(re.fullmatch(r"[1-9]\d* runs queued", c["why"]) for c in added)
    assert len({c["node_id"] for c in busy["changes"] if c["node_id"]}) == 2  # actors on both nodes

    deadline = time.time() + 15
    while (ray.get(handle.info.remote())["actors"] > 1 or ray.get(handle.info.remote())["starting"]) \
            and time.time() < deadline:
        time.sleep(0.2)
    idle = ray.get(handle.info.remote())
    assert idle["actors"] == 1 and idle["starting"] == 0
    kinds = [c["change"] for c in idle["changes"]]
    assert kinds[0] == "started" and kinds.count("removed") == len(added)
    assert kinds.count("cancelled") == 1  # the extra that found no free CPU never ran, and went
    assert all(c["why"].startswith("idle ") for c in idle["changes"] if c["change"] == "removed")
    check_records(idle["changes"], start=0)
    assert "added one on node" in describe(added[0]) and describe(added[0]).startswith(f"{added[0]['actors']} actors")


def test_an_actor_killed_mid_burst_loses_no_run(fleet):
    handle, backend = fleet(FleetSpec("code", min_actors=1, max_actors=3, idle_s=2.0, max_restarts=1))
    killed = []

    def kill_a_busy_actor(info):
        if killed or info["actors"] < 2:
            return
        actors = ray.get(handle.actors.remote())
        busy = [a for a, i in zip(actors, ray.get([a.info.remote() for a in actors])) if i["in_flight"]]
        if busy:
            killed.append(ray.get(busy[-1].info.remote()))
            ray.kill(busy[-1], no_restart=True)  # dead for good: its runs must go to the others

    results, _ = watch(handle, lambda: burst(backend, threads=3, calls=4, runs=3, sleep_s=0.4), kill_a_busy_actor)
    assert killed and killed[0]["in_flight"] >= 1
    assert results == expected(3, 4, 3)
    events = backend.drain_events()
    assert events and all("sandbox actor died" in e and "queued again" in e for e in events)
    info = ray.get(handle.info.remote())
    assert info["runs"] == 36  # each run delivered once, the lost ones included
    lost = [c for c in info["changes"] if c["change"] == "lost"]
    assert len(lost) == 1 and lost[0]["node_id"] == killed[0]["node_id"]
    check_records(info["changes"], start=0)
