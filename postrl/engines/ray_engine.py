"""engine: ray. Rollout workers, the reward worker and the sandbox pool are Ray actors; the loop is unchanged.

    trainer (driver)        RolloutWorker i (step % n)           RewardWorker          SandboxFleet
    submit(q): put weights -> generate(order q, [weights ref]) -- groups as they finish -> score(chunk)
                                 (run_order: goes on sampling)  <- scores ---------    code domain:
    take(q): ray.get  <------ Rollout(q), once every chunk is scored                  run_many(reqs) <-> actors

Orders and their timing are `postrl.engines.pipeline`'s: an order is submitted at the start of
trainer step q - K with a reference to the weights of that moment, published once per policy
version through Ray's object store (`ray.put` of the state dict, after each update, when the next
order goes out). A worker fetches a version only when it differs from what it holds. The rollout
worker runs the order through `run_order`, the same call as the local engines: each set of whole
groups goes to the reward worker (`score.remote`) the moment its last sample finishes, and is
graded there while the rollout worker samples the rest; the worker returns the Rollout once the
last chunk is scored. The reward worker holds the run's domains; a code domain among them runs
its programs on the domain's sandbox fleet (`postrl.engines.ray_sandbox`): between
`ray.sandbox_actors` and `ray.max_sandbox_actors` sandbox actors, each holding an elastic pool,
shared with the trainer's own domains (eval). The trainer logs each change of the fleet's size
and reports `sandbox/<domain>/actors`, `.../workers` (all actors') and `.../runs`.

Extensions: the run's `imports:` are loaded by each rollout and reward actor when it starts
(`postrl.extensions.load`), before it builds anything from the config; their verifier pools
inherit them. A Python callable passed as a reward (`postrl.train(reward_funcs=...)`) lives in the
trainer's process only: such a run is refused with one line before any actor starts.

Faults: when a result cannot be fetched because a rollout or reward actor died, the dead actors
are replaced (up to `ray.max_restarts` times in all) and every order in flight is submitted
again. An order's outcome is fixed by its tasks, its weights and its (seed, step) generator, so
the re-run produces the samples the lost run would have: none is lost, and since results are
taken once per step, none is duplicated. A dead sandbox actor is restarted by Ray (or replaced)
and the runs it had in flight are sent again by its fleet; orders are not re-run for it. Each
event is logged; `engine/restarts` counts replaced rollout/reward actors, `engine/sandbox_requeues` the
sandbox calls sent again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import ray
import torch

from postrl.abilities import RunsCode
from postrl.config.schema import Config
from postrl.engines.orders import Order, Rollout, Scored, reward_terms, run_order, score_chunk
from postrl.engines.pipeline import Pipeline
from postrl.engines.ray_sandbox import FleetSpec, RaySandbox, describe, start_sandbox_fleet
from postrl.errors import UserError
from postrl.extensions import load as load_extensions
from postrl.records import Sample
from postrl.sampling.policy import Policy
from postrl.tasks.env import has_environments


class RayScorer:
    """`run_order`'s scorer on the reward actor: a chunk goes out as an actor call, its result is
    fetched when the rollout is collected."""

    def __init__(self, reward_worker):
        self.reward_worker = reward_worker

    def submit(self, samples: list[Sample]):
        return self.reward_worker.score.remote(samples)

    def result(self, ref) -> Scored:
        return ray.get(ref)


class RolloutWorker:
    """Holds a copy of the policy; samples orders with the weights each one names."""

    def __init__(self, model, tok, cfg: Config, sandboxes: dict[str, RaySandbox] | None = None):
        load_extensions(cfg.imports)  # the run's own modules exist on every actor (`imports:`)
        torch.set_num_threads(1)  # one actor per CPU Ray schedules it on
        if cfg.ray.rollout_gpus:  # Ray set CUDA_VISIBLE_DEVICES to the GPU it gave this actor: cuda:0 here
            model = model.to(f"cuda:{torch.cuda.current_device()}")
        self.policy, self.cfg, self.loaded = Policy(model.eval(), tok, rollout=cfg.rollout), cfg, None
        self.envs = None
        """The run's domains when some are environments: episodes step them here (tools, feedback)."""
        if has_environments(cfg):
            from postrl.tasks.catalog import build_domains

            self.envs = build_domains(cfg, "cuda" if cfg.ray.rollout_gpus else "cpu")
            for name, backend in (sandboxes or {}).items():
                self.envs[name].use_sandbox(backend)

    def ping(self) -> bool:
        return True

    def generate(self, order: Order, weights: list, reward_worker) -> Rollout:
        ref = weights[0]  # boxed in a list so Ray hands over the ref, fetched only when new
        if self.loaded != ref:  # one ref per published version
            self.policy.load_weights(ray.get(ref), order.version)
            self.loaded = ref
        return run_order(self.policy, order, self.cfg, RayScorer(reward_worker), self.envs).result()


