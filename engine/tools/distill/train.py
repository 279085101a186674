"""Training the draft on the target's replies: match the target's top-k distribution (KL) and
its sampled tokens (cross-entropy), with AdamW on a warm-up + cosine schedule.

Every batch follows from the step number alone (a seeded shuffle per epoch), so a checkpoint
needs only the model, the optimizer and the step to continue exactly where it stopped.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM

from ...errors import TandemError
from ...runtime.cpu import fast_bf16
from .data import Sequence

CHECKPOINT_NAME = "checkpoint.pt"
RECENT_STEPS = 50  # the reported training loss is the mean over this many last steps


@dataclass(frozen=True)
class TrainSettings:
    batch_size: int = 16  # sequences per step (~3,000 reply tokens at 256 new tokens each)
    epochs: float = 2.0
    learning_rate: float = 2e-3
    final_lr_fraction: float = 0.1
    warmup_fraction: float = 0.03
    weight_decay: float = 0.01
    # The KL term carries the target's whole distribution; the cross-entropy on the sampled
    # token is a light anchor (and covers tokens outside the stored top-k).
    ce_weight: float = 0.2
    checkpoint_every: int = 200
    seed: int = 0


@dataclass
class StepReport:
    step: int
    total_steps: int
    loss: float


@dataclass
class TrainOutcome:
    step: int
    total_steps: int
    finished: bool  # False when stopped (Ctrl-C) or paused at a step limit
    recent_loss: dict[str, float]  # mean loss, kl and ce over the last RECENT_STEPS steps
    initial_heldout: dict[str, float]  # held-out scores of the untrained draft
    tokens_per_s: float  # reply tokens trained on per second, in this invocation


def total_steps(sequence_count: int, settings: TrainSettings) -> int:
    return max(1, math.ceil(settings.epochs * sequence_count / settings.batch_size))


def learning_rate(step: int, steps: int, settings: TrainSettings) -> float:
    warmup = max(1, round(settings.warmup_fraction * steps))
    if step < warmup:
        return settings.learning_rate * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    floor = settings.final_lr_fraction
    return settings.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_indices(step: int, sequence_count: int, settings: TrainSettings) -> list[int]:
    """The sequences of `step`: positions step·B … step·B + B − 1 of an endless stream of
    epochs, each epoch a fresh seeded permutation."""
    orders: dict[int, torch.Tensor] = {}
    indices = []
    for position in range(step * settings.batch_size, (step + 1) * settings.batch_size):
        epoch, offset = divmod(position, sequence_count)
        if epoch not in orders:
            generator = torch.Generator().manual_seed(settings.seed * 7919 + epoch)
            orders[epoch] = torch.randperm(sequence_count, generator=generator)
        indices.append(int(orders[epoch][offset]))
    return indices


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) right-padded; causal attention keeps padding out of sight
    rows: torch.Tensor  # (N,) batch row of each reply position
    columns: torch.Tensor  # (N,) input position whose output predicts that reply token
    top_ids: torch.Tensor  # (N, k)
    top_logprobs: torch.Tensor  # (N, k)
    sampled: torch.Tensor  # (N,) the token the target actually sampled

    def to(self, device: torch.device) -> Batch:
        return Batch(*(tensor.to(device) for tensor in vars(self).values()))


def make_batch(sequences: list[Sequence]) -> Batch:
    width = max(len(sequence.token_ids) - 1 for sequence in sequences)  # the last token predicts nothing
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    rows, columns = [], []
    for row, sequence in enumerate(sequences):
        ids = sequence.token_ids[:-1].long()
        input_ids[row, : len(ids)] = ids
        # Reply token j is predicted by the output at position prompt_length + j − 1.
        start = sequence.prompt_length - 1
        columns.append(torch.arange(start, start + sequence.reply_length))
        rows.append(torch.full((sequence.reply_length,), row))
    return Batch(
        input_ids=input_ids,
        rows=torch.cat(rows),
        columns=torch.cat(columns),
        top_ids=torch.cat([sequence.top_ids for sequence in sequences]).long(),
        top_logprobs=torch.cat([sequence.top_logprobs for sequence in sequences]).float(),
        sampled=torch.cat([sequence.token_ids[sequence.prompt_length :] for sequence in sequences]).long(),
    )


def reply_logits(draft: LlamaForCausalLM, batch: Batch) -> torch.Tensor:
    """(N, V) draft logits at the reply positions only: the output layer over the prompt and
    the padding would cost as much as the rest of the model and teach nothing."""
    hidden = draft.model(input_ids=batch.input_ids).last_hidden_state  # (B, T, D)
    return draft.lm_head(hidden[batch.rows, batch.columns])  # (N, V)


def distill_losses(logits: torch.Tensor, batch: Batch) -> dict[str, torch.Tensor]:
    """Mean KL(target top-k, renormalised ‖ draft) and cross-entropy on the sampled tokens."""
    draft_logprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    target_logprobs = torch.log_softmax(batch.top_logprobs, dim=-1)  # (N, k): renormalised top-k
    kl = (target_logprobs.exp() * (target_logprobs - draft_logprobs.gather(-1, batch.top_ids))).sum(-1)
    ce = -draft_logprobs.gather(-1, batch.sampled[:, None]).squeeze(-1)
    return {"kl": kl.mean(), "ce": ce.mean()}


def autocast(device: torch.device):
    # bf16 matmuls with fp32 master weights: ~4× the fp32 speed on AVX-512 BF16 CPUs, but
    # ~8× slower than fp32 where the CPU lacks bf16 (emulated), so only where it is native.
    if device.type == "cuda" or (device.type == "cpu" and fast_bf16()):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.inference_mode()
def evaluate(
    draft: LlamaForCausalLM, sequences: list[Sequence], device: torch.device, batch_size: int = 16, unproposable_id: int | None = None
) -> dict[str, float]:
    """Held-out KL and greedy agreement (draft argmax == target argmax), per reply position.
    `unproposable_id` is a reduced draft's shared id for every token it does not keep: it is
    never proposed, so it never agrees."""
    was_training = draft.training
    draft.eval()
    kl_sum, agree, positions = 0.0, 0, 0
    for first in range(0, len(sequences), batch_size):
        batch = make_batch(sequences[first : first + batch_size]).to(device)
        with autocast(device):
            logits = reply_logits(draft, batch)
        losses = distill_losses(logits, batch)
        count = batch.sampled.shape[0]
        kl_sum += float(losses["kl"]) * count
        if unproposable_id is not None:
            logits[:, unproposable_id] = float("-inf")
        agree += int((logits.argmax(-1) == batch.top_ids[:, 0]).sum())
        positions += count
    draft.train(was_training)
    return {"kl": kl_sum / max(positions, 1), "agreement": agree / max(positions, 1), "positions": positions}


class Trainer:
    """Owns the draft's optimisation and its checkpoint in `folder`."""

    def __init__(
        self,
        draft: LlamaForCausalLM,
        train_data: list[Sequence],
        heldout_data: list[Sequence],
        settings: TrainSettings,
        folder: Path,
        device: torch.device,
        unproposable_id: int | None = None,
    ):
        if not train_data:
            raise TandemError("There is no training data: the target wrote no replies.")
        self.draft = draft.to(device)
        self.train_data = train_data
        self.heldout_data = heldout_data
        self.settings = settings
        self.folder = folder
        self.device = device
        self.unproposable_id = unproposable_id
        self.total_steps = total_steps(len(train_data), settings)
        self.optimizer = torch.optim.AdamW(
            _parameter_groups(draft, settings.weight_decay), lr=settings.learning_rate, betas=(0.9, 0.95)
        )
        self.step = 0
        self.initial_heldout: dict[str, float] = {}
        self.recent: list[dict[str, float]] = []

    @property
    def checkpoint_path(self) -> Path:
        return self.folder / CHECKPOINT_NAME

    def resume(self) -> bool:
        """Load the last checkpoint, if there is one."""
        if not self.checkpoint_path.is_file():
            return False
        state = read_checkpoint(self.checkpoint_path, self.device)
        if state["examples_seen"] != state["step"] * self.settings.batch_size:
            raise TandemError(f"{self.checkpoint_path} was written with another batch size; start a new run.")
        try:
            self.draft.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError) as error:  # what torch raises for mismatched shapes
            raise TandemError(f"{self.checkpoint_path} does not fit this draft ({error}); start a new run.") from error
        self.step = state["step"]
        self.initial_heldout = state["initial_heldout"]
        self.recent = state["recent"]
        return True

    def save_checkpoint(self) -> None:
        state: dict[str, Any] = {
            "model": self.draft.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "examples_seen": self.step * self.settings.batch_size,  # the data position
            "initial_heldout": self.initial_heldout,
            "recent": self.recent,
        }
        write_checkpoint(self.checkpoint_path, state)

    def run(
        self,
        should_stop: Callable[[], bool],
        on_step: Callable[[StepReport], None],
        max_steps: int | None = None,
    ) -> TrainOutcome:
        """Train until the last step, a stop request, or step `max_steps`; checkpoint on leaving."""
        if not self.initial_heldout:
            self.initial_heldout = evaluate(self.draft, self.heldout_data, self.device, unproposable_id=self.unproposable_id)
        last_step = self.total_steps if max_steps is None else min(self.total_steps, max_steps)
        self.draft.train()
        tokens, seconds = 0, 0.0
        while self.step < last_step and not should_stop():
            started = _now(self.device)
            tokens += self._train_step()
            seconds += _now(self.device) - started
            on_step(StepReport(self.step, self.total_steps, self.recent[-1]["loss"]))
            if self.step % self.settings.checkpoint_every == 0:
                self.save_checkpoint()
        self.save_checkpoint()
        self.draft.eval()
        return TrainOutcome(
            step=self.step,
            total_steps=self.total_steps,
            finished=self.step >= self.total_steps,
            recent_loss=_mean_losses(self.recent),
            initial_heldout=self.initial_heldout,
            tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        )

    def _train_step(self) -> int:
        indices = batch_indices(self.step, len(self.train_data), self.settings)
        batch = make_batch([self.train_data[index] for index in indices]).to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, self.total_steps, self.settings)
        with autocast(self.device):
            logits = reply_logits(self.draft, batch)
        losses = distill_losses(logits, batch)
        loss = losses["kl"] + self.settings.ce_weight * losses["ce"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        losses["loss"] = loss
        self.recent = (self.recent + [{name: value.item() for name, value in losses.items()}])[-RECENT_STEPS:]
        return int(batch.sampled.shape[0])


def _parameter_groups(draft: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # Norm gains (1-D) are not decayed: pulling them to zero would shrink every activation.
    matrices = [parameter for parameter in draft.parameters() if parameter.dim() >= 2]
    vectors = [parameter for parameter in draft.parameters() if parameter.dim() < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]


def _mean_losses(recent: list[dict[str, float]]) -> dict[str, float]:
    if not recent:
        return {}
    return {key: sum(entry[key] for entry in recent) / len(recent) for key in recent[0]}


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def read_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (OSError, RuntimeError, EOFError) as error:
        raise TandemError(f"Cannot read the checkpoint {path}: {error}") from error


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    os.replace(partial, path)  # a crash mid-save keeps the previous checkpoint
