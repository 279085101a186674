"""Training both heads from recorded draft tokens, with held-out figures for their cards.

Examples are recorded per mode (greedy, sampled) by `calibrate`: a drafted token's features,
whether the target would accept it (greedy: it is the target's argmax; sampled: q(x) <= p(x))
and its acceptance probability min(1, p(x)/q(x)), SpecDec++'s soft label.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...heads.modules import AcceptanceHead, SprinterVerifier

# SPRINTER's threshold lets through at most this share of the tokens the target would
# reject (on held-out prompts). The paper's fixed 0.5 knows nothing of the pair.
MAX_FALSE_POSITIVE_RATE = 0.1
# SpecDec++: a missed rejection costs a wasted target call, so rejections weigh more (the
# paper's best: 6); 15% of its examples carry the target's own token instead of the draft's.
REJECTION_WEIGHT = 6.0
TRUE_TOKEN_SHARE = 0.15
BATCH_ROWS = 2048  # rows per training step


@dataclass
class Examples:
    features: torch.Tensor  # (N, F) float32
    accepted: torch.Tensor  # (N,) float32, 1.0 where the target would accept the token
    acceptance: torch.Tensor  # (N,) float32, min(1, p/q) (greedy: equal to `accepted`)
    true_token: torch.Tensor  # (N,) bool: the token is the target's own, not the draft's

    def __len__(self) -> int:
        return self.features.shape[0]

    def where(self, keep: torch.Tensor) -> Examples:
        return Examples(self.features[keep], self.accepted[keep], self.acceptance[keep], self.true_token[keep])

    @property
    def drafted(self) -> Examples:
        return self.where(~self.true_token)

    @staticmethod
    def concat(parts: list[Examples]) -> Examples:
        return Examples(*(torch.cat([getattr(part, name) for part in parts]) for name in ("features", "accepted", "acceptance", "true_token")))


def train_sprinter(train: Examples, heldout: Examples, steps: int = 300, seed: int = 0) -> tuple[SprinterVerifier, dict]:
    """Fit the verifier on drafted tokens (BCE on accept/reject); pick its threshold on the
    held-out ones so that at most MAX_FALSE_POSITIVE_RATE of rejections pass."""
    train, heldout = train.drafted, heldout.drafted
    verifier = SprinterVerifier(train.features.shape[1])
    _fit(verifier, train.features, train.accepted, torch.ones(len(train)), steps, seed)
    with torch.no_grad():
        scores = torch.sigmoid(verifier(heldout.features))
    threshold = _threshold_for(scores, heldout.accepted, MAX_FALSE_POSITIVE_RATE)
    return verifier, {"threshold": threshold, **sprinter_metrics(scores, heldout.accepted, threshold, train.accepted)}


def sprinter_metrics(scores: torch.Tensor, accepted: torch.Tensor, threshold: float, train_accepted: torch.Tensor) -> dict:
    passed = scores >= threshold
    rejected = accepted == 0
    majority = float(train_accepted.mean() >= 0.5)
    return {
        "heldout_examples": len(scores),
        # η: the share of tokens the target would reject that the verifier lets through.
        "false_positive_rate": _share(passed & rejected, rejected),
        "pass_rate": float(passed.float().mean()) if len(scores) else 0.0,
        # Of the tokens that go out unchecked, how many the target would have rejected.
        "unchecked_error_rate": _share(passed & rejected, passed),
        "accuracy": float(((scores >= 0.5).float() == accepted).float().mean()),
        "constant_accuracy": float((accepted == majority).float().mean()),
        "bce": _bce(scores, accepted),
        "constant_bce": _bce(torch.full_like(scores, float(train_accepted.mean())), accepted),
    }


def train_acceptance_head(train: Examples, heldout: Examples, steps: int = 300, seed: int = 0) -> tuple[AcceptanceHead, dict]:
    """Fit SpecDec++'s head on soft labels with rejections weighted REJECTION_WEIGHT, on
    drafted tokens mixed with TRUE_TOKEN_SHARE of the target's own."""
    train = _mix_true_tokens(train, seed)
    head = AcceptanceHead(train.features.shape[1])
    _fit(head, train.features, train.acceptance, _rejection_weights(train.acceptance), steps, seed)
    drafted = heldout.drafted
    with torch.no_grad():
        predicted = torch.sigmoid(head(drafted.features))
    # The constant that minimises the same weighted loss on the training set.
    weights = _rejection_weights(train.acceptance)
    constant = float((weights * train.acceptance).sum() / weights.sum())
    heldout_weights = _rejection_weights(drafted.acceptance)
    return head, {
        "heldout_examples": len(drafted),
        # Rejection-weighted BCE, the loss it was trained on, against the best constant's.
        "bce": _bce(predicted, drafted.acceptance, heldout_weights),
        "constant_bce": _bce(torch.full_like(predicted, constant), drafted.acceptance, heldout_weights),
        "mean_predicted": float(predicted.mean()) if len(drafted) else 0.0,
        "mean_acceptance": float(drafted.acceptance.mean()) if len(drafted) else 0.0,
    }


