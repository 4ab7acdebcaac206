"""engine: local. The pipeline in this process: inline at max_staleness 0 (the synchronous loop,
on the trainer's own model), in threads on a copy of the model above it. Both run each order
through `postrl.engines.orders.run_order`, and keep their books in the `Pipeline` base.
"""

from __future__ import annotations

import copy
import queue
import threading

import torch

from postrl.config.schema import Config
from postrl.engines.orders import LocalScorer, Order, Pending, Rollout, reward_terms, run_order
from postrl.engines.pipeline import Pipeline
from postrl.sampling.policy import Policy


class InlineEngine(Pipeline):
    """max_staleness 0 in this process: the order runs when it is taken, on the trainer's own model.
    This is the synchronous loop; no copy of the model. Finished groups are graded by a scoring
    thread while the rest of the batch is generated (`run_order`)."""

    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print):
        super().__init__(policy, domains, cfg, log)
        self.scorer = LocalScorer(domains, reward_terms(cfg))

    def _start(self, order: Order) -> Order:
        return order

    def _wait(self, order: Order) -> Rollout:
        return run_order(self.policy, order, self.cfg, self.scorer, self.domains).result()

    def close(self) -> None:
        self.scorer.close()


class ThreadedEngine(Pipeline):
    """Rollouts in two threads of this process, on a copy of the model: one samples orders in turn,
    the other scores groups as they finish (`run_order`), so grading overlaps the rest of the
    batch, the next batches, and the trainer. torch releases the GIL inside its kernels, so the
    threads run in parallel; with `split_cores` torch's intra-op threads are halved while the
    engine runs (restored by close): two busy threads that each start a full OpenMP team would
    oversubscribe the cores. At most max_staleness + 1 orders are ever outstanding: that is the
    queue's bound."""

    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print, split_cores: bool = True):
        super().__init__(policy, domains, cfg, log)
        self._torch_threads = torch.get_num_threads()
        if split_cores:  # the trainer and the sampling thread each get half (scoring is light)
            torch.set_num_threads(max(1, self._torch_threads // 2))
        model = copy.deepcopy(policy.model).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.rollout_policy = Policy(model, policy.tok, policy.max_batch, rollout=cfg.rollout)
        self._loaded: dict | None = None  # the published weights the rollout model holds now
        self._published: tuple[int, dict] | None = None
        self._orders: queue.Queue = queue.Queue()
        self._results: dict[tuple[int, int], Pending | BaseException] = {}  # by order key
        self._epoch = 0  # bumped by _discard: results of older epochs are dropped
        self._cond = threading.Condition()
        self.scorer = LocalScorer(domains, reward_terms(cfg))
        self._threads = [threading.Thread(target=self._generate_loop, name="rollout-generate", daemon=True),
                         self.scorer.thread]
        self._threads[0].start()

    def _start(self, order: Order) -> tuple[int, int]:
        order.weights = self._publish()
        self._orders.put((self._epoch, order))
        return order.key

    def _publish(self) -> dict[str, torch.Tensor]:
        """A frozen copy of the trainer's weights, once per version: orders submitted between two
        updates share it, and the trainer's next in-place update does not touch it."""
        version = self.policy.version
        if self._published is None or self._published[0] != version:
            weights = {k: v.detach().clone() for k, v in self.policy.model.state_dict().items()}
            self._published = (version, weights)
        return self._published[1]

    def _generate_loop(self) -> None:
        while (item := self._orders.get()) is not None:
            epoch, order = item
            try:
                if self._loaded is not order.weights:  # once per published version
                    self.rollout_policy.load_weights(order.weights, order.version)
                    self._loaded = order.weights
                # delivered generated; its last groups may still be scoring while the next order samples
                self._deliver(epoch, order.key, run_order(self.rollout_policy, order, self.cfg, self.scorer,
                                                          self.domains))
            except BaseException as e:  # handed to the trainer, which raises it at take()
                self._deliver(epoch, order.key, e)

    def _deliver(self, epoch: int, key: tuple[int, int], result: Pending | BaseException) -> None:
        with self._cond:
            if epoch == self._epoch:
                self._results[key] = result
                self._cond.notify_all()

    def _wait(self, key: tuple[int, int]) -> Rollout:
        with self._cond:
            self._cond.wait_for(lambda: key in self._results)
            result = self._results.pop(key)
        try:
            if isinstance(result, BaseException):
                raise result
            return result.result()
        except BaseException as e:
            raise RuntimeError(f"rollout of step {key[0]} failed") from e

    def _ready(self, key: tuple[int, int]) -> bool:
        with self._cond:
            result = self._results.get(key)
        return isinstance(result, BaseException) or (result is not None and result.done())

    def _discard(self) -> None:
        with self._cond:
            self._epoch += 1
            self._results.clear()
        self._published = None  # a restored trainer may reuse a version number with other weights

    def close(self) -> None:
        self._orders.put(None)
        self._threads[0].join(timeout=60)
        self.scorer.close()
        self.rollout_policy.close()
        torch.set_num_threads(self._torch_threads)


def make_local_engine(policy: Policy, domains: dict, cfg: Config, log=print) -> Pipeline:
    """engine: local. max_staleness 0 runs inline (the synchronous loop); above, rollout threads.
    (pipeline.source=replay:RUN_DIR replays a stored run instead: `postrl.engines.replay`.)"""
    if cfg.pipeline.max_staleness == 0:
        return InlineEngine(policy, domains, cfg, log)
    return ThreadedEngine(policy, domains, cfg, log)