class RewardWorker:
    """The run's domains (verifiers, reward models; the sandbox through its actor), scoring chunks."""

    def __init__(self, cfg: Config, sandboxes: dict[str, RaySandbox]):
        from postrl.tasks.catalog import build_domains  # with the run's reward-model terms, as the trainer's

        load_extensions(cfg.imports)  # before the domains: they may be the extensions' own
        torch.set_num_threads(1)
        # reward models (`reward_models`) on the GPU Ray gave this actor (ray.reward_gpus), else the CPU
        self.cfg, self.sandboxes = cfg, sandboxes
        self.domains = build_domains(cfg, "cuda" if cfg.ray.reward_gpus else "cpu")
        for name, backend in sandboxes.items():
            self.domains[name].use_sandbox(backend)

    def ping(self) -> bool:
        return True

    def score(self, samples: list[Sample]) -> Scored:
        scored = score_chunk(samples, self.domains, reward_terms(self.cfg))
        scored.events = tuple(e for b in self.sandboxes.values() for e in b.drain_events())
        return scored


@dataclass
class Flight:
    order: Order
    ref: Any
    """Object ref of the scored `Rollout`."""


def check_gpus(workers: int, each: float, reward: float) -> None:
    """One line, instead of actors that wait forever for GPUs the cluster does not have."""
    have = ray.cluster_resources().get("GPU", 0)
    if workers * each + reward > have:
        asked = [f"ray.rollout_gpus = {each:g} x {workers} rollout actors"] if each else []
        asked += [f"ray.reward_gpus = {reward:g}"] if reward else []
        raise UserError(f"config keys {' + '.join(asked)}: {workers * each + reward:g} GPUs, the Ray cluster has "
                        f"{have:g}; set them to 0 to run those actors on CPUs")


