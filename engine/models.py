"""Finding and loading models: the bundled demo, GGUF files, Hugging Face folders and repo ids.

Every source ends up as a local Hugging Face folder (`resolve_source`), which is then loaded
with transformers at the precision and on the device the spec asks for (`load_model`).
A GGUF file is dequantised into a safetensors folder under the cache once; after that it
loads in under a second instead of ~17 s.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError
from transformers import AutoTokenizer

from . import tokenizer_shelf
from .config import (
    CPU_DEFAULT_PRECISION, CUDA_DEFAULT_PRECISION, DEMO_TARGET, DRAFT_CPU_DEFAULT_PRECISION, DRAFT_DEFAULT_PRECISION,
    LLAMACPP_TARGET_PRECISION, STORED, ModelSpec,
)
from .demo_model import demo_gguf_path
from .errors import ModelLoadError
from .model_files import check_model_files
from .paths import cache_dir
from .runtime import ModelRuntime
from .runtime import llamacpp_library, llamacpp_process
from .runtime.device import resolve_device
from .runtime.eagle3_head import Eagle3Head, check_fits_target, load_head
from .runtime.forward_plan import ForwardPlan, ForwardSettings, int8_kernel_runs_on, plan_forward
from .runtime.reduced_vocabulary import ReducedVocabulary, ReducedVocabularyRuntime
from .runtime.model_reading import READ_ERRORS, without_progress_bars

ProgressCallback = Callable[[str, "float | None"], None]
RuntimeFactory = Callable[[bool, tuple[int, ...]], ModelRuntime]  # (hidden_states, feature_layers) -> runtime

MAX_CONTEXT_LENGTH = 8192
# For configs that do not say how long a context they were trained for.
FALLBACK_CONTEXT_LENGTH = 2048

DEMO_LABEL = "SmolLM2-135M-Instruct (demo)"

# Only what transformers needs to load a model: skips .bin pickles, ONNX and GGUF variants
# that would multiply the download.
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
# A scratch folder this old belongs to a conversion that was killed, not one still running.
STALE_PARTIAL_AGE_S = 6 * 3600
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
log = logging.getLogger("tandem.models")


@dataclass
class LoadedModel:
    """A model ready to run, with the tokenizer and settings it was loaded with.

    `open_runtime()` gives a fresh cache over the loaded weights, made by `runtime_factory`
    (engine/runtime/: torch over `model`, by its `forward_plan`, or llama.cpp, where `model` is None).
    """

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype | None
    precision: str
    label: str
    context_length: int
    folder: Path | None = None  # where its files are, for companions such as an n-gram table
    runtime: str = "torch"
    gpu_layers: int = 0  # llama.cpp: how many layers it offloaded to a GPU (-1: all)
    gguf_file: Path | None = None  # llama.cpp: the file it runs (a re-quantised copy, where it made one)
    runtime_factory: RuntimeFactory | None = None  # a fresh runtime; torch's over `model` by default
    compile: bool = False  # torch on the CPU: compile the forward in the background (runtime/compiled_forward.py)
    extra_stop_ids: frozenset[int] = frozenset()  # end-of-turn ids the weights' own metadata names
    release: Callable[[], None] | None = None  # frees what the garbage collector cannot see
    vocabulary: ReducedVocabulary | None = None  # a draft that knows part of the tokenizer's vocabulary
    # What an EAGLE-3 head must match: the residual stream's width, the layer count, and the
    # token embeddings it reads (a torch model's own; llama.cpp's from its GGUF file).
    hidden_size: int = 0
    layer_count: int = 0
    vocab_size: int = 0
    embeddings: Callable[[], torch.Tensor] | None = None
    # torch: which forward runs which rows, and why (runtime/forward_plan.py); llama.cpp: None
    forward_plan: ForwardPlan | None = None

    def __post_init__(self) -> None:
        if self.runtime_factory is None:
            from .runtime.torch_load import torch_runtime_factory  # transformers' model classes: torch pairs only

            if self.forward_plan is None:
                self.forward_plan = plan_forward(self.model, self.device, ForwardSettings.for_pair(self.compile, self.precision))
            log.info("%s: %s", self.label, self.forward_plan.describe())
            self.runtime_factory = torch_runtime_factory(self.model, self.device, self.context_length, self.forward_plan)
        if self.model is not None and not self.hidden_size:
            config = self.model.config
            self.hidden_size, self.layer_count, self.vocab_size = config.hidden_size, config.num_hidden_layers, config.vocab_size
            self.embeddings = lambda: input_embedding_table(self.model)

    def open_runtime(self, hidden_states: bool = False, feature_layers: tuple[int, ...] = ()) -> ModelRuntime:
        """A fresh cache over the weights; `hidden_states` makes it return the final hidden
        state beside the logits (`ModelRuntime.last_hidden_states`), `feature_layers` keep
        those layers' inputs per slot (`ModelRuntime.features`)."""
        runtime = self.runtime_factory(hidden_states, feature_layers)
        return ReducedVocabularyRuntime(runtime, self.vocabulary) if self.vocabulary is not None else runtime

    @property
    def stop_token_ids(self) -> frozenset[int]:
        model_sources = (self.model.generation_config, self.model.config) if self.model is not None else ()
        # the model's own configs name ids in its vocabulary, which a reduced draft maps
        in_model = frozenset(token for source in model_sources for token in _eos_ids(source))
        return self.extra_stop_ids | _full_vocabulary_ids(in_model, self.vocabulary) | _eos_ids(self.tokenizer)

    @property
    def forward_plan_line(self) -> str | None:
        """The forward plan in one line, for the speed panel and the bench (None on llama.cpp)."""
        return self.forward_plan.describe() if self.forward_plan is not None else None

    def close(self) -> None:
        if self.release is not None:
            self.release()
            self.release = None


