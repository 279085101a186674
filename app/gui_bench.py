"""`tandem gui-bench`: what the window costs its engine.

The same prompts go, for each method, through the engine directly (as `tandem bench` runs
them, on a thread of their own) and through the real `MainWindow` (typed into the chat pane,
sent with its Send button, streamed, rendered, stored), one after the other, prompt by
prompt and in turn first, so that drift of the machine and a method's learning hit both alike. For each method it reports:

- the engine's tok/s headless, and the app's: the reply's tokens over the time from Send to
  the reply's end arriving on the window's thread;
- the window thread's CPU share while replies stream: its own CPU time (time.thread_time on
  that thread) from the first text to the end, over that wall time;
- the longest gap between two updates of the reply's text on screen, from its first text to
  its end.

Both runs of a prompt use the same seed and start from empty caches. With `one_conversation`
every prompt of a method goes into one chat, as a user writes one: both runs of a prompt then
get the same earlier turns (the window's own replies) and read them all again, so that the
window's cost is measured with the conversation it has to lay out.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine import methods as method_table
from engine.chat_prompt import Message
from engine.config import ConfigError, DecodeSettings, PairConfig
from engine.events import Finished

DEFAULT_ALIAS = "default"  # the method the app decodes the pair with
STEP_TIMEOUT_S = 600.0  # a load or reply that takes longer ends the bench as failed


@dataclass
class RunFigures:
    """One prompt through one path (the engine alone, or the window)."""

    prompt_index: int
    tokens: int
    seconds: float  # the reply's wall time (for the window: Send to the end on its thread)
    streaming_s: float = 0.0  # window only: from the first text to the end
    main_thread_cpu_s: float = 0.0  # window only: the window thread's CPU time over streaming_s
    updates: int = 0  # window only: times the reply's text was handed to the screen
    longest_gap_s: float = 0.0  # window only: the longest wait between two of those

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class MethodFigures:
    method: str
    engine: list[RunFigures] = field(default_factory=list)
    app: list[RunFigures] = field(default_factory=list)

    def summary(self) -> dict:
        engine_tokens, engine_s = _totals(self.engine)
        app_tokens, app_s = _totals(self.app)
        engine_rate = engine_tokens / engine_s if engine_s > 0 else 0.0
        app_rate = app_tokens / app_s if app_s > 0 else 0.0
        streaming = sum(run.streaming_s for run in self.app)
        return {
            "method": self.method,
            "prompts": len(self.app),
            "engine_tokens": engine_tokens,
            "engine_seconds": engine_s,
            "engine_tokens_per_s": engine_rate,
            "app_tokens": app_tokens,
            "app_seconds": app_s,
            "app_tokens_per_s": app_rate,
            "app_to_engine": app_rate / engine_rate if engine_rate > 0 else None,
            "main_thread_cpu_share": sum(run.main_thread_cpu_s for run in self.app) / streaming if streaming > 0 else None,
            "updates_per_s": sum(run.updates for run in self.app) / streaming if streaming > 0 else None,
            "longest_gap_s": max((run.longest_gap_s for run in self.app), default=0.0),
            # A method that does not write the same reply on both paths (`auto` learns as it
            # goes and chooses differently) compares unequal work: a shorter reply to a long
            # conversation pays the same reading for fewer tokens.
            "unequal_replies": sum(e.tokens != a.tokens for e, a in zip(self.engine, self.app)),
            "per_prompt": [{"engine": asdict(e), "app": asdict(a)} for e, a in zip(self.engine, self.app)],
        }


def _totals(runs: list[RunFigures]) -> tuple[int, float]:
    return sum(run.tokens for run in runs), sum(run.seconds for run in runs)


class RecordingEngine:
    """The engine the window is given, which keeps the pair it loaded: the headless runs use
    that same pair (same weights, same runtime), while the window's worker is idle."""

    def __init__(self, engine: Any):
        self._engine = engine
        self.pair: Any = None

    def load_pair(self, config: PairConfig, progress: Callable) -> Any:
        self.pair = self._engine.load_pair(config, progress)
        return self.pair

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def run_gui_bench(
    engine: Any, pair: PairConfig, prompts: list[str], method_names: list[str], settings: DecodeSettings,
    progress: Callable[[str], None] = lambda _line: None, one_conversation: bool = False,
) -> dict:
    """Open a window over `engine`, load `pair`, run every prompt with every method through the
    engine alone and through the window (each prompt in a new chat, or with `one_conversation`
    all of a method's prompts in one); the figures, per method. Needs a QApplication."""
    from .main_window import MainWindow

    recording = RecordingEngine(engine)
    window = MainWindow(recording)
    window.resize(1280, 800)
    window.show()
    results: list[MethodFigures] = []
    started = time.perf_counter()
    try:
        if window.client.pair is None or window.client.pair.config != pair:
            window.request_pair(pair)
        _wait_until(lambda: window.client.pair is not None and window.client.loading is None, "the pair to load")
        loaded = recording.pair
        chosen = [method_table.default_method(loaded.methods) if name == DEFAULT_ALIAS else name for name in method_names]
        for method in dict.fromkeys(chosen):
            if method not in loaded.methods:
                raise ConfigError(f"the pair {pair.name!r} does not offer {method!r}; it offers {', '.join(loaded.methods)}")
            figures = MethodFigures(method)
            results.append(figures)
            engine_thread = window.client.worker  # headless replies run on the app's engine thread too
            _warm_up(loaded, settings.with_changes(method=method, max_new_tokens=8), engine_thread)
            for index, prompt in enumerate(prompts):
                run_settings = settings.with_changes(method=method, seed=index)
                new_chat = not one_conversation or index == 0
                earlier = [] if new_chat else _turns_so_far(window)
                messages = [*earlier, Message("user", prompt)]
                alone = lambda: _run_headless(loaded, messages, index, run_settings, engine_thread)  # noqa: E731
                shown = lambda: _run_in_window(window, loaded, prompt, index, run_settings, new_chat)  # noqa: E731
                # Who goes first alternates: a method that learns as it runs (`auto`'s trials,
                # its speed record) then pays for its learning on both paths alike.
                if index % 2 == 0:
                    figures.engine.append(alone())
                    figures.app.append(shown())
                else:
                    figures.app.append(shown())
                    figures.engine.append(alone())
                engine_run, app_run = figures.engine[-1], figures.app[-1]
                progress(
                    f"  {method} prompt {index + 1}/{len(prompts)}: engine {engine_run.tokens_per_s:.1f} tok/s, "
                    f"app {app_run.tokens_per_s:.1f} tok/s, window thread "
                    f"{app_run.main_thread_cpu_s / app_run.streaming_s if app_run.streaming_s else 0:.0%} of a core, "
                    f"longest gap {app_run.longest_gap_s * 1000:.0f} ms"
                )
        description = window.client.pair.description
    finally:
        window.close()
    return {
        "pair": pair.name,
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_cores": os.cpu_count()},
        "runtime": description.get("runtime"),
        "qt_platform": os.environ.get("QT_QPA_PLATFORM", ""),
        "settings": {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens,
                     "one_conversation": one_conversation},
        "seconds": time.perf_counter() - started,
        "methods": [figures.summary() for figures in results],
    }


