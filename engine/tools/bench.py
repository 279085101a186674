"""`tandem bench`: speed and acceptance of every decoding method on one pair, in one run.

Methods are interleaved per prompt after a warm-up, so drift of the machine (heat, other
processes) hits all of them alike, and every ratio compares numbers taken in the same run.
"""
from __future__ import annotations

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

from ..chat_prompt import Message, build_prompt
from .. import methods
from ..config import DEMO_TARGET, ConfigError, DecodeSettings
from ..events import Finished
from .quality import rouge_l_f1, target_nll
from ..runtime import int8_kernel, llamacpp_library
from ..runtime.cpu import cpu_flags, cpu_name
from ..runtime.device import device_name
from ..runtime.peers import AssistedGeneration, LlamaCppGeneration
from ..session import LoadedPair, method_refusal
from ..stats import GenerationStats
from .costs import CostTable, drafter_of
from . import llama_server

ENGINE_METHODS = methods.NAMES
# Peers: transformers' assisted generation on the same weights, and llama.cpp's plain
# generation of the same target file (the number a CPU user compares with).
PEER_METHODS = tuple(methods.BENCH_PEERS)
ALL_METHODS = ENGINE_METHODS + PEER_METHODS
VECTOR_FLAGS = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8"}


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

    def summary(self, reference: MethodResult | None, cost_table: CostTable | None = None) -> dict:
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
            # (a llama-server row reports no target calls: unknown, not none)
            "target_calls_per_token": target_calls / tokens_from_calls if target_calls and tokens_from_calls else None,
            "draft_calls_per_target_call": draft_calls / target_calls if with_stats and target_calls else None,
            "draft_stage_acceptance": stage_accepted / stage_proposed if stage_proposed else None,
            "tree_nodes_per_target_call": tree_nodes / target_calls if tree_nodes and target_calls else None,
            "acceptance_by_depth": _acceptance_by_position(with_stats),
            "draft_time_s": sum(s.draft_time_s for s in with_stats),
            "target_time_s": sum(s.target_time_s for s in with_stats),
            "exact_match_vs_ar": None,
            # Quality, for approximate methods above all: the target's mean NLL per output
            # token at temperature 1, and ROUGE-L F1 of each output against ar's.
            "exact": methods.is_exact(self.method),
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
        if cost_table is not None and len(with_stats) == len(self.runs) and self.runs:
            predicted = sum(cost_table.reply_seconds(stats, drafter_of(self.method)) for stats in with_stats)
            summary["predicted_tokens_per_s"] = tokens / predicted if predicted > 0 else None
        if reference is not None and reference.runs:
            reference_speed = reference.summary(None)["tokens_per_s"]
            if cost_table is not None and summary.get("predicted_tokens_per_s"):
                reference_predicted = reference.summary(None, cost_table).get("predicted_tokens_per_s")
                summary["predicted_speedup_vs_ar"] = summary["predicted_tokens_per_s"] / reference_predicted if reference_predicted else None
            summary["speedup_vs_ar"] = tokens_per_s / reference_speed if reference_speed else None
            expected = {run.prompt_index: run.token_ids for run in reference.runs}
            matches = [run.token_ids == expected.get(run.prompt_index) for run in self.runs]
            summary["exact_match_vs_ar"] = sum(matches) / len(matches) if matches else None
            overlaps = [rouge_l_f1(run.token_ids, expected[run.prompt_index]) for run in self.runs if run.prompt_index in expected]
            summary["rouge_l_vs_ar"] = sum(overlaps) / len(overlaps) if overlaps else None
        return summary


def by_kind(results: dict[str, MethodResult], methods: list[str], kinds: list[str]) -> dict[str, dict[str, dict]]:
    """Per kind of task, per method: tok/s over that kind's prompts, and against ar's on the
    same prompts in this run."""
    report: dict[str, dict[str, dict]] = {}
    for kind in dict.fromkeys(kinds):
        speeds = {}
        for method in methods:
            runs = [run for run in results[method].runs if kinds[run.prompt_index] == kind]
            seconds = sum(run.seconds for run in runs)
            speeds[method] = sum(len(run.token_ids) for run in runs) / seconds if seconds > 0 else 0.0
        plain = speeds.get("ar")
        report[kind] = {method: {"tokens_per_s": speed, "speedup_vs_ar": speed / plain if plain else None}
                        for method, speed in speeds.items()}
    return report


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


# A name `--methods` takes beside the methods: the one the app would use for the pair.
DEFAULT_ALIAS = "default"