def load_model(
    spec: ModelSpec, progress: ProgressCallback | None = None, as_draft: bool = False, runtime: str = "auto",
    compile: bool = False,
) -> LoadedModel:
    """Load the model `spec` describes, converting or finding its files first as needed, on
    the runtime `runtime` asks for ("auto": llama.cpp where the model has a GGUF file and
    llama-cpp-python is installed). `as_draft` only changes what precision "auto" means;
    `compile` lets a torch model on the CPU be compiled in the background once it runs."""
    report = progress or _ignore_progress
    check_model_files(spec)  # a broken download is refused in a sentence, before a reader trips on it
    gguf = runtime_gguf(spec, runtime)
    if gguf is not None:
        return _load_with_llamacpp(spec, gguf, report, as_draft)
    device = resolve_device(spec.device)
    precision, precision_reason = precision_and_reason(spec.precision, device, as_draft)
    folder = resolve_source(spec, report)
    tokenizer = _load_tokenizer(folder)
    report("Loading weights…", None)
    # Imported here: transformers' model classes cost ~85 MB of memory that a pair running
    # on llama.cpp never needs.
    from .runtime.torch_load import load_torch_weights

    model = load_torch_weights(folder, device, precision)
    context_length = _context_length(model.config)
    plan = plan_forward(model, device, ForwardSettings.for_pair(compile, precision, precision_reason))
    return LoadedModel(
        runtime=plan.name,
        forward_plan=plan,
        compile=compile,
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=model.dtype,
        folder=folder,
        precision=precision,
        label=source_label(spec),
        context_length=context_length,
        vocabulary=ReducedVocabulary.load(folder),
    )


def load_eagle_head(source: str, target: LoadedModel) -> Eagle3Head:
    """The EAGLE-3 head at `source` (a folder, or a Hugging Face repo id in the local cache or
    downloadable), refused with the reason when it does not fit `target`."""
    path = Path(source).expanduser()
    if path.is_dir():
        folder = path
    elif REPO_ID.match(source):
        folder = _hub_snapshot(source)
    else:
        raise ModelLoadError(f"EAGLE-3 head not found: {path}")
    head = load_head(folder, target.layer_count or None)
    check_fits_target(head, target.hidden_size, target.vocab_size, target.layer_count)
    return head


def runtime_gguf(spec: ModelSpec, runtime: str) -> Path | None:
    """The GGUF file llama.cpp should run for `spec`, or None when torch runs it."""
    if runtime == "torch":
        return None
    gguf = _gguf_path(spec)
    if gguf is None:
        folder = Path(spec.source).expanduser()
        gguf = _exported_gguf(folder) if folder.is_dir() else None
    if runtime == "llama.cpp":
        if gguf is None:
            raise ModelLoadError(
                f"{spec.source} has no GGUF file for the llama.cpp runtime. "
                f"Export one with: tandem export-gguf {spec.source}"
            )
        if not llamacpp_process.wanted():  # a worker says so itself, as it loads
            llamacpp_library.library()  # a clear error now if the library is missing or too old
        return gguf
    return gguf if gguf is not None and llamacpp_library.available() else None


