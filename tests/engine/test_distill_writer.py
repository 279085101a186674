"""The one reply writer (engine/tools/distill/writer.py) over a sequence batch made here: it
drives any runtime through the `SequenceBatch` contract alone, keeps to the runtime's pacing,
and writes each reply as decoding that sequence alone would."""
from __future__ import annotations

import torch

from engine.tools.distill.replies import Job
from engine.tools.distill.writer import BatchReplyWriter

VOCAB = 16


def rule_logits(sequence: list[int]) -> torch.Tensor:
    """(V,) float32: the scripted model's next-token logits, which depend on the sequence alone."""
    favourite = (5 * sum(sequence) + len(sequence) ** 2 + sequence[-1]) % VOCAB
    return torch.tensor([4.0 if token == favourite else -float((token * 5 + len(sequence)) % 7) for token in range(VOCAB)])


class ScriptedBatch:
    """A `SequenceBatch` and nothing more (any other attribute the writer read would fail),
    which checks that it is driven as the contract says: sequences start only in free slots
    while `can_start` and `fits` allow (at most two prompts and 12 prompt tokens per step),
    every running sequence is fed once a step, and only running ones are released. Rows come
    back in reverse slot order, so a writer that assumed its own order would mix replies up."""

    def __init__(self, slots: int, sequence_tokens: int = 64):
        self.slots = slots
        self.sequence_tokens = sequence_tokens
        self.sequences: dict[int, list[int]] = {}  # running slot -> its tokens so far
        self.starting: list[int] = []  # slots started since the last step
        self.starts = self.steps = 0
        self.most_running = 0
        self.closed = False

    def can_start(self) -> bool:
        return len(self.starting) < 2

    def fits(self, prompt_length: int) -> bool:
        return sum(len(self.sequences[slot]) for slot in self.starting) + prompt_length <= 12

    def start(self, slot: int, prompt_ids: list[int]) -> None:
        assert 0 <= slot < self.slots and slot not in self.sequences
        assert self.can_start() and self.fits(len(prompt_ids))
        self.sequences[slot] = list(prompt_ids)
        self.starting.append(slot)
        self.starts += 1

    def step(self, next_tokens: list[tuple[int, int]]) -> tuple[list[int], torch.Tensor]:
        fed = [slot for slot, _ in next_tokens]
        assert sorted(fed) == sorted(slot for slot in self.sequences if slot not in self.starting)
        for slot, token in next_tokens:
            self.sequences[slot].append(token)
        self.starting = []
        self.steps += 1
        self.most_running = max(self.most_running, len(self.sequences))
        slots = sorted(self.sequences, reverse=True)
        return slots, torch.stack([rule_logits(self.sequences[slot]) for slot in slots])

    def release(self, slot: int) -> None:
        del self.sequences[slot]

    def close(self) -> None:
        self.closed = True


def alone(prompt: list[int], new_tokens: int, stop: frozenset[int]) -> list[int]:
    """The greedy reply to `prompt` decoded by itself."""
    sequence, reply = list(prompt), []
    while True:
        token = int(rule_logits(sequence).argmax())
        reply.append(token)
        sequence.append(token)
        if token in stop or len(reply) == new_tokens:
            return reply


PROMPTS = [[(3 * key + step) % VOCAB for step in range(1 + key % 6)] for key in range(11)]


def jobs() -> list[Job]:
    return [Job(key, prompt, torch.Generator().manual_seed(key)) for key, prompt in enumerate(PROMPTS)]


def test_the_writer_drives_a_batch_through_the_contract_alone_and_writes_each_reply_as_alone():
    batch = ScriptedBatch(slots=3)
    closed = []
    writer = BatchReplyWriter(batch, on_close=lambda: closed.append(True))
    assert writer.sequence_tokens == 64
    stop = frozenset({5})
    replies = {reply.key: reply for reply in writer.write(jobs(), 8, 0.0, 2, stop)}
    writer.close()
    assert sorted(replies) == list(range(len(PROMPTS)))
    for key, prompt in enumerate(PROMPTS):
        assert replies[key].reply_ids == alone(prompt, 8, stop), key
        assert replies[key].stopped == (replies[key].reply_ids[-1] in stop)
        assert replies[key].prompt_ids == prompt and replies[key].top_ids.shape == (len(replies[key].reply_ids), 2)
    assert 0 < sum(reply.stopped for reply in replies.values()) < len(PROMPTS)  # both ways of ending
    assert batch.starts == len(PROMPTS) and batch.most_running == 3  # slots freed and taken again
    assert batch.sequences == {}  # every sequence released
    assert batch.closed and closed == [True]


def test_a_stopped_writer_keeps_the_replies_that_ended_and_drops_the_running_ones():
    batch = ScriptedBatch(slots=3)
    replies = list(BatchReplyWriter(batch).write(jobs(), 8, 0.0, 0, frozenset(), should_stop=lambda: batch.steps >= 12))
    assert 0 < len(replies) < len(PROMPTS)
    assert all(reply.reply_ids == alone(PROMPTS[reply.key], 8, frozenset()) for reply in replies)


def test_sampled_replies_follow_each_jobs_own_generator_whatever_shares_the_batch():
    few = list(BatchReplyWriter(ScriptedBatch(slots=2)).write(jobs(), 6, 1.0, 0, frozenset()))
    many = list(BatchReplyWriter(ScriptedBatch(slots=5)).write(jobs(), 6, 1.0, 0, frozenset()))
    assert {reply.key: reply.reply_ids for reply in few} == {reply.key: reply.reply_ids for reply in many}
    assert abs(few[0].sampled_mass - 1) < 1e-5  # 16 tokens: every one is a candidate
