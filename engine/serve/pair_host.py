"""The pair the server has loaded, and the saved pairs a request's `model` may name instead.

One pair is in memory at a time: a request for another closes it and loads that one (as LM
Studio and Ollama load a model on its first request), on the worker thread, so requests
queued behind it wait rather than run on a half-loaded pair. A pair's names are those of the
app's pair picker (engine/pairs.py), read again at every request, so a pair saved in the app
while the server runs can be asked for.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from ..config import PairConfig
from ..pairs import all_pairs
from ..session import LoadedPair, load_pair
from .api_errors import RequestError


class PairHost:
    def __init__(
        self,
        loaded: LoadedPair | PairConfig,
        saved_pairs: Callable[[], list[PairConfig]] = all_pairs,
        load: Callable[[PairConfig], LoadedPair] = load_pair,
    ):
        """`loaded`: the first pair, loaded, or its config for the worker thread to load
        (`tandem serve` does that: see `load_first`)."""
        first = loaded if isinstance(loaded, PairConfig) else loaded.config
        self.default_name = first.name
        # The first pair is kept by its config: one from --target is not among the saved ones.
        self._first = first
        self._saved_pairs = saved_pairs
        self._load = load
        self._pair: LoadedPair | None = None
        # Set on a compile's thread when a runtime's background work ends; the worker thread
        # then measures again what it changed, before its next reply (as `tandem chat` does).
        self._background_work_ended = threading.Event()
        if not isinstance(loaded, PairConfig):
            self._hold(loaded)

    def load_first(self) -> None:
        """Load the first pair now, on the calling thread (the worker's, before any request).

        Why there and not on the main thread: a thread's OpenMP threads stay with it, and two
        threads' teams of two on two cores make libgomp stop spinning at its barriers: a reply
        on the worker after a load on the main thread ran at a third of its speed (47 tok/s
        against 140 on the demo pair, docs/BENCHMARKS.md)."""
        self.pair_for(None)

    def names(self) -> list[str]:
        """Every pair a request may name, the first pair's first."""
        names = [self.default_name]
        names += [config.name for config in self._saved_pairs() if config.name not in names]
        return names

    def knows(self, name: str) -> bool:
        return name in self.names()

    @property
    def loaded_name(self) -> str | None:
        pair = self._pair
        return pair.config.name if pair is not None else None

    def pair_for(self, name: str | None) -> LoadedPair:
        """The pair called `name` (None: the first pair), loaded if it is not the one in
        memory. Call it on the worker thread only: it runs the models."""
        name = name or self.default_name
        pair = self._pair
        if pair is None or pair.config.name != name:
            self.close()
            self._hold(self._load(self._config(name)))
        elif self._background_work_ended.is_set():
            self._background_work_ended.clear()
            pair.after_background_work()
        return self._pair

    def close(self) -> None:
        pair, self._pair = self._pair, None
        if pair is not None:
            pair.close()

    def _hold(self, pair: LoadedPair) -> None:
        self._pair = pair
        self._background_work_ended.clear()
        if pair.has_background_work:
            pair.when_background_work_changes(self._background_work_ended.set)

    def _config(self, name: str) -> PairConfig:
        if name == self.default_name:
            return self._first
        for config in self._saved_pairs():
            if config.name == name:
                return config
        raise unknown_model(name)  # the route checked the name: the pair was deleted since


def unknown_model(name: str) -> RequestError:
    return RequestError(404, f"The model {name!r} does not exist: GET /v1/models lists the pairs this server has.",
                        "model_not_found", "model")