def _exported_gguf(folder: Path) -> Path | None:
    """The GGUF export beside a Hugging Face folder's weights (`tandem export-gguf`)."""
    found = sorted(folder.glob("*.gguf"))
    return found[0] if found else None


def _load_with_llamacpp(spec: ModelSpec, gguf: Path, report: ProgressCallback, as_draft: bool) -> LoadedModel:
    from .runtime.llamacpp import LlamaCppRuntime, load_weights, token_embeddings

    original = gguf
    precision = spec.precision
    if precision == "auto":
        precision = STORED if as_draft else LLAMACPP_TARGET_PRECISION
    folder = None if _gguf_path(spec) is not None else Path(spec.source).expanduser()
    tokenizer = _load_tokenizer(folder) if folder is not None else _gguf_tokenizer(original, report)
    vocabulary = ReducedVocabulary.load(folder)
    announce = lambda message: report(message, None)  # noqa: E731
    use_gpu = spec.device != "cpu"  # offloads only where the build can
    if llamacpp_process.wanted():
        # This process never loads llama.cpp: the worker converts and loads the file.
        report("Loading weights (llama.cpp, in its own process)…", None)
        weights = llamacpp_process.load_weights(gguf, precision, use_gpu, announce)
        gguf = weights.path
    else:
        if precision in llamacpp_library.QUANTISED_FILE_TYPES:
            gguf = llamacpp_library.quantised_copy(gguf, precision, announce=announce)
        report("Loading weights (llama.cpp)…", None)
        weights = load_weights(gguf, use_gpu)
    context_length = min(weights.context_length or FALLBACK_CONTEXT_LENGTH, MAX_CONTEXT_LENGTH)
    return LoadedModel(
        model=None,
        tokenizer=tokenizer,
        device=torch.device("cpu"),  # logits arrive in host memory, wherever llama.cpp ran
        dtype=None,
        precision=weights.file_type,
        label=source_label(spec),
        context_length=context_length,
        folder=folder,
        runtime=_llamacpp_label(weights),
        gpu_layers=weights.gpu_layers,
        gguf_file=gguf,
        runtime_factory=lambda hidden_states, feature_layers=(): LlamaCppRuntime(
            weights, context_length, hidden_states=hidden_states, feature_layers=feature_layers
        ),
        hidden_size=weights.hidden_size,
        layer_count=weights.layer_count,
        vocab_size=weights.vocab_size,
        embeddings=lambda: token_embeddings(gguf),
        extra_stop_ids=_full_vocabulary_ids(weights.eos_token_ids, vocabulary),
        release=weights.close,
        vocabulary=vocabulary,
    )


def _llamacpp_label(weights) -> str:
    """How the speed panel names the runtime: "llama.cpp", "llama.cpp (GPU, own process)"…"""
    where = ["GPU"] if weights.gpu_layers else []
    where += ["own process"] if isinstance(weights, llamacpp_process.WorkerWeights) else []
    return "llama.cpp" + (f" ({', '.join(where)})" if where else "")


def _eos_ids(source: Any) -> frozenset[int]:
    eos = getattr(source, "eos_token_id", None)
    if isinstance(eos, int):
        return frozenset({eos})
    if isinstance(eos, (list, tuple)):
        return frozenset(int(token) for token in eos)
    return frozenset()


def _full_vocabulary_ids(model_ids: frozenset[int], vocabulary: ReducedVocabulary | None) -> frozenset[int]:
    """Ids a model's own metadata names (its end-of-turn ids), in the tokenizer's vocabulary."""
    if vocabulary is None:
        return model_ids
    return frozenset(vocabulary.kept_ids[token] for token in model_ids if token < vocabulary.other_id)


def _gguf_tokenizer(gguf: Path, report: ProgressCallback | None = None) -> Any:
    """The tokenizer stored in a GGUF file, read once (~4 s) and cached as a Hugging Face
    tokenizer folder (well under a second), keyed by the file and the transformers version
    that read it: a converter that changes its mind gets a fresh cache."""
    import transformers

    folder = _converted_folder(gguf)
    if folder.is_dir():
        return _load_tokenizer(folder)
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    cached = cache_dir() / "tokenizers" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if cached.is_dir():
        return _load_tokenizer(cached)
    (report or _ignore_progress)(f"Reading the tokenizer in {gguf.name} (first use only, a few seconds)…", None)
    tokenizer = _read_gguf_tokenizer(gguf)
    _write_atomically(cached, tokenizer.save_pretrained)
    return tokenizer


