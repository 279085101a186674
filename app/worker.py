"""The bridge between the window and the engine: one long-lived thread owns the models.

`EngineWorker` lives on that thread and does all model work there, one request at a time:
loading a pair, generating a reply (each engine event becomes a signal), calibrating the
pair's heads (minutes), checking which drafts fit a target, downloading a model. Errors
cross back as data in signals.

`EngineClient` lives on the GUI thread. It starts and joins the thread, queues requests to
the worker, and re-emits the worker's signals once it has updated what it knows (which pair
is active, whether a reply is streaming). Stopping a reply calls `Generation.stop()`
directly: the worker is busy in the decode loop, so a queued slot would only run after it;
cancelling a calibration sets a flag that the calibration checks between its steps.
"""
from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.errors import TandemError
from engine.events import Finished, PromptPrepared, PromptProgress, StatsUpdate, TextDelta

from .engine_api import EngineApi

# The most often a reply's new text goes to the window. Each update costs the window's thread
# ~3.5 ms of layout and paint, taken from a core the engine's two threads share: at 30 a second
# the app wrote 0.88x its engine, at 15 a second 0.90-0.91x (docs/BENCHMARKS.md, tandem
# gui-bench), with text still arriving every 67 ms.
TEXT_INTERVAL_S = 1 / 15


@dataclass(frozen=True)
class PairInfo:
    """What the GUI knows about the loaded pair; the models themselves stay on the worker."""

    config: PairConfig
    description: dict  # LoadedPair.describe(): target, draft, device, precision, memory_mb
    methods: tuple[str, ...]
    verifiers: tuple[tuple[str, str, bool], ...]  # (name, label, is_exact)
    heads_card: dict | None = None  # the calibrated heads' card (held-out figures), if the pair has heads
    heads_problem: str | None = None  # why heads on disk could not be used

    def verifier_label(self, name: str) -> str:
        return next((label for key, label, _exact in self.verifiers if key == name), name)

    @classmethod
    def of(cls, config: PairConfig, loaded: Any) -> PairInfo:
        heads = getattr(loaded, "heads", None)
        return cls(
            config, loaded.describe(), tuple(loaded.methods), tuple(loaded.verifiers),
            heads.card if heads is not None else None, getattr(loaded, "heads_problem", None),
        )


@dataclass(frozen=True)
class GenerationRequest:
    request_id: int
    messages: tuple[Message, ...]  # oldest first, ending with the user message to answer
    settings: DecodeSettings
    system_prompt: str | None


class CoalescedText:
    """The reply's text deltas, merged into one per TEXT_INTERVAL_S.

    The engine yields a delta per round, a hundred or more a second on a small pair. A signal
    for each woke the window's thread as often, and on a 2-core machine every wake-up takes a
    core from the engine's threads, which wait for each other at every step (issue 45). Merged,
    the window wakes at most `interval_s` apart (and a slow round's text still goes at once)."""

    def __init__(self, interval_s: float = TEXT_INTERVAL_S, clock: Callable[[], float] = time.perf_counter):
        self.interval_s = interval_s
        self._clock = clock
        self._deltas: list[TextDelta] = []
        self._last_sent = -math.inf

    @property
    def pending(self) -> bool:
        return bool(self._deltas)

    def add(self, delta: TextDelta) -> bool:
        """Keep `delta`; whether the text kept should be sent now."""
        self._deltas.append(delta)
        return self._clock() - self._last_sent >= self.interval_s

    def take(self) -> TextDelta:
        """The deltas kept, as one (their text, tokens, provenance and pieces in order)."""
        deltas, self._deltas = self._deltas, []
        self._last_sent = self._clock()
        if len(deltas) == 1:
            return deltas[0]
        return TextDelta(
            "".join(delta.text for delta in deltas),
            tuple(token for delta in deltas for token in delta.token_ids),
            tuple(kind for delta in deltas for kind in delta.provenance),
            # Pieces only where every delta has its own: else none, as a delta without them has.
            tuple(piece for delta in deltas for piece in delta.pieces)
            if all(len(delta.pieces) == len(delta.provenance) for delta in deltas) else (),
        )


