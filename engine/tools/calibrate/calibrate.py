"""`tandem calibrate`: train a pair's SPRINTER verifier and SpecDec++ acceptance head.

The target writes its own replies to the shipped distillation prompts (as `tandem distill`
makes them); then draft and target each read every prompt + reply once, and every reply
position becomes examples: the draft's hidden state there, the token the draft would propose
(greedy: its argmax; sampled: a draw at the chat temperature) and whether the target would
accept it. 15% true-token examples (the target's own next token) are recorded beside them
for SpecDec++. Prefixes are the target's own text: what a round's first drafted token sees.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...chat_prompt import Message, build_prompt
from ...config import CHAT_DEFAULT_TEMPERATURE, DecodeSettings
from ..distill.data import split_prompts
from ...drafters.model_drafter import fit_vocab
from ...errors import TandemError
from ...prompts import DISTILL_PROMPTS, read_prompts
from ...events import Finished
from ...runtime import ModelRuntime
from ...heads.features import head_features
from ...heads.store import MODES, DraftHeads, save_heads, user_heads_folder
from .train import Examples, train_acceptance_head, train_sprinter

# (phase, done, total): "replies" counts prompts answered, "training" the heads fitted.
Progress = Callable[[str, int, int], None]


class CalibrationCancelled(TandemError):
    """The user stopped a calibration; nothing was saved."""


@dataclass(frozen=True)
class CalibrationSettings:
    prompts: int = 160  # of the shipped distillation prompts; every tenth is held out
    max_new_tokens: int = 128
    temperature: float = CHAT_DEFAULT_TEMPERATURE  # the target's replies, and the sampled heads'
    training_steps: int = 300
    seed: int = 0


def calibrate(
    pair, settings: CalibrationSettings = CalibrationSettings(), progress: Progress | None = None,
    should_stop: Callable[[], bool] = lambda: False, out_folder: Path | None = None, prompts: list[str] | None = None,
) -> DraftHeads:
    """Train `pair`'s heads, save them (to the user's folder for the pair unless `out_folder`)
    and attach them to `pair`. Raises CalibrationCancelled when `should_stop` says so."""
    report = progress or (lambda phase, done, total: None)
    if pair.draft is None or pair.draft_runner is None:
        raise TandemError(f"The pair {pair.config.name!r} has no draft model: there is nothing to calibrate.")
    started = time.perf_counter()
    if prompts is None:

        prompts = read_prompts(DISTILL_PROMPTS)
    chosen = prompts[: settings.prompts]
    _, heldout_prompts = split_prompts(chosen)
    recording = _recording_path(pair, settings, chosen)
    if recording.is_file():
        # The same pair, prompts and settings were recorded before (training is what one
        # retries): skip the minutes of replies.
        saved = torch.load(recording, weights_only=False)
        recorded, tokens = saved["recorded"], saved["tokens"]
        report("replies", len(chosen), len(chosen))
    else:
        recorded, tokens = _record(pair, settings, chosen, heldout_prompts, report, should_stop)
        recording.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"recorded": recorded, "tokens": tokens}, recording)
    if not all(recorded[split]["greedy"] for split in recorded):
        raise TandemError("The target wrote no reply to learn from; calibrate with more prompts.")
    heads = train_heads(
        {mode: Examples.concat(recorded["train"][mode]) for mode in MODES},
        {mode: Examples.concat(recorded["heldout"][mode]) for mode in MODES},
        settings, report, should_stop,
    )
    heads.card.update(
        pair=pair.config.name, target=pair.target.label, draft=pair.draft.label,
        data={"prompts": len(chosen), "heldout_prompts": len(heldout_prompts), "reply_tokens": tokens,
              "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
              "source": "the target's own replies to resources/prompts/distill_prompts.jsonl"},
        seconds=round(time.perf_counter() - started, 1),
    )
    save_heads(out_folder or user_heads_folder(pair.config.name), heads)
    pair.attach_heads(heads)
    return heads


def _record(pair, settings: CalibrationSettings, chosen: list[str], heldout_prompts: list[str],
            report: Progress, should_stop: Callable[[], bool]) -> tuple[dict, int]:
    """The target's reply to every prompt, and the examples of every reply position."""
    draft = pair.draft.open_runtime(hidden_states=True)  # a cache of its own: the pair's stays as it is
    try:
        recorded = {"train": _empty(), "heldout": _empty()}
        tokens = 0
        for index, prompt in enumerate(chosen):
            if should_stop():
                raise CalibrationCancelled("Calibration cancelled; the pair keeps its previous heads.")
            report("replies", index, len(chosen))
            ids, prompt_length = _target_reply(pair, prompt, settings, seed=settings.seed * 100_003 + index)
            if len(ids) == prompt_length:
                continue  # the target ended its turn at once: no position to learn from
            generator = torch.Generator().manual_seed(settings.seed * 7_919 + index)
            examples = record_examples(pair.target_runner, draft, ids, prompt_length, pair.vocab_size, settings.temperature, generator)
            split = "heldout" if prompt in heldout_prompts else "train"
            for mode in MODES:
                recorded[split][mode].append(examples[mode])
            tokens += len(ids) - prompt_length
        report("replies", len(chosen), len(chosen))
    finally:
        draft.close()
        pair.target_runner.reset()
    return recorded, tokens


