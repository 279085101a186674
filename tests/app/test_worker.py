"""The engine worker thread: signal order, stopping, errors as data, and a clean shutdown."""
from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import Qt

from app.worker import CoalescedText, EngineClient
from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig, demo_pair
from engine.errors import ModelLoadError, OutOfMemoryError
from engine.events import Finished, Provenance, TextDelta
from tests.app.fake_engine import FakeEngine, words

QUESTION = [Message("user", "Tell me something.")]


@pytest.fixture
def make_client():
    clients: list[EngineClient] = []

    def make(engine: FakeEngine) -> EngineClient:
        client = EngineClient(engine)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.shutdown()


def loaded(qtbot, make_client, engine: FakeEngine) -> EngineClient:
    client = make_client(engine)
    with qtbot.waitSignal(client.pair_loaded, timeout=5000):
        client.load_pair(demo_pair())
    return client


def record(client: EngineClient) -> list[str]:
    events: list[str] = []
    client.prompt_prepared.connect(lambda *_: events.append("prompt"))
    client.text_delta.connect(lambda *_: events.append("text"))
    client.stats_updated.connect(lambda *_: events.append("stats"))
    client.finished.connect(lambda *_: events.append("finished"))
    client.errored.connect(lambda *_: events.append("error"))
    return events


def test_events_arrive_in_order_as_signals(qtbot, make_client):
    client = loaded(qtbot, make_client, FakeEngine())
    events = record(client)
    expected = [client.prompt_prepared, client.text_delta, client.stats_updated, client.text_delta]
    with qtbot.waitSignals(expected, order="strict", timeout=5000):
        client.generate(QUESTION, DecodeSettings(), None)
    qtbot.waitUntil(lambda: not client.generating, timeout=5000)
    assert events[0] == "prompt" and events[-2:] == ["stats", "finished"]
    assert set(events[1:-2]) == {"text", "stats"}


def test_the_reply_text_and_provenance_come_through_whole(qtbot, make_client):
    engine = FakeEngine()
    client = loaded(qtbot, make_client, engine)
    deltas = []
    client.text_delta.connect(lambda _id, delta: deltas.append(delta))
    with qtbot.waitSignal(client.finished, timeout=5000) as finished:
        client.generate(QUESTION, DecodeSettings(), "Be brief.")
    _request_id, event, description = finished.args
    assert isinstance(event, Finished) and event.stop_reason == "eos"
    assert "".join(d.text for d in deltas) == event.text == engine.reply
    assert {p.value for d in deltas for p in d.provenance} == {"draft", "target", "bonus"}
    assert description["device"] == "cpu"
    assert engine.requests[0][2] == "Be brief."


def test_stop_ends_the_reply_within_a_round(qtbot, make_client):
    client = loaded(qtbot, make_client, FakeEngine(token_delay_s=0.05))
    with qtbot.waitSignal(client.text_delta, timeout=5000):
        client.generate(QUESTION, DecodeSettings(), None)
    with qtbot.waitSignal(client.finished, timeout=2000) as finished:
        client.stop()
    assert finished.args[1].stop_reason == "stopped"
    assert len(words(finished.args[1].text)) < len(words(FakeEngine().reply))
    assert not client.generating


def test_stop_before_the_worker_starts_the_reply_still_stops_it(qtbot, make_client):
    client = loaded(qtbot, make_client, FakeEngine(token_delay_s=0.05))
    with qtbot.waitSignal(client.finished, timeout=5000) as finished:
        client.generate(QUESTION, DecodeSettings(), None)
        client.stop()
    assert finished.args[1].stop_reason == "stopped"


def test_an_error_mid_reply_crosses_as_data(qtbot, make_client):
    client = loaded(qtbot, make_client, FakeEngine(fail_after_tokens=3))
    with qtbot.waitSignal(client.errored, timeout=5000) as errored:
        client.generate(QUESTION, DecodeSettings(), None)
    assert isinstance(errored.args[1], OutOfMemoryError)
    assert not client.generating and client.can_generate


def test_a_failed_load_leaves_the_previous_pair_active(qtbot, make_client):
    broken = PairConfig("broken", ModelSpec("/models/missing"))
    engine = FakeEngine(failing_sources={"/models/missing": ModelLoadError("Model file not found")})
    client = loaded(qtbot, make_client, engine)
    with qtbot.waitSignal(client.load_failed, timeout=5000) as failed:
        client.load_pair(broken)
    assert failed.args[0] == broken and isinstance(failed.args[1], ModelLoadError)
    assert client.pair.config.name == "demo" and client.loading is None
    assert engine.closed_pairs == []


def test_loading_a_new_pair_closes_the_old_one_on_the_worker(qtbot, make_client):
    engine = FakeEngine()
    client = loaded(qtbot, make_client, engine)
    with qtbot.waitSignal(client.pair_loaded, timeout=5000):
        client.load_pair(PairConfig("other", ModelSpec("/models/other")))
    assert client.pair.config.name == "other" and engine.closed_pairs == ["demo"]


def test_shutdown_mid_reply_stops_the_engine_and_joins_the_thread(qtbot, make_client):
    engine = FakeEngine(token_delay_s=0.05)
    client = loaded(qtbot, make_client, engine)
    with qtbot.waitSignal(client.text_delta, timeout=5000):
        client.generate(QUESTION, DecodeSettings(), None)
    started = time.perf_counter()
    client.shutdown()
    assert time.perf_counter() - started < 1.0
    assert not client._thread.isRunning()
    assert engine.closed_pairs == ["demo"]


