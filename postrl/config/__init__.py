"""The typed config tree a run reads, by concern: YAML recipes and dotted command-line overrides load into it.

    from postrl.config.loading import load_config
    cfg = load_config("recipes/default.yaml", ["rl.kl_coef=0.02", "train.total_steps=10"])

- `schema`: the tree itself, one dataclass a section (`model:`, `train:`, `rl:`, ...) and `Config`
  above them; each field's docstring-style comment is its help text (the config reference in
  docs/config.md is generated from them), and a few queries of a loaded tree.
- `fields`: what a field's value may be beyond its type (`ranged`, `Choice`, `NonEmpty`), declared
  beside the field and checked as the tree is built.
- `loading`: recipe files, dotted overrides, building the tree from a mapping (types coerced,
  unknown keys named with the closest valid one), saving it as a run's `config.yaml`.
- `checks`: the checks that span fields (`validate`), run once by `load_config`.

An unknown key, a wrong type or a value out of range raises `ConfigError` with one line naming the
key. Values that name a registered thing (a domain, a loss, a schedule, ...) are checked by
`postrl.names.check_names`: this package knows no registry and imports nothing of postrl but the
errors, the monitors' settings (`postrl.monitor.settings`, import-free) and the atomic writer
(`files`). This `__init__` imports none of its modules (docs/architecture.md).
"""
