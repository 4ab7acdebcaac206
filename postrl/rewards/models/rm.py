"""Bradley-Terry reward models: a scalar head on a causal LM backbone, trained on preference pairs.

    pairs = load_pairs("prefs.jsonl")                              # TRL format (postrl.rewards.models.preferences)
    rm = RewardModel.from_backbone("runs/demo/final", lora_r=8)    # any HF causal LM directory or GGUF file
    rm, report = train_reward_model(pairs, "runs/rm", rm=rm)      # report["heldout_accuracy"]
    rm = RewardModel.load("runs/rm"); rm.score(["2+2="], ["4"])
    register_rm_term("rm", "runs/rm")   # then `reward: {rm: 1.0}` in a recipe; or `verifier: rm:runs/rm`

The model is the backbone's `AutoModelForSequenceClassification` (one label): the causal LM's
decoder with a linear head in place of the vocabulary head. The head reads the hidden state of the
last real (non-pad) token; inputs are right-padded, and cut from the left to `max_length` tokens
(the end of the reply matters most). Loss: -log sigmoid(r(chosen) - r(rejected)) (Bradley-Terry),
so only differences of scores carry meaning; as a reward the score is squashed with a sigmoid to
keep it in (0, 1). With `lora_r` > 0 the backbone is frozen and LoRA adapters (peft) train with the
head; without, every weight trains.

A prompt and a reply are rendered as TRL does: text by plain concatenation (`prompt + reply`),
chat messages through the tokenizer's chat template (a tokenizer without one: `role: content`
lines). The saved directory is a standard Hugging Face model directory
(`AutoModelForSequenceClassification.from_pretrained` loads it; LoRA adapters merged in, and kept
in `adapter/`), plus `postrl_rm.json` (how inputs are rendered, the scoring micro-batch size,
the backbone it came from) and `rm_report.json`.

The character-level model of earlier versions (`RewardModel.create`, trained from scratch on the
shipped "sorted letters" set, `postrl rm train` without `--backbone`) is the same class with a
fresh 2-layer Llama and `sep="\\n"` between prompt and reply; its directories (no postrl_rm.json)
still load.

The held-out split is by prompt (a hash of it), so no held-out prompt is seen in training.
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForSequenceClassification,
)

from postrl.errors import UserError
from postrl.model.chartok import build_char_tokenizer
from postrl.rewards.models.preferences import Pair, Text, load_pairs, split_pairs  # noqa: F401  (load_pairs, split_pairs: the API)
from postrl.rewards.terms import TERMS, register_term

META_FILE = "postrl_rm.json"
MAX_CHARS = 256
"""The character-level model's context: its inputs are cut to their last MAX_CHARS characters."""


@dataclass
class RmMeta:
    """How a reward model reads its inputs; saved as postrl_rm.json beside the weights."""

    sep: str = ""
    """Between a text prompt and a text reply ("" = TRL's plain concatenation; the char model: newline)."""
    max_length: int = 512
    """Longest input in tokens; longer ones keep their last max_length tokens."""
    score_batch_size: int = 16
    """Inputs per forward pass when scoring (a run's rewards, reward-check)."""
    backbone: str = ""
    """The causal LM it was built on ('' = trained from scratch)."""
    lora_r: int = 0
    """LoRA rank it was trained with (0 = every weight trained)."""