def _warm_up(pair: Any, settings: DecodeSettings, engine_thread: Any) -> None:
    """One short reply first, so neither path pays for first-call costs the other does not."""
    _run_headless(pair, [Message("user", "Hello")], -1, settings, engine_thread)


def _turns_so_far(window: Any) -> list[Message]:
    """The window's open chat, as the engine is given it."""
    controller = window.controller
    return [Message(stored.role, stored.content) for stored in controller.store.messages(controller.conversation_id)]


def _reset_caches(pair: Any) -> None:
    """No run may reuse another's prefill of the same prompt (as in `tandem bench`)."""
    if hasattr(pair, "reset_caches"):
        pair.reset_caches()


def _run_headless(pair: Any, messages: list[Message], index: int, settings: DecodeSettings, on_thread_of: Any) -> RunFigures:
    """The engine alone, on the app's engine thread (`on_thread_of`, its worker object); the
    window's thread meanwhile only waits. Not on a fresh thread: each thread keeps its own
    OpenMP threads, and two teams on two cores made the headless replies run at a third of
    their speed."""
    outcome: dict[str, Any] = {}

    def generate() -> None:
        try:
            _reset_caches(pair)
            begun = time.perf_counter()
            for event in pair.generate(messages, settings.with_changes(stats_every_s=1e9)):
                if isinstance(event, Finished):
                    outcome["finished"] = event
            outcome["seconds"] = time.perf_counter() - begun
        except Exception as error:  # re-raised on the calling thread
            outcome["error"] = error

    from PySide6.QtCore import QTimer

    QTimer.singleShot(0, on_thread_of, generate)  # runs on the thread that object lives in
    _wait_until(lambda: "seconds" in outcome or "error" in outcome, f"the engine's reply to prompt {index + 1}")
    if "error" in outcome:
        raise outcome["error"]
    return RunFigures(index, len(outcome["finished"].token_ids), outcome["seconds"])


