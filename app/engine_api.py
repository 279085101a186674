"""What the app asks of the engine, in one place, so tests can hand the worker a fake.

Every method here runs on the engine worker thread. The engine's modules (and torch) are
imported on first use there, so the window opens before the heavy imports finish.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

from engine.config import ModelSpec, PairConfig
from engine.errors import ModelLoadError

Progress = Callable[[str, "float | None"], None]
CalibrationProgress = Callable[[str, int, int], None]  # phase ("replies" | "training"), done, total


class EngineApi(Protocol):
    def load_pair(self, config: PairConfig, progress: Progress) -> Any:
        """A LoadedPair (engine/session.py)."""

    def draft_incompatibility(self, target: ModelSpec, draft: ModelSpec) -> str | None:
        """Why `draft` cannot draft for `target`, or None when it can."""

    def download_model(self, repo_id: str, progress: Progress) -> str:
        """Fetch a Hugging Face repo for offline use; return the model source to save."""

    def calibrate(self, pair: Any, progress: CalibrationProgress, should_stop: Callable[[], bool]) -> dict | None:
        """Train `pair`'s SPRINTER and SpecDec++ heads, save them and attach them to it;
        return their card, or None when `should_stop` ended it (nothing changed)."""


class LocalEngine:
    """The real engine. `calibration` (an engine.tools.calibrate.calibrate.CalibrationSettings) replaces
    the default calibration, e.g. a smaller one for the screenshots."""

    def __init__(self, calibration: Any = None) -> None:
        self._tokenizers: dict[str, Any] = {}  # by model source: reading one can take seconds
        self._calibration = calibration

    def load_pair(self, config: PairConfig, progress: Progress) -> Any:
        if "engine.session" not in sys.modules:  # the first load imports torch and transformers first
            progress("Starting the engine…", None)
        from engine.session import load_pair

        return load_pair(config, progress)

    def draft_incompatibility(self, target: ModelSpec, draft: ModelSpec) -> str | None:
        from engine.compat import compatibility_reason

        return compatibility_reason(self._tokenizer(target), self._tokenizer(draft))

    def _tokenizer(self, spec: ModelSpec) -> Any:
        from engine.models import load_tokenizer_only

        if spec.source not in self._tokenizers:
            self._tokenizers[spec.source] = load_tokenizer_only(spec)
        return self._tokenizers[spec.source]

    def calibrate(self, pair: Any, progress: CalibrationProgress, should_stop: Callable[[], bool]) -> dict | None:
        from engine.tools.calibrate.calibrate import CalibrationCancelled, CalibrationSettings, calibrate

        try:
            return calibrate(pair, self._calibration or CalibrationSettings(), progress, should_stop).card
        except CalibrationCancelled:
            return None

    def download_model(self, repo_id: str, progress: Progress) -> str:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

        from engine.models import HUB_FILE_PATTERNS, REPO_ID

        if not REPO_ID.match(repo_id):
            raise ModelLoadError(f"'{repo_id}' is not a Hugging Face repo id (it looks like owner/name).")
        progress(f"Connecting to Hugging Face for {repo_id}…", None)
        try:
            # The same files and cache the engine uses, so loading the repo id later finds them offline.
            snapshot_download(repo_id, allow_patterns=HUB_FILE_PATTERNS, tqdm_class=_progress_bar_class(repo_id, progress))
        except GatedRepoError as error:
            raise ModelLoadError(f"{repo_id} is gated: accept its licence on huggingface.co and log in first.") from error
        except RepositoryNotFoundError as error:
            raise ModelLoadError(f"There is no public model named {repo_id} on Hugging Face.") from error
        except LocalEntryNotFoundError as error:  # what the hub raises when the network fails
            raise ModelLoadError(_offline_message(repo_id)) from error
        except Exception as error:  # "no connection" also surfaces as OSError or httpx errors, with no common base
            if isinstance(error, OSError) or _looks_offline(error):
                raise ModelLoadError(_offline_message(repo_id)) from error
            raise
        return repo_id


def _offline_message(repo_id: str) -> str:
    return (
        f"Could not download {repo_id}: Hugging Face cannot be reached, so this machine seems to be offline. "
        "Download the model on a connected machine and add its folder or GGUF file instead."
    )


def _looks_offline(error: Exception) -> bool:
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError", "OfflineModeIsEnabled"})


def _progress_bar_class(repo_id: str, progress: Progress) -> type:
    """A tqdm that reports the hub's byte counter to `progress` instead of a terminal."""
    from tqdm.auto import tqdm

    class ReportingBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False
            kwargs["file"] = _Discard()
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self.unit == "B" and self.total:
                progress(f"Downloading {repo_id}: {self.n / 2**20:.0f} of {self.total / 2**20:.0f} MB", self.n / self.total)
            return shown

    return ReportingBar


class _Discard:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass
