"""A data-parallel learner: `train.learners: N` ranks of torch.distributed (gloo on CPU, NCCL on CUDA).

    trainer process = rank 0                                 learner process r = 1 .. N-1
    Learner.update(batch, kl_coef, generator)                learner_main: waits on its pipe
      Ranks.begin: pipe <- Update(batch, kl_coef, ...) ----> Learner.update(batch, ...): the same call
      each minibatch: its rows split N ways (tensor_split), this rank's share forward + backward
      all_reduce(gradients, SUM) <-------------------------> all_reduce(gradients, SUM)
      clip, optimizer step: the same gradients and state on every rank, so the same parameters
      all_reduce(loss terms, per-row entropy; kl max: MAX) -> rank 0's UpdateStats

Why the sum is the minibatch's gradient: each micro-batch's loss is weighted by its share of the
minibatch's aggregation denominator (token-mean: its tokens over the minibatch's tokens), counted
on the whole minibatch, which every rank holds; the weighted losses of all ranks therefore add up
to the minibatch's loss, and their gradients to its gradient. One learner's result, up to the
order of float additions. Only the update is split: rank 0 builds the batch (reference and
proximal log-probs, advantages) as with one learner and sends it whole to every rank.

State: every rank loads the run's model from its path (LoRA adapters added as in the trainer)
and makes a fresh optimiser; rank 0's learner sends its weights and `Learner.state_dict()`
(`Ranks.send_state`: a `LoadState`) with the first update and again after every change made
outside an update (a checkpoint load on resume or rollback, the rollback's LR change), and from
there every rank takes the same steps. The learner is given its `Ranks` when it is built
(`start_learners` makes rank 0's, `learner_main` the others'); `Ranks` knows the rows, the pipes
and the reductions, not the learner's optimiser or policy.

Messages from rank 0 to the other ranks are the frozen dataclasses `LoadState`, `Update` and
`Stop`, pickled when sent.
Checkpoints are written by rank 0 alone. Threads: each rank updates with 1/N of the trainer's
torch threads (rank 0 only during the update; it samples and builds batches with all of them).

Faults: rank 0 looks at the ranks at each step's start (`dead`; `Run.check_learners` then writes a
checkpoint and stops with one line). A rank that dies during an update fails the collective at
once (gloo: connection closed by peer), one that hangs fails it after `train.learner_timeout_s`;
the run stops with one line naming the newest checkpoint (the update was half done, so no
checkpoint of it). A rank whose trainer has gone exits.
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from postrl.config.schema import Config
from postrl.errors import UserError
from postrl.extensions import load as load_extensions
from postrl.faults import crash_point
from postrl.learner.learner import Learner
from postrl.learner.sharded import end_group, refuse_a_default_group, start_group
from postrl.model.load import load_model
from postrl.model.lora import apply_lora
from postrl.records import Batch
from postrl.sampling.policy import Policy

_START = datetime.timedelta(seconds=600)
"""Longest wait for the ranks to start (import, load the model) and connect."""


@dataclass(frozen=True)
class LoadState:
    """Rank 0 -> the other ranks: its model weights and `Learner.state_dict()` (None: the weights
    only), on the CPU."""

    weights: dict[str, torch.Tensor]
    learner: dict | None


@dataclass(frozen=True)
class Update:
    """Rank 0 -> the other ranks: the same `Learner.update` call, the batch on the CPU."""

    batch: Batch
    kl_coef: float
    generator_state: torch.Tensor
    """The update's generator's state: every rank draws the same minibatch order."""


@dataclass(frozen=True)
class Stop:
    """Rank 0 -> the other ranks: the run is over, exit."""


@dataclass(frozen=True)
class GatherState:
    """Rank 0 -> the other sharded ranks: gather the optimiser's state whole with rank 0 (a checkpoint)."""


@dataclass(frozen=True)
class ScaleLR:
    """Rank 0 -> the other sharded ranks: `Learner.scale_lr(factor)` (a rollback's)."""

    factor: float