class ShutdownRequested(Exception):
    """Raised from a load's progress callback to abandon the load when the app closes."""


class EngineWorker(QObject):
    load_progress = Signal(str, object)  # message, fraction done or None
    pair_loaded = Signal(object)  # PairInfo
    load_failed = Signal(object, object)  # PairConfig, Exception
    prompt_prepared = Signal(int, object)  # request id, PromptPrepared
    # Request id, PromptProgress, when it was read (time.monotonic() here, not as it arrives:
    # the window may take the first one late, and the reading speed is measured from these).
    prompt_progress = Signal(int, object, float)
    text_delta = Signal(int, object)  # request id, TextDelta
    stats_updated = Signal(int, object, object)  # request id, GenerationStats, pair description now
    finished = Signal(int, object, object)  # request id, Finished, pair description now
    errored = Signal(int, object)  # request id, Exception
    drafts_checked = Signal(str, object)  # target source, {draft source: reason or None}
    download_progress = Signal(str, object)
    downloaded = Signal(str, str)  # repo id, local folder
    download_failed = Signal(str, object)  # repo id, Exception
    calibration_progress = Signal(str, int, int)  # phase ("replies" | "training"), done, total
    calibrated = Signal(object)  # PairInfo of the pair, now with its heads
    calibration_cancelled = Signal()
    calibration_failed = Signal(object)  # Exception
    runtime_changed = Signal(object)  # the pair's description, once its background work (a compile) ended
    # Emitted on the thread that did that work; delivered to the worker's own thread.
    _background_work_ended = Signal(object)  # the LoadedPair

    def __init__(self, engine: EngineApi):
        super().__init__()
        self._background_work_ended.connect(self._describe_after_background_work)
        self._engine = engine
        self._pair: Any = None  # the LoadedPair; touched on the worker thread only
        self._lock = threading.Lock()  # guards the fields below, shared with the GUI thread
        self._generation: Any = None
        self._generation_id: int | None = None
        self._cancelled: set[int] = set()
        self._shutting_down = False
        self._calibration_stop = threading.Event()

    # Called from the GUI thread

    def stop_generation(self, request_id: int) -> None:
        with self._lock:
            self._cancelled.add(request_id)
            if self._generation is not None and self._generation_id == request_id:
                self._generation.stop()

    def begin_shutdown(self) -> None:
        """Make the worker drop queued work, end a reply after its current round, and
        abandon a load at its next progress report and a calibration at its next step."""
        with self._lock:
            self._shutting_down = True
            self._calibration_stop.set()
            if self._generation is not None:
                self._generation.stop()

    def arm_calibration(self) -> None:
        """Called as a calibration is requested, so that a Cancel right after it still counts."""
        self._calibration_stop.clear()

    def cancel_calibration(self) -> None:
        self._calibration_stop.set()

    # Slots: run on the worker thread, in the order they were requested

    @Slot(object)
    def load_pair(self, config: PairConfig) -> None:
        if self._shutting_down:
            return

        def progress(message: str, fraction: float | None) -> None:
            if self._shutting_down:
                raise ShutdownRequested
            self.load_progress.emit(message, fraction)

        try:
            loaded = self._engine.load_pair(config, progress)
        except ShutdownRequested:
            return
        except Exception as error:  # any failure leaves the previous pair active; the GUI says why
            self.load_failed.emit(config, error)
            return
        if self._shutting_down:
            loaded.close()
            return
        previous, self._pair = self._pair, loaded
        if previous is not None:
            previous.close()
        if hasattr(loaded, "when_background_work_changes"):
            loaded.when_background_work_changes(lambda: self._background_work_ended.emit(loaded))
        self.pair_loaded.emit(PairInfo.of(config, loaded))

    @Slot(object)
    def _describe_after_background_work(self, pair: Any) -> None:
        if pair is not self._pair or self._shutting_down:  # a pair replaced since
            return
        try:
            pair.after_background_work()
        except Exception as error:  # the measurement failing costs the tree its best shape, not the app
            warnings.warn(f"measuring the tree costs again failed: {error}", RuntimeWarning, stacklevel=1)
        self.runtime_changed.emit(pair.describe())

    @Slot(object)
    def generate(self, request: GenerationRequest) -> None:
        if self._shutting_down:
            return
        text = CoalescedText()
        try:
            if self._pair is None:
                raise TandemError("No model pair is loaded yet. Wait for it to load, or choose one in Settings.")
            generation = self._pair.generate(list(request.messages), request.settings, request.system_prompt)
            with self._lock:
                self._generation, self._generation_id = generation, request.request_id
                if request.request_id in self._cancelled or self._shutting_down:
                    generation.stop()
            for event in generation:
                if isinstance(event, TextDelta):
                    if text.add(event):
                        self.text_delta.emit(request.request_id, text.take())
                    continue
                if text.pending:  # text first: the events after it speak of a reply that includes it
                    self.text_delta.emit(request.request_id, text.take())
                self._emit(request.request_id, event)
            if text.pending:
                self.text_delta.emit(request.request_id, text.take())
        except Exception as error:  # crosses to the GUI thread as data and is shown there
            if text.pending:  # the text written before the error is kept with the failed reply
                self.text_delta.emit(request.request_id, text.take())
            self.errored.emit(request.request_id, error)
        finally:
            with self._lock:
                self._generation = self._generation_id = None
                self._cancelled.discard(request.request_id)

    def _emit(self, request_id: int, event: Any) -> None:
        if isinstance(event, StatsUpdate):
            self.stats_updated.emit(request_id, event.stats, self._pair.describe())
        elif isinstance(event, PromptPrepared):
            self.prompt_prepared.emit(request_id, event)
        elif isinstance(event, PromptProgress):
            self.prompt_progress.emit(request_id, event, time.monotonic())
        elif isinstance(event, Finished):
            self.finished.emit(request_id, event, self._pair.describe())

    @Slot()
    def calibrate(self) -> None:
        """Train the active pair's heads (minutes). Cancelled, the pair keeps what it had."""
        if self._shutting_down:
            return
        try:
            if self._pair is None:
                raise TandemError("No model pair is loaded yet, so there is nothing to calibrate.")
            card = self._engine.calibrate(self._pair, self.calibration_progress.emit, self._calibration_stop.is_set)
        except Exception as error:  # shown in Settings; the pair stays as it was
            self.calibration_failed.emit(error)
            return
        if card is None:
            self.calibration_cancelled.emit()
        else:
            self.calibrated.emit(PairInfo.of(self._pair.config, self._pair))

    @Slot(object, object)
    def check_drafts(self, target: ModelSpec, drafts: list[ModelSpec]) -> None:
        if self._shutting_down:
            return
        reasons: dict[str, str | None] = {}
        for draft in drafts:
            try:
                reasons[draft.source] = self._engine.draft_incompatibility(target, draft)
            except Exception as error:  # an unreadable model is reported as the reason, per draft
                reasons[draft.source] = f"its tokenizer could not be read: {error}"
        self.drafts_checked.emit(target.source, reasons)

    @Slot(str)
    def download_model(self, repo_id: str) -> None:
        if self._shutting_down:
            return
        try:
            folder = self._engine.download_model(repo_id, self.download_progress.emit)
        except Exception as error:  # offline, unknown repo, disk full: shown in the picker
            self.download_failed.emit(repo_id, error)
            return
        self.downloaded.emit(repo_id, folder)

    @Slot()
    def shut_down(self) -> None:
        """Last request: free the models on the thread that owns them, then end the thread.
        The worker moves back to the GUI thread, so it can be deleted there once the thread is gone."""
        if self._pair is not None:
            self._pair.close()
            self._pair = None
        self.moveToThread(QCoreApplication.instance().thread())
        QThread.currentThread().quit()


