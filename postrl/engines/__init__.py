"""Where rollouts run: each step's prompts are sampled and scored by an engine, now or ahead of the
trainer. `registry` names them (`engine:` in the config), `pipeline` holds the order bookkeeping
and the local engines, `ray_engine` the Ray one, `replay` trains on a stored run's rollouts.

An engine knows the policy, the domains, the config and a log; it does not know the run or the
loop, and never calls back into them."""