def available_methods(pair: LoadedPair, server: ServerPeer | None = None) -> list[str]:
    """Every method this pair can run here: its own, and the peers whose libraries or
    programs are installed."""
    peers = []
    if AssistedGeneration.can_run(pair.target, pair.draft):
        peers.append("hf-assisted")
    if llamacpp_library.available():
        peers.append("llamacpp-ar")
        given, runs = _target_gguf(pair), pair.target.gguf_file
        if runs is not None and (given is None or runs.resolve() != given.resolve()):
            peers.append("llamacpp-ar-same")  # only where Tandem runs another file than the one given
    if server is not None:
        peers += llama_server.offered(server.binary, server.target_gguf or _target_gguf(pair), server.draft_gguf)
    return [m for m in ENGINE_METHODS if m in pair.methods] + peers


def resolve_default(names: list[str], pair: LoadedPair) -> list[str]:
    """`names` with `default` replaced by the method the app and `tandem chat` decode `pair`
    with (each method once)."""
    default = methods.default_method(pair.methods)
    return list(dict.fromkeys(default if name == DEFAULT_ALIAS else name for name in names))


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


@dataclass(frozen=True)
class ServerPeer:
    """Where llama.cpp's own llama-server is, the draft GGUF its speculative row drafts with, and
    the target GGUF it runs where Tandem's target is a folder (the same weights, converted)."""

    binary: Path | None
    draft_gguf: Path | None = None
    target_gguf: Path | None = None


class Bench:
    def __init__(self, pair: LoadedPair, settings: DecodeSettings, cost_table: CostTable | None = None,
                 server: ServerPeer | None = None):
        self.pair = pair
        self.settings = settings
        self.cost_table = cost_table  # another device's costs, to predict each method's speed there
        self.server = server or ServerPeer(llama_server.find_binary())
        self._servers: list[llama_server.LlamaServer] = []  # the llama-server rows' processes, closed after the runs

    def run(self, prompts: list[str], methods: list[str], progress: Callable[[str], None] = print,
            kinds: list[str] | None = None) -> dict:
        """Every method on every prompt; `kinds`: each prompt's kind of task, to report by."""
        results = self.replies(prompts, methods, progress)
        if not self.settings.synthetic_acceptance:  # synthetic replies are not text worth scoring
            progress("scoring every output with the target…")
            self._score_with_target(prompts, results)
        reference = results.get("ar")
        learnt_shapes = {} if self.settings.fixed_tree_shape else self.pair.auto_tree_shapes
        return {
            "machine": machine_description(self.pair),
            "pair": self.pair.describe(),
            "settings": self.settings.to_dict() | {"prompts": len(prompts)},
            "results": [results[method].summary(reference, self.cost_table) for method in methods],
            "cost_table": self.cost_table.to_dict() if self.cost_table else None,
            "tree_shapes": {method: learnt_shapes[method].describe() for method in methods if method in learnt_shapes},
            "synthetic_acceptance": list(self.settings.synthetic_acceptance) or None,
            "by_kind": by_kind(results, methods, kinds) if kinds and any(kinds) else None,
        }

    def replies(self, prompts: list[str], methods: list[str], progress: Callable[[str], None] = print) -> dict[str, MethodResult]:
        """Every method's timed reply to every prompt, methods interleaved, after a warm-up."""
        unsupported = [m for m in methods if m in ENGINE_METHODS and m not in self.pair.methods]
        if unsupported:
            raise ConfigError(f"{method_refusal(self.pair, unsupported[0])} It offers {', '.join(self.pair.methods)}.")
        try:
            return self._timed_replies(prompts, methods, progress)
        finally:
            for server in self._servers:
                server.close()
            self._servers.clear()

    def _timed_replies(self, prompts: list[str], methods: list[str], progress: Callable[[str], None]) -> dict[str, MethodResult]:
        runners = {method: self._runner(method) for method in methods}
        progress("warming up…")
        for method in methods:
            runners[method](prompts[0], max_new_tokens=8)
        results = {method: MethodResult(method) for method in methods}
        name_width = max(len(method) for method in methods)
        for index, prompt in enumerate(prompts):
            # Rotate the order per prompt: no method always runs first (or right after another).
            order = methods[index % len(methods) :] + methods[: index % len(methods)]
            for method in order:
                with _peak_rss() as peak:
                    token_ids, seconds, stats = runners[method](prompt, self.settings.max_new_tokens)
                results[method].runs.append(RunRecord(index, token_ids, seconds, stats))
                results[method].peak_rss_mb = max(results[method].peak_rss_mb, peak())
                progress(f"prompt {index + 1}/{len(prompts)} {method:>{name_width}}: {len(token_ids) / seconds:6.1f} tok/s")
        return results

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
        if method in llama_server.METHODS:
            return self._server_runner(method)
        pair, settings = self.pair, self.settings
        if method in ("llamacpp-ar", "llamacpp-ar-same"):
            gguf = _target_gguf(pair) if method == "llamacpp-ar" else pair.target.gguf_file
            if gguf is None:
                raise ConfigError(f"{method} needs a target that runs from a .gguf file (the demo target does)")
            # -same runs what Tandem's runtime runs, attention included (its verifying
            # attention, llamacpp.verifying_attention); llamacpp-ar keeps the library's defaults.
            same = method == "llamacpp-ar-same"
            peer = LlamaCppGeneration(gguf, pair.context_length, torch.get_num_threads(), pair.target.gpu_layers, settings, same)
        else:
            peer = AssistedGeneration(pair.target, pair.draft, pair.stop_token_ids, settings)

        def run(prompt: str, max_new_tokens: int):
            prompt_ids = build_prompt(pair.tokenizer, [Message("user", prompt)], None, pair.context_length).token_ids
            started = time.perf_counter()
            token_ids = peer(prompt, prompt_ids, max_new_tokens)
            return token_ids, time.perf_counter() - started, None

        return run

    def _server_runner(self, method: str) -> Callable[..., tuple[tuple[int, ...], float, GenerationStats | None]]:
        pair, binary, target_gguf = self.pair, self.server.binary, self.server.target_gguf or _target_gguf(self.pair)
        if binary is None:
            raise ConfigError(f"{method} needs llama.cpp's llama-server: give --llama-server PATH or set ${llama_server.ENVIRONMENT_VARIABLE}")
        if target_gguf is None:
            raise ConfigError(f"{method} needs a target GGUF: a target that runs from one, or --llama-server-target")
        arguments = llama_server.server_arguments(method, target_gguf, self.server.draft_gguf, pair.context_length,
                                                  torch.get_num_threads(), self.settings)
        server = llama_server.LlamaServer(binary, arguments)
        self._servers.append(server)

        def run(prompt: str, max_new_tokens: int):
            prompt_ids = build_prompt(pair.tokenizer, [Message("user", prompt)], None, pair.context_length).token_ids
            reply = server.complete(method, prompt_ids, max_new_tokens, self.settings)
            return reply.token_ids, reply.seconds, reply.stats

        return run

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

