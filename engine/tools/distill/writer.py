"""The one reply writer: many target replies at once over any runtime's `SequenceBatch`
(engine/runtime/base.py), the torch batch on a GPU, the native int8 forward or llama.cpp on a
CPU, all driven the same way.

Each step feeds every running reply its last token; a reply that ends (a stop token, or
`max_new_tokens`) frees its slot for the next job, as soon as the runtime takes new
sequences. Each reply is drawn with its own generator from the logits its sequence gets
alone, so which replies share a step changes nothing in any of them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ...models import LoadedModel
from ...runtime.base import SequenceBatch
from ...runtime.native_batch import NativeSequenceBatch
from ...runtime.native_forward import refusal
from ...runtime.torch_batch import TorchSequenceBatch
from .replies import Job, Reply, RunningReply, check_prompt_fits, sample_next


class BatchReplyWriter:
    """A `ReplyWriter` over `batch`; `on_close` runs after the batch closes (to free the
    model it ran)."""

    def __init__(self, batch: SequenceBatch, on_close: Callable[[], None] | None = None):
        self.batch = batch
        self.sequence_tokens = batch.sequence_tokens
        self._on_close = on_close

    def close(self) -> None:
        self.batch.close()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def write(
        self,
        jobs: Iterable[Job],
        max_new_tokens: int,
        temperature: float,
        stored_top_k: int,
        stop_ids: frozenset[int],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[Reply]:
        """Yield each job's reply as it ends. Stopping drops the replies still running."""
        batch = self.batch
        waiting = iter(jobs)
        held: Job | None = None  # a job taken that did not fit beside this step's prompts
        exhausted = False
        running: dict[int, RunningReply] = {}
        free = list(range(batch.slots - 1, -1, -1))
        next_tokens: list[tuple[int, int]] = []  # (slot, token): each running reply's last token
        while True:
            # 1. new replies take the free slots, as the runtime paces its prompts
            while free and not exhausted and batch.can_start():
                job, held = held or next(waiting, None), None
                if job is None:
                    exhausted = True
                    break
                check_prompt_fits(job.prompt_ids, batch.sequence_tokens, max_new_tokens)
                if not batch.fits(len(job.prompt_ids)):
                    held = job
                    break
                slot = free.pop()
                batch.start(slot, job.prompt_ids)
                running[slot] = RunningReply(job)
            if not running or should_stop():
                return
            # 2. one step over every running reply
            slots, logits = batch.step(next_tokens)
            # 3. each its next token; the replies that end free their slots
            next_tokens = []
            for slot, token in zip(slots, sample_next(logits, [running[slot] for slot in slots], temperature, stored_top_k)):
                finished = running[slot].add(token, stop_ids, max_new_tokens)
                if finished is None:
                    next_tokens.append((slot, token))
                    continue
                del running[slot]
                batch.release(slot)
                free.append(slot)
                yield finished


# The batches of models loaded for a pair (`LoadedModel`)


def torch_batch(target: LoadedModel, slots: int) -> TorchSequenceBatch:
    """Fixed batches of `slots` replies through the target's torch model (a GPU's way).
    Ids are the tokenizer's throughout, also for a reduced-vocabulary model (a draft)."""
    model, vocabulary = target.model, target.vocabulary
    usable_vocab = min(len(target.tokenizer), model.config.vocab_size if vocabulary is None else vocabulary.full_size)
    # Padding is masked out everywhere; any id will do, and a stop id always exists.
    pad = getattr(target.tokenizer, "pad_token_id", None)
    pad_id = int(pad) if isinstance(pad, int) else min(target.stop_token_ids)
    if vocabulary is None:
        return TorchSequenceBatch(model, target.device, slots, target.context_length, usable_vocab, pad_id)
    return TorchSequenceBatch(model, target.device, slots, target.context_length, usable_vocab, pad_id,
                              vocabulary.to_model_ids, vocabulary.full_logits)


def native_refusal(target: LoadedModel) -> str | None:
    """Why the target's replies cannot be written on the native forward; None when they can."""
    if target.model is None:
        return f"{target.label} runs on {target.runtime}, not on torch"
    return refusal(target.model, target.device)


def native_batch(target: LoadedModel, slots: int, sequence_tokens: int) -> NativeSequenceBatch:
    reason = native_refusal(target)
    if reason is not None:
        raise ValueError(f"the native forward cannot write {target.label}'s replies: {reason}")
    return NativeSequenceBatch(target.model, target.device, slots, sequence_tokens)
