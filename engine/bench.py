"""`tandem bench`: speed and acceptance of every decoding method on one pair, in one run.

Methods are interleaved per prompt after a warm-up, so drift of the machine (heat, other
processes) hits all of them alike, and every ratio compares numbers taken in the same run.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
import transformers

from .chat_prompt import Message, build_prompt
from .config import APPROXIMATE_METHODS, DEMO_TARGET, HEAD_METHODS, METHODS, ConfigError, DecodeSettings
from .events import Finished
from .quality import rouge_l_f1, target_nll
from .runtime import llamacpp_library
from .runtime.reduced_vocabulary import full_vocabulary_view
from .session import LoadedPair
from .stats import GenerationStats

ENGINE_METHODS = METHODS
# Peers: transformers' assisted generation on the same weights, and llama.cpp's plain
# generation of the same target file (the number a CPU user compares with).
PEER_METHODS = ("hf-assisted", "llamacpp-ar")
ALL_METHODS = ENGINE_METHODS + PEER_METHODS
VECTOR_FLAGS = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8"}
DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "resources" / "prompts" / "chat_prompts.jsonl"


@dataclass
class RunRecord:
    """One method on one prompt."""

    prompt_index: int
    token_ids: tuple[int, ...]
    seconds: float
    stats: GenerationStats | None  # None for peers that do not report acceptance


@dataclass
class MethodResult:
    method: str
    runs: list[RunRecord] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    nll_total: float = 0.0  # the target's NLL of every output token, summed (after timing)
    nll_tokens: int = 0

    def summary(self, reference: MethodResult | None) -> dict:
        tokens = sum(len(run.token_ids) for run in self.runs)
        seconds = sum(run.seconds for run in self.runs)
        with_stats = [run.stats for run in self.runs if run.stats is not None]
        proposed = sum(s.draft_tokens_proposed for s in with_stats)
        accepted = sum(s.draft_tokens_accepted for s in with_stats)
        target_calls = sum(s.target_calls for s in with_stats)
        tokens_from_calls = sum(s.tokens_from_target_calls for s in with_stats)  # stop tokens included
        draft_calls = sum(s.draft_calls for s in with_stats)
        stage_proposed = sum(s.stage_tokens_proposed for s in with_stats)
        stage_accepted = sum(s.stage_tokens_accepted for s in with_stats)
        tree_nodes = sum(s.tree_nodes_verified for s in with_stats)
        tokens_per_s = tokens / seconds if seconds > 0 else 0.0
        summary = {
            "method": self.method,
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens_per_s,
            "speedup_vs_ar": None,
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_accepted_per_target_call": tokens_from_calls / target_calls if with_stats and target_calls else None,
            "target_calls_per_token": target_calls / tokens_from_calls if with_stats and tokens_from_calls else None,
            "draft_calls_per_target_call": draft_calls / target_calls if with_stats and target_calls else None,
            "draft_stage_acceptance": stage_accepted / stage_proposed if stage_proposed else None,
            "tree_nodes_per_target_call": tree_nodes / target_calls if tree_nodes and target_calls else None,
            "acceptance_by_depth": _acceptance_by_position(with_stats),
            "draft_time_s": sum(s.draft_time_s for s in with_stats),
            "target_time_s": sum(s.target_time_s for s in with_stats),
            "exact_match_vs_ar": None,
            # Quality, for approximate methods above all: the target's mean NLL per output
            # token at temperature 1, and ROUGE-L F1 of each output against ar's.
            "exact": self.method not in APPROXIMATE_METHODS,
            "target_nll": self.nll_total / self.nll_tokens if self.nll_tokens else None,
            "rouge_l_vs_ar": None,
            "unchecked_share": sum(s.unchecked_tokens for s in with_stats) / tokens if with_stats and tokens else None,
            "target_calls_skipped": sum(s.target_calls_skipped for s in with_stats) if with_stats else None,
            "peak_rss_mb": self.peak_rss_mb,
            "per_prompt": [
                {
                    "prompt_index": run.prompt_index,
                    "tokens": len(run.token_ids),
                    "seconds": run.seconds,
                    "tokens_per_s": len(run.token_ids) / run.seconds if run.seconds > 0 else 0.0,
                    "acceptance_rate": run.stats.acceptance_rate if run.stats else None,
                }
                for run in self.runs
            ],
        }
        if reference is not None and reference.runs:
            reference_speed = reference.summary(None)["tokens_per_s"]
            summary["speedup_vs_ar"] = tokens_per_s / reference_speed if reference_speed else None
            expected = {run.prompt_index: run.token_ids for run in reference.runs}
            matches = [run.token_ids == expected.get(run.prompt_index) for run in self.runs]
            summary["exact_match_vs_ar"] = sum(matches) / len(matches) if matches else None
            overlaps = [rouge_l_f1(run.token_ids, expected[run.prompt_index]) for run in self.runs if run.prompt_index in expected]
            summary["rouge_l_vs_ar"] = sum(overlaps) / len(overlaps) if overlaps else None
        return summary


def _acceptance_by_position(stats: list[GenerationStats]) -> list[float]:
    """Of the rounds that drafted at least d tokens deep, the share that kept d of them."""
    proposed: list[int] = []
    accepted: list[int] = []
    for one in stats:
        for position, (p, a) in enumerate(zip(one.proposed_by_position, one.accepted_by_position)):
            if position == len(proposed):
                proposed.append(0)
                accepted.append(0)
            proposed[position] += p
            accepted[position] += a
    return [a / p if p else 0.0 for a, p in zip(accepted, proposed)]


def read_prompts(path: Path) -> list[str]:
    prompts = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ConfigError(f"cannot read prompts file {path}: {error.strerror}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            prompts.append(str(json.loads(line)["prompt"]))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ConfigError(f"{path}:{number}: expected a JSON object with a \"prompt\" key") from error
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts


def available_methods(pair: LoadedPair) -> list[str]:
    """Every method this pair can run here: its own, and the peers whose libraries are installed."""
    peers = []
    if _runs_on_torch(pair):
        peers.append("hf-assisted")
    if importlib.util.find_spec("llama_cpp") is not None:
        peers.append("llamacpp-ar")
    return [m for m in ENGINE_METHODS if m in pair.methods] + peers


def parse_methods(text: str, available: tuple[str, ...]) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(available)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ConfigError(f"unknown method {unknown[0]!r}; available: {', '.join(available)}, or all")
    if not names:
        raise ConfigError("no method given")
    return names


def _refusal(pair: LoadedPair, method: str) -> str:
    """Why the bench cannot run `method` on `pair`, with what the pair offers instead."""
    message = f"the pair {pair.config.name!r} cannot run {method!r}; it offers {', '.join(pair.methods)}"
    if method in HEAD_METHODS and pair.draft is not None:
        # The one refusal a command fixes. A heads problem already says to calibrate again.
        why = pair.heads_problem or f"its draft has no calibrated heads; run tandem calibrate --pair {pair.config.name}"
        message += f" ({why.rstrip('.')})"
    return message


class Bench:
    def __init__(self, pair: LoadedPair, settings: DecodeSettings):
        self.pair = pair
        self.settings = settings

    def run(self, prompts: list[str], methods: list[str], progress: Callable[[str], None] = print) -> dict:
        unsupported = [m for m in methods if m in ENGINE_METHODS and m not in self.pair.methods]
        if unsupported:
            raise ConfigError(_refusal(self.pair, unsupported[0]))
        runners = {method: self._runner(method) for method in methods}
        progress("warming up…")
        for method in methods:
            runners[method](prompts[0], max_new_tokens=8)
        results = {method: MethodResult(method) for method in methods}
        for index, prompt in enumerate(prompts):
            # Rotate the order per prompt: no method always runs first (or right after another).
            order = methods[index % len(methods) :] + methods[: index % len(methods)]
            for method in order:
                with _peak_rss() as peak:
                    token_ids, seconds, stats = runners[method](prompt, self.settings.max_new_tokens)
                results[method].runs.append(RunRecord(index, token_ids, seconds, stats))
                results[method].peak_rss_mb = max(results[method].peak_rss_mb, peak())
                progress(f"prompt {index + 1}/{len(prompts)} {method:>12}: {len(token_ids) / seconds:6.1f} tok/s")
        progress("scoring every output with the target…")
        self._score_with_target(prompts, results)
        reference = results.get("ar")
        learnt_shapes = {} if self.settings.fixed_tree_shape else self.pair.auto_tree_shapes
        return {
            "machine": machine_description(self.pair),
            "pair": self.pair.describe(),
            "settings": self.settings.to_dict() | {"prompts": len(prompts)},
            "results": [results[method].summary(reference) for method in methods],
            "tree_shapes": {method: learnt_shapes[method].describe() for method in methods if method in learnt_shapes},
        }

    def _score_with_target(self, prompts: list[str], results: dict[str, MethodResult]) -> None:
        """One target forward per output, after all timing: the target's NLL of it."""
        pair = self.pair
        for result in results.values():
            for run in result.runs:
                prompt_ids = build_prompt(pair.tokenizer, [Message("user", prompts[run.prompt_index])], None, pair.context_length).token_ids
                total, count = target_nll(pair.target_runner, prompt_ids, run.token_ids)
                result.nll_total += total
                result.nll_tokens += count
        pair.reset_caches()

    def _runner(self, method: str) -> Callable[..., tuple[tuple[int, ...], float, GenerationStats | None]]:
        if method in ENGINE_METHODS:
            return lambda prompt, max_new_tokens: self._run_engine(method, prompt, max_new_tokens)
        if method == "llamacpp-ar":
            return LlamaCppRunner(self.pair, self.settings)
        if not _runs_on_torch(self.pair):
            raise ConfigError("hf-assisted runs transformers on the pair's weights: add --runtime torch")
        assistant = _hf_assistant(self.pair)  # once: a reduced draft's view is a new class
        return lambda prompt, max_new_tokens: self._run_hf_assisted(prompt, max_new_tokens, assistant)

    def _run_engine(self, method: str, prompt: str, max_new_tokens: int):
        self.pair.reset_caches()  # no method may reuse another's prefill of the same prompt
        settings = self.settings.with_changes(method=method, max_new_tokens=max_new_tokens, stats_every_s=1e9)
        started = time.perf_counter()
        finished = None
        for event in self.pair.generate([Message("user", prompt)], settings):
            if isinstance(event, Finished):
                finished = event
        seconds = time.perf_counter() - started
        return finished.token_ids, seconds, finished.stats

    def _run_hf_assisted(self, prompt: str, max_new_tokens: int, assistant: torch.nn.Module | None):
        """The peer: transformers' own generate() on the same target weights, with the same
        kind of drafter (its prompt-lookup for the n-gram pair, the draft model otherwise)."""
        pair, settings = self.pair, self.settings
        prompt_ids = build_prompt(pair.tokenizer, [Message("user", prompt)], None, pair.context_length).token_ids
        input_ids = torch.tensor([prompt_ids], device=pair.target.device)
        options: dict = {"max_new_tokens": max_new_tokens, "eos_token_id": sorted(pair.stop_token_ids)}
        options["pad_token_id"] = options["eos_token_id"][0]
        if assistant is not None:
            options["assistant_model"] = assistant
        else:
            options["prompt_lookup_num_tokens"] = settings.draft_tokens
        if settings.greedy:
            options["do_sample"] = False
        else:
            options.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or None)
        started = time.perf_counter()
        with torch.inference_mode():
            output = pair.target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **options)
        seconds = time.perf_counter() - started
        new_tokens = output[0, len(prompt_ids) :].tolist()
        # The engine does not emit the stop token; count and compare the same way.
        for index, token in enumerate(new_tokens):
            if token in pair.stop_token_ids:
                new_tokens = new_tokens[:index]
                break
        return tuple(new_tokens), seconds, None


