"""engine: local with `pipeline.samplers: N`: sampling in N processes of their own, scoring here.

    trainer process                                  sampler process i (own model copy, own torch threads)
    submit(q): publish weights (shared memory,  ---> load them if new; run the order from the
               once per version), send order q       (seed, q, stream) generator; each group as it
    receiver thread i  <--- group ready -----------  finishes (`generate`'s on_ready) ...
       -> LocalScorer (grades it while the           ... and at the end the order's sample order
          sampler samples the rest)       <--- done
    take(q): waits for order q, every chunk scored

Orders, their timing and their staleness are `postrl.engines.pipeline`'s: an order for step q is
sent at the start of trainer step q - K with the weights of that moment; nothing about its result
depends on which process samples it or when, so K = 0 equals the synchronous loop bit for bit
(with the same torch thread count), and any K is reproducible run to run.

Weights: once per policy version the trainer copies its state dict into one flat shared-memory
buffer per dtype (`publish`); a sampler gets the buffer's handle (no copy through the pipe) before
the first order that needs it, and copies it into its model. Orders in flight keep their version's
buffer; the trainer's in-place updates never touch it, and a later version is written into a
buffer no order in flight reads (making new shared memory costs more than the copy). The
sampler's policy hands each version to its sampling backend (`rollout.backend`) once.

Messages are frozen dataclasses (below): `LoadWeights` and `RunOrder` on a sampler's order
queue (None stops it); `GroupReady` for each set of whole groups, then `OrderDone` (or
`OrderFailed`) on its result pipe, each carrying the try's `attempt` id.

Scoring stays in the trainer's process (a `LocalScorer` thread): verifiers, sandbox pools,
reward models and Python reward callables exist once, as in the synchronous loop. A domain that
is an environment (tools, feedback) is stepped by the sampler, which builds its own copy of the
run's domains for that.

Processes and threads: each sampler uses `pipeline.sampler_threads` torch threads (0: the
trainer's threads split evenly between trainer and samplers, at least one each); above
max_staleness 0 the trainer keeps the rest while the engine runs. At max_staleness 0 the trainer
waits while the samplers work and keeps all its threads.

Faults: each sampler talks through pipes of its own, so a sampler that dies (killed, out of
memory) breaks only its pipes: its receiver thread sees the end of the pipe, and the trainer
starts a new sampler and sends it every unfinished order it had, with their weights. An order's
samples depend only on its tasks, weights and generator, so the new sampler makes the samples the
lost one would have; the groups the dead one had already sent are dropped (their scores are never
attached), so no sample is lost or counted twice. Logged, and counted in `engine/restarts`; an
order on which samplers die three times is an error.
"""

from __future__ import annotations

import copy
import itertools
import os
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.multiprocessing as mp

from postrl.config.schema import Config
from postrl.engines.orders import LocalScorer, Order, Pending, Rollout, generate, reward_terms
from postrl.engines.pipeline import Pipeline
from postrl.extensions import load as load_extensions
from postrl.learner.batch import reference_logprobs
from postrl.learner.distributed import next_order
from postrl.model.device import model_device
from postrl.model.lora import make_reference
from postrl.records import Sample
from postrl.sampling.policy import Policy
from postrl.tasks.env import has_environments

MAX_TRIES = 3
"""Samplers that may die on one order before the run stops with an error."""


# ---------------------------------------------------------------------------- weights in shared memory


