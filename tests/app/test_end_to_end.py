"""The one test with the real engine and the real demo pair: load it, chat offline, see the
reply stream with its stats, stop one, switch method, and regenerate."""
from __future__ import annotations

import re
import socket
import pytest

from app.engine_api import LocalEngine
from engine.config import DecodeSettings
from tests.app.helpers import last_reply, send, send_and_wait


@pytest.fixture
def shared_model_cache(tandem_home, tandem_home_for_session, demo_target_folder):
    """Converted weights are rebuildable: share the test session's cache, where the demo GGUF
    was converted once (~20 s), so this test's private home loads it in about a second."""
    tandem_home.mkdir(parents=True, exist_ok=True)
    (tandem_home / "cache").symlink_to(tandem_home_for_session / "cache", target_is_directory=True)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test: the app works offline."""
    attempts = []
    original = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
            raise OSError(f"network access attempted: {address}")
        return original(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    assert attempts == []


def test_chat_with_the_real_demo_pair(make_window, qtbot, shared_model_cache, no_network):
    window = make_window(LocalEngine())
    assert window.load_progress.isVisible()
    qtbot.waitUntil(lambda: window.client.pair is not None, timeout=180_000)
    assert window.client.pair.config.name == "demo"
    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=48, draft_tokens=4))

    seen: list[str] = []
    window.client.prompt_prepared.connect(lambda *_: seen.append("prompt"))
    window.client.text_delta.connect(lambda *_: seen.append("text"))
    window.client.stats_updated.connect(lambda *_: seen.append("stats"))
    window.client.finished.connect(lambda *_: seen.append("finished"))
    chain = send_and_wait(qtbot, window, "What is the capital of France? Answer in one sentence.", timeout=60_000)
    assert re.fullmatch(r"prompt text( text| stats)* stats finished", " ".join(seen))
    assert "Paris" in chain.text and last_reply(window).text == chain.text
    assert window.speed_panel.speed.text().endswith("tok/s")
    assert last_reply(window).figures_line.isVisible()

    # Greedy `ar` through the same window gives the same reply: speculative decoding is lossless.
    window.method_combo.setCurrentIndex(window.method_combo.findData("ar"))
    window.method_combo.activated.emit(window.method_combo.currentIndex())
    with qtbot.waitSignal(window.client.finished, timeout=60_000) as regenerated:
        window.regenerate_action.trigger()
    reference = regenerated.args[1]
    assert reference.stats.method == "ar" and reference.text == chain.text

    window.set_decoding(DecodeSettings(method="chain", max_new_tokens=400))
    send(qtbot, window, "Write a long story about a lighthouse keeper.")
    qtbot.waitUntil(lambda: len(last_reply(window).text) > 40, timeout=60_000)
    with qtbot.waitSignal(window.client.finished, timeout=10_000) as stopped:
        window.pane.stop_button.click()
    assert stopped.args[1].stop_reason == "stopped" and len(stopped.args[1].token_ids) < 400
