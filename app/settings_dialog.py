"""Settings: the model pairs (saved in the engine's pair store, shared with the CLI), the
loaded pair's learned heads (calibrated here), and how replies are decoded. Decoding changes
apply to the next reply, without a restart."""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import methods as method_table
from engine.config import VERIFIERS, ConfigError, DecodeSettings, PairConfig
from engine.pairs import builtin_pairs, save_user_pairs

from .error_text import error_text
from .heads_panel import HeadsPanel
from .pair_picker import PairPicker, model_label
from .settings import AppSettings, LocalServerSettings
from .worker import EngineClient

NAME_ROLE = Qt.ItemDataRole.UserRole
TREE_SHAPES = ("auto", "8x3", "16x4", "24x5", "32x6", "64x8")


def pair_summary(pair: PairConfig) -> str:
    return (
        f"{pair.name}: {model_label(pair.target.source)} + {model_label(pair.draft.source) if pair.draft else 'n-gram'}"
        f" ({pair.target.precision}, {pair.target.device})"
    )


def pair_details(pair: PairConfig) -> str:
    """Everything a pair is made of, with whole paths: the tooltip wherever a pair is listed."""
    return "\n".join((
        pair.name,
        f"Target: {pair.target.source} ({pair.target.precision}, {pair.target.device})",
        f"Draft: {pair.draft.source if pair.draft else 'n-gram prompt lookup'}",
        f"Runtime: {pair.runtime}" + ("" if pair.compile else " (torch on the CPU: not compiled, where the native forward does not run it)"),
    ))


class DecodingForm(QWidget):
    """The decoding knobs. A knob that would have no effect is disabled, with the reason."""

    def __init__(self, settings: DecodeSettings, methods: tuple[str, ...], verifiers: tuple[tuple[str, str, bool], ...]):
        super().__init__()
        form = QFormLayout(self)
        self.method = QComboBox()
        for row in method_table.TABLE:
            if row.name in methods and row.exact:  # SPRINTER is the toolbar's Verifier switch
                self.method.addItem(f"{row.title}: {row.summary}", row.name)
        self.draft_tokens = QSpinBox()
        self.draft_tokens.setRange(1, 64)
        self.draft_tokens.setToolTip(
            "K: the most tokens a chain drafts per target call; each round drafts as many as measure to pay here")
        self.tree_shape = QComboBox()
        self.tree_shape.setEditable(True)
        self.tree_shape.addItems(TREE_SHAPES)
        self.tree_shape.setToolTip(
            "Tree size: auto chooses it every round from the measured cost of verifying on this device "
            "and the acceptance seen so far; BUDGETxDEPTH fixes the drafted tokens per target call and the longest path"
        )
        self.verifier = QComboBox()
        for name, label, exact in verifiers:
            self.verifier.addItem(label if exact else f"{label} (approximate: output may differ from the target's)", name)
        self.verifier.setToolTip(
            "How sampled draft tokens are verified against the target (SPRINTER checks its flagged tokens this way too). "
            "Exact or SPRINTER (approximate) is the toolbar's Verifier switch."
        )
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.temperature.setToolTip(
            "0 is greedy: always the most likely token, so Regenerate repeats a reply. "
            "Above 0 replies are sampled; speculative decoding stays exact at any temperature."
        )
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 8192)
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setToolTip("A fixed seed makes sampled replies repeatable")
        self.note = QLabel()
        self.note.setObjectName("formNote")
        self.note.setWordWrap(True)

        form.addRow("Method", self.method)
        form.addRow("Draft tokens (K)", self.draft_tokens)
        form.addRow("Tree shape", self.tree_shape)
        form.addRow("Exact verifier", self.verifier)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max new tokens", self.max_new_tokens)
        form.addRow("Seed", self.seed)
        form.addRow(self.note)

        self.set_settings(settings)
        self.method.currentIndexChanged.connect(self._update_enabled)
        self.temperature.valueChanged.connect(self._update_enabled)

    def set_settings(self, settings: DecodeSettings) -> None:
        self.method.setCurrentIndex(max(self.method.findData(settings.method), 0))
        self.draft_tokens.setValue(settings.draft_tokens)
        self.tree_shape.setCurrentText(settings.tree_shape)
        self.verifier.setCurrentIndex(max(self.verifier.findData(settings.verifier), 0))
        self.temperature.setValue(settings.temperature)
        self.top_p.setValue(settings.top_p)
        self.top_k.setValue(settings.top_k)
        self.max_new_tokens.setValue(settings.max_new_tokens)
        self.seed.setValue(-1 if settings.seed is None else settings.seed)
        self._update_enabled()

    def settings(self, base: DecodeSettings) -> DecodeSettings:
        return base.with_changes(
            method=self.method.currentData(),
            draft_tokens=self.draft_tokens.value(),
            tree_shape=self.tree_shape.currentText().strip() or "auto",
            verifier=self.verifier.currentData() or base.verifier,
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value(),
            max_new_tokens=self.max_new_tokens.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(),
        )

    def _update_enabled(self) -> None:
        knob = method_table.method(self.method.currentData()).knob if self.method.currentData() else method_table.KNOB_NONE
        drafting = self.method.currentData() != "ar"
        tree = knob == method_table.KNOB_TREE_SHAPE
        adaptive = knob == method_table.KNOB_ADAPTIVE
        sampling = self.temperature.value() > 0
        self.draft_tokens.setEnabled(drafting and not tree and not adaptive)
        self.tree_shape.setEnabled(tree)
        self.verifier.setEnabled(drafting and not tree and sampling and self.verifier.count() > 0)
        for knob in (self.top_p, self.top_k, self.seed):
            knob.setEnabled(sampling)
        notes = []
        if not drafting:
            notes.append("ar drafts nothing, so K and the verifier do not apply.")
        if tree:
            notes.append(
                "Trees are verified exactly (one target sample per visited node); the tree shape replaces K."
            )
        if adaptive:
            notes.append("The adaptive chain chooses its draft length every round, so K does not apply.")
        if not sampling:
            notes.append(
                "Temperature 0 is greedy: a draft token is kept exactly when it is the target's top choice, "
                "so top-p, top-k, seed and the verifier do not apply."
            )
        self.note.setText(" ".join(notes))


