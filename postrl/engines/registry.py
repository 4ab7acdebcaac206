"""Engines by name (`engine:` in the config).

    engine = ENGINES.get(cfg.engine)(policy, domains, cfg, log)   # local | ray
    engine.submit(step, tasks); engine.take(step); engine.resample(step, round, tasks)
    engine.state_dict(); engine.close()

Both are `postrl.engines.pipeline.Pipeline`s, so the training loop is the same code for both.
Each factory imports its engine when called: Ray is only imported by runs that use it.
"""

from __future__ import annotations

import importlib.util

from postrl.errors import UserError
from postrl.registry import Registry

ENGINES = Registry("engine", key="engine")


@ENGINES.register("local")
def local(policy, domains, cfg, log):
    """In this process: inline at max_staleness 0, rollout threads above; with pipeline.samplers N,
    N sampler processes; with pipeline.source=replay:RUN_DIR, a stored run's rollouts instead of
    sampling."""
    if cfg.pipeline.source:
        from postrl.engines.replay import ReplayEngine

        return ReplayEngine(policy, domains, cfg, log)
    if cfg.pipeline.samplers:
        from postrl.engines.processes import ProcessEngine

        return ProcessEngine(policy, domains, cfg, log)
    from postrl.engines.local import make_local_engine

    return make_local_engine(policy, domains, cfg, log)


@ENGINES.register("ray")
def ray(policy, domains, cfg, log):
    """Rollout, reward and sandbox actors on a Ray cluster (local unless ray.address is set)."""
    if importlib.util.find_spec("ray") is None:
        raise UserError("engine: ray needs Ray, which is not installed: pip install 'postrl[ray]'")
    from postrl.engines.ray_engine import RayEngine

    return RayEngine(policy, domains, cfg, log)
