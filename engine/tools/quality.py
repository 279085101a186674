"""How close an output is to what the target would write, for approximate methods (SPRINTER):
the target's own negative log-likelihood of it, and ROUGE-L against target-only output."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime import ModelRuntime


def lcs_length(first: Sequence[int], second: Sequence[int]) -> int:
    """Length of the longest common subsequence, in O(len(first) * len(second)) time and
    O(len(second)) memory."""
    previous = [0] * (len(second) + 1)
    for item in first:
        current = [0]
        for column, other in enumerate(second, start=1):
            current.append(previous[column - 1] + 1 if item == other else max(previous[column], current[column - 1]))
        previous = current
    return previous[-1]


def rouge_l_f1(candidate: Sequence[int], reference: Sequence[int]) -> float:
    """ROUGE-L F1 on token ids: 1.0 for two empty outputs, 0.0 when only one is empty."""
    if not candidate and not reference:
        return 1.0
    common = lcs_length(candidate, reference)
    if common == 0:
        return 0.0
    precision, recall = common / len(candidate), common / len(reference)
    return 2 * precision * recall / (precision + recall)


def target_nll(target: ModelRuntime, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[float, int]:
    """(summed negative log-likelihood, token count) of `output_ids` after `prompt_ids` under
    the target at temperature 1, from one forward; the target's cache is emptied after."""
    if not output_ids:
        return 0.0, 0
    target.reset()
    try:
        logits = target.forward(list(prompt_ids) + list(output_ids[:-1]), logits_wanted=len(output_ids))
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        chosen = log_probs.gather(-1, torch.tensor(list(output_ids), device=log_probs.device)[:, None])
        return float(-chosen.sum()), len(output_ids)
    finally:
        target.reset()