def _hf_assistant(pair: LoadedPair) -> torch.nn.Module | None:
    """The draft as transformers' assisted generation needs it: on the target's vocabulary."""
    if pair.draft is None:
        return None
    draft, vocabulary = pair.draft.model, pair.draft.vocabulary
    return draft if vocabulary is None else full_vocabulary_view(draft, vocabulary)


class LlamaCppRunner:
    """llama-cpp-python's plain generation (`Llama.create_chat_completion`) of the target's
    GGUF file, with the same prompts and token budget; greedy, or sampled alike."""

    def __init__(self, pair: LoadedPair, settings: DecodeSettings):
        try:
            from llama_cpp import Llama
        except ImportError as error:
            raise ConfigError(
                "llamacpp-ar needs llama-cpp-python: pip install llama-cpp-python (it compiles, ~5 minutes)"
            ) from error
        gguf = _target_gguf(pair)
        if gguf is None:
            raise ConfigError("llamacpp-ar needs a target given as a .gguf file (the demo target is one)")
        self.settings = settings
        with _without_amx_repacking():
            self.llm = Llama(
                model_path=str(gguf), n_ctx=pair.context_length, n_threads=torch.get_num_threads(),
                n_gpu_layers=pair.target.gpu_layers,  # on the GPU exactly when Tandem's target is
                seed=settings.seed or 0, verbose=False,
            )

    def __call__(self, prompt: str, max_new_tokens: int):
        settings = self.settings
        sampling = {"temperature": 0.0, "top_k": 1} if settings.greedy else {
            "temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k,
        }
        self.llm.reset()  # no reuse of another run's prefill
        started = time.perf_counter()
        reply = self.llm.create_chat_completion(
            messages=[{"role": "user", "content": prompt}], max_tokens=max_new_tokens, **sampling
        )
        seconds = time.perf_counter() - started
        text = reply["choices"][0]["message"]["content"] or ""
        token_ids = tuple(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))
        return token_ids, seconds, None