class Ranks:
    """What `Learner.update` needs on any rank: its share of the rows and the reductions. On rank 0
    it also holds the other ranks (`peers`) and sends them each update."""

    def __init__(self, rank: int, world: int, group, threads: int, peers: list | None = None, where: str = "",
                 sharded: bool = False, device: torch.device | str = "cpu"):
        self.rank, self.world, self.group, self.threads = rank, world, group, threads
        self.device = torch.device(device)
        """Where this rank's collectives' tensors live (NCCL: its CUDA device)."""
        self.sharded = sharded
        """`train.shard: fsdp` (`postrl.learner.sharded`): the learner shards its model over the
        default process group; this group carries the statistics."""
        self.peers = peers or []
        """Rank 0: (process, order queue) of ranks 1..N-1. A put never blocks (a feeder thread
        writes the pipe), so a rank that hangs fails the collective after the timeout instead of
        holding up rank 0 here."""
        self.where = where
        """Rank 0: the run directory, for the message that tells how to resume."""
        self._threads_before = 0

    # -- rank 0
    def send_state(self, weights: dict[str, torch.Tensor], learner_state: dict) -> None:
        """Rank 0: its model weights and `Learner.state_dict()` to every rank, ahead of the next update."""
        self._send(LoadState(*_cpu((weights, learner_state))))

    def gather_state(self) -> None:
        """Rank 0, sharded: every rank joins the gather of the optimiser's state that rank 0 starts next."""
        self._send(GatherState())

    def scale_lr(self, factor: float) -> None:
        """Rank 0, sharded: every rank scales its learning rate as rank 0 just did."""
        self._send(ScaleLR(factor))

    def begin(self, batch: Batch, kl_coef: float, generator: torch.Generator) -> None:
        """Rank 0: send the update to every rank, and take its share of the threads until `end`."""
        if self.rank != 0:
            return
        self._send(Update(_batch_to(batch, "cpu"), kl_coef, generator.get_state()))
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(self.threads)

    def end(self) -> None:
        if self.rank == 0 and self._threads_before:
            torch.set_num_threads(self._threads_before)

    def dead(self) -> list[tuple[int, int | None]]:
        """(rank, exit code) of every rank that is not running."""
        return _dead(self.peers)

    def _send(self, message: LoadState | Update | Stop | GatherState | ScaleLR) -> None:
        data = pickle.dumps(message)  # now: the optimiser's state changes in place during the update
        for _, orders in self.peers:
            orders.put(data)

    def close(self) -> None:
        self._send(Stop())
        for process, orders in self.peers:
            orders.cancel_join_thread()  # a dead rank never reads what is left: do not wait on it at exit
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        self.peers = []
        if self.sharded:
            end_group()

    # -- every rank
    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a minibatch's rows (empty when there are fewer rows than ranks)."""
        return rows.tensor_split(self.world)[self.rank]

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        """Every rank's gradients summed into each `params`' .grad (a missing one counts as zeros):
        one all-reduce per dtype over a flat buffer."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for group in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            self._all_reduce(flat, dist.ReduceOp.SUM)
            for p, g in zip(group, flat.split([p.numel() for p in group])):
                p.grad.copy_(g.view_as(p.grad))

    def most(self, count: int) -> int:
        """The largest of the ranks' `count`s."""
        top = torch.tensor([count], dtype=torch.float64, device=self.device)
        self._all_reduce(top, dist.ReduceOp.MAX)
        return int(top)

    def sum_stats(self, totals: dict[str, float], kl_max: float, sample_entropy: torch.Tensor,
                  memory: dict[str, float]) -> float:
        """Loss terms summed into `totals` (not the gradient norm "gn": every rank has the same), each
        row's entropy into `sample_entropy` (each row is one rank's), the ranks' largest `memory`
        figures into it, and the largest KL, returned."""
        keys = sorted(k for k in totals if k != "gn")
        flat = torch.tensor([totals[k] for k in keys], dtype=torch.float64, device=sample_entropy.device)
        self._all_reduce(flat, dist.ReduceOp.SUM)
        totals.update(zip(keys, flat.tolist()))
        self._all_reduce(sample_entropy, dist.ReduceOp.SUM)
        names = sorted(memory)
        top = torch.tensor([kl_max] + [memory[k] for k in names], dtype=torch.float64, device=self.device)
        self._all_reduce(top, dist.ReduceOp.MAX)
        memory.update(zip(names, top[1:].tolist()))
        return float(top[0])

    def check_same(self, params: list[torch.Tensor]) -> None:
        """Every rank holds the same `params` (a float64 sum of each, compared by MAX and MIN):
        the invariant of data parallelism, checked after every update."""
        digest = torch.stack([p.detach().double().sum() for p in params])
        low, high = -digest, digest.clone()
        self._all_reduce(low, dist.ReduceOp.MAX)
        self._all_reduce(high, dist.ReduceOp.MAX)
        if not torch.equal(-low, high):
            raise RuntimeError(f"learner rank {self.rank}: the ranks' parameters differ after the update "
                               f"({int((-low != high).sum())} of {len(params)} tensors)")

    def _all_reduce(self, tensor: torch.Tensor, op) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = op
        try:
            self.group.allreduce([tensor], options).wait()
        except RuntimeError as e:  # a rank died (connection closed) or hung (timeout)
            if self.rank != 0:
                raise
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            raise self._lost(f"the collective failed: {reason[:300]}") from None

    def _lost(self, why: str) -> UserError:
        for process, _ in self.peers:
            process.join(timeout=2)  # a rank that just died: its exit code
        dead = ", ".join(f"rank {r} (exit code {code})" for r, code in self.dead()) or "a learner rank"
        self.close()
        return UserError(f"{dead} stopped during the update; {why}. The update was not finished, so the "
                         f"newest checkpoint is where the run continues: postrl train --resume {self.where}")