class RayEngine(Pipeline):
    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print):
        super().__init__(policy, domains, cfg, log)
        r = cfg.ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:  # else the caller's cluster (tests share one per module)
            ray.init(address=r.address or None, num_cpus=(r.num_cpus or None) if not r.address else None,
                     include_dashboard=False, log_to_driver=False)
        # the object store gets a CPU copy of the model and CPU weights, whatever device the trainer's
        # model is on; a rollout actor moves them to the GPU Ray gave it (ray.rollout_gpus) or keeps the CPU
        model = copy.deepcopy(policy.model).to("cpu")
        for p in model.parameters():
            p.requires_grad_(False)
        self._model_ref = ray.put(model)  # one copy in the object store, shared by every (re)started worker
        try:
            check_gpus(r.rollout_workers, r.rollout_gpus, r.reward_gpus)
        except UserError:
            if self._owns_ray:
                ray.shutdown()
            raise
        self._actor = (ray.remote(num_cpus=1, num_gpus=r.rollout_gpus)(RolloutWorker),
                       ray.remote(num_cpus=0, num_gpus=r.reward_gpus)(RewardWorker))
        self._sandbox_seen: dict[str, dict] = {}  # domain -> what of its fleet was logged
        self.sandbox_fleets, self.sandboxes = self._start_sandboxes()
        self.workers = [self._new_worker() for _ in range(r.rollout_workers)]
        self.scorer = self._actor[1].remote(cfg, self.sandboxes)
        self.restarts = self.sandbox_requeues = 0
        self._published: tuple[int, Any] | None = None

    def _start_sandboxes(self) -> tuple[dict, dict[str, RaySandbox]]:
        """One sandbox fleet per domain that runs code; the trainer's domains (eval) use it too."""
        r = self.cfg.ray
        fleets, backends = {}, {}
        for name, domain in self.domains.items():
            sandbox_cfg = domain.sandbox_config() if isinstance(domain, RunsCode) else None
            if sandbox_cfg is None:
                continue
            spec = FleetSpec(name, r.sandbox_actors, r.max_sandbox_actors, r.sandbox_idle_s, r.max_restarts)
            fleets[name], info = start_sandbox_fleet(sandbox_cfg, spec)
            backends[name] = RaySandbox(fleets[name], info, r.max_restarts)
            domain.use_sandbox(backends[name])
            kind = "an actor" if spec.max_actors == 1 else (
                f"a fleet of {spec.min_actors} to {spec.max_actors} actors (those above {spec.min_actors} "
                f"stop after {spec.idle_s:g} s idle)")
            self.log(f"ray engine: sandbox pool of domain {name} is {kind} ({info['n_workers']} workers, "
                     f"isolation {info['isolation']})")
            self._log_sandbox_changes(name, info)
        return fleets, backends

    def _new_worker(self):
        return self._actor[0].remote(self._model_ref, self.policy.tok, self.cfg, self.sandboxes)

    def _publish(self):
        version = self.policy.version
        if self._published is None or self._published[0] != version:
            weights = {k: v.detach().to("cpu") for k, v in self.policy.model.state_dict().items()}
            self._published = (version, ray.put(weights))  # serialised now
        return self._published[1]

    def _start(self, order: Order) -> Flight:
        flight = Flight(replace(order, weights=self._publish()), None)
        self._dispatch(flight)
        return flight

    def _dispatch(self, flight: Flight) -> None:
        o = flight.order
        worker = self.workers[o.step % len(self.workers)]
        flight.ref = worker.generate.remote(replace(o, weights=None), [o.weights], self.scorer)

    def _wait(self, flight: Flight) -> Rollout:
        while True:
            try:
                rollout = ray.get(flight.ref)
            except ray.exceptions.RayError as e:
                if not self._recover(e, flight):
                    raise
                continue
            self.sandbox_requeues += sum("queued again" in e for e in rollout.events)
            return rollout

    def _ready(self, flight: Flight) -> bool:
        return bool(ray.wait([flight.ref], timeout=0)[0])

    def _recover(self, error: Exception, current: Flight) -> bool:
        """Replace dead actors and submit every order in flight again; False if none had died."""
        dead = [i for i, w in enumerate(self.workers) if not _alive(w)]
        scorer_dead = not _alive(self.scorer)
        if not dead and not scorer_dead:
            return False
        self.restarts += len(dead) + scorer_dead
        if self.restarts > self.cfg.ray.max_restarts:
            self.log(f"ray engine: {self.restarts} actor restarts exceed ray.max_restarts; giving up")
            return False
        for i in dead:
            self.workers[i] = self._new_worker()
        if scorer_dead:
            self.scorer = self._actor[1].remote(self.cfg, self.sandboxes)
        flights = [current, *(f for f in self.in_flight.values() if f is not current)]
        again = sorted(f.order.step for f in flights)
        self.log(f"ray engine: {'rollout worker(s) ' + str(dead) if dead else ''}"
                     f"{' reward worker' if scorer_dead else ''} died ({type(error).__name__}); "
                     f"restarted; steps {again} submitted again")
        for f in flights:
            self._dispatch(f)
        return True

    def metrics(self) -> dict[str, float]:
        m = {"engine/restarts": float(self.restarts)}
        if self.sandboxes:
            for event in (e for b in self.sandboxes.values() for e in b.drain_events()):  # the trainer's own calls
                self.log(event)
                self.sandbox_requeues += 1
            m["engine/sandbox_requeues"] = float(self.sandbox_requeues)
            m |= self._sandbox_metrics()
        return super().metrics() | m

    def _sandbox_metrics(self) -> dict[str, float]:
        """Actors, pool workers (all actors') and runs (delivered since the fleet started) per
        domain; every change since the last step is logged."""
        m = {}
        for name, fleet in self.sandbox_fleets.items():
            seen = self._sandbox_seen[name]
            info = ray.get(fleet.info.remote(seen["changes"]))
            if info["pid"] != seen["pid"]:  # restarted by Ray: its records start over
                info = ray.get(fleet.info.remote(0))
            self._log_sandbox_changes(name, info)
            m[f"sandbox/{name}/actors"] = float(info["actors"])
            m[f"sandbox/{name}/workers"] = float(info["n_workers"])
            m[f"sandbox/{name}/runs"] = float(info["runs"])
        return m

    def _log_sandbox_changes(self, name: str, info: dict) -> None:
        """Log the changes of a fleet's actor count in `info` (those not logged yet) and each new
        resize of its actors' pools."""
        seen = self._sandbox_seen.get(name)
        if seen is None or seen["pid"] != info["pid"]:
            seen = self._sandbox_seen[name] = {"pid": info["pid"], "pools": {}}
        for change in info["changes"]:
            self.log(f"ray engine: sandbox of domain {name}: {describe(change)}")
        seen["changes"] = info["n_changes"]
        for pool in info["pools"]:
            key = (pool["key"], pool["pid"])
            for _, n in pool["sizes"][seen["pools"].get(key, 1):]:  # its first size: logged when it started
                self.log(f"ray engine: sandbox pool of domain {name} resized to {n} workers"
                         + (f" (actor {pool['key']})" if len(info["pools"]) > 1 else ""))
            seen["pools"][key] = len(pool["sizes"])

    def _discard(self) -> None:
        self._published = None

    def close(self) -> None:
        for fleet in self.sandbox_fleets.values():  # its actors first, then itself
            try:
                ray.get(fleet.close.remote(), timeout=30)
            except ray.exceptions.RayError:
                pass  # dead already: its actors died with it
        for actor in [*self.workers, self.scorer, *self.sandbox_fleets.values()]:
            ray.kill(actor)
        if self._owns_ray:
            ray.shutdown()


def _alive(actor) -> bool:
    try:
        ray.get(actor.ping.remote(), timeout=60)
        return True
    except ray.exceptions.RayActorError:
        return False
