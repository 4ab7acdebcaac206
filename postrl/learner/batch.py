"""A step's samples as the learner's tensors: padded rows, micro-batches, log-probs written into them.

    ids, attn, loss_mask, old = padded_rows(samples, pad_id)       # [B, T] and [B, T-1], on the CPU
    micros = micro_batches(rows, attn, size, budget, packed)       # model.micro_batch_size, train.max_tokens_per_microbatch
    out = logprobs_into(model, micros, ids, attn, loss_mask, temps, out, pack, chunk_mib)

Position t of the [B, T-1] masks predicts token t+1. `Learner.build_batch` assembles a batch with
these, and a sampler process (`pipeline.reference: sampler`) computes its order's reference
log-probs with `reference_logprobs`, the very same calls, so both get the same numbers.
"""

from __future__ import annotations

import torch

from postrl.config.schema import ModelConfig, TrainConfig
from postrl.model.logprobs import token_logprobs
from postrl.records import Sample


def padded_rows(samples: list[Sample], pad: int):
    """Right-padded prompt+completion rows on the CPU: ids, attention [B, T]; loss mask and
    behaviour log-probs [B, T-1], where position t predicts token t+1 (the mask is 0 on the
    observation tokens of multi-turn samples, `Sample.loss_mask`). Rows are padded as lists and
    made into each tensor in one call: a slice assignment per row costs more than the row."""
    rows = [s.prompt_ids + s.completion_ids for s in samples]
    width = max(map(len, rows))
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], dtype=torch.long, device="cpu")
    attn = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], dtype=torch.long, device="cpu")
    # a multi-turn episode's observation tokens (tool results, feedback) are context, not
    # actions: masked out of the loss and the KL like the prompt
    masks = [[1.0] * len(s.completion_ids) if s.loss_mask is None else s.loss_mask for s in samples]
    loss_mask = completion_rows(samples, masks, width - 1)
    old = completion_rows(samples, [s.logprobs for s in samples], width - 1)
    return ids, attn, loss_mask, old


def completion_rows(samples: list[Sample], values: list[list[float]], width: int) -> torch.Tensor:
    """[B, width] zeros with each sample's per-completion-token values at its completion's
    positions: position t predicts token t+1, so a completion's values start at len(prompt) - 1."""
    rows = []
    for s, v in zip(samples, values):
        start = len(s.prompt_ids) - 1
        rows.append([0.0] * start + list(v) + [0.0] * (width - start - len(v)))
    return torch.tensor(rows, dtype=torch.float32, device="cpu")


def check_whole_groups(groups: list[int], size: int) -> None:
    """A ValueError unless `groups` (each sample's `Sample.group`, in batch order) are whole groups of
    `size` samples, each group's samples contiguous: the advantages view the rewards as [G, size]."""
    chunks = [groups[i : i + size] for i in range(0, len(groups), size)]
    firsts = [chunk[0] for chunk in chunks]
    if len(groups) % size == 0 and all(g == chunk[0] for chunk in chunks for g in chunk) \
            and len(set(firsts)) == len(firsts):
        return
    shown = ", ".join(map(str, groups[:32])) + (", ..." if len(groups) > 32 else "")
    raise ValueError(f"a batch must hold whole groups of train.samples_per_prompt = {size} samples, each group's "
                     f"samples contiguous; got {len(groups)} samples of groups {shown}")


def completion_length(sample: Sample) -> int:
    """Tokens of a completion as the soft overlong penalty counts them: all of a single turn's; an
    episode's longest model turn (each turn is cut at max_new_tokens on its own)."""
    if sample.episode is None:
        return len(sample.completion_ids)
    return max((t.tokens for t in sample.episode.turns if t.role == "assistant"), default=0)


def micro_batches(mb: torch.Tensor, attention_mask: torch.Tensor, size: int, budget: int,
                  packed: bool) -> list[torch.Tensor]:
    """`mb`'s rows in order, cut into micro-batches of at most `size` rows (`model.micro_batch_size`,
    0 = no limit) and `budget` tokens (`train.max_tokens_per_microbatch`: the forward's tokens,
    padded rows x longest row, or the rows' sum when packed); a row over the budget alone makes a
    micro-batch."""
    size = size or len(mb)
    if not budget:
        return [mb[i : i + size] for i in range(0, len(mb), size)]
    lengths = attention_mask[mb].sum(-1).tolist()
    out, start = [], 0
    for end in range(1, len(mb) + 1):
        span = lengths[start:end]
        cost = sum(span) if packed else len(span) * max(span)
        if end - start > 1 and (end - start > size or cost > budget):
            out.append(mb[start : end - 1])
            start = end - 1
    out.append(mb[start:])
    return out


@torch.no_grad()
def logprobs_into(model, micros: list[torch.Tensor], ids, attn, loss_mask, temps, out: torch.Tensor, pack: bool,
                  chunk_mib: float) -> torch.Tensor:
    """`out` with `model`'s log-probs of the completion tokens written into the rows of `micros`, one
    micro-batch at a time (a forward over the whole batch is a memory spike with a large
    vocabulary), each cut to its longest row."""
    for micro in micros:
        width = int(attn[micro].sum(-1).max())
        logp, _ = token_logprobs(model, ids[micro, :width], attn[micro, :width], temps[micro],
                                 needed=loss_mask[micro, : width - 1], pack=pack, chunk_mib=chunk_mib)
        out[micro, : width - 1] = logp * loss_mask[micro, : width - 1]
    return out


def reference_logprobs(ref_model, samples: list[Sample], pad_id: int, train: TrainConfig, model_cfg: ModelConfig,
                       device: torch.device) -> list[list[float]]:
    """Each sample's reference log-probs over its completion, computed exactly as
    `Learner.build_batch` computes them for a batch of these samples in this order. A sampler
    process calls this on its order (`pipeline.reference: sampler`), so a batch made of one order
    gets the very numbers the learner would have computed."""
    ids, attn, loss_mask, old = (t.to(device) for t in padded_rows(samples, pad_id))
    temps = torch.tensor([s.temperature for s in samples], device=device)
    rows = torch.arange(len(samples), device=device)
    micros = micro_batches(rows, attn, model_cfg.micro_batch_size, train.max_tokens_per_microbatch,
                           train.pack_sequences)
    out = logprobs_into(ref_model, micros, ids, attn, loss_mask, temps, torch.zeros_like(old),
                        pack=train.pack_sequences, chunk_mib=model_cfg.logits_chunk_mib).cpu()
    return [out[i, len(s.prompt_ids) - 1 : len(s.prompt_ids) - 1 + len(s.completion_ids)].tolist()
            for i, s in enumerate(samples)]
