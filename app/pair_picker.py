"""The model pair picker: choose a target among the models found on this machine or added
(Hugging Face folder, GGUF file, or a repo id to download), a draft that shares its
tokenizer, its precision and device; it says which methods the pair gets.

Models found on disk (app/found_models.py, scanned off the GUI thread) carry their
tokenizer's digest, so the found drafts that fit a found target, and an EAGLE-3 head for it,
are offered at once. Whether an added model fits is asked of the worker (it reads tokenizers,
which takes seconds); until it answers, other models are listed but cannot be chosen. The
n-gram drafter needs no model and always fits.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine import methods
from engine.config import CPU_DEFAULT_PRECISION, DEMO_DRAFT_FOLDER, DEMO_TARGET, DEVICES, PRECISIONS, RUNTIMES, ModelSpec, PairConfig
from engine.discovery import Found, FoundModel, draft_choices, pair_methods
from engine.errors import ModelLoadError
from engine.model_files import check_pair_files

from .error_text import error_text
from .found_models import FoundModelsPanel
from .model_scan import ModelScan, last_found
from .worker import EngineClient

PRECISION_LABELS = {
    "auto": f"auto: 8-bit ({CPU_DEFAULT_PRECISION} on torch, Q8_0 on llama.cpp)",
    "int8": "int8: 8-bit weights (bitsandbytes; Q8_0 on llama.cpp), half the memory",
    "int8-wo": "int8-wo: 8-bit weights; integer matmuls on the CPU, CUDA graphs on a GPU (Q8_0 on llama.cpp)",
    "int4-wo": "int4-wo: 4-bit weights for 1-8B targets on the CPU, 0.58x int8's bytes a step (Q4_K_S on llama.cpp)",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp32": "fp32: full precision, most memory",
    "stored": "stored: a GGUF file as it is, e.g. Q4_K_M (llama.cpp only)",
}
RUNTIME_LABELS = {
    "auto": "auto: as tandem tune measured fastest here, else llama.cpp for GGUF files, PyTorch otherwise",
    "llama.cpp": "llama.cpp: GGUF files only",
    "torch": "PyTorch: every model, bitsandbytes int8 on a GPU",
}
DEVICE_LABELS = {"auto": "auto: the GPU when there is one", "cpu": "CPU", "cuda": "CUDA GPU"}
SOURCE_ROLE = Qt.ItemDataRole.UserRole
NGRAM = ""  # the draft list's entry for "no draft model: n-gram prompt lookup"
CHECKING = "checking its tokenizer…"
DEMO_DRAFT = str(DEMO_DRAFT_FOLDER)
# Shipped with the app: always listed, never stored among the user's own models.
BUNDLED_MODELS = (DEMO_TARGET, DEMO_DRAFT)


def model_label(source: str) -> str:
    if source == DEMO_TARGET:
        return "SmolLM2-135M-Instruct (bundled demo)"
    if source == DEMO_DRAFT:
        return "SmolLM2-135M distilled draft (bundled)"
    path = Path(source).expanduser()
    return f"{path.name} ({path.parent})" if path.is_absolute() else source


def found_label(model: FoundModel) -> str:
    details = " ".join(part for part in (model.family, model.size_label, model.quantisation) if part)
    return f"{model.name} — {details}, {model.app}" if details else f"{model.name}, {model.app}"


class PairPicker(QDialog):
    models_changed = Signal(list)  # the user's model sources, after one was added

    def __init__(
        self,
        client: EngineClient,
        models: list[str],
        taken_names: set[str],
        pair: PairConfig | None = None,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Model pair")
        self.client = client
        self.edited = pair  # what the dialog does not show (n-gram settings, an EAGLE-3 head) is kept
        self.user_models = [m for m in models if m not in BUNDLED_MODELS]
        self.taken_names = taken_names
        self.reasons: dict[str, str | None] = {}  # draft source -> why it does not fit, None if it does
        self._checked_target = ""
        self._name_edited = pair is not None
        self.found: Found | None = last_found()  # shown at once; a fresh scan replaces it

        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Models on this machine"))
        self.found_models = FoundModelsPanel()
        layout.addWidget(self.found_models)
        form = QFormLayout()
        self.name = QLineEdit(pair.name if pair else "")
        self.name.textEdited.connect(self._on_name_edited)
        self.target = QComboBox()
        self.precision = QComboBox()
        for value in PRECISIONS:
            self.precision.addItem(PRECISION_LABELS.get(value, value), value)
        self.device = QComboBox()
        for value in DEVICES:
            self.device.addItem(DEVICE_LABELS.get(value, value), value)
        form.addRow("Name", self.name)
        form.addRow("Target model", self.target)
        form.addRow("Target precision", self.precision)
        form.addRow("Device", self.device)
        self.runtime = QComboBox()
        for value in RUNTIMES:
            self.runtime.addItem(RUNTIME_LABELS.get(value, value), value)
        form.addRow("Runtime", self.runtime)
        self.compile = QCheckBox("Compile torch models on the CPU in the background")
        self.compile.setChecked(True)
        self.compile.setToolTip(
            "The pair chats at once; meanwhile torch compiles the model's forward (minutes the first time, "
            "then cached on disk) and replies run faster once it is done. No effect on llama.cpp or on a GPU. "
            "TANDEM_COMPILE=0 turns it off for every pair."
        )
        form.addRow("", self.compile)
        layout.addLayout(form)

        layout.addWidget(QLabel("Draft (only models with the target's tokenizer can draft for it)"))
        self.drafts = QListWidget()
        self.drafts.setMinimumHeight(110)
        self.drafts.setWordWrap(True)
        layout.addWidget(self.drafts)
        self.eagle_head = QCheckBox()
        self.eagle_head.setChecked(True)
        self.eagle_head.setVisible(False)
        self.eagle_head_source = ""
        self.other_tokenizers = 0  # found models that cannot draft for a found target
        layout.addWidget(self.eagle_head)
        self.methods_line = QLabel()
        self.methods_line.setObjectName("pairMethods")
        self.methods_line.setWordWrap(True)
        layout.addWidget(self.methods_line)

        adding = QGroupBox("Add a model")
        adding_layout = QVBoxLayout(adding)
        row = QHBoxLayout()
        self.add_folder_button = QPushButton("Hugging Face folder…")
        self.add_gguf_button = QPushButton("GGUF file…")
        row.addWidget(self.add_folder_button)
        row.addWidget(self.add_gguf_button)
        row.addStretch()
        adding_layout.addLayout(row)
        row = QHBoxLayout()
        self.repo_id = QLineEdit()
        self.repo_id.setPlaceholderText("Hugging Face repo id, e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        self.download_button = QPushButton("Download")
        self.download_button.setToolTip("The only action in Tandem that uses the network")
        row.addWidget(self.repo_id, 1)
        row.addWidget(self.download_button)
        adding_layout.addLayout(row)
        self.download_progress = QProgressBar()
        self.download_progress.setVisible(False)
        self.status = QLabel()
        self.status.setObjectName("pickerStatus")
        self.status.setWordWrap(True)
        adding_layout.addWidget(self.download_progress)
        adding_layout.addWidget(self.status)
        layout.addWidget(adding)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)

        self.add_folder_button.clicked.connect(self._choose_folder)
        self.add_gguf_button.clicked.connect(self._choose_gguf)
        self.download_button.clicked.connect(self._download)
        self.repo_id.returnPressed.connect(self._download)
        self.target.currentIndexChanged.connect(self._on_target_changed)
        self.drafts.currentItemChanged.connect(self._on_draft_changed)
        self.name.textChanged.connect(lambda *_: self._update_ok())
        client.drafts_checked.connect(self._on_drafts_checked)
        client.download_progress.connect(self._on_download_progress)
        client.downloaded.connect(self._on_downloaded)
        client.download_failed.connect(self._on_download_failed)
        self.found_models.target_chosen.connect(self._choose_found_target)
        self.found_models.folder_added.connect(lambda _folder: self._scan())
        self.eagle_head.toggled.connect(lambda _checked: self._update_methods())
        self.scan = ModelScan(self)
        self.scan.found.connect(self._on_found)
        self.scan.failed.connect(self.found_models.show_failure)

        self._fill_targets(pair.target.source if pair else DEMO_TARGET)
        if pair:
            self.precision.setCurrentIndex(max(self.precision.findData(pair.target.precision), 0))
            self.device.setCurrentIndex(max(self.device.findData(pair.target.device), 0))
            self.runtime.setCurrentIndex(max(self.runtime.findData(pair.runtime), 0))
            self.compile.setChecked(pair.compile)
        self._on_target_changed()
        self._select_draft(pair.draft.source if pair and pair.draft else NGRAM)
        if self.found is not None:
            self.found_models.show_found(self.found, self.target.currentData())
        self._scan()
        self.resize(760, 780)

    # The result

    def accept(self) -> None:
        """Save only a pair whose model files are whole: a broken one keeps the picker open
        with the reason, which says what to do."""
        try:
            check_pair_files(self.pair())
        except ModelLoadError as error:
            self._set_status(f"This pair cannot be saved: {error}", failed=True)
            return
        super().accept()

    def pair(self) -> PairConfig:
        target = ModelSpec(self.target.currentData(), self.precision.currentData(), self.device.currentData())
        draft_source = self.selected_draft()
        draft = ModelSpec(draft_source, "auto", target.device) if draft_source else None
        kept = {"ngram": self.edited.ngram} if self.edited else {}
        if self.edited and self.edited.target.source == target.source:
            kept["eagle"] = self.edited.eagle  # an EAGLE-3 head fits its own target only
        if self._found_head_chosen():
            kept["eagle"] = self.eagle_head_source
        return PairConfig(
            self.name.text().strip(), target, draft, runtime=self.runtime.currentData(), compile=self.compile.isChecked(), **kept
        )

    def selected_draft(self) -> str:
        item = self.drafts.currentItem()
        return item.data(SOURCE_ROLE) if item else NGRAM

    # Models

    def all_models(self) -> list[str]:
        return [*BUNDLED_MODELS, *self.user_models]

    def add_model(self, source: str) -> None:
        if source not in self.all_models():
            self.user_models.append(source)
            self.models_changed.emit(list(self.user_models))
        self._fill_targets(self.target.currentData())
        self._check_drafts()

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Hugging Face model folder (with config.json)")
        if folder:
            self.add_model(folder)

    def _choose_gguf(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(self, "GGUF model file", "", "GGUF models (*.gguf)")
        if path:
            self.add_model(path)

    def _download(self) -> None:
        repo_id = self.repo_id.text().strip()
        if not repo_id:
            return
        self.download_button.setEnabled(False)
        self.download_progress.setVisible(True)
        self.download_progress.setRange(0, 0)
        self._set_status(f"Waiting to download {repo_id}…")
        self.client.download(repo_id)

    @Slot(str, object)
    def _on_download_progress(self, message: str, fraction: float | None) -> None:
        if fraction is None:
            self.download_progress.setRange(0, 0)
        else:
            self.download_progress.setRange(0, 1000)
            self.download_progress.setValue(int(fraction * 1000))
        self._set_status(message)

    @Slot(str, str)
    def _on_downloaded(self, repo_id: str, source: str) -> None:
        self.download_button.setEnabled(True)
        self.download_progress.setVisible(False)
        self._set_status(f"Downloaded {repo_id}; it is now in the lists above.")
        self.add_model(source)

    @Slot(str, object)
    def _on_download_failed(self, repo_id: str, error: Exception) -> None:
        self.download_button.setEnabled(True)
        self.download_progress.setVisible(False)
        self._set_status(error_text(error), failed=True)

    def _set_status(self, text: str, failed: bool = False) -> None:
        self.status.setText(text)
        self.status.setProperty("failed", failed)
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)

    # Models found on this machine

    def _scan(self) -> None:
        self.found_models.show_searching()
        self.scan.start()

    @Slot(object)
    def _on_found(self, found: Found) -> None:
        self.found = found
        self.found_models.show_found(found, self.target.currentData())
        self._fill_targets(self.target.currentData())
        self._check_drafts()

    def _found(self, source: str) -> FoundModel | None:
        return self.found.model(source) if self.found is not None else None

    def _choose_found_target(self, source: str) -> None:
        self.target.setCurrentIndex(max(self.target.findData(source), 0))

    def _label(self, source: str) -> str:
        model = self._found(source)
        return found_label(model) if model is not None else model_label(source)

    def _found_head_chosen(self) -> bool:
        return not self.eagle_head.isHidden() and self.eagle_head.isChecked() and bool(self.eagle_head_source)

    # Target and drafts

    def _fill_targets(self, keep: str) -> None:
        self.target.blockSignals(True)
        self.target.clear()
        found = [model.source for model in self.found.usable] if self.found is not None else []
        for source in dict.fromkeys([*self.all_models(), *found]):
            if source == DEMO_DRAFT:
                continue  # 16M parameters distilled to draft for the demo target, not to chat
            self.target.addItem(self._label(source), source)
            self.target.setItemData(self.target.count() - 1, source, Qt.ItemDataRole.ToolTipRole)
        self.target.setCurrentIndex(max(self.target.findData(keep), 0))
        self.target.blockSignals(False)

    def _on_target_changed(self) -> None:
        if not self._name_edited:
            self.name.setText(self._suggested_name())
        self.found_models.select(self.target.currentData())
        self._check_drafts()

    def _check_drafts(self) -> None:
        target = self.target.currentData()
        if target != self._checked_target:
            self.reasons = {}
            self._checked_target = target
        self._offer_found_drafts(target)
        others = [m for m in self.all_models() if m != target and m not in self.reasons]
        for source in others:
            self.reasons[source] = CHECKING
        if others:
            self.client.check_drafts(ModelSpec(target), [ModelSpec(source) for source in others])
        self._fill_drafts()

    def _offer_found_drafts(self, target: str) -> None:
        """The found drafts with a found target's tokenizer fit it without asking the worker;
        an EAGLE-3 head found for it is offered beside them."""
        model = self._found(target)
        choices = draft_choices(model, self.found) if model is not None else None
        for draft in choices.drafts if choices else ():
            self.reasons[draft.source] = None
        head = choices.heads[0] if choices and choices.heads else None
        self.eagle_head_source = head.source if head else ""
        self.eagle_head.setText(f"Also draft with the EAGLE-3 head found: {head.name} ({head.app})" if head else "")
        self.eagle_head.setToolTip(head.source if head else "")
        self.eagle_head.setVisible(head is not None)
        self.other_tokenizers = choices.other_tokenizers if choices else 0

    @Slot(str, object)
    def _on_drafts_checked(self, target_source: str, reasons: dict) -> None:
        if target_source != self._checked_target:
            return  # an answer about a target the user has since changed
        self.reasons.update(reasons)
        self._fill_drafts()

    def _fill_drafts(self) -> None:
        keep = self.selected_draft()
        self.drafts.blockSignals(True)
        self.drafts.clear()
        ngram = QListWidgetItem("n-gram prompt lookup (no draft model; always fits)")
        ngram.setData(SOURCE_ROLE, NGRAM)
        ngram.setToolTip("Drafts by continuing text that already appeared in the conversation")
        self.drafts.addItem(ngram)
        for source, reason in self.reasons.items():
            item = QListWidgetItem(self._label(source) if reason is None else f"{self._label(source)} — {reason}")
            item.setData(SOURCE_ROLE, source)
            item.setToolTip(source if reason is None else f"{source}\nCannot draft for this target: {reason}")
            if reason is not None:
                item.setFlags(item.flags() & ~(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable))
            self.drafts.addItem(item)
        self.drafts.blockSignals(False)
        self._select_draft(keep)

    def _select_draft(self, source: str) -> None:
        for row in range(self.drafts.count()):
            item = self.drafts.item(row)
            if item.data(SOURCE_ROLE) == source and item.flags() & Qt.ItemFlag.ItemIsEnabled:
                self.drafts.setCurrentItem(item)
                break
        else:
            self.drafts.setCurrentRow(0)
        if not self._name_edited:
            self.name.setText(self._suggested_name())
        self._update_ok()
        self._update_methods()

    def _update_methods(self) -> None:
        """Say which methods the pair gets, before it is loaded (calibrated heads come later)."""
        target, draft = self.target.currentData(), self.selected_draft()
        has_head = self._found_head_chosen() or bool(self.edited and self.edited.eagle and self.edited.target.source == target)
        offered = pair_methods(self._found(target), self._found(draft), has_draft_model=bool(draft), has_eagle_head=has_head)
        line = "This pair gets: " + ", ".join(methods.label(name) for name in offered)
        if draft:
            line += "; SPRINTER and the adaptive chain once its heads are calibrated"
        others = self.other_tokenizers
        if others:
            line += f". {others} other model{'s' if others != 1 else ''} found here use{'s' if others == 1 else ''} another tokenizer"
        self.methods_line.setText(line + ".")

    # Name and OK

    def _on_draft_changed(self, *_items) -> None:
        if not self._name_edited:
            self.name.setText(self._suggested_name())
        self._update_ok()
        self._update_methods()

    def _on_name_edited(self, _text: str) -> None:
        self._name_edited = True

    def _suggested_name(self) -> str:
        target = self.target.currentData() or DEMO_TARGET
        draft = self.selected_draft() if self.drafts.count() else NGRAM
        base = f"{self._short_name(target)} + {self._short_name(draft) if draft else 'n-gram'}"
        name, number = base, 2
        while name in self.taken_names:
            name, number = f"{base} ({number})", number + 1
        return name

    def _short_name(self, source: str) -> str:
        model = self._found(source)
        if model is not None:
            return model.name.split("/")[-1]  # an Ollama blob's file name says nothing; its tag does
        return "SmolLM2-135M" if source == DEMO_TARGET else Path(source).stem.split("/")[-1]

    def _update_ok(self) -> None:
        name = self.name.text().strip()
        problem = ""
        if not name:
            problem = "Give the pair a name."
        elif name in self.taken_names:
            problem = f"There is already a pair named “{name}”."
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(not problem)
        ok.setToolTip(problem)