@dataclass
class SharedWeights:
    """A state dict as one flat shared-memory tensor per dtype plus where each entry lives in it.
    Pickled through a torch.multiprocessing pipe it travels as handles, not bytes."""

    version: int
    buffers: dict[torch.dtype, torch.Tensor]
    layout: list[tuple[str, torch.dtype, int, tuple[int, ...]]]
    """(name, dtype, offset, shape) per state-dict entry."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, dtype, offset, shape in self.layout:
            n = 1
            for d in shape:
                n *= d
            out[name] = self.buffers[dtype][offset : offset + n].view(shape)
        return out


def publish(state: dict[str, torch.Tensor], version: int,
            into: dict[torch.dtype, torch.Tensor] | None = None) -> SharedWeights:
    """A frozen shared-memory copy of `state`: later in-place updates do not reach it. `into`: the
    buffers of an earlier copy of the same state dict that nobody reads any more, written over
    instead of allocating new shared memory (which costs more than the copy)."""
    sizes: dict[torch.dtype, int] = {}
    layout = []
    for name, t in state.items():
        layout.append((name, t.dtype, sizes.get(t.dtype, 0), tuple(t.shape)))
        sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
    buffers = into or {dtype: torch.empty(n, dtype=dtype).share_memory_() for dtype, n in sizes.items()}
    shared = SharedWeights(version, buffers, layout)
    with torch.no_grad():
        for t, view in zip(state.values(), shared.state_dict().values()):
            view.copy_(t.detach().reshape(view.shape))
    return shared


# ---------------------------------------------------------------------------- messages
# Trainer -> sampler, on its order queue: LoadWeights, RunOrder; None tells it to stop.
# Sampler -> trainer, on its result pipe: GroupReady as groups finish, then OrderDone or OrderFailed.


@dataclass(frozen=True)
class LoadWeights:
    """Load these published weights; sent before the first order that needs a version the sampler lacks."""

    weights: SharedWeights


@dataclass(frozen=True)
class RunOrder:
    """Sample (and, with pipeline.reference: sampler, run the reference pass over) one order."""

    attempt: int
    """Id of this try of the order: answers of an earlier (dead) try are dropped."""
    order: Order
    """Its `weights` are None: they went ahead in a LoadWeights."""


@dataclass(frozen=True)
class GroupReady:
    """Whole groups of a try's samples, sent the moment their last sample finished."""

    attempt: int
    samples: list[Sample]


@dataclass(frozen=True)
class OrderDone:
    """A try finished: every group was sent before this."""

    attempt: int
    sample_order: list[int]
    """For each of the order's samples in order, its index among the samples of the GroupReady messages."""
    start: float
    end: float
    """time.time() stamps of generation."""
    ref_logprobs: list[list[float]] | None = None
    """Per sample, in order: the reference log-probs (pipeline.reference: sampler), else None."""
    reference_s: float = 0.0
    """Seconds of that reference pass."""


@dataclass(frozen=True)
class OrderFailed:
    attempt: int
    error: str
    """The sampler's traceback."""


# ---------------------------------------------------------------------------- the sampler process


def sampler_main(model, tok, max_batch: int, cfg: Config, threads: int, device: str, orders, results) -> None:
    """A sampler process: orders in, groups out, until it gets None or the trainer is gone."""
    load_extensions(cfg.imports)  # the run's own modules (`imports:`) exist here too
    torch.set_num_threads(threads)
    model = copy.deepcopy(model).to(device).eval()  # its own tensors: not the pickled shared ones
    policy = Policy(model, tok, max_batch, rollout=cfg.rollout)
    reference = None  # the frozen initial policy (the model arrives with the run's initial weights)
    if cfg.pipeline.reference == "sampler" and cfg.rl.kl_coef > 0:
        reference = make_reference(model)
    envs = None
    if has_environments(cfg):  # episodes step the run's environments here (tools, feedback)
        from postrl.tasks.catalog import build_domains

        envs = build_domains(cfg)
    loaded, parent = None, os.getppid()
    while (msg := next_order(orders, parent)) is not None:
        if isinstance(msg, LoadWeights):
            policy.load_weights(msg.weights.state_dict(), msg.weights.version)
            loaded = msg.weights.version
            continue
        attempt, order = msg.attempt, msg.order
        sent: dict[int, int] = {}

        def ready(chunk: list[Sample], attempt: int = attempt, sent: dict = sent) -> None:
            for s in chunk:
                sent[id(s)] = len(sent)
            results.send(GroupReady(attempt, chunk))

        try:
            if loaded != order.version:  # the trainer sends weights before the first order that needs them
                raise RuntimeError(f"sampler holds weights {loaded}, order wants {order.version}")
            start = time.time()
            samples = generate(policy, order, cfg, on_ready=ready, envs=envs)
            end = time.time()
            ref = None if reference is None else reference_logprobs(
                reference, samples, tok.pad_token_id, cfg.train, cfg.model, torch.device(device))
            ref_s = 0.0 if reference is None else time.time() - end
            results.send(OrderDone(attempt, [sent[id(s)] for s in samples], start, end, ref, ref_s))
        except Exception:
            results.send(OrderFailed(attempt, traceback.format_exc()))


