"""A pair's calibrated heads on disk: `heads.safetensors` (weights only, never pickles) and
`heads.json`, the card that says what they were trained on and how well they did."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import ModelLoadError
from .modules import AcceptanceHead, SprinterVerifier

WEIGHTS_FILE = "heads.safetensors"
CARD_FILE = "heads.json"
CARD_FORMAT = 1
MODES = ("greedy", "sampled")  # heads per decoding mode: what "accept" means differs


@dataclass
class DraftHeads:
    """Per mode, SPRINTER's verifier with its threshold and SpecDec++'s acceptance head."""

    verifiers: dict[str, SprinterVerifier]
    acceptance_heads: dict[str, AcceptanceHead]
    card: dict

    @property
    def feature_width(self) -> int:
        return int(self.card["feature_width"])

    def threshold(self, mode: str) -> float:
        return float(self.card["modes"][mode]["sprinter"]["threshold"])

    def passes(self, mode: str, features: torch.Tensor) -> bool:
        """SPRINTER: whether the token goes out without the target checking it."""
        with torch.no_grad():
            return float(torch.sigmoid(self.verifiers[mode](features[None]))[0]) >= self.threshold(mode)

    def acceptance(self, mode: str, features: torch.Tensor) -> float:
        """SpecDec++: the predicted probability that the target accepts the token."""
        with torch.no_grad():
            return float(torch.sigmoid(self.acceptance_heads[mode](features[None]))[0])


def mode_for(greedy: bool) -> str:
    return "greedy" if greedy else "sampled"


def save_heads(folder: Path, heads: DraftHeads) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for mode in MODES:
        for name, module in (("sprinter", heads.verifiers[mode]), ("acceptance", heads.acceptance_heads[mode])):
            tensors.update({f"{name}.{mode}.{key}": value.detach().contiguous() for key, value in module.state_dict().items()})
    # Weights first, card last: a card on disk means its weights are complete.
    save_file(tensors, str(folder / WEIGHTS_FILE))
    (folder / CARD_FILE).write_text(json.dumps({**heads.card, "format": CARD_FORMAT}, indent=2) + "\n")


def has_heads(folder: Path) -> bool:
    return (folder / CARD_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def load_heads(folder: Path) -> DraftHeads:
    """Read what `save_heads` wrote; a missing, corrupt or mismatched file is a
    ModelLoadError that names it."""
    try:
        card = json.loads((folder / CARD_FILE).read_text())
        tensors = load_file(str(folder / WEIGHTS_FILE))
        width = int(card["feature_width"])
        blocks = int(card.get("acceptance_blocks", 3))
        inner = int(card.get("acceptance_width", 128))
        verifiers, acceptance_heads = {}, {}
        for mode in MODES:
            verifiers[mode] = _module(SprinterVerifier(width), tensors, f"sprinter.{mode}.")
            acceptance_heads[mode] = _module(AcceptanceHead(width, blocks, inner), tensors, f"acceptance.{mode}.")
            float(card["modes"][mode]["sprinter"]["threshold"])
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as error:
        raise ModelLoadError(f"The calibrated heads in {folder} cannot be read ({error}); run tandem calibrate again.") from error
    return DraftHeads(verifiers, acceptance_heads, card)


def _module(module: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str) -> torch.nn.Module:
    state = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
    module.load_state_dict(state)  # strict: a missing or misshapen tensor raises
    return module.eval()


def user_heads_folder(pair_name: str) -> Path:
    """Where `tandem calibrate` keeps a pair's heads: the user data folder, by pair name."""
    from ..paths import data_dir

    slug = "".join(character if character.isalnum() or character in "-_." else "_" for character in pair_name) or "pair"
    return data_dir() / "heads" / slug


def find_heads(pair_name: str, target_label: str, draft_label: str, draft_folder: Path | None) -> DraftHeads | None:
    """The heads calibrated for exactly this target and draft: the user's own, else the ones
    shipped beside the draft (the demo's). Heads trained for other models are not used."""
    candidates = [user_heads_folder(pair_name)] + ([draft_folder / "heads"] if draft_folder is not None else [])
    for folder in candidates:
        if has_heads(folder):
            heads = load_heads(folder)
            if heads.card.get("target") == target_label and heads.card.get("draft") == draft_label:
                return heads
    return None