def _target_gguf(pair: LoadedPair) -> Path | None:
    from ..demo_model import demo_gguf_path

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
        "processor": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # What the kernels can use: one model name ("AMD EPYC", "Intel Xeon") covers very
        # different vector units, and bf16's speed depends on them.
        "cpu_vector_flags": sorted(cpu_flags() & VECTOR_FLAGS),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp_python": llamacpp_library.version() if llamacpp_library.available() else None,
        "device": str(device),
    }
    if device_name(device):
        description["gpu"] = device_name(device)
    elif pair.target.gpu_layers:  # llama.cpp's GPU: torch's first, or unnamed where torch has no CUDA
        description["gpu"] = device_name(torch.device("cuda", 0)) if torch.cuda.is_available() else "llama.cpp's GPU"
    elif pair.target.model is not None:  # a torch target on the CPU: which int8 products it runs
        description["int8_kernel"] = int8_kernel.variant_name() or f"none, oneDNN's _int_mm ({int8_kernel.unavailable_reason()})"
        if int8_kernel.use_amx():
            description["int8_kernel"] += ", AMX for 2+ tokens"
    return description


LEGEND = """tok/s: reply tokens per second (prompt reading included); vs ar: against plain decoding in this run.
accept: share of drafted tokens the target kept; tok/call: tokens per target call (τ; ar is 1.00);
calls/tok: target calls per token; drafts/call: drafter calls per target call; stage acc: the draft's
agreement with the n-gram stage (staged); exact: share of replies identical to ar's (greedy);
nll: the target's mean negative log-likelihood of the reply (lower: closer to what it would write);
rougeL: overlap with ar's reply (1 = same text); peak MB: the process's resident memory.
by position: of the rounds that drafted d tokens deep, the share that kept the d-th."""


