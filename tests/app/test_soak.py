"""`tandem soak` on the fake engine: a short soak through the worker thread and the chat store
passes, and each check fails when what it checks goes wrong."""
from __future__ import annotations

import json
import platform
import threading
from dataclasses import dataclass, field

import pytest

from app import soak
from app.soak import SoakPlan, run_soak
from app.storage import STOPPED, ChatStore
from engine.cli import main
from engine.config import demo_pair
from engine.prompts import CHAT_PROMPTS, read_prompts
from tests.app.fake_engine import FakeEngine, FakePair

# Six replies: a warm-up of two, the pair switched every two, the third of each three stopped.
PLAN = SoakPlan(replies=6, max_new_tokens=40, warmup=2, pair_every=2, stop_every=3, conversation_length=2)
ALL_PASS = {"memory": True, "threads": True, "chats": True, "stops": True, "replies": True}


def soaked(engine: FakeEngine, tmp_path, plan: SoakPlan = PLAN):
    # A round takes 20 ms: a Stop clicked at the first text lands well before a reply ends.
    engine.token_delay_s = 0.02
    return run_soak(engine, demo_pair(), plan, tmp_path / "chats.sqlite3", read_prompts(CHAT_PROMPTS), progress=lambda _: None)


def results(report) -> dict[str, bool]:
    return {check.name: check.passed for check in report.checks()}


def test_a_short_soak_switches_methods_and_pairs_stops_replies_and_passes(qtbot, tmp_path):
    engine = FakeEngine()
    report = soaked(engine, tmp_path)

    assert results(report) == ALL_PASS and report.passed
    assert [config.name for config in engine.loads] == ["demo", "demo n-gram", "demo"]
    assert engine.closed_pairs == ["demo", "demo n-gram", "demo"]  # each switch closed the old pair; shut-down the last
    assert [reply.method for reply in report.replies] == ["auto", "ar", "chain", "auto", "ar", "chain"]
    assert [settings.method for _messages, settings, _system in engine.requests] == [r.method for r in report.replies]
    assert [reply.stop_reason == "stopped" for reply in report.replies] == [False, False, True, False, False, True]
    # A stopped reply is saved with the partial text it had, marked stopped.
    store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        stopped = store.message(report.replies[2].message_id)
        assert stopped.status == STOPPED and stopped.content == report.replies[2].text
        assert 0 < len(stopped.content) < len(report.replies[1].text)
        assert len(store.list_conversations()) == 3  # a new conversation every second reply
    finally:
        store.close()


def test_a_reply_the_chats_file_loses_fails_the_chats_check(qtbot, tmp_path, monkeypatch):
    finish_reply = ChatStore.finish_reply

    def losing_stopped_replies(store, message_id, content, provenance, figures, status, note=""):
        if status != STOPPED:  # a stopped reply keeps only what the last delta wrote, still "streaming"
            finish_reply(store, message_id, content, provenance, figures, status, note)

    monkeypatch.setattr(ChatStore, "finish_reply", losing_stopped_replies)
    report = soaked(FakeEngine(), tmp_path)

    assert results(report) == ALL_PASS | {"chats": False}
    assert [line.split(" is saved")[0] for line in report.unsaved] == ["reply 3", "reply 6"]
    assert "saved as interrupted" in report.unsaved[0]  # reopened, a reply left streaming reads as cut off


@dataclass
class HoardingEngine(FakeEngine):
    """Keeps 40 MB more with every reply, as a leak would."""

    hoard: list[bytes] = field(default_factory=list)

    def load_pair(self, config, progress):
        super().load_pair(config, progress)
        return HoardingPair(self, config)


class HoardingPair(FakePair):
    def generate(self, messages, settings, system_prompt=None):
        self.engine.hoard.append(b"\x01" * (40 * 2**20))  # written, so resident
        return super().generate(messages, settings, system_prompt)


def test_memory_that_grows_after_the_warm_up_fails_the_memory_check(qtbot, tmp_path):
    report = soaked(HoardingEngine(), tmp_path)

    assert results(report) == ALL_PASS | {"memory": False}
    assert report.memory()["max_drift"] > 0.05
    assert report.memory()["most_after_warmup_mb"] - report.memory()["warmup_peak_mb"] > 4 * 40 * 0.9


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's heap account")
def test_a_leak_shows_in_the_heaps_blocks_in_use_beside_resident_memory(qtbot, tmp_path):
    report = soaked(HoardingEngine(), tmp_path)

    memory = report.memory()
    assert memory["heap_most_after_warmup_mb"] - memory["heap_warmup_peak_mb"] > 4 * 40 * 0.9
    memory_line = next(check.detail for check in report.checks() if check.name == "memory")
    assert f"the C heap's blocks in use {memory['heap_warmup_peak_mb']:.0f} MB" in memory_line


@dataclass
class LoadSpikingEngine(FakeEngine):
    """Each load holds memory until its pair's second reply, as the old pair's pages do until the
    new pair runs: 20 MB at the first load, 120 MB at the later ones."""

    loads_made: int = 0

    def load_pair(self, config, progress):
        super().load_pair(config, progress)
        self.loads_made += 1
        return SpikingPair(self, config, b"\x01" * ((20 if self.loads_made == 1 else 120) * 2**20))


class SpikingPair(FakePair):
    def __init__(self, engine, config, ballast: bytes):
        super().__init__(engine, config)
        self.ballast: bytes | None = ballast
        self.replies = 0

    def generate(self, messages, settings, system_prompt=None):
        self.replies += 1
        if self.replies == 2:  # what the load held is let go
            self.ballast = None
        return super().generate(messages, settings, system_prompt)


def test_memory_held_only_right_after_a_pair_loads_passes_the_memory_check(qtbot, tmp_path):
    report = soaked(LoadSpikingEngine(), tmp_path)

    assert results(report) == ALL_PASS
    memory = report.memory()
    assert memory["most_after_a_load_mb"] - memory["most_after_warmup_mb"] > 120 * 0.9  # seen, and reported


@dataclass
class ThreadLeakingEngine(FakeEngine):
    """Starts a thread with every load that outlives the pair."""

    release: threading.Event = field(default_factory=threading.Event)
    started: list[threading.Thread] = field(default_factory=list)

    def load_pair(self, config, progress):
        thread = threading.Thread(target=self.release.wait, name=f"left-behind-{len(self.started) + 1}")
        thread.start()
        self.started.append(thread)
        return super().load_pair(config, progress)


def test_a_thread_left_running_fails_the_threads_check(qtbot, tmp_path):
    engine = ThreadLeakingEngine()
    try:
        report = soaked(engine, tmp_path)
    finally:
        engine.release.set()
        for thread in engine.started:
            thread.join()

    assert results(report) == ALL_PASS | {"threads": False}
    assert report.leaked_threads == ["left-behind-1", "left-behind-2", "left-behind-3"]
    assert report.engine_thread_finished


def test_tandem_soak_prints_the_checks_writes_the_figures_and_exits_by_them(qtbot, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(soak, "LocalEngine", lambda: FakeEngine(token_delay_s=0.02))
    figures = tmp_path / "soak.json"

    code = main(["soak", "--replies", "6", "--max-tokens", "40", "--warmup", "2", "--json", str(figures)])

    table = capsys.readouterr().out
    assert code == 0 and table.rstrip().endswith("PASS")
    assert [line.split()[:2] for line in table.splitlines()[2:7]] == [[name, "pass"] for name in ALL_PASS]
    written = json.loads(figures.read_text())
    assert written["passed"] and len(written["replies"]) == 6 and written["pairs"] == ["demo", "demo n-gram"]
    assert [reply["stop_reason"] == "stopped" for reply in written["replies"]] == [False] * 4 + [True, False]
    assert written["memory"]["warmup_peak_mb"] > 0

    monkeypatch.setattr(soak, "LocalEngine", lambda: FakeEngine(token_delay_s=0.02, fail_after_tokens=3))
    assert main(["soak", "--replies", "6", "--max-tokens", "40", "--warmup", "2"]) == 1
    assert "replies  FAIL" in capsys.readouterr().out
