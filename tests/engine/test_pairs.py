"""The pair store shared by the app and the command line."""
from __future__ import annotations

import json

import pytest

from engine.config import ConfigError, ModelSpec, PairConfig
from engine.pairs import all_pairs, find_pair, load_user_pairs, save_user_pairs, user_pairs_path


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))


def test_saved_pairs_come_back_after_the_builtin_demo():
    mine = PairConfig("mine", ModelSpec("/models/target", precision="bf16"), ModelSpec("/models/draft"))
    save_user_pairs([mine])
    assert load_user_pairs() == [mine]
    assert [pair.name for pair in all_pairs()] == ["demo", "mine"]
    assert find_pair("mine") == mine


def test_a_saved_pair_may_not_take_a_builtin_name():
    with pytest.raises(ConfigError, match="built-in"):
        save_user_pairs([PairConfig("demo", ModelSpec("/models/target"))])


def test_a_pair_can_be_read_from_a_json_file(tmp_path):
    description = {"name": "from file", "target": {"source": "/models/t.gguf"}, "draft": None}
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(description))
    assert find_pair(str(path)) == PairConfig("from file", ModelSpec("/models/t.gguf"))


def test_a_damaged_store_is_a_clear_error():
    user_pairs_path().write_text("{ not json")
    with pytest.raises(ConfigError, match="could not be read"):
        load_user_pairs()
