"""A runtime that runs another one behind the contract and changes what passes between them
(a reduced draft's ids, a draft's window over a long prompt): what it does not change, the
inner runtime answers."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .base import ModelRuntime


class WrappedRuntime(ModelRuntime):
    """`inner` holds the cache; a subclass maps the slot operations onto it."""

    def __init__(self, inner: ModelRuntime, vocab_size: int):
        super().__init__(vocab_size)
        self.inner = inner
        self.name = inner.name
        self.supports_trees = inner.supports_trees
        self.returns_hidden = inner.returns_hidden
        self.warm_up_message = inner.warm_up_message

    def _clear(self) -> None:
        self.inner.reset()

    def last_hidden_states(self) -> torch.Tensor:
        return self.inner.last_hidden_states()

    def warm_up(self) -> None:
        self.inner.warm_up()

    def start_background_work(self) -> None:
        self.inner.start_background_work()

    def when_background_work_changes(self, listener: Callable[[], None]) -> None:
        self.inner.when_background_work_changes(listener)

    @property
    def background_note(self) -> str | None:
        return self.inner.background_note

    def close(self) -> None:
        self.inner.close()