class RewardModel:
    def __init__(self, model, tokenizer, meta: RmMeta | None = None, peft_model=None):
        self.model = model
        """The sequence-classification model; with LoRA, the one peft injected its adapters into."""
        self.tokenizer = tokenizer
        self.meta = meta or RmMeta(sep="\n", max_length=MAX_CHARS + 1)
        self.peft_model = peft_model
        """The peft wrapper while LoRA adapters are trained (None otherwise)."""

    # -- building, loading, saving ----------------------------------------------------------------

    @classmethod
    def create(cls, alphabet: str, seed: int = 0, hidden: int = 64, layers: int = 2) -> RewardModel:
        """A character-level model trained from scratch (the shipped 'sorted letters' set)."""
        torch.manual_seed(seed)
        tok = build_char_tokenizer(alphabet + "\n")
        config = LlamaConfig(
            vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=MAX_CHARS + 8, num_labels=1,
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )
        return cls(LlamaForSequenceClassification(config), tok, RmMeta(sep="\n", max_length=MAX_CHARS + 1))

    @classmethod
    def from_backbone(cls, path: str | Path, *, lora_r: int = 0, lora_alpha: float = 16.0,
                      target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                      max_length: int = 512, score_batch_size: int = 16, seed: int = 0,
                      name: str = "") -> RewardModel:
        """A fresh scalar head on the decoder of the causal LM at `path` (an HF directory or a GGUF
        file, as `postrl.model.load.load_model` reads them)."""
        from postrl.model.load import load_model

        causal, tok = load_model(str(path), log=lambda *a: None)
        config = copy.deepcopy(causal.config)
        config.num_labels, config.pad_token_id = 1, tok.pad_token_id
        torch.manual_seed(seed)
        seq = AutoModelForSequenceClassification.from_config(config)
        if not hasattr(seq, "score"):
            raise UserError(f"{path}: {type(seq).__name__} has no `score` head; postrl's reward models need one")
        missing = seq.base_model.load_state_dict(causal.base_model.state_dict(), strict=False)
        if missing.missing_keys:
            raise UserError(f"{path}: the backbone's decoder does not fit ({missing.missing_keys[:2]})")
        del causal
        meta = RmMeta(max_length=max_length, score_batch_size=score_batch_size, backbone=name or str(path),
                      lora_r=lora_r)
        if lora_r <= 0:
            return cls(seq, tok, meta)
        from peft import LoraConfig, get_peft_model

        # SEQ_CLS: peft freezes the backbone and keeps the head (`score`) trainable and saved
        peft = get_peft_model(seq, LoraConfig(r=lora_r, lora_alpha=lora_alpha, target_modules=list(target_modules),
                                              bias="none", task_type="SEQ_CLS"))
        return cls(seq, tok, meta, peft_model=peft)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> RewardModel:
        """The reward model saved at `path`, on `device`."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"{path}: not a reward model directory (no config.json)")
        meta_path = path / META_FILE
        meta = RmMeta(**json.loads(meta_path.read_text())) if meta_path.is_file() else None
        model = AutoModelForSequenceClassification.from_pretrained(path).to(device)
        return cls(model.eval(), AutoTokenizer.from_pretrained(path), meta)

    def save(self, path: str | Path) -> None:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if self.peft_model is not None:
            self.peft_model.save_pretrained(out / "adapter")
            copy.deepcopy(self.peft_model).merge_and_unload().save_pretrained(out)
        else:
            self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        (out / META_FILE).write_text(json.dumps(asdict(self.meta), indent=1) + "\n")

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters that train (LoRA: the adapters and the head)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- scoring ----------------------------------------------------------------------------------

    def render(self, prompt: Text, reply: Text) -> tuple[str, bool]:
        """(text, whether it already carries the special tokens) of one input."""
        if isinstance(prompt, str) and isinstance(reply, str):
            return prompt + self.meta.sep + reply, False
        messages = [*_as_messages(prompt, "user"), *_as_messages(reply, "assistant")]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False), True
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages), False

    def encode(self, prompts: list[Text], replies: list[Text]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, attention mask), right-padded, each input cut to its last max_length tokens."""
        rows = []
        for p, r in zip(prompts, replies, strict=True):
            text, templated = self.render(p, r)
            if self.meta.sep and not templated:  # the char model: cut by characters, as it was trained
                text = text[-MAX_CHARS:]
            ids = self.tokenizer(text, add_special_tokens=not templated)["input_ids"]
            rows.append(ids[-self.meta.max_length:] or [self.tokenizer.pad_token_id])
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device="cpu")  # moved by `logits`
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device="cpu")
        return ids, mask

    def logits(self, prompts: list[Text], replies: list[Text]) -> torch.Tensor:
        """Raw scores [B]: the head on the hidden state of each input's last real token."""
        device = next(self.model.parameters()).device
        ids, mask = (t.to(device) for t in self.encode(prompts, replies))
        hidden = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
        last = hidden[torch.arange(len(ids), device=device), mask.sum(1) - 1]  # [B, H]
        return self.model.score(last)[:, 0].float()  # [B]

    @torch.no_grad()
    def score(self, prompts: list[Text], replies: list[Text], batch_size: int = 0) -> list[float]:
        """Raw Bradley-Terry scores (higher = preferred), `batch_size` inputs per forward
        (0 = the model's own `score_batch_size`)."""
        self.model.eval()
        step = batch_size or self.meta.score_batch_size
        out: list[float] = []
        for i in range(0, len(prompts), step):
            out += self.logits(prompts[i : i + step], replies[i : i + step]).tolist()
        return out