class LocalServerForm(QWidget):
    """The local server switch: `tandem serve` for the active pair, started by the app
    (app/local_server.py); its state is in the main window's status bar."""

    def __init__(self, settings: LocalServerSettings):
        super().__init__()
        layout = QVBoxLayout(self)
        self.enabled = QCheckBox("Local server (OpenAI-compatible API)")
        self.enabled.setChecked(settings.enabled)
        layout.addWidget(self.enabled)
        help_text = QLabel(
            "Serves the active pair to other programs on this machine (editors, notebooks, chat front-ends) at "
            "http://127.0.0.1:PORT/v1, as “tandem serve” does, and follows the pair you switch to. "
            "The server is a separate process: it loads its own copy of the pair, so the pair's memory is "
            "needed twice, and it shares the processor with the app, so a reply written in both at once is "
            "slower in each. It only listens on 127.0.0.1: other machines cannot reach it."
        )
        help_text.setObjectName("formNote")
        help_text.setWordWrap(True)
        layout.addWidget(help_text)
        form = QFormLayout()
        self.port = QSpinBox()
        self.port.setRange(1024, 65535)
        self.port.setValue(settings.port)
        self.port.setMaximumWidth(120)
        self.port.setToolTip("The port on 127.0.0.1 it listens on (tandem serve's default is 8080)")
        self.api_key = QLineEdit(settings.api_key)
        self.api_key.setPlaceholderText("none: any program on this machine may use it")
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.api_key.setToolTip(
            "Optional: programs must then send 'Authorization: Bearer KEY' (the api_key of an OpenAI client). "
            "It is kept in the settings file as written."
        )
        form.addRow("Port", self.port)
        form.addRow("API key", self.api_key)
        layout.addLayout(form)
        layout.addStretch()
        self.enabled.toggled.connect(self._update_enabled)
        self._update_enabled()

    def settings(self) -> LocalServerSettings:
        return LocalServerSettings(enabled=self.enabled.isChecked(), port=self.port.value(), api_key=self.api_key.text().strip())

    def _update_enabled(self) -> None:
        for knob in (self.port, self.api_key):
            knob.setEnabled(self.enabled.isChecked())