def test_shutdown_abandons_a_load_at_its_next_progress_report(qtbot, make_client):
    engine = FakeEngine(load_delay_s=2.0)
    client = make_client(engine)
    client.load_pair(demo_pair())
    qtbot.waitUntil(lambda: bool(engine.loads), timeout=2000)
    started = time.perf_counter()
    client.shutdown()
    assert time.perf_counter() - started < 1.0


def test_calibration_runs_on_the_worker_reports_its_phases_and_gives_the_pair_its_heads(qtbot, make_client):
    engine = FakeEngine()
    client = loaded(qtbot, make_client, engine)
    assert "sprinter" not in client.pair.methods and client.pair.heads_card is None
    gui_thread = threading.get_ident()
    steps, threads = [], []
    client.worker.calibration_progress.connect(lambda *_: threads.append(threading.get_ident()),
                                               Qt.ConnectionType.DirectConnection)
    client.calibration_progress.connect(lambda *step: steps.append(step))
    with qtbot.waitSignals([client.busy_changed, client.calibrated], order="strict", timeout=5000):
        client.calibrate()
    assert gui_thread not in threads  # the calibration ran on the engine thread
    assert steps == [("replies", done, 8) for done in range(9)] + [("training", done, 2) for done in range(3)]
    assert {"adaptive", "sprinter"} <= set(client.pair.methods)
    assert client.pair.heads_card["modes"]["greedy"]["sprinter"]["false_positive_rate"] == 0.098
    assert client.can_generate and not client.calibrating


def test_replies_wait_while_a_calibration_runs(qtbot, make_client):
    client = loaded(qtbot, make_client, FakeEngine(calibration_step_s=0.05))
    client.calibrate()
    assert client.calibrating and not client.can_generate
    with qtbot.waitSignal(client.calibrated, timeout=5000):
        pass
    assert client.can_generate


def test_a_cancelled_calibration_leaves_the_pair_as_it_was(qtbot, make_client):
    engine = FakeEngine(calibration_step_s=0.05)
    client = loaded(qtbot, make_client, engine)
    before = client.pair
    with qtbot.waitSignal(client.calibration_progress, timeout=5000):
        client.calibrate()
    with qtbot.waitSignal(client.calibration_cancelled, timeout=5000):
        client.cancel_calibration()
    assert client.pair is before and "sprinter" not in client.pair.methods
    assert engine.calibrations == 0 and not client.calibrating and client.can_generate
    with qtbot.waitSignal(client.finished, timeout=5000) as finished:
        client.generate(QUESTION, DecodeSettings(method="chain"), None)
    assert finished.args[1].stats.exact


def test_a_failed_calibration_crosses_as_data_and_replies_go_on(qtbot, make_client):
    engine = FakeEngine(calibration_error=OutOfMemoryError("The machine ran out of memory while calibrating."))
    client = loaded(qtbot, make_client, engine)
    with qtbot.waitSignal(client.calibration_failed, timeout=5000) as failed:
        client.calibrate()
    assert isinstance(failed.args[0], OutOfMemoryError)
    assert "sprinter" not in client.pair.methods and client.can_generate
    with qtbot.waitSignal(client.finished, timeout=5000):
        client.generate(QUESTION, DecodeSettings(), None)


def test_shutdown_cancels_a_calibration_at_its_next_step(qtbot, make_client):
    engine = FakeEngine(calibration_step_s=0.1)
    client = loaded(qtbot, make_client, engine)
    with qtbot.waitSignal(client.calibration_progress, timeout=5000):
        client.calibrate()
    started = time.perf_counter()
    client.shutdown()
    assert time.perf_counter() - started < 1.0
    assert engine.calibrations == 0 and not client._thread.isRunning()


def test_a_fast_reply_reaches_the_window_in_few_signals_and_whole(qtbot, make_client):
    # One delta per word with no delay: a signal per delta would wake the window's thread for each.
    engine = FakeEngine(reply=" ".join(f"word{i}" for i in range(400)), stats_every_round=False)
    client = loaded(qtbot, make_client, engine)
    deltas = []
    client.text_delta.connect(lambda _id, delta: deltas.append(delta))
    with qtbot.waitSignal(client.finished, timeout=5000) as finished:
        client.generate(QUESTION, DecodeSettings(method="ar", max_new_tokens=400), None)
    event = finished.args[1]
    assert len(event.token_ids) == 400
    assert len(deltas) < 100  # merged: the reply took well under 100 screen refreshes
    assert "".join(d.text for d in deltas) == event.text == engine.reply
    assert sum(len(d.token_ids) for d in deltas) == 400
    assert all(len(d.pieces) == len(d.provenance) == len(d.token_ids) for d in deltas)
    assert "".join(piece for d in deltas for piece in d.pieces) == event.text


def test_text_is_merged_until_a_refresh_interval_has_passed():
    now = [0.0]
    text = CoalescedText(interval_s=0.05, clock=lambda: now[0])
    delta = lambda word, kind: TextDelta(word, (len(word),), (kind,), (word,))  # noqa: E731
    assert text.add(delta("One", Provenance.TARGET))  # the first text goes at once
    assert text.take().text == "One"
    now[0] = 0.01
    assert not text.add(delta(" two", Provenance.DRAFT)) and not text.add(delta(" three", Provenance.BONUS))
    assert text.pending
    now[0] = 0.06
    assert text.add(delta(" four", Provenance.TARGET))
    merged = text.take()
    assert merged.text == " two three four" and merged.pieces == (" two", " three", " four")
    assert merged.provenance == (Provenance.DRAFT, Provenance.BONUS, Provenance.TARGET) and merged.token_ids == (4, 6, 5)
    assert not text.pending