# ---------------------------------------------------------------------------- the trainer's side


@dataclass
class Flight:
    """An order sent to a sampler, and what has come back of it."""

    order: Order
    worker: int
    attempt: int = 0
    """Id of the current try: messages of an earlier (dead) try are dropped."""
    tries: int = 0
    chunks: list[tuple[list[Sample], Any]] = field(default_factory=list)
    """(group's samples, scorer job), as they arrive."""
    done: OrderDone | None = None
    """The sampler's answer once it finished the order."""
    error: str = ""


@dataclass
class Sampler:
    process: Any
    orders: Any
    """Its order queue (a put never blocks: a feeder thread writes the pipe)."""
    results: Any
    """Our end of its result pipe."""
    loaded: int | None = None
    """Version of the weights last sent to it."""
    alive: bool = True


class ProcessEngine(Pipeline):
    """Orders sampled by `pipeline.samplers` processes (see the module docstring)."""

    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print):
        super().__init__(policy, domains, cfg, log)
        n = cfg.pipeline.samplers
        self._torch_threads = torch.get_num_threads()
        self.threads = cfg.pipeline.sampler_threads or max(1, self._torch_threads // (n + 1))
        if self.max_staleness > 0:  # the trainer works while they sample: it keeps the rest of the cores
            torch.set_num_threads(max(1, self._torch_threads - n * self.threads))
        self._ctx = mp.get_context("spawn")
        self.device = model_device(policy.model)  # samplers sample on the trainer's device
        self._model = copy.deepcopy(policy.model).cpu().eval()  # what each (re)started sampler starts from
        for p in self._model.parameters():
            p.requires_grad_(False)
        self._cond = threading.Condition()
        self._flights: dict[tuple[int, int], Flight] = {}
        self._attempts = itertools.count(1)
        self._published: SharedWeights | None = None
        self._buffers: list[dict[torch.dtype, torch.Tensor]] = []
        """Every shared-memory buffer set made so far; one that no order in flight reads is reused."""
        self.restarts = 0
        self.reference_s = 0.0
        """Seconds of the samplers' reference passes in the orders taken since the run last recorded
        a step's metrics (`metrics_recorded`)."""
        self.scorer = LocalScorer(domains, reward_terms(cfg))
        self.samplers = [self._spawn(i) for i in range(n)]

    def _spawn(self, i: int) -> Sampler:
        orders = self._ctx.Queue()
        results_out, results_in = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=sampler_main, name=f"postrl-sampler-{i}", daemon=True,
            args=(self._model, self.policy.tok, self.policy.max_batch, self.cfg, self.threads, str(self.device), orders,
                  results_in))
        process.start()
        results_in.close()  # the child's end: a dead child then shows as a closed pipe here
        sampler = Sampler(process, orders, results_out)
        threading.Thread(target=self._receive, args=(i, sampler), name=f"sampler-{i}-results", daemon=True).start()
        return sampler

    # -- sending
    def _start(self, order: Order) -> tuple[int, int]:
        flight = Flight(replace(order, weights=self._publish()), worker=order.step % len(self.samplers))
        with self._cond:
            self._flights[order.key] = flight
            self._send(flight)
        return order.key

    def _publish(self) -> SharedWeights:
        """The trainer's weights in shared memory, once per policy version, in a buffer set that no
        order in flight reads (a sampler reads an order's weights before it runs the order, and
        a sampler started again reads them again), else in a new one."""
        version = self.policy.version
        if self._published is None or self._published.version != version:
            with self._cond:
                in_use = {id(f.order.weights.buffers) for f in self._flights.values()}
            spare = next((b for b in self._buffers if id(b) not in in_use), None)
            self._published = publish(self.policy.model.state_dict(), version, into=spare)
            if spare is None:
                self._buffers.append(self._published.buffers)
        return self._published

    def _send(self, flight: Flight) -> None:
        """Send an order (and its weights, if that sampler lacks them); called holding the lock."""
        sampler = self.samplers[flight.worker]
        flight.attempt, flight.tries = next(self._attempts), flight.tries + 1
        flight.chunks, flight.done, flight.error = [], None, ""
        if sampler.loaded != flight.order.version:
            sampler.orders.put(LoadWeights(flight.order.weights))
            sampler.loaded = flight.order.version
        sampler.orders.put(RunOrder(flight.attempt, replace(flight.order, weights=None)))

    # -- receiving
    def _receive(self, i: int, sampler: Sampler) -> None:
        """Reads sampler i's results until its pipe ends (it exited or died)."""
        while True:
            try:
                msg: GroupReady | OrderDone | OrderFailed = sampler.results.recv()
            except (EOFError, OSError):
                break
            with self._cond:
                flight = next((f for f in self._flights.values() if f.attempt == msg.attempt), None)
                if flight is None:  # a discarded order, or a try that was replaced
                    continue
                match msg:
                    case GroupReady(samples=chunk):
                        flight.chunks.append((chunk, self.scorer.submit(chunk)))
                    case OrderDone():
                        flight.done = msg
                    case OrderFailed(error=error):
                        flight.error = error
                self._cond.notify_all()
        with self._cond:
            sampler.alive = False
            self._cond.notify_all()

    def _wait(self, key: tuple[int, int]) -> Rollout:
        with self._cond:
            while True:
                flight = self._flights[key]
                if flight.done or flight.error:
                    break
                if not self.samplers[flight.worker].alive:
                    self._replace(flight.worker)
                    continue
                self._cond.wait(timeout=5.0)
            del self._flights[key]
        if flight.error:
            raise RuntimeError(f"rollout of step {key[0]} failed in sampler {flight.worker}:\n{flight.error}")
        done = flight.done
        self.reference_s += done.reference_s
        by_index = [s for chunk, _ in flight.chunks for s in chunk]
        samples = [by_index[j] for j in done.sample_order]
        for s, r in zip(samples, done.ref_logprobs or ()):
            s.ref_logprobs = r
        return Pending(key[0], samples, done.start, done.end, flight.chunks, self.scorer).result()

    def _ready(self, key: tuple[int, int]) -> bool:
        with self._cond:
            flight = self._flights.get(key)
            return flight is not None and flight.done is not None and all(job.done() for _, job in flight.chunks)

    def _replace(self, i: int) -> None:
        """Sampler i died: start another and send it every unfinished order it had (holding the lock)."""
        old = self.samplers[i]
        old.process.join(timeout=5)
        old.orders.cancel_join_thread()  # what is left in its queue is sent again below
        again = sorted((f for f in self._flights.values() if f.worker == i and not f.done and not f.error),
                       key=lambda f: (f.order.step, f.order.stream))
        for f in again:
            if f.tries >= MAX_TRIES:
                raise RuntimeError(f"sampler processes died {f.tries} times on the order of step {f.order.step} "
                                   f"(last exit code {old.process.exitcode}; its error is above; a script that "
                                   f"starts them must guard its entry point with if __name__ == '__main__')")
        self.restarts += 1
        self.samplers[i] = self._spawn(i)
        self.log(f"sampler process {i} died (exit code {old.process.exitcode}); restarted; "
                 f"steps {[f.order.step for f in again]} sent again")
        for f in again:
            self._send(f)

    def metrics(self) -> dict[str, float]:
        return super().metrics() | {"engine/restarts": float(self.restarts), "time/reference_s": self.reference_s}

    def metrics_recorded(self) -> None:
        self.reference_s = 0.0

    def _discard(self) -> None:
        with self._cond:
            self._flights.clear()  # their samplers finish them; the results are dropped on arrival
        self._published = None  # a restored trainer may reuse a version number with other weights
        for sampler in self.samplers:
            sampler.loaded = None

    def close(self) -> None:
        for sampler in self.samplers:
            sampler.orders.put(None)
        for sampler in self.samplers:
            sampler.process.join(timeout=30)
            if sampler.process.is_alive():
                sampler.process.kill()
            sampler.orders.cancel_join_thread()
        self.scorer.close()
        torch.set_num_threads(self._torch_threads)