def _as_messages(value: Text, role: str) -> list[dict[str, str]]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


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
    rm: RewardModel | None = None,
    steps: int = 400,
    batch_size: int = 32,
    lr: float = 2e-3,
    heldout_fraction: float = 0.2,
    seed: int = 0,
    log=None,
) -> tuple[RewardModel, dict]:
    """Train `rm` (default: a character-level model from scratch) with the Bradley-Terry loss;
    returns it and a report with held-out pairwise accuracy (saved to out_dir with the model)."""
    train, heldout = split_pairs(pairs, heldout_fraction)
    if not train:
        raise UserError("no training pairs left after the held-out split")
    if rm is None:
        if not all(isinstance(x, str) for p in pairs for x in (p.prompt, p.chosen, p.rejected)):
            raise UserError("the character-level model reads text pairs; give a backbone for chat messages")
        alphabet = "".join(sorted({c for p in pairs for c in p.prompt + p.chosen + p.rejected}))
        rm = RewardModel.create(alphabet, seed=seed)
    losses = _optimise(rm, train, steps, batch_size, lr, seed, log)
    report = {
        "train_pairs": len(train),
        "heldout_pairs": len(heldout),
        "steps": steps,
        "backbone": rm.meta.backbone,
        "lora_r": rm.meta.lora_r,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "train_accuracy": pairwise_accuracy(rm, train[:100]),
        "heldout_accuracy": pairwise_accuracy(rm, heldout),
    }
    if out_dir is not None:
        rm.save(out_dir)
        (Path(out_dir) / "rm_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return rm, report


def _optimise(rm: RewardModel, train: list[Pair], steps: int, batch_size: int, lr: float, seed: int,
              log) -> list[float]:
    params = rm.parameters()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    rng = random.Random(seed)
    rm.model.train()
    losses = []
    for step in range(steps):
        batch = rng.sample(train, min(batch_size, len(train)))
        prompts = [p.prompt for p in batch]
        # chosen and rejected in one forward pass: [2B] -> [B] margins
        r = rm.logits(prompts + prompts, [p.chosen for p in batch] + [p.rejected for p in batch])
        loss = -torch.nn.functional.logsigmoid(r[: len(batch)] - r[len(batch) :]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log is not None and (step + 1) % max(1, steps // 10) == 0:
            log(f"rm step {step + 1}/{steps}: loss {sum(losses[-10:]) / len(losses[-10:]):.4f}")
    rm.model.eval()
    return losses


def register_rm_term(name: str, model_dir: str | Path, device: str | torch.device = "cpu") -> RewardModel:
    """Register a trained reward model, on `device`, as the reward term `name` (sigmoid of its score)."""
    rm = RewardModel.load(model_dir, device)

    def term(tasks, responses) -> list[float]:
        raw = rm.score([task_prompt(t) for t in tasks], [r.text for r in responses])
        return [sigmoid(s) for s in raw]

    TERMS.remove(name)  # a run registers its reward models afresh (the Ray reward actor, a test)
    register_term(name)(term)
    return rm


def task_prompt(task) -> Text:
    """What a reward model reads as the prompt of a task: its chat messages for a chat domain, else
    its text (a data set domain without `system` or `messages` is not a chat one: `conversational`)."""
    return tuple(task.messages) if task.messages and task.meta.get("conversational", True) else task.prompt


# ---------------------------------------------------------------------------- the shipped set


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