def format_table(report: dict) -> str:
    table = report.get("cost_table")
    predicted = f"pred {table['device'][:14]}" if table else ""
    name_width = max([12] + [len(row["method"]) for row in report["results"]])
    header = (
        f"{'method':<{name_width}} {'tok/s':>7} {'vs ar':>6} {'accept':>7} {'tok/call':>8} {'calls/tok':>9} "
        f"{'drafts/call':>11} {'stage acc':>9} {'exact':>6} {'nll':>6} {'rougeL':>6} {'peak MB':>8}"
        + (f" {predicted:>22}" if table else "")
    )
    plan = report.get("pair", {}).get("forward_plan")  # the target's, on torch
    lines = ([f"target forward plan: {plan}", ""] if plan else []) + [header, "-" * len(header)]

    def show(value, pattern: str) -> str:
        return pattern.format(value) if value is not None else "—"

    for row in report["results"]:
        prediction = ""
        if table:
            prediction = f" {show(row.get('predicted_tokens_per_s'), '{:.1f}'):>14} {show(row.get('predicted_speedup_vs_ar'), '{:.2f}x'):>7}"
        lines.append(
            f"{row['method']:<{name_width}} {row['tokens_per_s']:>7.1f} {show(row['speedup_vs_ar'], '{:.2f}x'):>6} "
            f"{show(row['acceptance_rate'], '{:.3f}'):>7} {show(row['mean_accepted_per_target_call'], '{:.2f}'):>8} "
            f"{show(row['target_calls_per_token'], '{:.3f}'):>9} {show(row['draft_calls_per_target_call'], '{:.2f}'):>11} "
            f"{show(row['draft_stage_acceptance'], '{:.3f}'):>9} {show(row['exact_match_vs_ar'], '{:.2f}'):>6} "
            f"{show(row.get('target_nll'), '{:.3f}'):>6} {show(row.get('rouge_l_vs_ar'), '{:.3f}'):>6} {row['peak_rss_mb']:>8.0f}"
            + prediction + _approximate_note(row)
        )
    for row in report["results"]:
        by_position = row.get("acceptance_by_depth") or []
        if by_position:
            shares = ", ".join(f"{share:.2f}" for share in by_position[:8])
            lines.append(f"{row['method']} acceptance by position: [{shares}]")
    for method, shape in report.get("tree_shapes", {}).items():
        costs = ", ".join(f"{size}: {ms:.0f}" for size, ms in shape["verify_ms_by_tokens"].items())
        reach = ", ".join(f"{share:.2f}" for share in shape["reach_by_depth"])
        draft_ms = f"{shape['draft_call_ms']:.1f}" if shape["draft_call_ms"] else "—"
        lines.append(f"{method} (auto shape): verify ms by tokens {{{costs}}}; draft call {draft_ms} ms; reach by depth [{reach}]")
    rates = report.get("synthetic_acceptance")
    if rates:
        lines.append(f"SYNTHETIC ACCEPTANCE at rates [{', '.join(f'{rate:g}' for rate in rates)}] by depth: drafters and the "
                     "target ran and paid their real cost, drafts were kept at random; the replies are not valid text")
    lines += _kind_table(report.get("by_kind"))
    if table:
        lines.append(f"pred: the replies above re-timed with the cost table of {table['device']} ({table['source']}); "
                     "Python's time per round is not in it")
    lines.append("")
    lines.append(LEGEND)
    return "\n".join(lines)


def _kind_table(kinds: dict[str, dict[str, dict]] | None) -> list[str]:
    """tok/s by kind of task, and against ar's where the run had ar."""
    if not kinds:
        return []
    methods = list(next(iter(kinds.values())))
    width = max(len(kind) for kind in kinds) + 1
    lines = ["", "by kind of task: tok/s (vs ar)", " " * width + "".join(f"{method:>20}" for method in methods)]
    for kind, speeds in kinds.items():
        cells = []
        for method in methods:
            ratio = speeds[method]["speedup_vs_ar"]
            cells.append(f"{speeds[method]['tokens_per_s']:.1f}" + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        lines.append(f"{kind:<{width}}" + "".join(f"{cell:>20}" for cell in cells))
    return lines


def _approximate_note(row: dict) -> str:
    """Marks a row whose method lets tokens out unchecked, and how many it did: its speed is
    not comparable with the exact rows' without its nll and rougeL."""
    if row.get("exact") is not False:
        return ""
    share = row.get("unchecked_share")
    return "  APPROXIMATE" + (f", {share:.0%} unchecked" if share is not None else "")