@contextmanager
def _without_amx_repacking() -> Iterator[None]:
    """On CPUs with AMX, llama.cpp repacks weights for its AMX kernels, and its first decode
    segfaults there (seen with llama-cpp-python 0.3.36 on the development Xeon; upstream
    ggml-org/llama.cpp#20824). Load with the plain CPU buffers on such CPUs."""
    import llama_cpp.llama as llama_module

    if "amx_int8" not in _cpu_flags():
        yield
        return
    default_params = llama_module.llama_cpp.llama_model_default_params

    def plain_buffers():
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_module.llama_cpp.llama_model_default_params = plain_buffers
    try:
        yield
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _runs_on_torch(pair: LoadedPair) -> bool:
    return pair.target.model is not None and (pair.draft is None or pair.draft.model is not None)


def _target_gguf(pair: LoadedPair) -> Path | None:
    from .models import demo_gguf_path

    source = pair.config.target.source
    if source == DEMO_TARGET:
        return demo_gguf_path()
    return Path(source) if source.endswith(".gguf") else None


@contextmanager
def _peak_rss(interval_s: float = 0.05) -> Iterator[Callable[[], float]]:
    """Sample this process's resident memory in the background; yields a reader of the peak."""
    process = psutil.Process()
    peak = [process.memory_info().rss]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(interval_s):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak[0] / 2**20
    finally:
        done.set()
        sampler.join()
        peak[0] = max(peak[0], process.memory_info().rss)


