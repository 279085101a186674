"""Help → About Tandem: the versions that decide how Tandem behaves, the pair in use and its
models, and the folders where chats, settings and models are kept.

Versions come from package metadata (engine/about.py), so opening the dialog never imports
torch or llama.cpp; "Copy" puts the same as plain text on the clipboard, for a bug report.
"""
from __future__ import annotations

import html
import os
import platform
from pathlib import Path

import PySide6
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPushButton, QVBoxLayout, QWidget

from engine import __version__
from engine.about import CONTENTS, component_versions
from engine.paths import locations

from .settings import SETTINGS_FILE
from .storage import DATABASE_FILE
from .worker import PairInfo

SECTIONS = ("Versions", "Model pair", "Files")


def hub_cache() -> Path:
    """Where models downloaded from Hugging Face are kept (its own cache, shared with other tools)."""
    from huggingface_hub import constants  # light, and only when the dialog opens

    return Path(constants.HF_HUB_CACHE)


def about_rows(pair: PairInfo | None, added_models: list[str]) -> dict[str, list[tuple[str, str]]]:
    """(what, value) rows of each section."""
    versions = [("Tandem", __version__), ("Python", platform.python_version()),
                ("Qt", f"{qVersion()} (PySide6 {PySide6.__version__})")]
    names = {"torch": "torch", "transformers": "transformers", "llama-cpp-python": "llama.cpp (llama-cpp-python)"}
    installed = component_versions()
    versions += [(title, installed.get(name) or "not installed") for name, title in names.items()]

    if pair is None:
        pair_rows = [("Pair", "none loaded")]
    else:
        described = pair.description
        pair_rows = [
            ("Pair", pair.config.name),
            ("Target", pair.config.target.source),
            ("Draft", pair.config.draft_model_label),  # the head has a row of its own
            ("EAGLE-3 head", described.get("eagle") or "none"),
            ("Runs on", f"{described.get('device', '?')}, {described.get('precision', '?')}, "
                        f"{described.get('runtime', 'torch')}"),
        ]
        if described.get("runtime_choice"):
            pair_rows.append(("Runtime chosen", described["runtime_choice"]))

    folders = locations()
    files = [
        ("Chats", str(folders["data"] / DATABASE_FILE)),
        ("Settings", str(folders["config"] / SETTINGS_FILE)),
        ("Config folder", f"{folders['config']} ({CONTENTS['config']})"),
        ("Data folder", f"{folders['data']} ({CONTENTS['data']})"),
        ("Cache folder", f"{folders['cache']} ({CONTENTS['cache']})"),
        ("Downloaded models", f"{hub_cache()} (Hugging Face's cache)"),
    ]
    if added_models:
        files.append(("Models you added", ", ".join(added_models)))
    return dict(zip(SECTIONS, (versions, pair_rows, files)))


def as_text(rows: dict[str, list[tuple[str, str]]]) -> str:
    return "\n\n".join(
        f"{section}\n" + "\n".join(f"  {what}: {value}" for what, value in section_rows)
        for section, section_rows in rows.items()
    )


def as_html(rows: dict[str, list[tuple[str, str]]]) -> str:
    parts = []
    for section, section_rows in rows.items():
        parts.append(f"<h4 style='margin-bottom:2px'>{html.escape(section)}</h4><table cellspacing='2'>")
        parts += [
            f"<tr><td style='padding-right:12px; white-space:nowrap'><b>{html.escape(what)}</b></td>"
            f"<td>{html.escape(value)}</td></tr>"
            for what, value in section_rows
        ]
        parts.append("</table>")
    return "".join(parts)


class AboutDialog(QDialog):
    def __init__(self, pair: PairInfo | None, added_models: list[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("About Tandem")
        self.rows = about_rows(pair, added_models)
        layout = QVBoxLayout(self)
        heading = QLabel(f"<h2 style='margin:0'>Tandem {html.escape(__version__)}</h2>"
                         "Offline chat with local language models, made fast by speculative decoding.")
        heading.setWordWrap(True)
        layout.addWidget(heading)
        self.details = QLabel(as_html(self.rows))
        self.details.setObjectName("aboutDetails")
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.details)
        if os.environ.get("TANDEM_HOME"):
            note = QLabel("TANDEM_HOME is set, so the config, data and cache folders are under it.")
            note.setObjectName("formNote")
            layout.addWidget(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy all of this as text, e.g. for a bug report")
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.text()))
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(640, self.sizeHint().height())

    def text(self) -> str:
        return f"Tandem {__version__}\n\n{as_text(self.rows)}"