def load_tokenizer_only(spec: ModelSpec) -> Any:
    """The tokenizer of `spec`, without loading weights: enough to check a pair's compatibility.

    A GGUF file that has not been converted yet is not converted here: its tokenizer is read
    straight from the file (~4 s instead of ~20 s).
    """
    check_model_files(spec)
    gguf = _gguf_path(spec)
    if gguf is not None and not _converted_folder(gguf).is_dir():
        return _read_gguf_tokenizer(gguf)
    return _load_tokenizer(resolve_source(spec))


def resolve_source(spec: ModelSpec, progress: ProgressCallback | None = None) -> Path:
    """The local Hugging Face folder that holds `spec`'s model, converting a GGUF file once."""
    report = progress or _ignore_progress
    gguf = _gguf_path(spec)
    if gguf is not None:
        return _converted_gguf(gguf, report, _conversion_message(spec, gguf))
    path = Path(spec.source).expanduser()
    if path.is_dir():
        return _checked_model_folder(path)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file.")
    if REPO_ID.match(spec.source):
        return _hub_snapshot(spec.source)
    raise ModelLoadError(f"Model file not found: {path}")


def input_embedding_table(model) -> torch.Tensor:
    """The (V, H) input embedding rows as values, for an EAGLE-3 head that embeds its tokens
    with the target's table: an int8 table is its rows times their scales, not the raw int8."""
    embeddings = model.get_input_embeddings()
    dequantised = getattr(embeddings, "dequantised", None)
    return embeddings.weight if dequantised is None else dequantised()


def resolve_precision(precision: str, device: torch.device, as_draft: bool = False) -> str:
    return precision_and_reason(precision, device, as_draft)[0]


def precision_and_reason(precision: str, device: torch.device, as_draft: bool = False) -> tuple[str, str]:
    """The precision a torch model loads at, and why (the forward plan shows it)."""
    if precision == STORED:
        raise ModelLoadError("Precision \"stored\" runs a GGUF file as it is, on the llama.cpp runtime; "
                             "this model runs on PyTorch. Choose the llama.cpp runtime, or another precision.")
    if precision != "auto":
        return precision, "the pair's setting"
    if as_draft:
        # int8 on the CPU only where Tandem's int8 kernel runs it: elsewhere it was never measured against bf16
        if int8_kernel_runs_on(device):
            return DRAFT_CPU_DEFAULT_PRECISION, "a draft's default on the CPU, where the int8 kernel runs"
        return DRAFT_DEFAULT_PRECISION, "a draft's default without the int8 kernel"
    if device.type == "cuda":
        return CUDA_DEFAULT_PRECISION, "the default on CUDA"
    return CPU_DEFAULT_PRECISION, "the default on the CPU"


def source_label(spec: ModelSpec) -> str:
    """A short name for the model, for the window title and the stats panel."""
    if spec.source == DEMO_TARGET:
        return DEMO_LABEL
    path = Path(spec.source).expanduser()
    return path.name if path.exists() else spec.source


# Sources


def _gguf_path(spec: ModelSpec) -> Path | None:
    """The GGUF file behind `spec`, or None when the source is not a GGUF file."""
    if spec.source == DEMO_TARGET:
        return demo_gguf_path()
    path = Path(spec.source).expanduser()
    if path.suffix.lower() != ".gguf":
        return None
    if not path.is_file():
        raise ModelLoadError(f"Model file not found: {path}")
    return path


# How long converting the demo GGUF for torch takes: 4.6-5.5 s on the 2-core development CPU
# (torch_load._gguf_metadata_read_once); a first start waits for it, so the loading line says so.
DEMO_CONVERSION_ESTIMATE = "about 6 s"


def _conversion_message(spec: ModelSpec, gguf: Path) -> str:
    if spec.source == DEMO_TARGET:
        return f"Converting the demo model (first start only, {DEMO_CONVERSION_ESTIMATE})…"
    return f"Converting {gguf.name} (first use only)…"