def start_learners(cfg: Config, model_path: str, device: torch.device, run_dir, correction: str,
                   log=print) -> Ranks:
    """Start ranks 1..N-1, each loading the model at `model_path` (the run's `model.name`,
    resolved) and learning with rollout correction `correction` (rank 0's resolved
    `rl.rollout_correction.mode`: a pure function of the batch), and connect them; returns rank
    0's `Ranks` (this process, the model on `device`), for the learner built next."""
    world = cfg.train.learners
    if cfg.train.shard == "fsdp":
        refuse_a_default_group()  # before any rank starts
    if device.type == "cuda" and torch.cuda.device_count() < world:
        raise UserError(f"train.learners {world}: needs {world} CUDA devices, {torch.cuda.device_count()} found")
    timeout = datetime.timedelta(seconds=cfg.train.learner_timeout_s)
    store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=_START, wait_for_workers=False)
    threads = max(1, torch.get_num_threads() // world)
    ctx = mp.get_context("spawn")
    peers = []
    for rank in range(1, world):
        orders = ctx.Queue()
        rank_device = f"cuda:{rank}" if device.type == "cuda" else str(device)
        process = ctx.Process(target=learner_main, name=f"postrl-learner-{rank}", daemon=True,
                              args=(rank, world, store.port, model_path, cfg, threads, rank_device, orders,
                                    os.getpid(), correction))
        process.start()
        peers.append((process, orders))
    _wait_ready(store, peers)
    group = _process_group(store, 0, world, device, timeout)
    sharded = cfg.train.shard == "fsdp"
    if sharded:
        start_group(store, 0, world, device, timeout)
    log(f"learner: {world} data-parallel ranks ({'nccl' if device.type == 'cuda' else 'gloo'}, "
        f"{'parameters, gradients and optimiser state sharded (FSDP2)' if sharded else 'replicated'}, "
        f"{threads} torch threads each during the update)")
    return Ranks(0, world, group, threads, peers, where=str(run_dir), sharded=sharded, device=device)


def learner_main(rank: int, world: int, port: int, model_path: str, cfg: Config, threads: int, device: str,
                 orders, parent: int, correction: str) -> None:
    """A learner rank: the trainer's updates, until it sends `Stop` or is gone."""
    load_extensions(cfg.imports)
    torch.set_num_threads(threads)
    timeout = datetime.timedelta(seconds=cfg.train.learner_timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world, False, timeout=_START)
    model, tok = load_model(model_path, cfg.model.dtype, log=lambda *a: None)
    model = apply_lora(model, cfg.model.lora).to(device)
    store.set(f"ready/{rank}", "1")  # loaded: the group forms now, and its collectives wait `timeout` at most
    group = _process_group(store, rank, world, torch.device(device), timeout)
    sharded = cfg.train.shard == "fsdp"
    if sharded:
        start_group(store, rank, world, torch.device(device), timeout)
    ranks = Ranks(rank, world, group, threads, sharded=sharded, device=device)
    learner = Learner(Policy(model, tok), None, cfg.train, cfg.rl, cfg.model, is_cap=cfg.pipeline.is_cap,
                      proximal=cfg.pipeline.proximal, ranks=ranks, correction=correction)
    try:
        while (data := next_order(orders, parent)) is not None:  # None: the trainer has gone
            msg = pickle.loads(data)
            if isinstance(msg, Stop):
                return
            if isinstance(msg, LoadState):
                learner.load_rank_state(msg.weights, msg.learner)
            elif isinstance(msg, GatherState):
                learner.full_optimizer_state()  # rank 0 keeps the gathered state
            elif isinstance(msg, ScaleLR):
                learner.scale_lr(msg.factor)
            elif isinstance(msg, Update):
                crash_point("learner.update")  # recovery tests: a rank dies with an update in hand
                generator = torch.Generator()
                generator.set_state(msg.generator_state)
                learner.update(_batch_to(msg.batch, device), msg.kl_coef, generator)
            else:
                raise TypeError(f"learner rank {rank}: unknown message {type(msg).__name__}")
    except Exception:
        traceback.print_exc()  # rank 0 sees the failed collective and says which rank stopped
        raise SystemExit(1) from None
    finally:
        end_group()


def _wait_ready(store, peers: list) -> None:
    """Until every rank has loaded its model (each sets ready/<rank>), or one has died starting."""
    keys = [f"ready/{r}" for r in range(1, len(peers) + 1)]
    deadline = time.monotonic() + _START.total_seconds()
    while not store.check(keys):
        dead = _dead(peers)
        if dead or time.monotonic() > deadline:
            for p, _ in peers:
                p.kill()
            what = ", ".join(f"rank {r} exited with code {code}" for r, code in dead) or \
                f"not all ranks started within {_START.total_seconds():.0f} s"
            raise UserError(f"train.learners {len(peers) + 1}: the learner ranks did not start: {what} "
                            f"(its error is printed above)")
        time.sleep(0.05)


def _dead(peers: list) -> list[tuple[int, int | None]]:
    """(rank, exit code) of each of `peers` (ranks 1..N-1: process, queue) that is not running."""
    return [(r, p.exitcode) for r, (p, _) in enumerate(peers, start=1) if not p.is_alive()]


def _process_group(store, rank: int, world: int, device: torch.device, timeout: datetime.timedelta):
    """A process group of its own (not torch.distributed's default one): a run in a process that
    has another group, or several runs one after another in one process, do not meet."""
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        torch.cuda.set_device(device)
        return dist.ProcessGroupNCCL(store, rank, world, options)
    return dist.ProcessGroupGloo(store, rank, world, timeout)


def next_order(orders, parent: int):
    """The next message from the trainer's queue, or None when told to stop or the trainer
    (process `parent`) has gone: what a learner rank and a sampler process wait on."""
    while True:
        try:
            return orders.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None
        except (EOFError, OSError):
            return None


def _batch_to(batch: Batch, device) -> Batch:
    return Batch(**{f.name: None if (t := getattr(batch, f.name)) is None else t.to(device)
                    for f in dataclasses.fields(batch)})


def _cpu(obj):
    """`obj` with every tensor in it copied to the CPU (it goes through a pipe)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj

