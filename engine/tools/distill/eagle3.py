"""Training an EAGLE-3 head (`tandem distill --kind eagle3`) on the target's own replies.

1. Features, recorded once: the target reads each reply (prompt included) through the same
   runtime contract chats use, opened with the head's feature layers; the residual stream
   entering those layers is stored per shard as float16 (`features-<shard>.npy`), so a
   stopped run keeps every finished shard.
2. Training-time test (EAGLE-3): the head is unrolled `ttt_steps` deep on its own outputs.
   Step 0 reads, at every position j, the target's feature before j and the token at j;
   step k reads its own step k-1 output at j and the token k further on, and sees the
   step-0 keys up to j plus its own chain's keys of steps 1..k (the tree it would draft).
   Each step matches the target's distribution at its position (soft cross-entropy over the
   stored top-k, renormalised on the draft vocabulary), later steps weighted less.
3. A reduced draft vocabulary: the tokens the target writes most; `d2t` maps them back.

The head starts from the target's last layer where the shapes allow (MLP, output
projection, the feature half of the attention inputs, final norm and LM head rows), and its
`fc` passes the highest feature layer through: a far better start than random weights.
Checkpoints hold the head, the optimizer and the step, so `--resume` continues exactly.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import TandemError
from ...models import LoadedModel
from ...runtime.cpu import fast_bf16
from ...runtime.eagle3_head import Eagle3Config, Eagle3Head, default_layer_ids
from ...runtime.reduced_vocabulary import ReducedVocabulary
from .data import Sequence, shard_paths
from .train import RECENT_STEPS, _parameter_groups, autocast, batch_indices, learning_rate, read_checkpoint, write_checkpoint

CHECKPOINT_NAME = "eagle3-checkpoint.pt"
FEATURES_PREFIX = "features-"
STEP_DECAY = 0.8  # weight of TTT step k: STEP_DECAY ** k


@dataclass(frozen=True)
class Eagle3Settings:
    ttt_steps: int = 3  # how deep training unrolls the head on its own outputs
    start: str = "random"  # the decoder layer's start: EAGLE-3's random one, or "target" (its last layer)
    draft_vocabulary: int = 8192
    batch_size: int = 8  # sequences per step
    epochs: float = 3.0
    learning_rate: float = 1e-3
    final_lr_fraction: float = 0.1
    warmup_fraction: float = 0.03
    weight_decay: float = 0.01
    checkpoint_every: int = 100
    seed: int = 0


HEAD_STARTS = ("random", "target")


# 1. Features


def record_features(
    target: LoadedModel, work_dir: Path, split: str, layer_ids: tuple[int, ...],
    should_stop: Callable[[], bool] = lambda: False, progress: Callable[[int], None] = lambda tokens: None,
) -> bool:
    """Record the target's features for every shard of `split` that lacks them; False when
    stopped first. `progress` is told the tokens read."""
    from .data import load_shard

    runtime = target.open_runtime(feature_layers=layer_ids)
    try:
        for shard in shard_paths(work_dir, split):
            destination = _features_path(shard)
            if destination.is_file():
                progress(sum(len(sequence.token_ids) for sequence in load_shard(shard)))
                continue
            rows = []
            for sequence in load_shard(shard):
                if should_stop():
                    return False
                runtime.reset()
                runtime.forward(sequence.token_ids.tolist(), logits_wanted=1)
                rows.append(runtime.features.to(torch.float16).numpy())
                progress(len(sequence.token_ids))
            partial = destination.with_suffix(".partial.npy")
            np.save(partial, np.concatenate(rows))
            os.replace(partial, destination)  # a shard's features exist whole or not at all
    finally:
        runtime.close()
    return True


def load_features(work_dir: Path, split: str) -> list[np.ndarray]:
    """Per sequence of `split` (in `load_split`'s order), its (L, F) float16 features."""
    from .data import load_shard

    rows = []
    for shard in shard_paths(work_dir, split):
        path = _features_path(shard)
        if not path.is_file():
            raise TandemError(f"{shard.name} has no recorded features yet.")
        features = np.load(path, mmap_mode="r")
        start = 0
        for sequence in load_shard(shard):
            end = start + len(sequence.token_ids)
            rows.append(features[start:end])
            start = end
    return rows


def _features_path(shard: Path) -> Path:
    return shard.with_name(FEATURES_PREFIX + shard.stem + ".npy")


# 2. The head and its start


def build_head(
    target_model: torch.nn.Module, vocabulary: ReducedVocabulary, layer_ids: tuple[int, ...] | None = None, seed: int = 0,
    start: str = "random",
) -> Eagle3Head:
    """A head for `target_model` (a torch Llama-family model). Its LM head and final norm are
    always the target's own (restricted to the draft vocabulary); its decoder layer and fc
    start as in EAGLE-3 ("random") or from the target's last layer ("target", see
    _start_midlayer_from_target). The random part of the start follows from `seed`, so a
    resumed run rebuilds it exactly."""
    if start not in HEAD_STARTS:
        raise ValueError(f"unknown head start {start!r}; one of {', '.join(HEAD_STARTS)}")
    config = target_model.config
    layer_ids = layer_ids or default_layer_ids(config.num_hidden_layers)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = Eagle3Head(Eagle3Config(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=head_dim,
            target_hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            draft_vocab_size=vocabulary.size - 1,  # the reduced vocabulary's shared "other" id is never drafted
            layer_ids=tuple(layer_ids),
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            max_position_embeddings=config.max_position_embeddings,
        ))
    _take_target_outputs(head, target_model, torch.tensor(vocabulary.kept_ids))
    if start == "target":
        _start_midlayer_from_target(head, target_model)
    return head


def _take_target_outputs(head: Eagle3Head, target_model: torch.nn.Module, kept: torch.Tensor) -> None:
    """The vocabulary maps, the LM head and the final norm: the target's own. `kept`: (draft
    V,) the target ids of the draft vocabulary, ascending."""
    with torch.no_grad():
        head.d2t.copy_(kept - torch.arange(len(kept)))
        head.t2d.zero_()
        head.t2d[kept] = True
        head.lm_head.weight.copy_(target_model.get_output_embeddings().weight[kept])
        head.norm.weight.copy_(target_model.model.norm.weight)


def _start_midlayer_from_target(head: Eagle3Head, target_model: torch.nn.Module) -> None:
    """The decoder layer as the target's last, reading the highest feature layer through fc.
    A warm start in weights, but a biased one in what it predicts: the target's top layers
    turn position t's features into a guess at token t+1, which the head is already given;
    on the demo target it starts at ~1% agreement and learnt slower than EAGLE-3's own
    random start (see docs/BENCHMARKS.md)."""
    config = target_model.config
    last = target_model.model.layers[-1]
    width = config.hidden_size
    with torch.no_grad():
        layer = head.midlayer
        for ours, theirs in (
            (layer.input_layernorm, last.input_layernorm), (layer.hidden_norm, last.input_layernorm),
            (layer.post_attention_layernorm, last.post_attention_layernorm),
        ):
            ours.weight.copy_(theirs.weight)
        for name in ("q_proj", "k_proj", "v_proj"):
            ours, theirs = getattr(layer.self_attn, name), getattr(last.self_attn, name)
            ours.weight[:, :width].mul_(0.1)  # the token half: small and random
            ours.weight[:, width:].copy_(theirs.weight)  # the feature half: the target's own
        layer.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(layer.mlp, name).weight.copy_(getattr(last.mlp, name).weight)
        head.fc.weight.zero_()
        head.fc.weight[:, -width:] = torch.eye(width)  # pass the highest feature layer through


# 3. Training-time test


@dataclass
class Eagle3Batch:
    ids: torch.Tensor  # (B, L) right-padded with 0
    features: torch.Tensor  # (B, L, F)
    lengths: torch.Tensor  # (B,)
    prompt_lengths: torch.Tensor  # (B,)
    top: torch.Tensor  # (B, L, k) draft ids of the target's top-k at each position (-1: outside), for the next token
    top_probs: torch.Tensor  # (B, L, k) their probabilities, renormalised on the draft vocabulary
    best: torch.Tensor  # (B, L) draft id of the target's first choice (-1: outside or none)


def make_batch(sequences: list[Sequence], features: list[np.ndarray], to_draft: torch.Tensor) -> Eagle3Batch:
    """Position j of a row carries token j, the target's features at j, and the target's
    distribution after token j (over the next token), where the data has it (reply
    positions); `to_draft` maps target ids to draft ids (-1 outside the draft vocabulary)."""
    width = max(len(sequence.token_ids) for sequence in sequences)
    k = sequences[0].top_ids.shape[1]
    batch = len(sequences)
    ids = torch.zeros(batch, width, dtype=torch.long)
    feats = torch.zeros(batch, width, features[0].shape[1])
    top = torch.full((batch, width, k), -1, dtype=torch.long)
    top_probs = torch.zeros(batch, width, k)
    for row, (sequence, rows) in enumerate(zip(sequences, features)):
        length, prompt = len(sequence.token_ids), sequence.prompt_length
        ids[row, :length] = sequence.token_ids.long()
        feats[row, :length] = torch.from_numpy(np.asarray(rows, dtype=np.float32))
        # Reply token r is what the target chose after position prompt + r - 1.
        positions = slice(prompt - 1, prompt - 1 + sequence.reply_length)
        drafted = to_draft[sequence.top_ids.long()]  # (R, k)
        probs = sequence.top_logprobs.float().exp() * (drafted >= 0)
        top[row, positions] = drafted
        top_probs[row, positions] = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    best = torch.where(top_probs.sum(-1) > 0, top[..., 0], torch.full_like(ids, -1))
    return Eagle3Batch(ids, feats, torch.tensor([len(s.token_ids) for s in sequences]),
                       torch.tensor([s.prompt_length for s in sequences]), top, top_probs, best)


def ttt_outputs(head: Eagle3Head, embeddings: torch.Tensor, batch: Eagle3Batch, steps: int) -> list[torch.Tensor]:
    """The head's outputs (B, L, H) at each unrolled step; step k's output at j predicts the
    token at j + k + 1."""
    ids, width = batch.ids, batch.ids.shape[1]
    inputs = torch.zeros(*ids.shape, head.config.hidden_size, dtype=embeddings.dtype, device=ids.device)
    inputs[:, 1:] = head.fuse(batch.features[:, :-1].to(embeddings.dtype))  # the feature before each token
    positions = torch.arange(width, device=ids.device)[None].expand(ids.shape[0], -1)
    causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
    scale = 1.0 / math.sqrt(head.config.head_dim)
    groups = head.config.num_attention_heads // head.config.num_key_value_heads
    outputs, chain_keys, chain_values = [], [], []
    hidden = inputs
    base_keys = base_values = None
    for step in range(steps):
        shifted = F.pad(ids[:, step:], (0, step))  # the token k further on
        query, key, value = head.attention_inputs(embeddings[shifted], hidden, positions + step)
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)  # (B, heads, L, d)
        if step == 0:
            base_keys, base_values = key, value
            attended = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        else:
            chain_keys.append(key)
            chain_values.append(value)
            scores = [torch.matmul(query, base_keys.transpose(-1, -2)).masked_fill(~causal, float("-inf")) * scale]
            scores += [(query * chain_key).sum(-1, keepdim=True) * scale for chain_key in chain_keys]
            weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(query.dtype)
            attended = torch.matmul(weights[..., :width], base_values)
            for index, chain_value in enumerate(chain_values):
                attended = attended + weights[..., width + index : width + index + 1] * chain_value
        hidden = head.finish(attended, hidden)
        outputs.append(hidden)
    return outputs


