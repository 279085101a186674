"""Other programs' generation of the same weights, which `tandem bench` sets beside Tandem's
methods: transformers' assisted generation, and llama-cpp-python's own generation. They
run model objects and libraries directly, so they live with the runtimes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import ConfigError
from . import llamacpp_process
from .llamacpp_generation import PlainGeneration
from .reduced_vocabulary import full_vocabulary_view


# What the peers read of engine/config.py's DecodeSettings and engine/models.py's
# LoadedModel, described here so that the runtimes import neither.


class DecodeSettings(Protocol):
    greedy: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    draft_tokens: int


class LoadedModel(Protocol):
    model: Any  # a transformers model, or None where the model runs on llama.cpp
    vocabulary: Any  # a reduced vocabulary, or None
    device: Any


class AssistedGeneration:
    """transformers' own generate() on the pair's torch weights, with the same kind of
    drafter: its prompt lookup for a pair without a draft model, the draft model otherwise."""

    @staticmethod
    def can_run(target: LoadedModel, draft: LoadedModel | None) -> bool:
        return target.model is not None and (draft is None or draft.model is not None)

    def __init__(self, target: LoadedModel, draft: LoadedModel | None, stop_ids: frozenset[int], settings: DecodeSettings):
        if not self.can_run(target, draft):
            raise ConfigError("hf-assisted runs transformers on the pair's weights: add --runtime torch")
        self.target, self.stop_ids, self.settings = target, stop_ids, settings
        # Built once: a reduced draft's full-vocabulary view is a new class each time.
        self.assistant = None
        if draft is not None:
            self.assistant = draft.model if draft.vocabulary is None else full_vocabulary_view(draft.model, draft.vocabulary)

    def __call__(self, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> tuple[int, ...]:
        settings = self.settings
        input_ids = torch.tensor([prompt_ids], device=self.target.device)
        options: dict = {"max_new_tokens": max_new_tokens, "eos_token_id": sorted(self.stop_ids)}
        options["pad_token_id"] = options["eos_token_id"][0]
        if self.assistant is not None:
            options["assistant_model"] = self.assistant
        else:
            options["prompt_lookup_num_tokens"] = settings.draft_tokens
        if settings.greedy:
            options["do_sample"] = False
        else:
            options.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k or None)
        with torch.inference_mode():
            output = self.target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **options)
        new_tokens = output[0, len(prompt_ids):].tolist()
        # Tandem does not emit the stop token; count and compare the same way.
        for index, token in enumerate(new_tokens):
            if token in self.stop_ids:
                return tuple(new_tokens[:index])
        return tuple(new_tokens)


class LlamaCppGeneration:
    """llama-cpp-python's plain generation (`Llama.create_chat_completion`) of the target's
    GGUF file, with the same prompts and token budget; greedy, or sampled alike. It runs in
    a llama.cpp worker process where Tandem's own llama.cpp runtime does (llamacpp_process:
    a GPU build beside CUDA torch); the reply's one round trip (~0.1 ms) is in its time."""

    def __init__(
        self, gguf: Path, context_length: int, threads: int, gpu_layers: int, settings: DecodeSettings,
        runtime_attention: bool = False,
    ):
        sampling = {"temperature": 0.0, "top_k": 1} if settings.greedy else {
            "temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k,
        }
        arguments = (str(gguf), context_length, threads, gpu_layers, sampling, settings.seed or 0, runtime_attention)
        if llamacpp_process.wanted():
            self._generation = llamacpp_process.WorkerGeneration(*arguments)
        else:
            self._generation = PlainGeneration(*arguments)

    def __call__(self, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> tuple[int, ...]:
        return self._generation.generate(prompt, max_new_tokens)
