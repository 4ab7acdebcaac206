"""Bradley-Terry reward model trained on preference pairs, usable as a reward term.

    pairs = load_pairs("postrl/data/prefs_sorted.jsonl")          # prompt, chosen, rejected
    rm, report = train_reward_model(pairs, out_dir="runs/rm")     # report["heldout_accuracy"]
    rm = RewardModel.load("runs/rm"); rm.score(["sort: cab"], ["abc"])
    register_rm_term("rm", "runs/rm")   # then `reward: {rm: 1.0}` in a recipe

The model is a Hugging Face `LlamaForSequenceClassification` with one output (the scalar head
reads the last real token), trained from scratch here with a character-level tokenizer
(`postrl.policy.chartok`) so that nothing is downloaded; the saved directory is a standard HF
model directory. Loss: -log sigmoid(r(chosen) - r(rejected)) (Bradley-Terry), so only
differences of scores carry meaning; as a reward term the score is squashed with a sigmoid to
keep the reward bounded in (0, 1).

The held-out split is by prompt (a hash of it), so no held-out prompt is seen in training.

The shipped preference set (`postrl/data/prefs_sorted.jsonl`, made by `make_preferences`)
encodes a property anyone can check: for the prompt "sort: <letters>", the preferred response
is the letters in alphabetical order; the rejected one is out of order or not the same letters.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from postrl.errors import UserError
from postrl.policy.chartok import build_char_tokenizer
from postrl.rewards.jsonl import read_jsonl
from postrl.rewards.terms import TERMS, register_term

SEP = "\n"
"""Between prompt and response in the model's input."""
MAX_CHARS = 256
"""Inputs are truncated to their last MAX_CHARS characters (the response end matters most)."""


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def make_preferences(n: int, seed: int = 0, letters: str = "abcdefgh") -> list[Pair]:
    """Pairs whose preferred response is the prompt's letters sorted. The rejected one is, in
    equal shares, the letters with one adjacent swap, shuffled, or sorted but with one letter
    replaced (so order alone does not decide: the response must also match the prompt)."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
        chosen = "".join(sorted(word))
        wrong = list(chosen)
        kind = rng.random()
        if kind < 1 / 3:  # one adjacent swap: out of order
            i = rng.randrange(len(wrong) - 1)
            wrong[i], wrong[i + 1] = wrong[i + 1], wrong[i]
        elif kind < 2 / 3:  # shuffled: out of order
            rng.shuffle(wrong)
        else:  # in order, but one letter is not the prompt's: unfaithful
            wrong[rng.randrange(len(wrong))] = rng.choice(letters)
            wrong.sort()
        rejected = "".join(wrong)
        if rejected != chosen:
            pairs.append(Pair(f"sort: {word}", chosen, rejected))
    return pairs


def is_sorted_answer(prompt: str, response: str) -> bool:
    """The property the shipped preferences encode (for checking a trained model)."""
    word = prompt.removeprefix("sort: ")
    return response == "".join(sorted(word))


def load_pairs(path: str | Path) -> list[Pair]:
    rows = read_jsonl(path, {"prompt": str, "chosen": str, "rejected": str})
    return [Pair(r["prompt"], r["chosen"], r["rejected"]) for r in rows]


def split_pairs(pairs: list[Pair], heldout_fraction: float) -> tuple[list[Pair], list[Pair]]:
    """(train, heldout), split by a hash of the prompt so that a prompt is on one side only."""
    def bucket(p: Pair) -> float:
        return int(hashlib.sha256(p.prompt.encode()).hexdigest()[:8], 16) / 16**8

    train = [p for p in pairs if bucket(p) >= heldout_fraction]
    heldout = [p for p in pairs if bucket(p) < heldout_fraction]
    return train, heldout


class RewardModel:
    def __init__(self, model: LlamaForSequenceClassification, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"

    @classmethod
    def create(cls, alphabet: str, seed: int = 0, hidden: int = 64, layers: int = 2) -> RewardModel:
        torch.manual_seed(seed)
        tok = build_char_tokenizer(alphabet + SEP)
        config = LlamaConfig(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=MAX_CHARS + 8, num_labels=1,
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )
        return cls(LlamaForSequenceClassification(config), tok)

    @classmethod
    def load(cls, path: str | Path) -> RewardModel:
        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"{path}: not a reward model directory (no config.json)")
        model = LlamaForSequenceClassification.from_pretrained(path)
        return cls(model.eval(), AutoTokenizer.from_pretrained(path))

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def logits(self, prompts: list[str], responses: list[str]) -> torch.Tensor:
        texts = [(p + SEP + r)[-MAX_CHARS:] for p, r in zip(prompts, responses, strict=True)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True)
        return self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]  # [B]

    @torch.no_grad()
    def score(self, prompts: list[str], responses: list[str], batch_size: int = 64) -> list[float]:
        """Raw Bradley-Terry scores (higher = preferred)."""
        self.model.eval()
        out: list[float] = []
        for i in range(0, len(prompts), batch_size):
            out += self.logits(prompts[i : i + batch_size], responses[i : i + batch_size]).tolist()
        return out


def pairwise_accuracy(rm: RewardModel, pairs: list[Pair]) -> float:
    """Fraction of pairs where the chosen response scores strictly higher."""
    if not pairs:
        return float("nan")
    chosen = rm.score([p.prompt for p in pairs], [p.chosen for p in pairs])
    rejected = rm.score([p.prompt for p in pairs], [p.rejected for p in pairs])
    return sum(c > r for c, r in zip(chosen, rejected)) / len(pairs)


def train_reward_model(
    pairs: list[Pair],
    out_dir: str | Path | None = None,
    *,
    steps: int = 400,
    batch_size: int = 32,
    lr: float = 2e-3,
    heldout_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[RewardModel, dict]:
    """Train from scratch; returns the model and a report with held-out pairwise accuracy."""
    train, heldout = split_pairs(pairs, heldout_fraction)
    if not train:
        raise UserError("no training pairs left after the held-out split")
    alphabet = "".join(sorted({c for p in pairs for c in p.prompt + p.chosen + p.rejected}))
    rm = RewardModel.create(alphabet, seed=seed)
    opt = torch.optim.AdamW(rm.model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    rng = random.Random(seed)
    rm.model.train()
    losses = []
    for _ in range(steps):
        batch = rng.sample(train, min(batch_size, len(train)))
        prompts = [p.prompt for p in batch]
        # chosen and rejected in one forward pass: [2B] -> [B] margins
        r = rm.logits(prompts + prompts, [p.chosen for p in batch] + [p.rejected for p in batch])
        loss = -torch.nn.functional.logsigmoid(r[: len(batch)] - r[len(batch) :]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    report = {
        "train_pairs": len(train),
        "heldout_pairs": len(heldout),
        "steps": steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_accuracy": pairwise_accuracy(rm, train[:500]),
        "heldout_accuracy": pairwise_accuracy(rm, heldout),
    }
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        rm.save(out_dir)
        (Path(out_dir) / "rm_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return rm, report


def register_rm_term(name: str, model_dir: str | Path) -> RewardModel:
    """Register a trained reward model as the reward term `name` (sigmoid of its score)."""
    rm = RewardModel.load(model_dir)

    def term(tasks, responses) -> list[float]:
        raw = rm.score([t.prompt for t in tasks], [r.text for r in responses])
        return [1.0 / (1.0 + math.exp(-s)) for s in raw]

    TERMS.remove(name)  # a run registers its reward models afresh (the Ray reward actor, a test)
    register_term(name)(term)
    return rm
