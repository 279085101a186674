"""The server's first pair is loaded on its worker thread, where its replies run."""
from __future__ import annotations

import threading

from engine.config import ModelSpec, PairConfig
from engine.serve.pair_host import PairHost
from engine.serve.work_queue import GenerationQueue


class FakePair:
    def __init__(self, config: PairConfig):
        self.config = config
        self.has_background_work = False
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_config_is_loaded_by_the_worker_before_any_request():
    """Each thread keeps its own OpenMP threads: a load on the main thread and replies on the
    worker made two teams on two cores, and replies ran at a third of their speed."""
    config = PairConfig("mine", ModelSpec("somewhere"))
    loaded_on = []

    def load(asked: PairConfig) -> FakePair:
        loaded_on.append(threading.current_thread().name)
        return FakePair(asked)

    host = PairHost(config, saved_pairs=lambda: [], load=load)
    assert host.loaded_name is None and host.names() == ["mine"]  # nothing loaded yet, but named
    queue = GenerationQueue(host, max_waiting=2)
    queue.start()
    queue.close()  # ends the worker once it has loaded and found nothing to do
    assert loaded_on == ["tandem-serve-worker"]
    assert host.loaded_name == "mine"
    host.close()


def test_a_pair_that_cannot_load_leaves_the_worker_serving():
    def load(_asked: PairConfig):
        raise FileNotFoundError("no such model")

    host = PairHost(PairConfig("broken", ModelSpec("nowhere")), saved_pairs=lambda: [], load=load)
    queue = GenerationQueue(host, max_waiting=2)
    queue.start()
    queue.close()
    assert host.loaded_name is None