def _rejection_weights(acceptance: torch.Tensor) -> torch.Tensor:
    return 1.0 + (REJECTION_WEIGHT - 1.0) * (1.0 - acceptance)


def _mix_true_tokens(examples: Examples, seed: int) -> Examples:
    drafted = ~examples.true_token
    true_indices = torch.nonzero(examples.true_token)[:, 0]
    wanted = int(drafted.sum() * TRUE_TOKEN_SHARE / (1 - TRUE_TOKEN_SHARE))
    generator = torch.Generator().manual_seed(seed)
    chosen = true_indices[torch.randperm(len(true_indices), generator=generator)[:wanted]]
    keep = drafted.clone()
    keep[chosen] = True
    return examples.where(keep)


def _fit(module: nn.Module, features: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, steps: int, seed: int) -> None:
    """AdamW on weighted BCE over batches of up to BATCH_ROWS rows, keeping the weights that
    did best on a tenth of the rows set aside: small sets overfit quickly."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(targets), generator=generator)
    checked, fitted = order[: max(len(order) // 10, 1)], order[max(len(order) // 10, 1):]
    module.standardise.fit(features[fitted])
    optimiser = torch.optim.AdamW(module.parameters(), lr=3e-3, weight_decay=1e-2)

    def loss_on(rows: torch.Tensor) -> torch.Tensor:
        losses = nn.functional.binary_cross_entropy_with_logits(module(features[rows]), targets[rows], reduction="none")
        return (losses * weights[rows]).sum() / weights[rows].sum()

    best_loss, best_state = float("inf"), None
    for step in range(steps + 1):
        if step % 10 == 0 or step == steps:
            with torch.no_grad():
                module.eval()
                checked_loss = float(loss_on(checked))
                module.train()
            if checked_loss < best_loss:
                best_loss, best_state = checked_loss, {key: value.clone() for key, value in module.state_dict().items()}
        if step == steps:
            break
        optimiser.zero_grad()
        batch = fitted[torch.randint(len(fitted), (BATCH_ROWS,), generator=generator)] if len(fitted) > BATCH_ROWS else fitted
        loss_on(batch).backward()
        optimiser.step()
    module.load_state_dict(best_state)
    module.eval()


def _threshold_for(scores: torch.Tensor, accepted: torch.Tensor, max_false_positive_rate: float) -> float:
    """The lowest score threshold that passes at most `max_false_positive_rate` of rejections."""
    rejected_scores = torch.sort(scores[accepted == 0], descending=True).values
    allowed = math.floor(max_false_positive_rate * len(rejected_scores))
    if allowed >= len(rejected_scores):
        return 0.0
    # Pass scores strictly above the (allowed + 1)-th best rejected score.
    return float(torch.nextafter(rejected_scores[allowed], torch.tensor(2.0)))


def _share(part: torch.Tensor, whole: torch.Tensor) -> float:
    count = int(whole.sum())
    return int(part.sum()) / count if count else 0.0


def _bce(predicted: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    if not len(targets):
        return 0.0
    losses = nn.functional.binary_cross_entropy(predicted.clamp(1e-6, 1 - 1e-6), targets, reduction="none")
    return float((losses * weights).sum() / weights.sum() if weights is not None else losses.mean())
