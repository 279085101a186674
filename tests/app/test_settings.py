"""The typed, versioned settings file."""
from __future__ import annotations

import json

import pytest

from app import settings as settings_module
from app.settings import SCHEMA_VERSION, AppSettings, LocalServerSettings, load_settings, save_settings, settings_path
from engine.config import CHAT_DEFAULT_TEMPERATURE


def test_defaults_when_there_is_no_file(tandem_home):
    settings, warning = load_settings()
    assert settings == AppSettings() and warning is None
    assert settings_path().parent == tandem_home / "config"


def test_settings_round_trip_with_their_schema_version():
    settings = AppSettings(active_pair="mine", models=["/models/a"], show_provenance=True)
    settings.decoding = settings.decoding.with_changes(method="ar", temperature=0.7, seed=3)
    save_settings(settings)
    assert json.loads(settings_path().read_text())["schema_version"] == SCHEMA_VERSION
    assert load_settings() == (settings, None)


def test_an_older_file_is_migrated_step_by_step(monkeypatch):
    # A future schema change registers MIGRATIONS[n]; here one that renamed a key, after
    # version 2 added the local server.
    monkeypatch.setattr(settings_module, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(
        settings_module.MIGRATIONS, 2, lambda data: {**data, "active_pair": data.pop("pair_name")}
    )
    settings_path().write_text(json.dumps({"schema_version": 1, "pair_name": "old"}))
    settings, warning = load_settings()
    assert settings.active_pair == "old" and warning is None
    assert settings.local_server == LocalServerSettings()


def test_an_unreadable_file_is_kept_aside_and_defaults_are_used():
    settings_path().write_text("{not json")
    settings, warning = load_settings()
    assert settings == AppSettings()
    assert "could not be read" in warning
    assert settings_path().with_suffix(".unreadable").read_text() == "{not json"


def test_a_bad_value_falls_back_to_its_default_without_losing_the_rest():
    settings_path().write_text(
        json.dumps({"schema_version": 1, "active_pair": "mine", "decoding": {"method": "nonsense", "top_p": 0.5}})
    )
    settings, _warning = load_settings()
    assert settings.active_pair == "mine"
    assert settings.decoding == AppSettings().decoding


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1])
def test_a_file_from_a_newer_version_is_copied_before_it_is_used(version):
    settings_path().write_text(json.dumps({"schema_version": version, "active_pair": "future"}))
    settings, warning = load_settings()
    assert settings.active_pair == "future"
    assert "newer Tandem" in warning
    assert settings_path().with_suffix(f".v{version}.json").exists()


def test_a_first_start_samples_so_that_regenerate_gives_another_reply():
    assert CHAT_DEFAULT_TEMPERATURE == 0.7
    assert load_settings()[0].decoding.temperature == CHAT_DEFAULT_TEMPERATURE


def test_a_saved_temperature_is_kept_and_a_missing_one_is_the_chat_default():
    settings_path().write_text(json.dumps({"schema_version": 1, "decoding": {"method": "ar", "temperature": 0.0}}))
    assert load_settings()[0].decoding.temperature == 0.0
    settings_path().write_text(json.dumps({"schema_version": 1, "decoding": {"method": "ar"}}))
    decoding = load_settings()[0].decoding
    assert (decoding.method, decoding.temperature) == ("ar", CHAT_DEFAULT_TEMPERATURE)


def test_a_decoding_entry_of_the_wrong_shape_falls_back_to_the_defaults():
    settings_path().write_text(json.dumps({"schema_version": 1, "active_pair": "mine", "decoding": ["ar"]}))
    settings, _warning = load_settings()
    assert settings.active_pair == "mine" and settings.decoding == AppSettings().decoding


def test_the_verifier_switch_is_saved_and_a_saved_sprinter_method_becomes_the_switch():
    settings = AppSettings(verifier_mode="sprinter")
    save_settings(settings)
    assert load_settings()[0].verifier_mode == "sprinter"

    # SPRINTER is never the method box's method: a file that says so (hand-edited, say)
    # turns the switch on and keeps an exact method for when it is turned off.
    settings_path().write_text(json.dumps({"schema_version": SCHEMA_VERSION, "decoding": {"method": "sprinter"}}))
    loaded = load_settings()[0]
    assert loaded.verifier_mode == "sprinter" and loaded.decoding.exact
    settings_path().write_text(json.dumps({"schema_version": SCHEMA_VERSION, "verifier_mode": "fastest"}))
    assert load_settings()[0].verifier_mode == "exact"


def test_the_theme_is_kept_and_a_file_without_one_or_with_an_unknown_one_follows_the_system():
    save_settings(AppSettings(theme="dark"))
    assert load_settings()[0].theme == "dark"
    settings_path().write_text(json.dumps({"schema_version": 1, "active_pair": "demo"}))  # written before View → Theme
    assert load_settings()[0].theme == "system"
    settings_path().write_text(json.dumps({"schema_version": 1, "theme": "solarized"}))
    assert load_settings()[0].theme == "system"


def test_the_local_server_settings_round_trip():
    settings = AppSettings()
    assert settings.local_server == LocalServerSettings(enabled=False, port=8080, api_key="")  # off by default
    settings.local_server = LocalServerSettings(enabled=True, port=8123, api_key="s3cret")
    save_settings(settings)
    assert json.loads(settings_path().read_text())["local_server"] == {"enabled": True, "port": 8123, "api_key": "s3cret"}
    assert load_settings()[0].local_server == settings.local_server


def test_a_version_1_file_gains_the_local_server_switched_off():
    settings_path().write_text(json.dumps({"schema_version": 1, "active_pair": "mine", "theme": "dark"}))
    settings, warning = load_settings()
    assert warning is None and (settings.active_pair, settings.theme) == ("mine", "dark")
    assert settings.local_server == LocalServerSettings()
    assert settings_module.migrate({"schema_version": 1})["local_server"] == {"enabled": False, "port": 8080, "api_key": ""}


def test_a_local_server_port_out_of_range_falls_back_to_8080():
    settings_path().write_text(json.dumps({"schema_version": 2, "local_server": {"enabled": True, "port": 70000}}))
    assert load_settings()[0].local_server == LocalServerSettings(enabled=True)