class _ReplyWatch:
    """Times one reply in the window: its text arriving and being shown, and its end."""

    def __init__(self) -> None:
        self.sent_at = 0.0
        self.first_text_at: float | None = None
        self.first_text_cpu = 0.0
        self.shown_at: list[float] = []
        self.finished: Finished | None = None
        self.finished_at = 0.0
        self.finished_cpu = 0.0
        self.error: Exception | None = None

    def on_text(self, _request_id: int, delta: Any) -> None:
        if self.first_text_at is None and delta.text:
            self.first_text_at, self.first_text_cpu = time.perf_counter(), time.thread_time()

    def on_shown(self) -> None:
        # The window may show the first text before this watch hears of it (its slots run first).
        if self.first_text_at is None:
            self.first_text_at, self.first_text_cpu = time.perf_counter(), time.thread_time()
        self.shown_at.append(time.perf_counter())

    def on_finished(self, _request_id: int, event: Finished, _description: dict) -> None:
        self.finished, self.finished_at, self.finished_cpu = event, time.perf_counter(), time.thread_time()

    def on_error(self, _request_id: int, error: Exception) -> None:
        self.error = error

    def figures(self, index: int) -> RunFigures:
        first = self.first_text_at if self.first_text_at is not None else self.finished_at
        # The reply's end is shown as the controller handles `finished`, right after this watch.
        moments = [first, *self.shown_at, self.finished_at]
        gaps = [later - earlier for earlier, later in zip(moments, moments[1:])]
        return RunFigures(
            index, len(self.finished.token_ids), self.finished_at - self.sent_at,
            streaming_s=self.finished_at - first,
            main_thread_cpu_s=self.finished_cpu - self.first_text_cpu if self.first_text_at is not None else 0.0,
            updates=len(self.shown_at), longest_gap_s=max(gaps, default=0.0),
        )