def _checked_model_folder(folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    hint = " It holds a .gguf file: choose that file instead." if any(folder.glob("*.gguf")) else ""
    raise ModelLoadError(f"{folder} is not a Hugging Face model folder: it has no config.json.{hint}")


def _hub_snapshot(repo_id: str) -> Path:
    """The cached download of a Hugging Face repo, downloading it if the hub can be reached."""
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILE_PATTERNS, local_files_only=True))
    except LocalEntryNotFoundError:
        pass  # not cached yet: download it below, if we may
    except HFValidationError as error:
        raise ModelLoadError(
            f"Model file not found, and '{repo_id}' is no Hugging Face repo id either: {error}"
        ) from error
    if _hub_offline():
        raise ModelLoadError(_offline_message(repo_id))
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILE_PATTERNS))
    except LocalEntryNotFoundError as error:  # what snapshot_download raises when the network fails
        raise ModelLoadError(_offline_message(repo_id)) from error
    except RepositoryNotFoundError as error:
        raise ModelLoadError(
            f"'{repo_id}' was not found on the Hugging Face hub (or it is private or gated)."
        ) from error
    except OSError as error:  # HTTP errors from the hub, and a full or unwritable disk
        raise ModelLoadError(f"Downloading '{repo_id}' failed: {error}") from error


def _hub_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; the environment may have changed since.
    setting = os.environ.get("HF_HUB_OFFLINE", "")
    return hub_constants.HF_HUB_OFFLINE or setting.upper() in {"1", "ON", "YES", "TRUE"}


def _offline_message(repo_id: str) -> str:
    return (
        f"'{repo_id}' is not in the local Hugging Face cache and the hub cannot be reached (offline). "
        "Download it once while online, or choose a local folder or GGUF file."
    )


# GGUF conversion


def _converted_gguf(gguf: Path, report: ProgressCallback, message: str) -> Path:
    folder = _converted_folder(gguf)
    if folder.is_dir():
        return folder
    report(message, None)
    _write_atomically(folder, lambda partial: _convert_gguf(gguf, partial))
    return folder


def _convert_gguf(gguf: Path, destination: Path) -> None:
    from .runtime.torch_load import convert_gguf

    convert_gguf(gguf, destination)


def _converted_folder(gguf: Path) -> Path:
    """Where the conversion of `gguf` is cached; a changed or moved file gets a new folder,
    and so does a new transformers version: one version's GGUF converter once named the demo
    target's eos token wrongly, and its cached conversion outlived the upgrade that fixed it."""
    import transformers

    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    short_hash = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{gguf.stem}-{short_hash}"


def _read_gguf_tokenizer(gguf: Path) -> Any:
    try:
        with without_progress_bars():  # transformers draws a bar over the GGUF's tensors
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except READ_ERRORS as error:
        raise ModelLoadError(f"Could not read the tokenizer in the GGUF file {gguf}: {error}") from error


def _write_atomically(destination: Path, write: Callable[[Path], None]) -> None:
    """Let `write` fill a scratch folder, then move it to `destination` in one step.

    A conversion that is killed or fails leaves no half-written `destination` behind, so an
    existing folder is always a complete one.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(destination)
    partial = Path(tempfile.mkdtemp(prefix=f".{destination.name}.partial-", dir=destination.parent))
    try:
        write(partial)
        try:
            os.replace(partial, destination)
        except OSError:
            if not destination.is_dir():
                raise
            # Another process finished the same conversion first: its folder is as good as ours.
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _remove_stale_partials(destination: Path) -> None:
    """Delete scratch folders that killed conversions left behind; they can be gigabytes."""
    now = time.time()
    for leftover in destination.parent.glob(f".{destination.name}.partial-*"):
        # A younger one may belong to a conversion that is still running in another process.
        if now - leftover.stat().st_mtime > STALE_PARTIAL_AGE_S:
            shutil.rmtree(leftover, ignore_errors=True)


# Loading


def _load_tokenizer(folder: Path) -> Any:
    return tokenizer_shelf.tokenizer_for(folder, _read_tokenizer)


def _read_tokenizer(folder: Path) -> Any:
    try:
        return AutoTokenizer.from_pretrained(folder)
    except READ_ERRORS as error:
        raise ModelLoadError(f"Could not read the tokenizer in {folder}: {error}") from error


def _context_length(config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        length = getattr(config, name, None)
        if isinstance(length, int) and length > 0:
            return min(length, MAX_CONTEXT_LENGTH)
    return FALLBACK_CONTEXT_LENGTH


def _ignore_progress(message: str, fraction: float | None) -> None:
    pass
