"""Finding the models other apps keep on this machine, each app's layout read as it writes it.

`discover()` walks the folders `locations.model_roots()` names, plus folders the user added,
and describes every model it finds from headers alone (`found.py`): a scan reads a few
kilobytes to a few megabytes per model and copies nothing. A GGUF file already described is
not read again while its size and modification time stay the same.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from .found import (
    FoundHead,
    FoundModel,
    describe_folder,
    describe_gguf,
    describe_head,
    is_eagle3_head,
    is_vision_projector,
    read_config,
)
from .locations import GPT4ALL, HUGGING_FACE, JAN, LM_STUDIO, OLLAMA, USER_FOLDER, ModelRoot, model_roots

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_LIBRARY = ("registry.ollama.ai", "library")
# llama.cpp's split files: name-00001-of-00003.gguf. The first part holds the metadata.
SPLIT_PART = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# How deep to look inside a folder of models: publisher/repo/file is 3 levels.
MAX_DEPTH = 4

_described: dict[tuple[str, int, int], FoundModel] = {}  # (path, size, mtime) -> its description


@dataclass(frozen=True)
class Found:
    models: tuple[FoundModel, ...]  # usable ones and those with a problem, in the order found
    heads: tuple[FoundHead, ...]  # EAGLE-3 heads
    searched: tuple[ModelRoot, ...]  # the folders that were there to search

    @property
    def usable(self) -> tuple[FoundModel, ...]:
        return tuple(model for model in self.models if model.usable)

    def model(self, source: str) -> FoundModel | None:
        return next((model for model in self.models if model.source == source), None)


def discover(
    folders: Iterable[str | Path] = (), home: Path | None = None, environ: Mapping[str, str] | None = None
) -> Found:
    """Every model in the usual places and in `folders`; see locations.py for `home` and `environ`."""
    roots = [root for root in model_roots(home, environ) if root.folder.is_dir()]
    roots += [ModelRoot(USER_FOLDER, Path(folder).expanduser()) for folder in folders if Path(folder).expanduser().is_dir()]
    models: dict[str, FoundModel] = {}
    heads: dict[str, FoundHead] = {}
    for root in roots:
        for found in FINDERS[root.app](root.folder):
            shelf = heads if isinstance(found, FoundHead) else models
            shelf.setdefault(found.source, found)  # a file in two searched folders is listed once
    return Found(tuple(models.values()), tuple(heads.values()), tuple(roots))


# Each app's layout


def find_in_lm_studio(root: Path) -> Iterator[FoundModel]:
    """publisher/repo/file.gguf, named publisher/repo/file as LM Studio shows it."""
    for path in _gguf_files(root):
        yield _described_gguf(path, path.relative_to(root).with_suffix("").as_posix(), LM_STUDIO)


def find_in_ollama(root: Path) -> Iterator[FoundModel]:
    """manifests/HOST/NAMESPACE/NAME/TAG: JSON whose model layer names a blob by its digest."""
    manifests = root / "manifests"
    for manifest in sorted(path for path in manifests.glob("*/*/*/*") if path.is_file()):
        host, namespace, name, tag = manifest.relative_to(manifests).parts
        if (host, namespace) == OLLAMA_LIBRARY:
            shown = f"{name}:{tag}"
        elif host == OLLAMA_LIBRARY[0]:
            shown = f"{namespace}/{name}:{tag}"
        else:
            shown = f"{host}/{namespace}/{name}:{tag}"
        yield _ollama_model(root, manifest, shown)


def _ollama_model(root: Path, manifest: Path, name: str) -> FoundModel:
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
        return FoundModel(str(manifest), name, OLLAMA, problem=f"Ollama's manifest {manifest} names no model file Tandem can read.")
    blob_name = str(digest).replace(":", "-", 1)  # sha256:<hex> is stored as blobs/sha256-<hex>
    blob = next((path for path in (root / "blobs" / blob_name, root / "blobs" / str(digest)) if path.is_file()), None)
    if blob is None:
        return FoundModel(
            str(root / "blobs" / blob_name), name, OLLAMA,
            problem=f"Ollama lists {name}, but its model file {blob_name} is not in {root / 'blobs'}: "
            f"it was removed or never finished downloading (`ollama pull {name}` fetches it again).",
        )
    return _described_gguf(blob, name, OLLAMA)


def find_in_hub_cache(root: Path) -> Iterator[FoundModel | FoundHead]:
    """models--ORG--NAME/snapshots/<revision>/: the revision `refs/main` names, else the newest.
    A snapshot holds a model folder (config.json, safetensors), GGUF files, or an EAGLE-3 head."""
    for repo in sorted(root.glob("models--*")):
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        snapshot = _hub_snapshot(repo)
        if snapshot is None:
            continue
        for path in _gguf_files(snapshot, max_depth=2):
            yield _described_gguf(path, f"{repo_id}/{path.relative_to(snapshot).with_suffix('').as_posix()}", HUGGING_FACE)
        yield from _model_folder(snapshot, repo_id, HUGGING_FACE)


def _hub_snapshot(repo: Path) -> Path | None:
    try:
        revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        revision = ""
    if revision and (repo / "snapshots" / revision).is_dir():
        return repo / "snapshots" / revision
    snapshots = [path for path in (repo / "snapshots").glob("*") if path.is_dir()]
    return max(snapshots, key=lambda path: path.stat().st_mtime, default=None)


def find_in_gpt4all(root: Path) -> Iterator[FoundModel]:
    """One flat folder of .gguf files."""
    for path in _gguf_files(root, max_depth=1):
        yield _described_gguf(path, path.stem, GPT4ALL)


def find_in_jan(root: Path) -> Iterator[FoundModel]:
    """models/<id>/<file>.gguf (Jan 0.5 adds an engine folder: models/llamacpp/<id>/model.gguf)."""
    for path in _gguf_files(root):
        yield _described_gguf(path, path.parent.name if path.stem == "model" else path.stem, JAN)


def find_in_folder(root: Path) -> Iterator[FoundModel | FoundHead]:
    """A folder the user added: GGUF files and model folders anywhere up to MAX_DEPTH down."""
    for path in _gguf_files(root):
        yield _described_gguf(path, path.relative_to(root).with_suffix("").as_posix(), USER_FOLDER)
    for config in sorted(_walk(root, "config.json", MAX_DEPTH)):
        folder = config.parent
        yield from _model_folder(folder, root.name if folder == root else folder.relative_to(root).as_posix(), USER_FOLDER)


FINDERS = {
    LM_STUDIO: find_in_lm_studio, OLLAMA: find_in_ollama, HUGGING_FACE: find_in_hub_cache,
    GPT4ALL: find_in_gpt4all, JAN: find_in_jan, USER_FOLDER: find_in_folder,
}


# Shared steps


def _model_folder(folder: Path, name: str, app: str) -> Iterator[FoundModel | FoundHead]:
    config = read_config(folder)
    if config is None:
        return
    if is_eagle3_head(config):
        yield describe_head(folder, config, name, app)
    elif any(folder.glob("*.safetensors")):  # a GGUF repo's config.json alone is no model folder
        yield describe_folder(folder, config, name, app)


def _gguf_files(root: Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """The .gguf model files under `root`: no vision projectors, and of a split model its first part."""
    found = []
    for path in sorted(_walk(root, "*.gguf", max_depth)):
        split = SPLIT_PART.match(path.name)
        if is_vision_projector(path) or (split and int(split["part"]) != 1):
            continue
        found.append(path)
    return found


def _walk(root: Path, pattern: str, max_depth: int) -> Iterator[Path]:
    for depth in range(1, max_depth + 1):
        yield from root.glob("/".join(["*"] * (depth - 1) + [pattern]))


def _described_gguf(path: Path, name: str, app: str) -> FoundModel:
    """describe_gguf, once per version of the file; a split model's parts must all be there."""
    try:
        stat = path.stat()
    except OSError:
        return describe_gguf(path, name, app)
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _described:
        _described[key] = describe_gguf(path, name, app)
    model = replace(_described[key], name=name, app=app)
    split = SPLIT_PART.match(path.name)
    if split and model.usable:
        model = _whole_split(path, split, model)
    return model


def _whole_split(first: Path, split: re.Match, model: FoundModel) -> FoundModel:
    count = int(split["count"])
    parts = [first.with_name(f"{split['stem']}-{part:05d}-of-{count:05d}.gguf") for part in range(1, count + 1)]
    missing = [part for part in parts if not part.is_file()]
    if missing:
        return replace(model, problem=f"{missing[0].name} is missing: a model split in {count} files needs all of them.")
    # The first part's tensors are only part of the model; its size on disk says more.
    return replace(model, parameters=None, file_bytes=sum(part.stat().st_size for part in parts))