class EngineClient(QObject):
    """The GUI thread's handle on the worker."""

    busy_changed = Signal()
    load_progress = Signal(str, object)
    pair_loaded = Signal(object)
    load_failed = Signal(object, object)
    prompt_prepared = Signal(int, object)
    prompt_progress = Signal(int, object, float)
    text_delta = Signal(int, object)
    stats_updated = Signal(int, object, object)
    finished = Signal(int, object, object)
    errored = Signal(int, object)
    drafts_checked = Signal(str, object)
    download_progress = Signal(str, object)
    downloaded = Signal(str, str)
    download_failed = Signal(str, object)
    calibration_progress = Signal(str, int, int)
    calibrated = Signal(object)
    calibration_cancelled = Signal()
    calibration_failed = Signal(object)
    runtime_changed = Signal(object)

    _load_requested = Signal(object)
    _generate_requested = Signal(object)
    _check_requested = Signal(object, object)
    _download_requested = Signal(str)
    _calibrate_requested = Signal()
    _shutdown_requested = Signal()

    def __init__(self, engine: EngineApi, parent: QObject | None = None):
        super().__init__(parent)
        self.pair: PairInfo | None = None
        self.loading: PairConfig | None = None  # the latest pair asked for and not yet loaded
        self.active_request: int | None = None
        self.calibrating = False  # the worker is (or will be) busy calibrating the pair's heads
        self.calibration_step: tuple[str, int, int] | None = None  # its latest progress report
        self._pending_loads = 0
        self._next_request_id = 1
        self._closed = False

        self._thread = QThread(self)
        self._thread.setObjectName("tandem-engine")
        self.worker = EngineWorker(engine)
        self.worker.moveToThread(self._thread)
        self._load_requested.connect(self.worker.load_pair)
        self._generate_requested.connect(self.worker.generate)
        self._check_requested.connect(self.worker.check_drafts)
        self._download_requested.connect(self.worker.download_model)
        self._calibrate_requested.connect(self.worker.calibrate)
        self._shutdown_requested.connect(self.worker.shut_down)

        self.worker.load_progress.connect(self._on_load_progress)
        self.worker.pair_loaded.connect(self._on_pair_loaded)
        self.worker.load_failed.connect(self._on_load_failed)
        self.worker.prompt_prepared.connect(self._on_prompt_prepared)
        self.worker.prompt_progress.connect(self._on_prompt_progress)
        self.worker.text_delta.connect(self._on_text_delta)
        self.worker.stats_updated.connect(self._on_stats_updated)
        self.worker.finished.connect(self._on_finished)
        self.worker.errored.connect(self._on_errored)
        self.worker.drafts_checked.connect(self._on_drafts_checked)
        self.worker.download_progress.connect(self._on_download_progress)
        self.worker.downloaded.connect(self._on_downloaded)
        self.worker.download_failed.connect(self._on_download_failed)
        self.worker.calibration_progress.connect(self._on_calibration_progress)
        self.worker.calibrated.connect(self._on_calibrated)
        self.worker.calibration_cancelled.connect(self._on_calibration_cancelled)
        self.worker.calibration_failed.connect(self._on_calibration_failed)
        self.worker.runtime_changed.connect(self._on_runtime_changed)
        self._thread.start()

    @property
    def generating(self) -> bool:
        return self.active_request is not None

    @property
    def thread_finished(self) -> bool:
        """Whether the engine thread has ended (it does in `shutdown`)."""
        return self._thread.isFinished()

    @property
    def can_generate(self) -> bool:
        return (self.pair is not None and self.loading is None and not self.generating and not self.calibrating
                and not self._closed)

    # Requests

    def load_pair(self, config: PairConfig) -> None:
        self._pending_loads += 1
        self.loading = config
        self._load_requested.emit(config)
        self.busy_changed.emit()

    def generate(self, messages: list[Message], settings: DecodeSettings, system_prompt: str | None) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        self.active_request = request_id
        self._generate_requested.emit(GenerationRequest(request_id, tuple(messages), settings, system_prompt or None))
        self.busy_changed.emit()
        return request_id

    def stop(self) -> None:
        if self.active_request is not None:
            self.worker.stop_generation(self.active_request)

    def check_drafts(self, target: ModelSpec, drafts: list[ModelSpec]) -> None:
        self._check_requested.emit(target, list(drafts))

    def download(self, repo_id: str) -> None:
        self._download_requested.emit(repo_id)

    def calibrate(self) -> None:
        """Calibrate the active pair's heads on the worker; replies wait until it ends."""
        self.calibrating, self.calibration_step = True, None
        self.worker.arm_calibration()
        self._calibrate_requested.emit()
        self.busy_changed.emit()

    def cancel_calibration(self) -> None:
        if self.calibrating:
            self.worker.cancel_calibration()

    def shutdown(self) -> None:
        """Stop any reply, free the models on their thread, and join it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.worker.begin_shutdown()
        self._shutdown_requested.emit()
        self._thread.wait()

    # Worker signals, arriving on the GUI thread

    @Slot(str, object)
    def _on_load_progress(self, message: str, fraction: float | None) -> None:
        if not self._closed:
            self.load_progress.emit(message, fraction)

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        if self._closed:
            return
        self.pair = info
        self._load_done()
        self.pair_loaded.emit(info)
        self.busy_changed.emit()

    @Slot(object, object)
    def _on_load_failed(self, config: PairConfig, error: Exception) -> None:
        if self._closed:
            return
        self._load_done()
        self.load_failed.emit(config, error)
        self.busy_changed.emit()

    def _load_done(self) -> None:
        self._pending_loads -= 1
        if self._pending_loads == 0:
            self.loading = None

    @Slot(int, object)
    def _on_prompt_prepared(self, request_id: int, event: PromptPrepared) -> None:
        if not self._closed:
            self.prompt_prepared.emit(request_id, event)

    @Slot(int, object, float)
    def _on_prompt_progress(self, request_id: int, event: PromptProgress, read_at: float) -> None:
        if not self._closed:
            self.prompt_progress.emit(request_id, event, read_at)

    @Slot(int, object)
    def _on_text_delta(self, request_id: int, event: TextDelta) -> None:
        if not self._closed:
            self.text_delta.emit(request_id, event)

    @Slot(object)
    def _on_runtime_changed(self, description: dict) -> None:
        if self._closed:
            return
        if self.pair is not None and self.pair.description.get("name") == description.get("name"):
            self.pair = replace(self.pair, description=description)  # what About shows
        self.runtime_changed.emit(description)

    @Slot(int, object, object)
    def _on_stats_updated(self, request_id: int, stats: Any, description: dict) -> None:
        if not self._closed:
            self.stats_updated.emit(request_id, stats, description)

    @Slot(int, object, object)
    def _on_finished(self, request_id: int, event: Finished, description: dict) -> None:
        if self._closed:
            return
        self._request_done(request_id)
        self.finished.emit(request_id, event, description)
        self.busy_changed.emit()

    @Slot(int, object)
    def _on_errored(self, request_id: int, error: Exception) -> None:
        if self._closed:
            return
        self._request_done(request_id)
        self.errored.emit(request_id, error)
        self.busy_changed.emit()

    def _request_done(self, request_id: int) -> None:
        if self.active_request == request_id:
            self.active_request = None

    @Slot(str, object)
    def _on_drafts_checked(self, target_source: str, reasons: dict) -> None:
        if not self._closed:
            self.drafts_checked.emit(target_source, reasons)

    @Slot(str, object)
    def _on_download_progress(self, message: str, fraction: float | None) -> None:
        if not self._closed:
            self.download_progress.emit(message, fraction)

    @Slot(str, str)
    def _on_downloaded(self, repo_id: str, folder: str) -> None:
        if not self._closed:
            self.downloaded.emit(repo_id, folder)

    @Slot(str, object)
    def _on_download_failed(self, repo_id: str, error: Exception) -> None:
        if not self._closed:
            self.download_failed.emit(repo_id, error)

    @Slot(str, int, int)
    def _on_calibration_progress(self, phase: str, done: int, total: int) -> None:
        if not self._closed:
            self.calibration_step = (phase, done, total)
            self.calibration_progress.emit(phase, done, total)

    @Slot(object)
    def _on_calibrated(self, info: PairInfo) -> None:
        if self._closed:
            return
        self.calibrating = False
        self.pair = info
        self.calibrated.emit(info)
        self.busy_changed.emit()

    @Slot()
    def _on_calibration_cancelled(self) -> None:
        if self._closed:
            return
        self.calibrating = False
        self.calibration_cancelled.emit()
        self.busy_changed.emit()

    @Slot(object)
    def _on_calibration_failed(self, error: Exception) -> None:
        if self._closed:
            return
        self.calibrating = False
        self.calibration_failed.emit(error)
        self.busy_changed.emit()
