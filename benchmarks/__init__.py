"""The benchmarks: scripts, run as `python benchmarks/NAME.py`, never imported as this package. This
file makes the directory a package for import-linter only (pyproject.toml's benchmarks contract)."""
