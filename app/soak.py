"""`tandem soak`: many replies through the app's own engine thread and chat store, checking
that nothing piles up over a long session. Not a timed test: `tandem bench` measures speed.

Each reply takes the path a reply in the window takes: the chat pane's Send button hands the
question to a ChatController, the EngineClient's worker thread decodes it, and the controller
streams it into a ChatStore. Along the way the decoding method (and the exact verifier)
changes with every reply, the pair is switched every few replies (unloaded and loaded on the
worker, as choosing another pair in the window does), some replies are stopped with the
pane's Stop button after their first text, and every few replies a new conversation starts.
Then the checks:

- memory: the process's resident memory after each reply past the warm-up stays within 5%
  of the most it held during the warm-up (reported beside it, where glibc tells it: the C
  heap's blocks in use, which a leak raises and the free blocks glibc keeps do not);
- threads: no Python thread started during the soak is alive after shut-down, and the
  engine's QThread has ended;
- chats: the chats file, opened again from disk, holds every reply as it ended (a stopped
  one with its partial text) after its question;
- stops: replies asked to stop did stop early, and no other did;
- replies: every planned reply ran, and none failed;
- garbage (with `score_replies`): every reply scored by its target's NLL per token and its
  longest loop, no method's replies worse than plain decoding's in the tail of either (a test
  with a known false-alarm rate), no reply past a guard that fails it alone, and the decoding
  caches, checked after every reply, equal to a fresh forward (app/soak_scoring.py). The
  replies above plain decoding's worst NLL or longest loop are listed to look at. `reference_replies` plain-decoding
  replies run after the others, so the reference does not rest on a few; `auto_every` makes
  every so many replies `auto`, whose explorations switch methods within a reply.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from PySide6.QtCore import QEvent, QEventLoop, QObject, QTimer, Slot
from PySide6.QtWidgets import QApplication

from engine import heap
from engine.config import VERIFIERS, ConfigError, DecodeSettings, PairConfig
from engine.events import Finished, TextDelta
from engine.prompts import CHAT_PROMPTS, read_prompts

from .chat_session import ChatController
from .chat_view import ChatPane
from .engine_api import EngineApi, LocalEngine
from .error_text import error_text
from .settings import AppSettings
from .soak_scoring import REFERENCE_METHOD, SCORE_KEY, ScoredReply, ScoringEngine, distribution, judge, verdict_lines
from .storage import COMPLETE, DATABASE_FILE, FAILED, STOPPED, ChatStore, StoredMessage
from .worker import EngineClient, PairInfo


@dataclass(frozen=True)
class SoakPlan:
    replies: int = 200
    max_new_tokens: int = 64
    warmup: int = 20  # replies after which resident memory should stay flat
    pair_every: int = 10  # replies between pair switches
    stop_every: int = 5  # the last reply of every five is stopped after its first text
    conversation_length: int = 4  # replies per conversation before a new one starts
    memory_tolerance: float = 0.05  # how far above its warm-up peak resident memory may rise
    step_timeout_s: float = 600.0  # a reply or a load that takes longer ends the soak as failed
    score_replies: bool = False  # judge every reply by its target's NLL per token (app/soak_scoring.py)
    reference_replies: int = 0  # plain-decoding replies run after the others, the garbage check's reference
    auto_every: int = 0  # every so many replies is `auto`, the others rotate over the rest (0: all rotate)
    temperature: float | None = None  # None: the app's

    def __post_init__(self) -> None:
        if self.replies < 2:
            raise ConfigError("a soak needs at least 2 replies")
        if not 1 <= self.warmup < self.replies:
            raise ConfigError(f"the warm-up must be 1 to {self.replies - 1} replies, fewer than the soak's {self.replies}")
        if self.max_new_tokens < 1:
            raise ConfigError("max_new_tokens must be at least 1")
        if min(self.pair_every, self.stop_every, self.conversation_length) < 1:
            raise ConfigError("pair_every, stop_every and conversation_length must be at least 1")
        if self.reference_replies < 0 or self.auto_every < 0:
            raise ConfigError("reference_replies and auto_every cannot be negative")

    @property
    def total(self) -> int:
        """The replies the soak sends: the planned ones, then the reference ones."""
        return self.replies + self.reference_replies

    def method(self, index: int, offered: tuple[str, ...]) -> str:
        """The method reply `index` decodes with, of the pair's `offered` ones."""
        if index >= self.replies:
            return REFERENCE_METHOD
        if self.auto_every and "auto" in offered:
            if index % self.auto_every == 0:
                return "auto"
            others = tuple(name for name in offered if name != "auto")
            return others[(index - index // self.auto_every - 1) % len(others)]
        return offered[index % len(offered)]

    def stops(self, index: int) -> bool:
        return index % self.stop_every == self.stop_every - 1

    def pair_stretch(self, index: int) -> int:
        """Which stretch of `pair_every` replies reply `index` is in: the pair changes with it."""
        return index // self.pair_every


@dataclass
class ReplyRecord:
    index: int
    pair: str
    method: str
    verifier: str
    prompt: str
    conversation_id: int
    message_id: int
    request_id: int
    stop_asked: bool
    streamed: str = ""  # the text deltas as they arrived
    text: str = ""  # the reply as it ended: what the chats file must hold
    stop_reason: str = ""  # "eos" | "length" | "context" | "stopped" | "error"
    error: str = ""
    tokens: int = 0
    seconds: float = 0.0
    rss_mb: float = 0.0  # the process's resident memory right after the reply
    heap_mb: float | None = None  # the C heap's blocks in use right after it (engine/heap.py; None: unknown)
    os_threads: int = 0  # the process's threads right after the reply (native ones included)
    score: dict | None = None  # engine.tools.reply_score.ReplyScore.to_dict(), with `score_replies`
    rounds_by_method: dict[str, int] = dataclasses.field(default_factory=dict)  # `auto`'s rounds, by the method that ran each

    @property
    def saved_status(self) -> str:
        if self.stop_reason == "error":
            return FAILED
        return STOPPED if self.stop_reason == "stopped" else COMPLETE

    def to_dict(self) -> dict:
        figures = dataclasses.asdict(self)
        for text_field in ("prompt", "streamed", "text"):
            del figures[text_field]
        return figures | {"characters": len(self.text)}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class SoakReport:
    plan: SoakPlan
    pairs: tuple[str, str]
    pair_note: str
    replies: list[ReplyRecord]
    threads_before: list[str]
    threads_after: list[str]
    leaked_threads: list[str]
    engine_thread_finished: bool
    unsaved: list[str]  # what the chats file lacks or holds wrongly, a line per reply
    failure: str | None  # why the soak ended early, if it did
    seconds: float

    def memory(self) -> dict | None:
        """Resident memory in MB: the most during the warm-up, the most after it, the last, each
        over the replies that did not follow a pair's load; and the most right after a load.

        Why not every reply: a switch loads the new pair before it lets the old one go (a pair
        that fails to load leaves the chat on the old one), so the reply after a load ends with
        both pairs' pages still resident, ~300 MB above the rest for the demo pair, and as much
        again or not by the allocator's timing. Peaks of those had failed a soak with no leak
        (+8.7%: 1,430 MB in the warm-up, 1,555 MB later, while the replies between loads grew
        from 1,141 to 1,189 MB). A leak, a pair never freed included, raises the replies between
        loads too."""
        between = [reply for reply in self.replies[: self.plan.warmup] if not self._after_load(reply)]
        later = [reply for reply in self.replies[self.plan.warmup :] if not self._after_load(reply)]
        if not between or not later:
            return None
        reference, most, final = max(r.rss_mb for r in between), max(r.rss_mb for r in later), later[-1].rss_mb
        loads = [reply.rss_mb for reply in self.replies if self._after_load(reply)]
        memory = {
            "warmup_peak_mb": reference, "most_after_warmup_mb": most, "final_mb": final,
            "max_drift": most / reference - 1, "final_drift": final / reference - 1,
            "most_after_a_load_mb": max(loads, default=0.0),
        }
        if all(reply.heap_mb is not None for reply in between + later):
            heap_reference, heap_most = max(r.heap_mb for r in between), max(r.heap_mb for r in later)
            memory |= {"heap_warmup_peak_mb": heap_reference, "heap_most_after_warmup_mb": heap_most,
                       "heap_max_drift": heap_most / heap_reference - 1}
        return memory

    def _after_load(self, reply: ReplyRecord) -> bool:
        """Whether `reply` is the first after a pair was loaded (the soak's first, or a switch's)."""
        return reply.index == 0 or self.plan.pair_stretch(reply.index) != self.plan.pair_stretch(reply.index - 1)

    def checks(self) -> list[Check]:
        plan, replies = self.plan, self.replies
        memory = self.memory()
        if memory is None:
            memory_check = Check("memory", False, f"only {len(replies)} replies ran: too few between loads, "
                                                  f"in the warm-up's {plan.warmup} and after it, to compare")
        else:
            memory_check = Check(
                "memory", memory["max_drift"] <= plan.memory_tolerance,
                f"between pair loads {memory['warmup_peak_mb']:.0f} MB at most in the first {plan.warmup} replies, "
                f"{memory['most_after_warmup_mb']:.0f} MB at most after ({memory['max_drift']:+.1%}, "
                f"limit {plan.memory_tolerance:+.0%}), {memory['final_mb']:.0f} MB at the end; "
                f"{memory['most_after_a_load_mb']:.0f} MB at most right after a load (both pairs resident)"
                + (f"; the C heap's blocks in use {memory['heap_warmup_peak_mb']:.0f} MB at most in the warm-up, "
                   f"{memory['heap_most_after_warmup_mb']:.0f} MB after ({memory['heap_max_drift']:+.1%}: "
                   f"a leak raises both figures, the free blocks glibc keeps only the resident one)"
                   if "heap_max_drift" in memory else ""),
            )
        leaked = f"still running: {', '.join(self.leaked_threads)}" if self.leaked_threads else "none left running"
        engine_thread = "engine thread ended" if self.engine_thread_finished else "ENGINE THREAD STILL RUNNING"
        threads_check = Check(
            "threads", not self.leaked_threads and self.engine_thread_finished,
            f"Python threads {len(self.threads_before)} before, {len(self.threads_after)} after ({leaked}); {engine_thread}",
        )
        stopped = [reply for reply in replies if reply.stop_reason == "stopped"]
        asked = [reply for reply in replies if reply.stop_asked]
        chats_check = Check(
            "chats", not self.unsaved,
            f"{len(replies) - len(self.unsaved)} of {len(replies)} replies read back from the chats file as they ended "
            f"({len(stopped)} stopped, with their partial text)" + (f"; {self.unsaved[0]}" if self.unsaved else ""),
        )
        unasked = [reply for reply in stopped if not reply.stop_asked]
        stopped_asked = len(stopped) - len(unasked)
        stops_check = Check(
            "stops", (stopped_asked > 0 or not asked) and not unasked,
            f"{stopped_asked} of {len(asked)} replies asked to stop ended early"
            + (" (the others had finished first)" if stopped_asked < len(asked) else "")
            + (f"; {len(unasked)} stopped unasked" if unasked else ""),
        )
        failed = [reply for reply in replies if reply.stop_reason == "error"]
        ran = f"{len(replies)} of {plan.total} ran"
        replies_check = Check(
            "replies", len(replies) == plan.total and not failed and self.failure is None,
            ran + (f"; {len(failed)} failed, first: {failed[0].error}" if failed else "; none failed")
            + (f"; the soak ended early: {self.failure}" if self.failure else ""),
        )
        checks = [memory_check, threads_check, chats_check, stops_check, replies_check]
        if plan.score_replies:
            passed, detail, _under_the_table = verdict_lines(judge(self.scored()))
            checks.append(Check("garbage", passed, detail))
        return checks

    def scored(self) -> list[ScoredReply]:
        return [ScoredReply(reply.index, reply.method, reply.prompt, reply.text, reply.score) for reply in self.replies]

    def garbage(self) -> dict | None:
        """The garbage check's figures: each method's test, the replies past a guard, the issue
        rule's counts and replies (to look at), NLL per token by method."""
        if not self.plan.score_replies:
            return None
        verdict = judge(self.scored())
        by_method: dict[str, list[float]] = {}
        for reply in self.scored():
            if reply.score is not None and reply.score["nll_per_token"] is not None:
                by_method.setdefault(reply.method, []).append(reply.score["nll_per_token"])
        return {
            "reference_worst": verdict.reference_worst, "reference_judged": verdict.reference_judged,
            "others_worst": verdict.others_worst, "others_judged": verdict.others_judged,
            "passed": verdict.passed,
            "tests": [test.to_dict() for test in verdict.tests],
            "nll_guard": verdict.nll_guard, "loop_guard": verdict.loop_guard,
            "catastrophic": [_listed(reply) for reply in verdict.catastrophic],
            # The rule, to look at: other replies above ar's worst NLL / longer than its longest loop
            "above_count": len(verdict.above), "looping_count": len(verdict.looping),
            "above": [_listed(reply) for reply in verdict.above],
            "reference_loop": verdict.reference_loop,
            "looping": [_listed(reply) for reply in verdict.looping],
            "cache_gap_worst": verdict.cache_gap_worst, "cache_failures": verdict.cache_failures,
            "nll_per_token_by_method": {name: distribution(values) for name, values in by_method.items()},
            "auto": self.auto_rounds(),
        }

    def auto_rounds(self) -> dict:
        """What `auto`'s replies ran: its rounds by method, and how many replies switched within."""
        auto = [reply for reply in self.replies if reply.method == "auto"]
        rounds: dict[str, int] = {}
        for reply in auto:
            for name, count in reply.rounds_by_method.items():
                rounds[name] = rounds.get(name, 0) + count
        return {
            "replies": len(auto), "rounds_by_method": rounds,
            "replies_running_several_methods": sum(len(reply.rounds_by_method) > 1 for reply in auto),
        }

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks())

    def to_dict(self) -> dict:
        from engine.runtime.cpu import cpu_name

        after_warmup = self.replies[self.plan.warmup - 1].os_threads if len(self.replies) >= self.plan.warmup else None
        return {
            "machine": {
                "platform": platform.platform(), "processor": cpu_name(), "cpu_cores": os.cpu_count(),
                "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            },
            "plan": dataclasses.asdict(self.plan),
            "pairs": list(self.pairs),
            "pair_note": self.pair_note,
            "passed": self.passed,
            "checks": [dataclasses.asdict(check) for check in self.checks()],
            "memory": self.memory(),
            "threads": {
                "before": self.threads_before, "after": self.threads_after, "leaked": self.leaked_threads,
                "engine_thread_finished": self.engine_thread_finished,
                "os_threads_after_warmup": after_warmup,
                "os_threads_after_last_reply": self.replies[-1].os_threads if self.replies else None,
            },
            "unsaved": self.unsaved,
            "failure": self.failure,
            "seconds": self.seconds,
            "garbage": self.garbage(),
            "replies": [reply.to_dict() for reply in self.replies],
        }


def switch_partner(pair: PairConfig) -> tuple[PairConfig, str]:
    """The pair the soak switches to and back from, and a line that says what it is: the same
    target drafting by n-gram prompt lookup (no draft model, no EAGLE-3 head), or, for a pair
    that already drafts that way, the pair itself, unloaded and loaded again."""
    if pair.draft is None and pair.eagle is None:
        return pair, f"'{pair.name}' unloaded and loaded again (it has no draft model to leave out)"
    partner = dataclasses.replace(pair, name=f"{pair.name} n-gram", draft=None, eagle=None)
    return partner, f"'{pair.name}' and '{partner.name}' (the same target, drafting by n-gram prompt lookup)"


class SoakDriver(QObject):
    """Sends the replies one after another from the event loop, as a user would, and records
    how each ended. The ChatController it makes saves them, as in the window."""

    def __init__(
        self, store: ChatStore, client: EngineClient, pane: ChatPane, pairs: tuple[PairConfig, PairConfig],
        plan: SoakPlan, prompts: list[str], progress: Callable[[str], None], loop: QEventLoop,
    ):
        super().__init__()
        self.client, self.pane, self.pairs, self.plan = client, pane, pairs, plan
        self.prompts, self.progress, self.loop = prompts, progress, loop
        self.replies: list[ReplyRecord] = []
        self.failure: str | None = None
        self._settings = AppSettings().decoding.with_changes(max_new_tokens=plan.max_new_tokens)
        if plan.temperature is not None:
            self._settings = self._settings.with_changes(temperature=plan.temperature)
        # Made before the driver connects to the client: its slots run first, so a reply is
        # saved before the driver samples memory and sends the next.
        self.controller = ChatController(store, client, pane, self.decode_settings)
        self._loaded_stretch: int | None = None
        self._current: ReplyRecord | None = None
        self._stop_clicked = False
        self._started = 0.0
        self._process = psutil.Process()
        self._watchdog = QTimer(self, singleShot=True, interval=int(plan.step_timeout_s * 1000))
        self._watchdog.timeout.connect(self._on_timeout)
        client.pair_loaded.connect(self._on_pair_loaded)
        client.load_failed.connect(self._on_load_failed)
        client.text_delta.connect(self._on_text_delta)
        client.finished.connect(self._on_finished)
        client.errored.connect(self._on_errored)

    def decode_settings(self) -> DecodeSettings:
        """What the controller asks for as each reply starts."""
        return self._settings

    @Slot()
    def next(self) -> None:
        """Load the pair this reply's stretch uses, or send the reply."""
        if self.failure is not None:
            return
        index = len(self.replies)
        if index == self.plan.total:
            self._watchdog.stop()
            self.loop.quit()
            return
        try:
            stretch = self.plan.pair_stretch(index)
            if stretch != self._loaded_stretch:
                self._loaded_stretch = stretch
                self._load(self.pairs[stretch % len(self.pairs)])
            else:
                self._send(index, self.client.pair)
        except Exception as error:  # a bug of the soak's own: end it with the reason instead of hanging
            self._fail(f"the soak itself failed at reply {index + 1}: {error_text(error)}")

    def _load(self, config: PairConfig) -> None:
        self.progress(f"loading the pair '{config.name}'…")
        self._watchdog.start()
        self.client.load_pair(config)  # as choosing a pair in the window does; _on_pair_loaded goes on

    def _send(self, index: int, pair: PairInfo) -> None:
        offered = pair.methods
        method = self.plan.method(index, offered)
        verifier = VERIFIERS[(index // len(offered)) % len(VERIFIERS)]
        self._settings = self._settings.with_changes(method=method, verifier=verifier)
        if index % self.plan.conversation_length == 0:
            self.controller.new_conversation()
        prompt = self.prompts[index % len(self.prompts)]
        self.pane.input.setPlainText(prompt)
        self.pane.send_button.click()
        stream = self.controller.stream
        if stream is None:
            self._fail(f"reply {index + 1} was not sent: {self.pane.send_button.toolTip() or 'the pane refused it'}")
            return
        self._current = ReplyRecord(
            index, pair.config.name, method, verifier, prompt, stream.conversation_id, stream.message_id,
            stream.request_id, self.plan.stops(index),
        )
        self._stop_clicked = False
        self._started = time.perf_counter()
        self._watchdog.start()

    def _reply_for(self, request_id: int) -> ReplyRecord | None:
        return self._current if self._current is not None and self._current.request_id == request_id else None

    @Slot(object)
    def _on_pair_loaded(self, _info: PairInfo) -> None:
        self._watchdog.stop()
        QTimer.singleShot(0, self.next)

    @Slot(object, object)
    def _on_load_failed(self, config: PairConfig, error: Exception) -> None:
        self._fail(f"the pair '{config.name}' did not load: {error_text(error)}")

    @Slot(int, object)
    def _on_text_delta(self, request_id: int, delta: TextDelta) -> None:
        reply = self._reply_for(request_id)
        if reply is None:
            return
        reply.streamed += delta.text
        if reply.stop_asked and delta.text and not self._stop_clicked:
            self._stop_clicked = True
            self.pane.stop_button.click()  # the user's Stop: ChatController.stop, then Generation.stop()

    @Slot(int, object, object)
    def _on_finished(self, request_id: int, event: Finished, _description: dict) -> None:
        reply = self._reply_for(request_id)
        if reply is not None:
            reply.score = event.extra.get(SCORE_KEY)
            reply.rounds_by_method = dict(event.stats.rounds_by_method)
            self._end(reply, event.text, event.stop_reason, len(event.token_ids))

    @Slot(int, object)
    def _on_errored(self, request_id: int, error: Exception) -> None:
        reply = self._reply_for(request_id)
        if reply is not None:
            reply.error = error_text(error)
            self._end(reply, reply.streamed, "error", 0)  # the controller keeps what had streamed

    def _end(self, reply: ReplyRecord, text: str, stop_reason: str, tokens: int) -> None:
        self._watchdog.stop()
        reply.text, reply.stop_reason, reply.tokens = text, stop_reason, tokens
        reply.seconds = time.perf_counter() - self._started
        reply.rss_mb = self._process.memory_info().rss / 2**20
        in_use = heap.in_use_bytes()
        reply.heap_mb = in_use / 2**20 if in_use is not None else None
        reply.os_threads = self._process.num_threads()
        self.replies.append(reply)
        self._current = None
        nll = reply.score["nll_per_token"] if reply.score else None
        self.progress(
            f"reply {reply.index + 1}/{self.plan.total} {reply.pair} {reply.method:>10}: {reply.tokens:3d} tokens, "
            f"{reply.stop_reason:<7} {reply.rss_mb:6.0f} MB" + (f", NLL/token {nll:.2f}" if nll is not None else "")
        )
        QTimer.singleShot(0, self.next)  # after the other slots of this signal, the controller's included

    @Slot()
    def _on_timeout(self) -> None:
        self._fail(f"nothing finished within {self.plan.step_timeout_s:.0f} s (at reply {len(self.replies) + 1})")

    def _fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
        self._watchdog.stop()
        self.loop.quit()


def run_soak(
    engine: EngineApi, pair: PairConfig, plan: SoakPlan, chats: Path, prompts: list[str],
    progress: Callable[[str], None] = print,
) -> SoakReport:
    """Run the soak in this process (making a QApplication if there is none), with the chats
    in a new file at `chats`, and check what it left behind."""
    if QApplication.instance() is None:
        QApplication(["tandem-soak"])
    if plan.score_replies:
        engine = ScoringEngine(engine)
    partner, pair_note = switch_partner(pair)
    started = time.perf_counter()
    threads_before = [thread for thread in threading.enumerate() if _running(thread)]
    store = ChatStore(chats)
    client = EngineClient(engine)
    pane = ChatPane()
    loop = QEventLoop()
    driver = SoakDriver(store, client, pane, (pair, partner), plan, prompts, progress, loop)
    QTimer.singleShot(0, driver.next)
    loop.exec()
    # 1. close as the window does: keep a reply cut off by a failure, free the models, join the thread
    driver.controller.save_for_close()
    client.shutdown()
    store.close()
    pane.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    # 2. threads left behind
    threads_after = [thread for thread in threading.enumerate() if _running(thread)]
    leaked = [thread.name for thread in threads_after if thread not in threads_before]
    # 3. every reply, read back from disk by a new connection
    reopened = ChatStore(chats)
    try:
        unsaved = unsaved_replies(reopened, driver.replies)
    finally:
        reopened.close()
    return SoakReport(
        plan, (pair.name, partner.name), pair_note, driver.replies, [thread.name for thread in threads_before],
        [thread.name for thread in threads_after], leaked, client.thread_finished, unsaved, driver.failure,
        time.perf_counter() - started,
    )


def _running(thread: threading.Thread) -> bool:
    """Whether `thread` still runs. threading lists a thread that Python did not start but that
    ran Python code (Qt's engine thread) as a "Dummy" that stays alive for good, so where the
    system lists its live threads (Linux) a thread counts only while its OS thread exists."""
    try:
        live = {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return thread.is_alive()
    return thread.is_alive() and thread.native_id in live


def unsaved_replies(store: ChatStore, replies: list[ReplyRecord]) -> list[str]:
    """What `store` lacks or holds wrongly, a line per reply: each reply must be there with the
    text and status it ended with, right after its question, and there must be no other reply."""
    problems = []
    conversations: dict[int, list[StoredMessage]] = {}
    for reply in replies:
        if reply.conversation_id not in conversations:
            conversations[reply.conversation_id] = store.messages(reply.conversation_id)
        messages = conversations[reply.conversation_id]
        position = next((i for i, message in enumerate(messages) if message.id == reply.message_id), None)
        if position is None:
            problems.append(f"reply {reply.index + 1} is not in the chats file")
            continue
        saved = messages[position]
        if saved.content != reply.text or saved.status != reply.saved_status:
            problems.append(
                f"reply {reply.index + 1} is saved as {saved.status} with {len(saved.content)} characters; "
                f"it ended {reply.saved_status} with {len(reply.text)}"
            )
        elif position == 0 or messages[position - 1].role != "user" or messages[position - 1].content != reply.prompt:
            problems.append(f"reply {reply.index + 1} is saved without its question before it")
    saved_replies = sum(message.role == "assistant" for c in store.list_conversations() for message in store.messages(c.id))
    if saved_replies != len(replies):
        problems.append(f"the chats file holds {saved_replies} replies; {len(replies)} were written")
    return problems


def format_report(report: SoakReport) -> str:
    plan = report.plan
    lines = [
        f"soak: {len(report.replies)} replies through the engine thread; pairs {report.pair_note}, "
        f"switched every {plan.pair_every} replies; every {plan.stop_every}th reply stopped after its first text",
        f"{'check':<8} {'result':<6} figures",
    ]
    for check in report.checks():
        lines.append(f"{check.name:<8} {'pass' if check.passed else 'FAIL':<6} {check.detail}")
    if plan.score_replies:
        lines += verdict_lines(judge(report.scored()))[2]
    methods: dict[str, int] = {}
    for reply in report.replies:
        methods[reply.method] = methods.get(reply.method, 0) + 1
    tokens = sum(reply.tokens for reply in report.replies)
    lines.append(f"methods: {', '.join(f'{name} {count}' for name, count in methods.items())}")
    if plan.score_replies:
        auto = report.auto_rounds()
        lines.append(
            f"auto's rounds: {', '.join(f'{name} {count}' for name, count in auto['rounds_by_method'].items()) or 'none'}; "
            f"{auto['replies_running_several_methods']} of {auto['replies']} auto replies ran several methods"
        )
    lines.append(f"{tokens} tokens in {report.seconds:.0f} s; process threads (native included) "
                 + " → ".join(str(reply.os_threads) for reply in _thread_samples(report)))
    lines.append("PASS" if report.passed else "FAIL")
    return "\n".join(lines)


def _thread_samples(report: SoakReport) -> list[ReplyRecord]:
    """The replies at the end of the warm-up and at the end, for the thread counts."""
    replies = report.replies
    if not replies:
        return []
    return [replies[min(report.plan.warmup, len(replies)) - 1], replies[-1]]


def command(
    pair: PairConfig, replies: int, max_new_tokens: int, warmup: int, json_out: Path | None,
    score_replies: bool = False, reference_replies: int = 0, auto_every: int = 0,
) -> int:
    """`tandem soak`: the soak on the real engine, with its chats in a temporary folder. Prints
    the table (progress to stderr), writes the figures to `json_out`; 0 when every check passed."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no window is ever shown
    plan = SoakPlan(
        replies=replies, max_new_tokens=max_new_tokens, warmup=warmup, score_replies=score_replies,
        reference_replies=reference_replies, auto_every=auto_every,
    )
    with tempfile.TemporaryDirectory(prefix="tandem-soak-") as folder:
        report = run_soak(
            LocalEngine(), pair, plan, Path(folder) / DATABASE_FILE, read_prompts(CHAT_PROMPTS),
            progress=lambda line: print(line, file=sys.stderr),
        )
    print(format_report(report))
    if json_out:
        json_out.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {json_out}", file=sys.stderr)
    return 0 if report.passed else 1


def _listed(reply: ScoredReply) -> dict:
    """A judged reply as the report lists it."""
    return {"index": reply.index, "method": reply.method, "prompt": reply.prompt, "text": reply.text, "score": reply.score}
