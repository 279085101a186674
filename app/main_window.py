"""The main window: conversations on the left, the chat in the middle, the speed panel docked
on the right; a toolbar to switch pair, method and verifier (Exact | SPRINTER); load progress
in the status bar."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer, Slot
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QColor, QKeySequence, QPainter, QPaintEvent, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSizePolicy,
    QSplitter,
    QToolBar,
    QWidget,
)

from engine import methods
from engine.config import (
    CHAT_DEFAULT_TEMPERATURE,
    ConfigError,
    DecodeSettings,
    PairConfig,
    demo_pair,
)
from engine.events import Finished
from engine.pairs import all_pairs, builtin_pairs
from engine.paths import config_dir
from engine.runtime.cpu import count_as_others
from engine.stats import GenerationStats

from . import export, theme
from .about_dialog import AboutDialog
from .chat_session import ChatController
from .chat_view import ChatPane
from .conversation_list import ConversationList
from .engine_api import EngineApi, LocalEngine
from .error_text import error_text
from .figures import calibration_step, sprinter_quality
from .load_steps import LoadSteps
from .local_server import LocalServer, ServerSpec, ServerState
from .message_widget import is_dark
from .provenance import DARK_COLOURS, LEGEND, LEGEND_TIPS, LIGHT_COLOURS
from .settings import AppSettings, load_settings, save_settings
from .settings_dialog import SettingsDialog, pair_details
from .speed_panel import SpeedPanel
from .storage import open_chat_store
from .verifier_switch import SPRINTER, VerifierSwitch, sprinter_refusal
from .worker import EngineClient, PairInfo

LAYOUT_FILE = "window.ini"
SERVER_PAIR_FILE = "local-server-pair.json"  # the pair the local server is given when it is no saved one
STATUS_MESSAGE_MS = 8000  # how long "Exported … to …" stays in the status bar
EXPORT_FILTERS = {export.MARKDOWN: "Markdown (*.md)", export.JSON: "JSON (*.json)"}
PAIR_NAME_CHARS = 40  # the pair switch widens to fit names up to about this many characters
WELCOME = "Ask anything. Replies are written on this machine, offline."
FIRST_LOAD = (
    "Loading the model pair… On the first start the bundled demo model is prepared once, "
    "which can take half a minute; the status bar below says what it is doing. "
    "You can type your first message meanwhile."
)


class ProvenanceLegend(QWidget):
    """What the provenance colours mean; shown while colouring is on."""

    def __init__(self, dark: bool):
        super().__init__()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.swatches: dict[str, QLabel] = {}
        for kind, meaning in LEGEND:
            swatch = QLabel()
            label = QLabel(meaning)
            for part in (swatch, label):
                part.setToolTip(LEGEND_TIPS[kind])
            layout.addWidget(swatch)
            layout.addWidget(label)
            self.swatches[kind] = swatch
        self.set_dark(dark)

    def set_dark(self, dark: bool) -> None:
        colours = DARK_COLOURS if dark else LIGHT_COLOURS
        for kind, swatch in self.swatches.items():
            pixmap = QPixmap(12, 12)
            pixmap.fill(QColor(colours[kind]))
            swatch.setPixmap(pixmap)


class ElidedLabel(QLabel):
    """One line that ends in "…" where it is narrower than its text, instead of being cut."""

    def __init__(self) -> None:
        super().__init__()
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def paintEvent(self, _event: QPaintEvent) -> None:
        area = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, area.width())
        painter = QPainter(self)
        self.style().drawItemText(painter, area, int(self.alignment()), self.palette(), self.isEnabled(), shown, self.foregroundRole())


class MainWindow(QMainWindow):
    def __init__(self, engine: EngineApi | None = None):
        super().__init__()
        self.setWindowTitle("Tandem")
        # The window thread's CPU time counts against the engine's thread budget: a core it uses is
        # one the native forward's threads would wait for at their barriers (engine/runtime/cpu.py).
        count_as_others(threading.get_native_id())
        self.settings, settings_warning = load_settings()
        theme.apply_theme(self.settings.theme)  # before any widget reads the palette
        self.store, store_warning = open_chat_store()
        self.pairs, pairs_warning = _read_pairs()
        self.settings_dialog: SettingsDialog | None = None
        # What turning Greedy off goes back to: the last temperature above 0 in use.
        self._sampling_temperature = self.settings.decoding.temperature or CHAT_DEFAULT_TEMPERATURE
        self._closed = False
        self._ready_text = ""  # the status line of the loaded pair
        self._loaded_in = ""  # how long it took to load, in that line
        self._load_failure_shown = False  # the banner holds a load error, which a later load ends
        self._failed_pairs: dict[str, tuple[PairConfig, str]] = {}  # name: (config that failed, why)

        self.client = EngineClient(engine or LocalEngine(), self)
        self.local_server = LocalServer(self)
        self.conversations = ConversationList(self.store)
        self.pane = ChatPane()
        self.splitter = QSplitter()
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.conversations)
        self.splitter.addWidget(self.pane)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([220, 680])
        self.setCentralWidget(self.splitter)
        self.speed_panel = SpeedPanel(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.speed_panel)
        self.controller = ChatController(self.store, self.client, self.pane, self.decode_settings, self)

        self._build_toolbar()
        self._build_menu_bar()
        self._build_status_bar()
        self._connect()
        self.resize(1200, 760)
        self._restore_layout()
        self.pane.view.set_show_provenance(self.settings.show_provenance)
        self._open_first_conversation()
        self._update_export_actions()
        # One banner holds every warning: shown one after another, only the last would stay.
        warnings = [warning for warning in (store_warning, settings_warning, pairs_warning) if warning]
        if warnings:
            self.pane.banner.show_message("\n\n".join(warnings), "warning")
        self.pane.view.set_placeholder_text(FIRST_LOAD)
        self.request_pair(self.pair_named(self.settings.active_pair) or demo_pair())

    # Building

    def _build_toolbar(self) -> None:
        toolbar = QToolBar("Main")
        toolbar.setObjectName("mainToolbar")
        toolbar.setMovable(False)
        self.addToolBar(toolbar)
        # New chat and the speed panel's toggle live in the menus (and the list has its own New
        # chat button), so that the toolbar fits a 1024-pixel-wide window without hiding any.
        self.new_action = QAction("New chat", self)
        self.new_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_action.triggered.connect(self.controller.new_conversation)
        self.addAction(self.new_action)  # Ctrl+N works wherever the focus is
        toolbar.addWidget(QLabel(" Pair "))
        self.pair_combo = QComboBox()
        self.pair_combo.setMinimumContentsLength(18)
        # Pairs are added and renamed after the window first shows: keep fitting the names.
        self.pair_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        toolbar.addWidget(self.pair_combo)
        toolbar.addWidget(QLabel(" Method "))
        self.method_combo = QComboBox()
        # Widens to "adaptive chain (SpecDec++)" once the pair has calibrated heads.
        self.method_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        toolbar.addWidget(self.method_combo)
        self.greedy_action = QAction("Greedy", self)
        self.greedy_action.setCheckable(True)
        self.greedy_action.setChecked(self.settings.decoding.greedy)
        self.greedy_action.setToolTip(
            "Greedy (temperature 0): always the most likely token, so Regenerate repeats a reply word for word. "
            "Off: replies are sampled (temperature in Settings → Decoding). Output is exact either way."
        )
        toolbar.addAction(self.greedy_action)
        toolbar.addSeparator()
        self.verifier_switch = VerifierSwitch()
        toolbar.addWidget(self.verifier_switch)
        toolbar.addSeparator()
        self.provenance_action = QAction("Colour tokens", self)
        self.provenance_action.setCheckable(True)
        self.provenance_action.setChecked(self.settings.show_provenance)
        self.provenance_action.setToolTip(
            "Show which reply tokens the draft proposed and the target accepted (and, with SPRINTER, "
            "which the target never checked)"
        )
        toolbar.addAction(self.provenance_action)
        self.speed_toggle = self.speed_panel.toggleViewAction()
        self.speed_toggle.setText("Speed panel")
        self.speed_toggle.setShortcut(QKeySequence("Ctrl+Shift+S"))
        self.settings_action = QAction("Settings…", self)
        self.settings_action.setShortcut(QKeySequence.StandardKey.Preferences)
        toolbar.addAction(self.settings_action)
        self.regenerate_action = QAction("Regenerate", self)
        self.regenerate_action.setShortcut(QKeySequence("Ctrl+R"))
        self.regenerate_action.triggered.connect(self.controller.regenerate)
        self.addAction(self.regenerate_action)
        self._fill_pair_combo()
        self._fill_method_combo(None)
        self._show_verifier()

    def _build_menu_bar(self) -> None:
        """What people look for first in a desktop app: File, View and Help."""
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addAction(self.new_action)
        file_menu.addSeparator()
        self.export_chat_action = file_menu.addAction("&Export chat…", self.export_chat)
        self.export_chat_action.setShortcut(QKeySequence("Ctrl+E"))
        self.export_chat_action.setStatusTip("Save this conversation as Markdown or JSON")
        self.export_all_action = file_menu.addAction("Export &all chats…", self.export_all_chats)
        self.export_all_action.setStatusTip("Save every conversation, as Markdown and JSON, into a new folder")
        file_menu.addSeparator()
        file_menu.addAction(self.settings_action)
        file_menu.addSeparator()
        self.quit_action = file_menu.addAction("&Quit", self.close)
        self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))  # the standard Quit key is empty on Windows
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)

        view_menu = bar.addMenu("&View")
        theme_menu = view_menu.addMenu("&Theme")
        self.theme_actions: dict[str, QAction] = {}
        themes = QActionGroup(self)
        for name in (theme.SYSTEM, theme.LIGHT, theme.DARK):
            action = theme_menu.addAction(theme.TITLES[name])
            action.setCheckable(True)
            action.setChecked(name == self.settings.theme)
            action.triggered.connect(lambda _checked, name=name: self.set_theme(name))
            themes.addAction(action)
            self.theme_actions[name] = action
        view_menu.addSeparator()
        view_menu.addAction(self.provenance_action)
        view_menu.addAction(self.speed_toggle)

        help_menu = bar.addMenu("&Help")
        self.about_action = help_menu.addAction("&About Tandem", self.open_about)
        self.about_action.setMenuRole(QAction.MenuRole.AboutRole)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.load_steps: LoadSteps | None = None  # of the latest load asked for
        self.load_clock = QTimer(self)  # counts the seconds of the step in progress
        self.load_clock.setInterval(1000)
        self.load_clock.timeout.connect(self._show_load_step)
        self.load_label = ElidedLabel()  # gives way to the colour legend beside it
        self.load_progress = QProgressBar()
        self.load_progress.setMaximumWidth(180)
        self.load_progress.setVisible(False)
        bar.addWidget(self.load_label, 1)
        bar.addWidget(self.load_progress)
        self.legend = ProvenanceLegend(is_dark())
        self.legend.setVisible(self.settings.show_provenance)
        bar.addPermanentWidget(self.legend)
        self.server_label = QLabel()
        self.server_label.setObjectName("localServerStatus")
        self.server_label.setVisible(False)
        self.server_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # the URL, to copy
        bar.addPermanentWidget(self.server_label)

    def _connect(self) -> None:
        self.conversations.selected.connect(self.controller.open_conversation)
        self.conversations.new_requested.connect(self.controller.new_conversation)
        self.conversations.delete_requested.connect(self.controller.delete)
        self.conversations.renamed.connect(self.controller.rename)
        self.controller.conversations_changed.connect(self._refresh_conversations)
        self.controller.conversations_changed.connect(self._update_export_actions)
        self.conversations.selected.connect(self._update_export_actions)
        self.pane.view.limit_settings_requested.connect(self.open_decoding_settings)
        self.controller.reply_started.connect(self.speed_panel.start_reply)
        self.client.load_progress.connect(self._on_load_progress)
        self.client.pair_loaded.connect(self._on_pair_loaded)
        self.client.load_failed.connect(self._on_load_failed)
        self.controller.reading_progress.connect(self.speed_panel.show_reading)
        self.client.stats_updated.connect(self._on_stats)
        self.client.finished.connect(self._on_finished)
        self.client.errored.connect(lambda _request_id, _error: self.speed_panel.fail_reply())
        self.client.calibrated.connect(self._on_calibrated)
        self.client.calibration_progress.connect(self._on_calibration_progress)
        self.client.calibration_cancelled.connect(self._show_ready)
        self.client.calibration_failed.connect(self._on_calibration_failed)
        self.client.runtime_changed.connect(self._on_runtime_changed)
        self.pair_combo.activated.connect(self._on_pair_chosen)
        self.method_combo.activated.connect(self._on_method_chosen)
        self.provenance_action.toggled.connect(self.set_show_provenance)
        self.greedy_action.triggered.connect(self.set_greedy)  # triggered: by the user only
        self.verifier_switch.chosen.connect(self.set_verifier_mode)
        self.settings_action.triggered.connect(self.open_settings)
        self.local_server.changed.connect(self._show_local_server)

    # Layout, kept by QSettings (window geometry only; everything else is in the settings file)

    def _layout_store(self) -> QSettings:
        return QSettings(str(config_dir() / LAYOUT_FILE), QSettings.Format.IniFormat)

    def _restore_layout(self) -> None:
        layout = self._layout_store()
        geometry, state, splitter = layout.value("geometry"), layout.value("state"), layout.value("splitter")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if state is not None:
            self.restoreState(state)
        if splitter is not None:
            self.splitter.restoreState(splitter)

    def _save_layout(self) -> None:
        layout = self._layout_store()
        layout.setValue("geometry", self.saveGeometry())
        layout.setValue("state", self.saveState())
        layout.setValue("splitter", self.splitter.saveState())
        layout.sync()

    def _open_first_conversation(self) -> None:
        saved = self.store.state("selected_conversation")
        conversation = self.store.conversation(int(saved)) if saved and saved.isdigit() else None
        if conversation is None:
            newest = self.store.list_conversations()
            conversation = newest[0] if newest else None
        self.controller.open_conversation(conversation.id if conversation else None)
        self.conversations.refresh(self.controller.conversation_id)

    @Slot()
    def _refresh_conversations(self) -> None:
        self.conversations.refresh(self.controller.conversation_id)

    # Pairs

    def pair_named(self, name: str) -> PairConfig | None:
        return next((pair for pair in self.pairs if pair.name == name), None)

    def request_pair(self, config: PairConfig) -> None:
        """Load `config` on the worker; the chat stays usable with the current pair meanwhile."""
        self.client.load_pair(config)
        self.load_steps = LoadSteps(f"Loading “{config.name}”…")
        self._show_load_step()
        self.load_clock.start()
        self.load_progress.setRange(0, 0)
        self.load_progress.setVisible(True)

    @Slot()
    def _show_load_step(self) -> None:
        self.load_label.setText(self.load_steps.line())
        self.load_label.setToolTip(self.load_steps.history())

    def _load_ended(self) -> None:
        if self.client.loading is None:
            self.load_clock.stop()

    @Slot(str, object)
    def _on_load_progress(self, message: str, fraction: float | None) -> None:
        if self.load_steps is not None:
            self.load_steps.report(message)
            self._show_load_step()
        if fraction is None:
            self.load_progress.setRange(0, 0)
        else:
            self.load_progress.setRange(0, 100)
            self.load_progress.setValue(round(fraction * 100))

    @Slot(object)
    def _on_pair_loaded(self, info: PairInfo) -> None:
        description = info.description
        self._load_ended()
        latest = self.load_steps is not None and self.client.loading is None  # not one a later request replaced
        self._loaded_in = f" · loaded in {int(self.load_steps.total_s())} s" if latest else ""
        self._ready_text = _ready_line(description, self._loaded_in)
        self.load_label.setText(self._ready_text)
        self.load_progress.setVisible(self.client.loading is not None)
        self.setWindowTitle(f"Tandem — {info.config.name}")
        if self._load_failure_shown:
            self._load_failure_shown = False
            self.pane.banner.hide()
        self.settings.active_pair = info.config.name
        save_settings(self.settings)
        self._failed_pairs.pop(info.config.name, None)
        self.speed_panel.set_pair(description)
        self.pane.view.set_placeholder_text(WELCOME)
        self._fill_pair_combo()
        self._fill_method_combo(info)
        self._show_verifier()
        self.speed_panel.set_heads(info.heads_card)
        if self.settings_dialog is not None:
            self.settings_dialog.mark_active(info.config.name)
        self._run_local_server()

    @Slot(object)
    def _on_runtime_changed(self, description: dict) -> None:
        """The runtime finished work it did in the background (compiling its forward)."""
        self.speed_panel.set_pair(description)
        showing_ready = self.load_label.text() == self._ready_text
        self._ready_text = _ready_line(description, self._loaded_in)
        if showing_ready:
            self.load_label.setText(self._ready_text)

    @Slot(object)
    def _on_calibrated(self, info: PairInfo) -> None:
        """The pair has new heads: SPRINTER and the adaptive chain become available."""
        self._fill_method_combo(info)
        self._show_verifier()
        self.speed_panel.set_heads(info.heads_card)
        self._show_ready()

    @Slot(str, int, int)
    def _on_calibration_progress(self, phase: str, done: int, total: int) -> None:
        """Shown here too, since Settings may be closed while a calibration runs."""
        if self.client.loading is None:
            name = self.client.pair.config.name if self.client.pair else ""
            self.load_label.setText(
                f"Calibrating the heads of “{name}”: {calibration_step(phase, done, total)} (Settings → Model pairs to cancel)"
            )

    @Slot(object)
    def _on_calibration_failed(self, error: Exception) -> None:
        self.pane.banner.show_message(f"Calibrating the heads failed. {_as_sentence(error_text(error))} The pair keeps what it had.")
        self._show_ready()

    @Slot()
    def _show_ready(self) -> None:
        if self.client.loading is None and self.client.pair is not None:
            self.load_label.setText(self._ready_text)

    @Slot(object, object)
    def _on_load_failed(self, config: PairConfig, error: Exception) -> None:
        self._load_ended()
        self.load_progress.setVisible(self.client.loading is not None)
        current = self.client.pair
        demo = demo_pair()
        if current is not None:
            still = f" Still using “{current.config.name}”."
            self.load_label.setText(f"Using “{current.config.name}”")
        elif config != demo and self.client.loading is None:
            # A saved pair that no longer loads must not leave the app without any pair.
            still = " Using the demo pair instead; choose another in Settings → Model pairs."
            self.request_pair(demo)
        else:
            still = " No pair is active: choose another in Settings → Model pairs."
            self.load_label.setText("No model pair loaded")
            self.pane.view.set_placeholder_text("No model pair is loaded. Choose one in Settings → Model pairs.")
        self._failed_pairs[config.name] = (config, _as_sentence(error_text(error)))
        self.pane.banner.show_message(f"Could not load “{config.name}”. {_as_sentence(error_text(error))}{still}")
        # A later load ends the message, except the fallback's own, which the message explains.
        self._load_failure_shown = self.client.loading is None
        self._fill_pair_combo()

    def _fill_pair_combo(self) -> None:
        active = self.client.pair.config.name if self.client.pair else self.settings.active_pair
        self.pair_combo.clear()
        metrics = self.pair_combo.fontMetrics()
        widest = metrics.averageCharWidth() * PAIR_NAME_CHARS
        for pair in self.pairs:
            # Only a name too long for the toolbar is elided; its tooltip holds it whole.
            name = metrics.elidedText(pair.name, Qt.TextElideMode.ElideMiddle, widest)
            failure = self.load_failure(pair)
            if failure is None:
                self.pair_combo.addItem(name, pair.name)
                tip = pair_details(pair)
            else:  # still listed, so that choosing it again retries the load
                self.pair_combo.addItem(f"⚠ {name} — failed to load", pair.name)
                tip = f"Failed to load: {failure}\nChoose it again to retry.\n\n{pair_details(pair)}"
            self.pair_combo.setItemData(self.pair_combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
        self.pair_combo.setCurrentIndex(max(self.pair_combo.findData(active), 0))
        current = self.pair_named(self.pair_combo.currentData())
        self.pair_combo.setToolTip(
            (f"{pair_details(current)}\n\n" if current else "")
            + "Switch model pair; the current one stays active until the new one is loaded"
        )

    def load_failure(self, pair: PairConfig) -> str | None:
        """Why `pair`'s last load failed, unless it has loaded since or has been edited."""
        failed = self._failed_pairs.get(pair.name)
        return failed[1] if failed is not None and failed[0] == pair else None

    def _fill_method_combo(self, info: PairInfo | None) -> None:
        """The pair's exact methods; SPRINTER is the Verifier switch's. Before a pair loads,
        those that need no calibrated heads (the box is sized for them when it first shows:
        Qt widens a combo box for longer items later, but never narrows it)."""
        self.method_combo.clear()
        offered = info.methods if info else [row.name for row in methods.TABLE if methods.HEADS not in row.needs]
        for row in methods.TABLE:
            if row.name not in offered or not row.exact:
                continue
            self.method_combo.addItem(row.title, row.name)
            self.method_combo.setItemData(self.method_combo.count() - 1, f"{row.title}: {row.summary}", Qt.ItemDataRole.ToolTipRole)
        self._show_method()

    def _show_method(self) -> None:
        """The exact method replies use (a saved one the pair lacks falls back); set aside
        while SPRINTER writes the replies."""
        self.method_combo.setCurrentIndex(max(self.method_combo.findData(self.exact_settings().method), 0))
        sprinter = self.decode_settings().method == SPRINTER
        self.method_combo.setEnabled(not sprinter)
        self.method_combo.setToolTip(
            "Replies are written by SPRINTER (approximate); this method applies when the Verifier is Exact"
            if sprinter else "Decoding method for the next reply (exact: the target checks every token)"
        )

    def _show_verifier(self) -> None:
        info = self.client.pair
        why_not = sprinter_refusal(info)
        quality = sprinter_quality(info.heads_card, self.settings.decoding.greedy) if info else None
        self.verifier_switch.show_state(self.settings.verifier_mode, why_not, quality)
        self._show_method()

    @Slot(str)
    def set_verifier_mode(self, mode: str) -> None:
        """Exact: replies use the method box's method. SPRINTER: they use SPRINTER (approximate)."""
        self.settings.verifier_mode = mode
        save_settings(self.settings)
        self._show_verifier()

    @Slot(int)
    def _on_pair_chosen(self, index: int) -> None:
        pair = self.pair_named(self.pair_combo.itemData(index))
        if pair is not None and (self.client.pair is None or pair != self.client.pair.config):
            self.request_pair(pair)

    @Slot(int)
    def _on_method_chosen(self, index: int) -> None:
        self.set_decoding(self.settings.decoding.with_changes(method=self.method_combo.itemData(index)))

    # Speed figures

    @Slot(int, object, object)
    def _on_stats(self, _request_id: int, stats: GenerationStats, description: dict) -> None:
        self.speed_panel.show_live_stats(stats, description)

    @Slot(int, object, object)
    def _on_finished(self, _request_id: int, event: Finished, description: dict) -> None:
        self.speed_panel.finish_reply(event.stats, description, event.stop_reason)

    # Decoding settings

    def decode_settings(self) -> DecodeSettings:
        """What the next reply uses: SPRINTER where the Verifier switch says so and the pair
        offers it, else the exact settings."""
        decoding = self.exact_settings()
        info = self.client.pair
        if info is not None:
            method = methods.method_for_mode(decoding.method, self.settings.verifier_mode)
            if method in info.methods:
                decoding = decoding.with_changes(method=method)
        return decoding

    def exact_settings(self) -> DecodeSettings:
        """The saved settings, fitted to what the loaded pair offers."""
        decoding = self.settings.decoding
        info = self.client.pair
        if info is not None:
            if decoding.method not in info.methods or not methods.is_exact(decoding.method):
                decoding = decoding.with_changes(method=methods.default_method(info.methods))
            verifier_names = [name for name, _label, _exact in info.verifiers]
            if verifier_names and decoding.verifier not in verifier_names:
                decoding = decoding.with_changes(verifier=verifier_names[0])
        return decoding

    def set_decoding(self, decoding: DecodeSettings) -> None:
        self.settings.decoding = decoding
        save_settings(self.settings)
        if not decoding.greedy:
            self._sampling_temperature = decoding.temperature
        self.greedy_action.setChecked(decoding.greedy)
        self._show_verifier()  # the held-out figures differ between greedy and sampled

    @Slot(bool)
    def set_greedy(self, greedy: bool) -> None:
        """Greedy on: temperature 0. Off: back to the temperature the replies were sampled at."""
        temperature = 0.0 if greedy else self._sampling_temperature
        self.set_decoding(self.settings.decoding.with_changes(temperature=temperature))

    @Slot(bool)
    def set_show_provenance(self, show: bool) -> None:
        self.settings.show_provenance = show
        save_settings(self.settings)
        self.provenance_action.setChecked(show)
        self.legend.setVisible(show)
        self.pane.view.set_show_provenance(show)

    # View and Help

    @Slot(str)
    def set_theme(self, name: str) -> None:
        """Restyle the app now and keep the choice; widgets that paint their own colours follow."""
        self.settings.theme = name
        save_settings(self.settings)
        theme.apply_theme(name)
        self.theme_actions[name].setChecked(True)
        dark = is_dark()
        self.legend.set_dark(dark)
        self.speed_panel.set_dark(dark)
        for message in self.pane.view.messages:
            message.restyle()

    @Slot()
    def open_about(self) -> AboutDialog:
        dialog = AboutDialog(self.client.pair, list(self.settings.models), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    # Export (File menu)

    @Slot()
    def _update_export_actions(self) -> None:
        self.export_chat_action.setEnabled(self.controller.conversation_id is not None)
        self.export_all_action.setEnabled(bool(self.store.list_conversations()))

    @Slot()
    def export_chat(self) -> None:
        conversation = self.store.conversation(self.controller.conversation_id) if self.controller.conversation_id else None
        if conversation is None:
            return
        suggested = Path.home() / f"{export.file_name(conversation.title)}.md"
        chosen, chosen_filter = QFileDialog.getSaveFileName(
            self, "Export chat", str(suggested), ";;".join(EXPORT_FILTERS.values())
        )
        if not chosen:
            return
        path = Path(chosen)
        if path.suffix.lower() not in (".md", ".json"):  # the format chosen in the dialog names the suffix
            kind = export.JSON if chosen_filter == EXPORT_FILTERS[export.JSON] else export.MARKDOWN
            path = path.with_name(f"{path.name}.{kind}")
        try:
            export.export_conversation(self.store, conversation.id, path)
        except export.ExportError as error:
            self._export_failed(error)
            return
        self.statusBar().showMessage(f"Exported “{conversation.title}” to {path}", STATUS_MESSAGE_MS)

    @Slot()
    def export_all_chats(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Export all chats into a folder", str(Path.home()))
        if not chosen:
            return
        try:
            folder, count = export.export_all(self.store, Path(chosen))
        except export.ExportError as error:
            self._export_failed(error)
            return
        chats = "1 chat" if count == 1 else f"{count} chats"
        self.statusBar().showMessage(f"Exported {chats} (Markdown and JSON) to {folder}", STATUS_MESSAGE_MS)

    def _export_failed(self, error: export.ExportError) -> None:
        QMessageBox.warning(
            self, "Export failed", f"{error} Choose another place to export to. Your chats are unchanged."
        )

    # The local server (Settings → Local server)

    def _run_local_server(self) -> None:
        """Serve the loaded pair as the settings ask; a newly loaded pair restarts the server.
        Until a pair has loaded it waits, so that two loads do not share the processor."""
        server = self.settings.local_server
        pair = self.client.pair.config if self.client.pair else None
        if not server.enabled or pair is None:
            self.local_server.run(None)
            return
        self.local_server.run(ServerSpec(self._server_pair_argument(pair), server.port, server.api_key))

    def _server_pair_argument(self, pair: PairConfig) -> str:
        """`tandem serve --pair`: the saved pair's name, or a file with the pair's JSON where the
        loaded pair is no saved one (or differs from the saved one of its name)."""
        if self.pair_named(pair.name) == pair:
            return pair.name
        path = config_dir() / SERVER_PAIR_FILE
        path.write_text(json.dumps(pair.to_dict(), indent=2), encoding="utf-8")
        return str(path)

    @Slot()
    def _show_local_server(self) -> None:
        server = self.local_server
        self.server_label.setText(server.text())
        self.server_label.setVisible(server.state is not ServerState.OFF)
        self.server_label.setToolTip(server.output() or "tandem serve: nothing written yet")

    # Settings dialog

    @Slot()
    def open_decoding_settings(self) -> SettingsDialog:
        """Settings at Decoding, with Max new tokens ready to change (a token-limit notice's link)."""
        dialog = self.open_settings()
        dialog.tabs.setCurrentIndex(dialog.tabs.indexOf(dialog.decoding.parentWidget()))
        dialog.decoding.max_new_tokens.setFocus()
        dialog.decoding.max_new_tokens.selectAll()
        return dialog

    @Slot()
    def open_settings(self) -> SettingsDialog:
        if self.settings_dialog is None:
            dialog = SettingsDialog(self.settings, self.pairs, self.client, self)
            dialog.applied.connect(self._apply_settings)
            dialog.pair_requested.connect(self.request_pair)
            dialog.pairs_changed.connect(self._on_pairs_changed)
            dialog.finished.connect(self._forget_settings_dialog)
            self.settings_dialog = dialog
        self.settings_dialog.open()
        return self.settings_dialog

    @Slot(object)
    def _apply_settings(self, changed: AppSettings) -> None:
        self.settings.models = list(changed.models)
        self.set_decoding(changed.decoding)
        self.set_show_provenance(changed.show_provenance)
        if changed.local_server != self.settings.local_server:
            self.settings.local_server = changed.local_server
            save_settings(self.settings)
        self._run_local_server()

    @Slot()
    def _on_pairs_changed(self) -> None:
        self.pairs, warning = _read_pairs()
        if warning:
            self.pane.banner.show_message(warning, "warning")
        self._fill_pair_combo()

    @Slot()
    def _forget_settings_dialog(self) -> None:
        self.settings_dialog.deleteLater()
        self.settings_dialog = None

    # Closing

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._closed:
            self._closed = True
            self._save_layout()
            self.controller.save_for_close()
            self.local_server.shutdown()
            self.client.shutdown()
            self.store.close()
        super().closeEvent(event)


def _as_sentence(text: str) -> str:
    """`text` ending in a full stop, so that the next sentence does not run into it."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?", "…")) else f"{text}."


def _read_pairs() -> tuple[list[PairConfig], str | None]:
    try:
        return all_pairs(), None
    except ConfigError as error:
        return builtin_pairs(), f"{error}. Only the built-in pairs are listed."


def _ready_line(description: dict, loaded_in: str) -> str:
    """The status line of a loaded pair: what runs it, where, and how (e.g. "compiling in the background")."""
    head = f" + EAGLE-3 head {description['eagle']}" if description.get("eagle") else ""
    return (
        f"Ready: {description.get('target')} + {description.get('draft')}{head} "
        f"on {description.get('device')} ({description.get('precision')}, {description.get('runtime', 'torch')})"
        + loaded_in
    )