def _recording_path(pair, settings: CalibrationSettings, prompts: list[str]) -> Path:
    from ...paths import cache_dir

    identity = json.dumps([
        pair.target.label, pair.target.precision, pair.draft.label, _weights_identity(pair.draft.folder),
        dataclasses.asdict(dataclasses.replace(settings, training_steps=0)), prompts,
    ])
    return cache_dir() / "calibration" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.pt"


def _weights_identity(folder: Path | None) -> list:
    """What tells a retrained draft from the one recorded before, under the same name."""
    if folder is None:
        return []
    files = sorted(path for pattern in ("*.safetensors", "*.gguf", "*.json") for path in folder.glob(pattern))
    return [(path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in files]


def train_heads(train: dict[str, Examples], heldout: dict[str, Examples], settings: CalibrationSettings,
                report: Progress, should_stop: Callable[[], bool]) -> DraftHeads:
    verifiers, acceptance_heads, modes = {}, {}, {}
    for done, mode in enumerate(MODES):
        if should_stop():
            raise CalibrationCancelled("Calibration cancelled; the pair keeps its previous heads.")
        report("training", done, len(MODES))
        verifiers[mode], sprinter = train_sprinter(train[mode], heldout[mode], settings.training_steps, settings.seed)
        acceptance_heads[mode], acceptance = train_acceptance_head(train[mode], heldout[mode], settings.training_steps, settings.seed)
        modes[mode] = {"sprinter": sprinter, "acceptance": acceptance, "training_examples": len(train[mode].drafted)}
    report("training", len(MODES), len(MODES))
    width = next(iter(train.values())).features.shape[1]
    head = acceptance_heads["greedy"]
    card = {"feature_width": width, "acceptance_blocks": len(head.blocks), "acceptance_width": head.logit.in_features, "modes": modes}
    return DraftHeads(verifiers, acceptance_heads, card)


@torch.inference_mode()
def record_examples(
    target: ModelRuntime, draft: ModelRuntime, ids: list[int], prompt_length: int, vocab_size: int,
    temperature: float, generator: torch.Generator,
) -> dict[str, Examples]:
    """Examples for every reply position of `ids`, per mode, from one forward of each model."""
    wanted = len(ids) - prompt_length  # rows that predict each reply token
    target.reset()
    draft.reset()
    target_logits = target.forward(ids[:-1], logits_wanted=wanted)  # (L, V)
    draft_logits = fit_vocab(draft.forward(ids[:-1], logits_wanted=wanted), vocab_size)
    hidden = draft.last_hidden_states()
    true_tokens = torch.tensor(ids[prompt_length:])
    examples = {}
    for mode in MODES:
        scale = 1.0 if mode == "greedy" else temperature
        q = torch.softmax(draft_logits / scale, dim=-1)
        p = torch.softmax(target_logits / scale, dim=-1)
        drafted = q.argmax(-1) if mode == "greedy" else torch.multinomial(q, 1, generator=generator)[:, 0]
        parts = [_labelled(hidden, q, p, tokens, mode, is_true) for tokens, is_true in ((drafted, False), (true_tokens, True))]
        examples[mode] = Examples.concat(parts)
    draft.reset()
    return examples


def _labelled(hidden, q, p, tokens, mode: str, is_true: bool) -> Examples:
    q_x = q.gather(-1, tokens[:, None])[:, 0]
    p_x = p.gather(-1, tokens[:, None])[:, 0]
    if mode == "greedy":  # the target accepts exactly its own argmax
        accepted = (p.argmax(-1) == tokens).float()
        acceptance = accepted
    else:
        accepted = (q_x <= p_x).float()
        acceptance = torch.clamp(p_x / q_x.clamp_min(1e-12), max=1.0)
    features = head_features(hidden, q, tokens)
    return Examples(features, accepted, acceptance, torch.full((len(tokens),), is_true))


def _target_reply(pair, prompt: str, settings: CalibrationSettings, seed: int) -> tuple[list[int], int]:
    """The chat-formatted prompt followed by the target's own sampled reply."""
    messages = [Message("user", prompt)]
    prompt_ids = build_prompt(pair.tokenizer, messages, None, pair.context_length - settings.max_new_tokens - 1).token_ids
    decode = DecodeSettings(method="ar", max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=seed)
    finished = next(event for event in pair.generate(messages, decode) if isinstance(event, Finished))
    return list(prompt_ids) + list(finished.token_ids), len(prompt_ids)


def _empty() -> dict[str, list[Examples]]:
    return {mode: [] for mode in MODES}