class SettingsDialog(QDialog):
    applied = Signal(object)  # AppSettings
    pair_requested = Signal(object)  # PairConfig to load now
    pairs_changed = Signal()

    def __init__(self, settings: AppSettings, pairs: list[PairConfig], client: EngineClient, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Tandem settings")
        self.settings = replace(settings, models=list(settings.models), local_server=replace(settings.local_server))
        self.client = client
        self.builtin_names = {pair.name for pair in builtin_pairs()}
        self.pairs = list(pairs)

        layout = QVBoxLayout(self)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs)
        self.tabs.addTab(self._pairs_tab(), "Model pairs")
        info = client.pair
        self.decoding = DecodingForm(
            settings.decoding,
            info.methods if info else method_table.NAMES,
            info.verifiers if info else tuple((name, name, True) for name in VERIFIERS),
        )
        decoding_tab = QWidget()
        decoding_layout = QVBoxLayout(decoding_tab)
        source = f"Methods and verifiers offered by the loaded pair “{info.config.name}”." if info else (
            "No pair is loaded yet: these are all the engine's methods and verifiers."
        )
        source += " SPRINTER (approximate) is the toolbar's Verifier switch."
        source_label = QLabel(source)
        source_label.setWordWrap(True)
        decoding_layout.addWidget(source_label)
        decoding_layout.addWidget(self.decoding)
        self.show_provenance = QCheckBox("Colour reply tokens by who produced them (draft or target)")
        self.show_provenance.setChecked(settings.show_provenance)
        decoding_layout.addWidget(self.show_provenance)
        decoding_layout.addStretch()
        self.tabs.addTab(decoding_tab, "Decoding")
        self.server_form = LocalServerForm(settings.local_server)
        self.tabs.addTab(self.server_form, "Local server")

        self.error = QLabel()
        self.error.setObjectName("formError")
        self.error.setWordWrap(True)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self._ok)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.Apply).clicked.connect(self.apply)
        layout.addWidget(buttons)
        self.resize(680, 600)

    # Pairs tab

    def _pairs_tab(self) -> QWidget:
        tab = QWidget()
        layout = QVBoxLayout(tab)
        layout.addWidget(QLabel("Model pairs (also used by `tandem chat --pair` and `tandem bench --pair`)"))
        self.pair_list = QListWidget()
        # Summaries hold model names and folders: wrap them within the list's width rather
        # than cut them off behind a horizontal scroll bar.
        self.pair_list.setWordWrap(True)
        self.pair_list.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.pair_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.pair_list.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.pair_list.setSpacing(2)
        layout.addWidget(self.pair_list, 1)
        row = QHBoxLayout()
        self.new_pair_button = QPushButton("New pair…")
        self.edit_pair_button = QPushButton("Edit…")
        self.remove_pair_button = QPushButton("Remove")
        self.use_pair_button = QPushButton("Use this pair")
        self.use_pair_button.setToolTip("Load it on the worker; the current pair stays active until it is ready")
        for button in (self.new_pair_button, self.edit_pair_button, self.remove_pair_button):
            row.addWidget(button)
        row.addStretch()
        row.addWidget(self.use_pair_button)
        layout.addLayout(row)
        self.heads_panel = HeadsPanel(self.client)
        layout.addWidget(self.heads_panel)
        self.new_pair_button.clicked.connect(lambda: self.open_picker(None))
        self.edit_pair_button.clicked.connect(lambda: self.open_picker(self.selected_pair()))
        self.remove_pair_button.clicked.connect(self._remove_pair)
        self.use_pair_button.clicked.connect(self._use_pair)
        self.pair_list.currentItemChanged.connect(lambda *_: self._update_pair_buttons())
        self._fill_pairs(self.settings.active_pair)
        return tab

    def _fill_pairs(self, select: str) -> None:
        self.pair_list.clear()
        for pair in self.pairs:
            text = pair_summary(pair)
            if pair.name == self.settings.active_pair:
                text += "   [in use]"
            item = QListWidgetItem(text)
            item.setData(NAME_ROLE, pair.name)
            item.setToolTip(pair_details(pair))
            self.pair_list.addItem(item)
            if pair.name == select:
                self.pair_list.setCurrentItem(item)
        self._update_pair_buttons()

    def selected_pair(self) -> PairConfig | None:
        item = self.pair_list.currentItem()
        return next((p for p in self.pairs if item and p.name == item.data(NAME_ROLE)), None)

    def _update_pair_buttons(self) -> None:
        pair = self.selected_pair()
        editable = pair is not None and pair.name not in self.builtin_names
        self.edit_pair_button.setEnabled(editable)
        self.remove_pair_button.setEnabled(editable and pair.name != self.settings.active_pair)
        self.use_pair_button.setEnabled(pair is not None)

    def open_picker(self, pair: PairConfig | None) -> PairPicker:
        """Open the picker (window-modal); the pair is saved when the user accepts it."""
        models = list(dict.fromkeys([*self.settings.models, *self._pair_models()]))
        taken = {p.name for p in self.pairs} - ({pair.name} if pair else set())
        picker = PairPicker(self.client, models, taken, pair, self)
        picker.models_changed.connect(self._on_models_changed)
        picker.accepted.connect(lambda: self._save_pair(picker.pair(), replacing=pair))
        picker.open()
        return picker

    def _pair_models(self) -> list[str]:
        sources = []
        for pair in self.pairs:
            sources.append(pair.target.source)
            if pair.draft:
                sources.append(pair.draft.source)
        return sources

    def _on_models_changed(self, models: list[str]) -> None:
        self.settings.models = list(models)
        self.applied.emit(self.settings)  # a downloaded or added model is kept even if the dialog is cancelled

    def _save_pair(self, pair: PairConfig, replacing: PairConfig | None) -> None:
        pairs = [p for p in self.pairs if replacing is None or p.name != replacing.name] + [pair]
        if self._store_pairs(pairs):
            self._fill_pairs(pair.name)

    def _remove_pair(self) -> None:
        pair = self.selected_pair()
        if pair is not None and self._store_pairs([p for p in self.pairs if p.name != pair.name]):
            self._fill_pairs(self.settings.active_pair)

    def _store_pairs(self, pairs: list[PairConfig]) -> bool:
        try:
            save_user_pairs([p for p in pairs if p.name not in self.builtin_names])
        except (ConfigError, OSError) as error:
            self.error.setText(error_text(error))
            return False
        self.pairs = pairs
        self.error.clear()
        self.pairs_changed.emit()
        return True

    def _use_pair(self) -> None:
        pair = self.selected_pair()
        if pair is not None:
            self.pair_requested.emit(pair)

    def mark_active(self, name: str) -> None:
        """The main window reports which pair is now active (after a load or a failed one)."""
        self.settings.active_pair = name
        self._fill_pairs(name)

    # Decoding tab, OK and Apply

    def apply(self) -> bool:
        try:
            self.settings.decoding = self.decoding.settings(self.settings.decoding)
        except ConfigError as error:
            self.error.setText(error_text(error))
            return False
        self.settings.show_provenance = self.show_provenance.isChecked()
        self.settings.local_server = self.server_form.settings()
        self.error.clear()
        self.applied.emit(self.settings)
        return True

    def _ok(self) -> None:
        if self.apply():
            self.accept()
