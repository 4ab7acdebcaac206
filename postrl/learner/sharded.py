"""The sharded learner: `train.shard: fsdp` with `train.learners: N` (FSDP2, torch's `fully_shard`).

    start_group(store, rank, world, device, timeout)   # torch.distributed's default group: FSDP2's mesh needs it
    model = shard(model, device)        # each decoder layer a unit, then the root; 1/N of each parameter here
    loss.backward()                     # gradients reduce-scattered (summed): 1/N of each gradient here
    opt.step()                          # 1/N of the optimiser state here
    weights = gather(model, names)      # every rank: the full tensors (rank 0 hands them to its sampler)
    state = full_optimizer_state(opt)   # every rank: the optimiser's state_dict() with full tensors
    load_optimizer_state(opt, state)    # every rank: the full state cut to its shards

What it changes against the replicated learner (`postrl.learner.distributed`): each rank keeps
1/N of the parameters, gradients and optimiser state (Adam's two moments; with a bf16 model the
float32 master weights, which are the sharded parameters themselves, computed in bf16 through
FSDP2's mixed precision). A layer's full weights exist only while it runs forward or backward.
Rank 0 keeps its sampler's full model apart (`Policy.model`); the learner trains its own sharded
copy and writes the updated weights back into the sampler's model once per update, the only
time the weights are gathered whole.

The state a checkpoint holds is the same as the replicated learner's: the optimiser's
`state_dict()` in torch's format, tensors gathered whole (with bf16, `master_weights` as
`postrl.learner.precision.MasterAdamW` writes them). So a sharded run resumes with any N, and a
sharded checkpoint resumes a replicated run and back.

Gradients are summed across ranks, not averaged: each rank's loss is already weighted by its
share of the minibatch (see `postrl.learner.distributed`), as with the replicated learner. FSDP2
gathers weights inside every forward and backward, so every rank runs the same number of them:
a rank with fewer micro-batches than another runs zero-weight ones (`Learner._accumulate`).
"""

from __future__ import annotations

import copy
import datetime
import resource

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from postrl.errors import UserError
from postrl.model.fastlm import hf_model


def start_group(store, rank: int, world: int, device: torch.device, timeout: datetime.timedelta) -> None:
    """torch.distributed's default process group over `store` (FSDP2's device mesh is built on a
    group c10d knows; the replicated learner uses a group of its own). One run at a time in a process."""
    refuse_a_default_group()
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("postrl-fsdp", store), rank=rank, world_size=world,
                            timeout=timeout, device_id=device if device.type == "cuda" else None)


def refuse_a_default_group() -> None:
    """One line when this process already has torch.distributed's default group (`start_group`'s)."""
    if dist.is_initialized():
        raise UserError("train.shard fsdp: this process already has a torch.distributed default process group "
                        "(another run, or the caller's own); FSDP2 needs its own: end it first "
                        "(torch.distributed.destroy_process_group())")


def end_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def shard(model: torch.nn.Module, device: torch.device, copy_first: bool) -> torch.nn.Module:
    """`model` (a copy of it when `copy_first`: rank 0's sampler keeps the original) sharded across
    the default group: every decoder layer one FSDP2 unit, then the root (embeddings, final norm,
    head: tied weights stay in one unit). A model in bf16 or fp16 keeps float32 shards (the master
    weights) and computes in its own dtype; gradients are reduced in float32 and summed."""
    if copy_first:
        model = copy.deepcopy(model)
    inner = hf_model(model)  # peft: the HF model
    dtype = next(inner.parameters()).dtype
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    inner.float()
    for layer in decoder_layers(inner):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(inner, mesh=mesh, mp_policy=policy)
    for unit in inner.modules():
        if hasattr(unit, "set_gradient_divide_factor"):
            unit.set_gradient_divide_factor(1.0)  # a sum, as the replicated learner's all-reduce
            unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a causal LM: the `layers` ModuleList of a Llama-family model (or of
    any model with one), else the modules whose class ends in DecoderLayer or Block."""
    inner = getattr(model, "model", None)
    if isinstance(getattr(inner, "layers", None), torch.nn.ModuleList):
        return list(inner.layers)
    return [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]


def gather(model: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """The full tensors of `model`'s parameters `names` (a collective: every rank, the same names)."""
    params = dict(model.named_parameters())
    return {n: full(params[n].detach()) for n in names}


def full_optimizer_state(opt: torch.optim.Optimizer, masters: bool) -> dict:
    """`opt.state_dict()` with every sharded tensor gathered whole, on the CPU (a collective); with
    `masters` (the float32 shards of a low-precision model), `master_weights` too: the parameters."""
    state = opt.state_dict()
    state["state"] = {i: {k: full(v).cpu() for k, v in s.items()} for i, s in state["state"].items()}
    if masters:
        state["master_weights"] = [full(p.detach()).cpu() for group in opt.param_groups for p in group["params"]]
    return state


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """`full_optimizer_state`'s (or a replicated learner's) `state` into `opt`, each rank taking its
    shards; `master_weights`, when present, into the sharded parameters."""
    params = [p for group in opt.param_groups for p in group["params"]]
    state = dict(state)
    masters = state.pop("master_weights", None)
    state["state"] = {i: {k: _shard_like(v, params[i]) for k, v in s.items()} for i, s in state["state"].items()}
    opt.load_state_dict(state)
    if masters is not None:
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(_shard_like(m, p))


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Full `weights` (by parameter name) into the sharded `model`'s parameters, each rank its shards."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in weights:
                p.copy_(_shard_like(weights[name], p))


def memory_mib(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    """This rank's learner memory: the bytes of its parameters, gradients and optimiser state (its
    shards of them when sharded), and the process's peak (CUDA: allocated; CPU: resident set,
    which includes the libraries and, on rank 0, the sampler's model)."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    if hasattr(opt, "model_params"):  # MasterAdamW: its float32 masters
        tensors += [p for group in opt.param_groups for p in group["params"]]
    state = sum(_local(t).numel() * t.element_size() for t in tensors)
    device = next(model.parameters()).device
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"learner/state_mib": state / 2**20, "learner/peak_mib": peak / 2**20}


def full(t: torch.Tensor) -> torch.Tensor:
    """`t` whole: a DTensor gathered (a collective), anything else as is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`value` (full) cut like the sharded `param` (a DTensor of the same shape); anything else as is."""
    if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape:
        # src_data_rank None: every rank holds `value` whole and cuts its own shards, no collective
        return distribute_tensor(value.to(param.device, param.dtype), param.device_mesh, param.placements,
                                 src_data_rank=None)
    return value
