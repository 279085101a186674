"""The second-stage drafter: a backoff trigram model over a background table and the
conversation."""
from __future__ import annotations

import random

import pytest

from engine.drafters.backoff_ngram import BackoffNgram, NgramCounts

VOCAB = 40


def background(seed: int = 0) -> NgramCounts:
    rng = random.Random(seed)
    counts = NgramCounts()
    for _ in range(20):
        counts.add([rng.randrange(VOCAB // 2) for _ in range(30)])
    return counts


@pytest.mark.parametrize("history", [(), (3,), (3, 7), (39, 38), (1, 2, 3, 4)])
def test_backoff_probabilities_sum_to_one(history):
    model = BackoffNgram(VOCAB, background())
    model.observe([5, 3, 7, 3, 7, 9, 3, 7, 1])
    total = sum(model.probability(history, token) for token in range(VOCAB))
    assert total == pytest.approx(1.0, abs=1e-9)


def test_proposals_come_only_from_seen_histories():
    model = BackoffNgram(VOCAB, background(1))
    context = [11, 4, 18, 4, 18, 2]
    proposal = model.propose(context, 6)
    history = context[-2:]
    for token in proposal:
        seen_after = [
            model.conversation.after.get(tuple(history[-n:]), {}).get(token, 0)
            + model.background.after.get(tuple(history[-n:]), {}).get(token, 0)
            for n in (1, 2)
        ]
        assert max(seen_after) > 0, f"{token} was never seen after {history}"
        history = (history + [token])[-2:]


def test_nothing_is_proposed_after_an_unseen_token():
    model = BackoffNgram(VOCAB)  # no background: only the conversation counts
    assert model.propose([30, 31, 32], 4) == []  # each token occurs once: nothing follows the last one


def test_the_conversation_is_copied():
    model = BackoffNgram(VOCAB)
    reply = [21, 22, 23, 24, 25]
    assert model.propose(reply + [9] + reply[:2], 3) == reply[2:5]


def test_a_new_conversation_starts_counting_over():
    model = BackoffNgram(VOCAB)
    model.observe([1, 2, 3, 1, 2])
    model.observe([7, 8])
    assert (1,) not in model.conversation.after


def test_table_round_trips_through_a_file(tmp_path):
    counts = background()
    counts.prune(min_count=2)
    counts.save(tmp_path / "table.npz")
    loaded = NgramCounts.load(tmp_path / "table.npz")
    assert {h: dict(c) for h, c in loaded.after.items()} == {h: dict(c) for h, c in counts.after.items() if c}