def ttt_losses(head: Eagle3Head, outputs: list[torch.Tensor], batch: Eagle3Batch) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """Weighted soft cross-entropy over the steps, and per step its loss and the share of
    positions whose draft argmax is the target's first choice."""
    total = 0.0
    figures = []
    for step, output in enumerate(outputs):
        # Step `step` at j predicts the token after position j + step.
        top = F.pad(batch.top[:, step:], (0, 0, 0, step), value=-1)
        probs = F.pad(batch.top_probs[:, step:], (0, 0, 0, step))
        best = F.pad(batch.best[:, step:], (0, step), value=-1)
        valid = probs.sum(-1) > 0  # (B, L)
        if not bool(valid.any()):
            continue
        logits = head.draft_logits(output[valid]).float()  # (N, draft V)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = top[valid].clamp(min=0)
        loss = -(probs[valid] * logprobs.gather(-1, chosen)).sum(-1).mean()
        total = total + STEP_DECAY**step * loss
        agree = (logits.argmax(-1) == best[valid]).float().mean()
        figures.append({"loss": float(loss.detach()), "agreement": float(agree), "positions": int(valid.sum())})
    return total, figures


class Eagle3Trainer:
    """Owns the head's optimisation and its checkpoint in `folder`."""

    def __init__(
        self, head: Eagle3Head, embeddings: torch.Tensor, train: tuple[list[Sequence], list[np.ndarray]],
        heldout: tuple[list[Sequence], list[np.ndarray]], settings: Eagle3Settings, folder: Path, device: torch.device,
    ):
        if not train[0]:
            raise TandemError("There is no training data: the target wrote no replies.")
        self.head = head.to(device)
        # bf16 where the device multiplies it natively (the features are stored as float16)
        compute = torch.bfloat16 if device.type == "cuda" or fast_bf16() else torch.float32
        self.embeddings = embeddings.detach().to(device, compute)
        self.train_data, self.heldout_data = train, heldout
        self.settings = settings
        self.folder = folder
        self.device = device
        self.to_draft = torch.full((head.config.vocab_size,), -1, dtype=torch.long)
        self.to_draft[head.target_ids.cpu()] = torch.arange(head.config.draft_vocab_size)
        train_settings = _as_train_settings(settings)
        self.train_settings = train_settings
        self.total_steps = max(1, math.ceil(settings.epochs * len(train[0]) / settings.batch_size))
        self.optimizer = torch.optim.AdamW(_parameter_groups(head, settings.weight_decay), lr=settings.learning_rate, betas=(0.9, 0.95))
        self.step = 0
        self.initial_heldout: list[dict[str, float]] = []
        self.recent: list[float] = []

    @property
    def checkpoint_path(self) -> Path:
        return self.folder / CHECKPOINT_NAME

    def resume(self) -> bool:
        if not self.checkpoint_path.is_file():
            return False
        state = read_checkpoint(self.checkpoint_path, self.device)
        try:
            self.head.load_state_dict(state["head"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, KeyError, ValueError) as error:
            raise TandemError(f"Cannot continue from {self.checkpoint_path} ({error}); start a new run.") from error
        self.step, self.initial_heldout, self.recent = state["step"], state["initial_heldout"], state["recent"]
        return True

    def save_checkpoint(self) -> None:
        state = {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                 "initial_heldout": self.initial_heldout, "recent": self.recent}
        write_checkpoint(self.checkpoint_path, state)

    def run(self, should_stop: Callable[[], bool], on_step: Callable[[int, int, float], None], max_steps: int | None = None) -> dict[str, Any]:
        if not self.initial_heldout:
            self.initial_heldout = self.evaluate()
        last_step = self.total_steps if max_steps is None else min(self.total_steps, max_steps)
        tokens, seconds = 0, 0.0
        self.head.train()
        while self.step < last_step and not should_stop():
            started = time.perf_counter()
            tokens += self._train_step()
            seconds += time.perf_counter() - started
            on_step(self.step, self.total_steps, self.recent[-1])
            if self.step % self.settings.checkpoint_every == 0:
                self.save_checkpoint()
        self.save_checkpoint()
        self.head.eval()
        return {"step": self.step, "total_steps": self.total_steps, "finished": self.step >= self.total_steps,
                "tokens_per_s": tokens / seconds if seconds else None,
                "train_loss": sum(self.recent) / len(self.recent) if self.recent else None}

    def _train_step(self) -> int:
        sequences, features = self.train_data
        indices = batch_indices(self.step, len(sequences), self.train_settings)
        batch = _to(make_batch([sequences[i] for i in indices], [features[i] for i in indices], self.to_draft), self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, self.total_steps, self.train_settings)
        with autocast(self.device):
            outputs = ttt_outputs(self.head, self.embeddings, batch, self.settings.ttt_steps)
            loss, _ = ttt_losses(self.head, outputs, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.recent = (self.recent + [float(loss.detach())])[-RECENT_STEPS:]
        return int(batch.lengths.sum())

    @torch.inference_mode()
    def evaluate(self, batch_size: int = 8) -> list[dict[str, float]]:
        """Per TTT step on the held-out replies: loss, and how often the head's first choice
        is the target's (step 0: the first drafted token's acceptance when greedy; step k:
        the k+1-th, given the ones before were right)."""
        sequences, features = self.heldout_data
        sums: list[dict[str, float]] = []
        was_training = self.head.training
        self.head.eval()
        for first in range(0, len(sequences), batch_size):
            batch = _to(make_batch(sequences[first:first + batch_size], features[first:first + batch_size], self.to_draft), self.device)
            with autocast(self.device):
                outputs = ttt_outputs(self.head, self.embeddings, batch, self.settings.ttt_steps)
                _, figures = ttt_losses(self.head, outputs, batch)
            for step, figure in enumerate(figures):
                if len(sums) <= step:
                    sums.append({"loss": 0.0, "agreement": 0.0, "positions": 0})
                count = figure["positions"]
                sums[step]["loss"] += figure["loss"] * count
                sums[step]["agreement"] += figure["agreement"] * count
                sums[step]["positions"] += count
        self.head.train(was_training)
        return [{"loss": s["loss"] / s["positions"], "agreement": s["agreement"] / s["positions"], "positions": s["positions"]}
                for s in sums if s["positions"]]


def _to(batch: Eagle3Batch, device: torch.device) -> Eagle3Batch:
    return Eagle3Batch(*(tensor.to(device) for tensor in vars(batch).values()))


def _as_train_settings(settings: Eagle3Settings):
    from .train import TrainSettings

    return TrainSettings(batch_size=settings.batch_size, epochs=settings.epochs, learning_rate=settings.learning_rate,
                         final_lr_fraction=settings.final_lr_fraction, warmup_fraction=settings.warmup_fraction,
                         weight_decay=settings.weight_decay, seed=settings.seed)


def write_report(folder: Path, report: dict[str, Any]) -> None:
    (folder / "distill-report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
