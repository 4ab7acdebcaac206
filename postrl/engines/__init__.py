"""Where rollouts run, by name (`engine:` in the config).

    engine = ENGINES.get(cfg.engine)(run)   # local | ray
    engine.submit(step, tasks, temps); engine.take(step); engine.state_dict(); engine.close()

Both are `postrl.engines.pipeline.Pipeline`s, so the training loop is the same code for both.
Each factory imports its engine when called: Ray is only imported by runs that use it.
"""

from __future__ import annotations

from postrl.algo.registry import Registry

ENGINES = Registry("engine")


@ENGINES.register("local")
def local(run):
    """In this process: inline at max_staleness 0, rollout threads above."""
    from postrl.engines.pipeline import make_local_engine

    return make_local_engine(run)


@ENGINES.register("ray")
def ray(run):
    """Rollout, reward and sandbox actors on a Ray cluster (local unless ray.address is set)."""
    from postrl.engines.ray_engine import RayEngine

    return RayEngine(run)
