"""Many sequences at once in a torch model's batch dimension (`SequenceBatch`): fixed
batches, distillation's way of writing a target's replies on a GPU, where a batch's forward
costs what one sequence's does.

The sequences of a batch start together: their prompts run in one left-padded forward (each
at positions from 0, the padding masked out), then every step feeds each row its next token
through transformers' cache. That cache holds one length for every row, so no sequence can
join a running batch: new ones start once all of a batch's have been released. A released
row keeps running on padding until then, and nothing else sees it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache

IdMap = Callable[[torch.Tensor], torch.Tensor]


class TorchSequenceBatch:
    """Batches of up to `slots` sequences of `model` on `device`. `usable_vocab`: the logits
    past it are embedding padding and are cut off; `pad_id` fills the prompts' left padding
    and the released rows; `to_model_ids` and `full_logits` map a reduced-vocabulary model's
    ids and logits from and to the tokenizer's (identity for any other)."""

    def __init__(
        self, model: torch.nn.Module, device: torch.device, slots: int, sequence_tokens: int, usable_vocab: int,
        pad_id: int, to_model_ids: IdMap = lambda ids: ids, full_logits: IdMap = lambda logits: logits,
    ):
        self.model = model
        self.device = device
        self.slots = slots
        self.sequence_tokens = sequence_tokens
        self.usable_vocab = usable_vocab
        self.pad_id = pad_id
        self.to_model_ids = to_model_ids
        self.full_logits = full_logits
        self._starting: list[tuple[int, list[int]]] = []  # (slot, prompt) of the batch to come
        self._rows: list[int] = []  # the running batch's slot of each row
        self._released: set[int] = set()  # its slots that ended
        self._cache: DynamicCache | None = None
        self._attention_mask = self._next_position = None  # (B, T) and (B, 1) for the running batch

    def close(self) -> None:
        self._cache = None

    # The contract

    def can_start(self) -> bool:
        return len(self._released) == len(self._rows)  # no batch running

    def fits(self, prompt_length: int) -> bool:
        return True

    def start(self, slot: int, prompt_ids: list[int]) -> None:
        self._starting.append((slot, prompt_ids))

    @torch.inference_mode()
    def step(self, next_tokens: list[tuple[int, int]]) -> tuple[list[int], torch.Tensor]:
        if self._starting:
            if next_tokens:
                raise ValueError("a torch batch starts its sequences only once the last batch's have ended")
            logits = self._run_prompts()
        else:
            logits = self._run_tokens(next_tokens)
        # Embedding rows past the tokenizer are padding and must never be sampled.
        logits = self.full_logits(logits).float()[:, : self.usable_vocab]  # (B, V)
        running = [row for row, slot in enumerate(self._rows) if slot not in self._released]
        if len(running) < len(self._rows):
            logits = logits[torch.tensor(running, device=logits.device)]
        return [self._rows[row] for row in running], logits

    def release(self, slot: int) -> None:
        self._released.add(slot)

    def _run_prompts(self) -> torch.Tensor:
        """The new batch's prompts in one left-padded forward: (B, V) model logits."""
        prompts = [prompt for _, prompt in self._starting]
        self._rows, self._released = [slot for slot, _ in self._starting], set()
        self._starting = []
        batch, width = len(prompts), max(len(ids) for ids in prompts)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T): each prompt starts at 0
        self._cache = DynamicCache(config=self.model.config)
        logits = self.model(
            input_ids=self.to_model_ids(input_ids), attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=self._cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        self._attention_mask, self._next_position = attention_mask, position_ids[:, -1:] + 1
        return logits

    def _run_tokens(self, next_tokens: list[tuple[int, int]]) -> torch.Tensor:
        """One token for every row of the running batch: (B, V) model logits."""
        row_of = {slot: row for row, slot in enumerate(self._rows)}
        tokens = [self.pad_id] * len(self._rows)
        for slot, token in next_tokens:
            tokens[row_of[slot]] = token
        token_ids = torch.tensor(tokens, dtype=torch.long).to(self.device)[:, None]  # (B, 1)
        ones = torch.ones((len(tokens), 1), dtype=torch.long, device=self.device)
        self._attention_mask = torch.cat([self._attention_mask, ones], dim=1)
        logits = self.model(
            input_ids=self.to_model_ids(token_ids), attention_mask=self._attention_mask, position_ids=self._next_position,
            past_key_values=self._cache, use_cache=True,
        ).logits[:, -1]
        self._next_position = self._next_position + 1
        return logits
