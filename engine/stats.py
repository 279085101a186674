"""Speed and acceptance statistics of one reply, updated every decoding round."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """Counters of one reply. Derived figures are properties so they can never disagree
    with the counters they come from."""

    method: str = "chain"
    tokens_generated: int = 0
    elapsed_s: float = 0.0
    time_to_first_token_s: float | None = None
    draft_tokens_proposed: int = 0
    draft_tokens_accepted: int = 0
    # proposed_by_position[i] / accepted_by_position[i]: draft tokens at position i+1 of a round
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    draft_time_s: float = 0.0
    target_time_s: float = 0.0
    prompt_tokens: int = 0
    # Trees: drafted nodes the target verified. Second stage: n-gram tokens the draft model
    # scored, and how many of them it kept as its own choice.
    tree_nodes_verified: int = 0
    stage_tokens_proposed: int = 0
    stage_tokens_accepted: int = 0
    # The stop token that ended the reply (0 or 1): a target call produced it, but it is not
    # part of the reply, so it is counted here and not in tokens_generated.
    stop_tokens: int = 0
    # SPRINTER: tokens its learned verifier let out without the target checking them, and
    # rounds that ended without a target call. `exact` is False for such a reply.
    unchecked_tokens: int = 0
    target_calls_skipped: int = 0
    exact: bool = True
    # Tokens each target call ran (what its cache lacked, then the draft): with a device's
    # measured cost per call size, `tandem bench --cost-table` re-times a reply for it.
    target_call_tokens: list[int] = field(default_factory=list)
    # `auto`: the rounds each method ran, and what it chose in plain words.
    rounds_by_method: dict[str, int] = field(default_factory=dict)
    note: str = ""

    def record_round(self, proposed: int, accepted: int) -> None:
        """Count one verified round: `proposed` draft tokens, the first `accepted` of them kept."""
        self.draft_tokens_proposed += proposed
        self.draft_tokens_accepted += accepted
        missing = proposed - len(self.proposed_by_position)
        if missing > 0:
            self.proposed_by_position.extend([0] * missing)
            self.accepted_by_position.extend([0] * missing)
        for position in range(proposed):
            self.proposed_by_position[position] += 1
            if position < accepted:
                self.accepted_by_position[position] += 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_generated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        if not self.draft_tokens_proposed:
            return None
        return self.draft_tokens_accepted / self.draft_tokens_proposed

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    @property
    def tokens_from_target_calls(self) -> int:
        """Every token the target's calls produced, the stop token included: without it, a
        reply that ends on a stop token shows `ar` below one token per call."""
        return self.tokens_generated + self.stop_tokens

    @property
    def mean_accepted_per_target_call(self) -> float | None:
        """Tokens emitted per target forward (the papers' "compression ratio"); 1.0 for `ar`."""
        return self.tokens_from_target_calls / self.target_calls if self.target_calls else None

    @property
    def target_calls_per_token(self) -> float | None:
        produced = self.tokens_from_target_calls
        return self.target_calls / produced if produced else None

    @property
    def target_calls_saved(self) -> int:
        """Target forwards saved compared with one target call per generated token."""
        return max(self.tokens_from_target_calls - self.target_calls, 0)

    @property
    def draft_calls_per_target_call(self) -> float | None:
        return self.draft_calls / self.target_calls if self.target_calls else None

    @property
    def draft_stage_acceptance(self) -> float | None:
        """Second stage: the share of n-gram tokens the draft model agreed with."""
        if not self.stage_tokens_proposed:
            return None
        return self.stage_tokens_accepted / self.stage_tokens_proposed

    @property
    def draft_time_share(self) -> float | None:
        busy = self.draft_time_s + self.target_time_s
        return self.draft_time_s / busy if busy > 0 else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            tokens_per_s=self.tokens_per_s,
            acceptance_rate=self.acceptance_rate,
            acceptance_by_position=self.acceptance_by_position,
            mean_accepted_per_target_call=self.mean_accepted_per_target_call,
            target_calls_per_token=self.target_calls_per_token,
            target_calls_saved=self.target_calls_saved,
            draft_time_share=self.draft_time_share,
            draft_calls_per_target_call=self.draft_calls_per_target_call,
            draft_stage_acceptance=self.draft_stage_acceptance,
        )
        return data

    def snapshot(self) -> GenerationStats:
        """An independent copy, safe to hand to another thread."""
        return GenerationStats(**asdict(self))  # asdict copies the lists too