def machine_description(pair: LoadedPair) -> dict:
    device = pair.target.device
    description = {
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # What the kernels can use: one model name ("AMD EPYC", "Intel Xeon") covers very
        # different vector units, and bf16's speed depends on them.
        "cpu_vector_flags": sorted(_cpu_flags() & VECTOR_FLAGS),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp_python": llamacpp_library.version() if llamacpp_library.available() else None,
        "device": str(device),
    }
    if device.type == "cuda":
        description["gpu"] = torch.cuda.get_device_name(device)
    return description


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def format_table(report: dict) -> str:
    header = (
        f"{'method':<12} {'tok/s':>7} {'vs ar':>6} {'accept':>7} {'tok/call':>8} {'calls/tok':>9} "
        f"{'drafts/call':>11} {'stage acc':>9} {'exact':>6} {'nll':>6} {'rougeL':>6} {'peak MB':>8}"
    )
    lines = [header, "-" * len(header)]

    def show(value, pattern: str) -> str:
        return pattern.format(value) if value is not None else "—"

    for row in report["results"]:
        lines.append(
            f"{row['method']:<12} {row['tokens_per_s']:>7.1f} {show(row['speedup_vs_ar'], '{:.2f}x'):>6} "
            f"{show(row['acceptance_rate'], '{:.3f}'):>7} {show(row['mean_accepted_per_target_call'], '{:.2f}'):>8} "
            f"{show(row['target_calls_per_token'], '{:.3f}'):>9} {show(row['draft_calls_per_target_call'], '{:.2f}'):>11} "
            f"{show(row['draft_stage_acceptance'], '{:.3f}'):>9} {show(row['exact_match_vs_ar'], '{:.2f}'):>6} "
            f"{show(row.get('target_nll'), '{:.3f}'):>6} {show(row.get('rouge_l_vs_ar'), '{:.3f}'):>6} {row['peak_rss_mb']:>8.0f}"
            + _approximate_note(row)
        )
    for method, shape in report.get("tree_shapes", {}).items():
        costs = ", ".join(f"{size}: {ms:.0f}" for size, ms in shape["verify_ms_by_tokens"].items())
        reach = ", ".join(f"{share:.2f}" for share in shape["reach_by_depth"])
        draft_ms = f"{shape['draft_call_ms']:.1f}" if shape["draft_call_ms"] else "—"
        lines.append(f"{method} (auto shape): verify ms by tokens {{{costs}}}; draft call {draft_ms} ms; reach by depth [{reach}]")
    return "\n".join(lines)


def _approximate_note(row: dict) -> str:
    """Marks a row whose method lets tokens out unchecked, and how many it did: its speed is
    not comparable with the exact rows' without its nll and rougeL."""
    if row.get("exact") is not False:
        return ""
    share = row.get("unchecked_share")
    return "  APPROXIMATE" + (f", {share:.0%} unchecked" if share is not None else "")