def _run_in_window(window: Any, pair: Any, prompt: str, index: int, settings: DecodeSettings, new_chat: bool = True) -> RunFigures:
    """The prompt typed into a new chat (or the open one) and sent with the Send button, as a
    user sends it."""
    window.set_decoding(settings)
    if new_chat:
        window.controller.new_conversation()
    _reset_caches(pair)  # the worker is idle between replies
    watch = _ReplyWatch()
    client = window.client
    # Connected after the window's own slots, so the end is timed once the window has
    # handled it (stored the reply and shown it whole).
    client.text_delta.connect(watch.on_text)
    client.finished.connect(watch.on_finished)
    client.errored.connect(watch.on_error)
    try:
        window.pane.input.setPlainText(prompt)
        watch.sent_at = time.perf_counter()
        window.pane.send_button.click()
        reply = window.pane.view.messages[-1]
        reply.content_shown.connect(watch.on_shown)
        _wait_until(lambda: watch.finished is not None or watch.error is not None, f"the reply to prompt {index + 1}")
    finally:
        client.text_delta.disconnect(watch.on_text)
        client.finished.disconnect(watch.on_finished)
        client.errored.disconnect(watch.on_error)
    if watch.error is not None:
        raise watch.error
    return watch.figures(index)


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = STEP_TIMEOUT_S) -> None:
    """Run the window's event loop, as the app's own loop runs it, until `condition` holds."""
    from PySide6.QtCore import QEventLoop, QTimer

    deadline = time.monotonic() + timeout_s
    loop = QEventLoop()
    # A slow poll: ten wake-ups a second cost the window's thread nothing it would measure.
    poll = QTimer(interval=100)
    poll.timeout.connect(lambda: loop.quit() if condition() or time.monotonic() > deadline else None)
    poll.start()
    if not condition():
        loop.exec()
    poll.stop()
    if not condition():
        raise TimeoutError(f"gave up waiting for {what} after {timeout_s:.0f} s")


def format_report(report: dict) -> str:
    lines = [
        f"{'method':<10} {'engine tok/s':>12} {'app tok/s':>10} {'app/engine':>10} {'window thread':>13} "
        f"{'updates/s':>9} {'longest gap':>11}"
    ]
    for row in report["methods"]:
        share = row["main_thread_cpu_share"]
        ratio = row["app_to_engine"]
        lines.append(
            f"{row['method']:<10} {row['engine_tokens_per_s']:>12.1f} {row['app_tokens_per_s']:>10.1f} "
            f"{(f'{ratio:.2f}x' if ratio is not None else '-'):>10} "
            f"{(f'{share:.0%}' if share is not None else '-'):>13} "
            f"{(row['updates_per_s'] or 0):>9.1f} {row['longest_gap_s'] * 1000:>8.0f} ms"
        )
    for row in report["methods"]:
        if row.get("unequal_replies"):
            lines.append(
                f"{row['method']}: {row['unequal_replies']} of {row['prompts']} replies differ between the paths "
                f"({row['engine_tokens']} tokens alone, {row['app_tokens']} in the window): its ratio compares unequal work"
            )
    lines.append(
        f"{report['pair']} ({report['runtime']}), T = {report['settings']['temperature']:g}, "
        f"up to {report['settings']['max_new_tokens']} tokens, "
        f"{'every prompt in one chat' if report['settings'].get('one_conversation') else 'each prompt in a new chat'}, "
        f"Qt platform {report['qt_platform'] or 'default'}"
    )
    return "\n".join(lines)


def command(pair: PairConfig, prompts: list[str], method_names: list[str], settings: DecodeSettings,
            json_out: Path | None, engine: Any = None, one_conversation: bool = False) -> int:
    """`tandem gui-bench`: the bench on the real engine (or `engine`), its chats and settings in
    a temporary folder; prints the table (progress to stderr) and writes the figures to `json_out`."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from engine import paths

    cache = paths.cache_dir()  # the user's: the demo model prepared there is reused
    with tempfile.TemporaryDirectory(prefix="tandem-gui-bench-") as folder:
        previous_home = os.environ.get(paths.HOME_VARIABLE)
        os.environ[paths.HOME_VARIABLE] = folder
        (Path(folder) / "cache").symlink_to(cache, target_is_directory=True)
        try:
            app = QApplication.instance() or QApplication(sys.argv[:1])
            from .style import stylesheet

            app.setStyleSheet(stylesheet(app.palette()))
            if engine is None:
                from .engine_api import LocalEngine

                engine = LocalEngine()
            report = run_gui_bench(
                engine, pair, prompts, method_names, settings, lambda line: print(line, file=sys.stderr), one_conversation
            )
        finally:
            if previous_home is None:
                os.environ.pop(paths.HOME_VARIABLE, None)
            else:
                os.environ[paths.HOME_VARIABLE] = previous_home
    print(format_report(report))
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {json_out}", file=sys.stderr)
    return 0
