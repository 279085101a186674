"""An EAGLE-3 head as a runtime: a draft model whose every token also reads a feature.

The head is a one-layer model with its own KV cache, so chain and tree drafters run it
through the same contract as any draft model. What differs is each token's input feature:

- a token of the context reads the target's features at the token before it (the target
  computed them while verifying: `ModelRuntime.features`), fused by the head's `fc`;
- a token the head drafted itself reads the head's own output at its parent.

A slot computed from a drafted parent is only a guess of what the target would give it, so
it is never reused as context: once the target has verified those tokens, the next round
reads them again with the target's features (`reusable_slots`). The head cannot run before
the target has read the context (the first round of a reply is a plain step: `ready_for`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import ModelRuntime
from .cpu import fast_bf16
from .eagle3_head import Eagle3Head
from .eagle3_native import NativeHeadLayer, native_head_refusal

GROWTH = 256  # cache rows added at a time
# The head's big matrices, multiplied in int8 on a CPU without native bf16 where the native
# head cannot run: one drafting call reads the LM head (draft vocabulary × width) whole, 19 MB
# in fp32, and a call is memory-bound (1.5 ms against 0.2 ms in int8 on the AVX2 EPYC). The
# small attention projections stay fp32: int8 is no faster there. Drafts change a little;
# exactness does not (the target verifies).
INT8_MATRICES = {"fc", "lm_head", "midlayer.mlp.gate_proj", "midlayer.mlp.up_proj", "midlayer.mlp.down_proj"}


class Eagle3Runtime(ModelRuntime):
    name = "EAGLE-3"

    def __init__(
        self, head: Eagle3Head, target: ModelRuntime, embeddings: torch.Tensor, dtype: torch.dtype | None = None,
        quantise: bool = True, native: bool | None = None,
    ):
        """`embeddings`: (V, H) the target's token embeddings (EAGLE-3 heads read the target's
        own, unless they ship theirs). The head runs in C with int8 weights where it can
        (`native`, by default unless a `dtype` is asked for; it then takes neither `dtype`
        nor `quantise`); else in torch, in `dtype`
        (default: bf16 where the CPU multiplies it natively, else fp32 with int8 for its big
        matrices unless `quantise` is off)."""
        super().__init__(head.config.vocab_size)
        if not target.feature_layers:
            raise ValueError("an EAGLE-3 head needs a target runtime opened with its feature layers")
        embeddings = (head.embed_tokens.weight if head.embed_tokens is not None else embeddings).detach()
        refusal = native_head_refusal(head, embeddings)
        if native is None:
            native = dtype is None and refusal is None
        elif native and refusal is not None:
            raise ValueError(f"the EAGLE-3 head cannot run natively here: {refusal}")
        if native:
            self._layer: NativeHeadLayer | _TorchHeadLayer = NativeHeadLayer(head.float().eval(), embeddings)
        else:
            # bf16 by default on a GPU and on CPUs that multiply it natively
            default = torch.bfloat16 if embeddings.device.type != "cpu" or fast_bf16() else torch.float32
            self._layer = _TorchHeadLayer(head, embeddings, dtype or default, quantise)
        self.dtype = self._layer.dtype
        self.name = f"EAGLE-3 ({'native int8' if native else str(self.dtype).removeprefix('torch.')})"
        self.target = target
        self._outputs = torch.zeros(0, head.config.hidden_size, dtype=self.dtype)  # slot -> the layer's output there
        self._exact: list[bool] = []  # slot -> computed from the target's feature (or the first token)
        self._target_ids = head.target_ids.cpu()  # indexes the host logits the drafter reads
        self._hidden_size = head.config.hidden_size

    # The contract

    def ready_for(self, context: list[int]) -> bool:
        """Whether the target has read all of `context` but its last token, whose feature
        the head's first drafted token needs."""
        return self._target_slots() >= len(context) - 1

    def reusable_slots(self) -> int:
        exact = 0
        while exact < self.chain_length and self._exact[exact]:
            exact += 1
        return exact

    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        start = len(self)
        return self._run_tree(new_ids, list(range(start - 1, start - 1 + len(new_ids))), list(range(start, start + len(new_ids))), logits_wanted)

    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        start, count = len(self), len(new_ids)
        with torch.inference_mode():
            features, exact = self._input_features(new_ids, parents)  # (T, H)
            output, draft_logits = self._layer.run(start, new_ids, features, positions, self.visible_slots(parents), logits_wanted)
            self._grow(start + count)
            self._outputs[start:start + count] = output
            self._exact[start:] = exact
        logits = torch.full((logits_wanted, self.vocab_size), float("-inf"))
        logits[:, self._target_ids] = draft_logits.float()
        return logits

    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        kept = list(range(prefix)) + list(extra_slots)
        if extra_slots:
            with torch.inference_mode():  # the cache tensors are inference tensors
                self._layer.keep(kept)
                self._outputs[: len(kept)] = self._outputs[torch.tensor(kept)]
        self._exact = [self._exact[slot] for slot in kept]

    def _clear(self) -> None:
        self._exact = []

    # Features

    def _target_slots(self) -> int:
        """How many leading slots of the context the target holds features for."""
        return min(len(self.target.features), self.target.chain_length)

    def _input_features(self, new_ids: list[int], parents: list[int]) -> tuple[torch.Tensor, list[bool]]:
        """Each new token's input feature, and whether it came from the target."""
        start = len(self)
        target_slots = self._target_slots()
        rows = torch.zeros(len(new_ids), self._hidden_size, dtype=self.dtype)
        exact: list[bool] = []
        from_target: list[tuple[int, int]] = []  # (new token, target slot)
        for index, parent in enumerate(parents):
            parent_id = None if parent < 0 else (new_ids[parent - start] if parent >= start else self.cached_ids[parent])
            if parent < 0:
                exact.append(True)  # the very first token has no feature before it: zeros
            elif parent < target_slots and self.target.cached_ids[parent] == parent_id:
                from_target.append((index, parent))
                exact.append(True)
            elif parent < start:
                rows[index] = self._outputs[parent]
                exact.append(False)
            else:
                raise ValueError("an EAGLE-3 head drafts one level a call: a drafted token's parent must have run before")
        if from_target:
            indices = [index for index, _ in from_target]
            slots = torch.tensor([slot for _, slot in from_target])
            rows[indices] = self._layer.fuse(self.target.features[slots]).to(self.dtype)
        return rows, exact

    def _grow(self, rows: int) -> None:
        if rows > self._outputs.shape[0]:
            extra = max(GROWTH, rows - self._outputs.shape[0])
            self._outputs = torch.cat((self._outputs, self._outputs.new_zeros(extra, self._outputs.shape[1])))


class _TorchHeadLayer:
    """The head's layer in torch, over a KV cache of torch tensors (what `NativeHeadLayer`
    does in C, for where that cannot run and for tests that want the head's exact floats)."""

    def __init__(self, head: Eagle3Head, embeddings: torch.Tensor, dtype: torch.dtype, quantise: bool):
        # On the device of the target's embeddings: a GPU target's head runs on its GPU, and
        # hands back host tensors like the native layer (the drafter reads them there).
        self.device = embeddings.device
        self.head = head.to(self.device, dtype).eval()
        if dtype == torch.float32 and quantise and self.device.type == "cpu":  # fbgemm's int8: CPU only
            self.head = _with_int8_matmuls(self.head)
        self.embeddings = embeddings.to(dtype)
        self.dtype = dtype
        # On a GPU, attention reads the whole cache (its rows past the context masked out), so
        # that a chain's calls share one shape per GROWTH rows rather than one each. Suspected,
        # not yet measured, as what made a head call cost 15 ms in a chain against 2.5 ms at one
        # repeated shape (H100, 2026-11-27: 324 attention calls took 4.6 s).
        self.static_shapes = self.device.type == "cuda"
        config = head.config
        self._keys = torch.zeros(1, config.num_key_value_heads, 0, config.head_dim, dtype=dtype, device=self.device)
        self._values = torch.zeros_like(self._keys)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.fuse(features.to(self.device, self.dtype)).cpu()

    def run(
        self, start: int, ids: list[int], inputs: torch.Tensor, positions: list[int], visible: torch.Tensor, logits_wanted: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        count = len(ids)
        inputs, visible = inputs.to(self.device), visible.to(self.device)
        embeddings = self.embeddings[torch.tensor(ids, device=self.device)]  # (T, H)
        query, key, value = self.head.attention_inputs(embeddings[None], inputs[None], torch.tensor([positions], device=self.device))
        self._grow(start + count)
        self._keys[:, :, start:start + count] = key[0:1]
        self._values[:, :, start:start + count] = value[0:1]
        rows = self._keys.shape[2] if self.static_shapes else start + count
        if rows > visible.shape[1]:
            visible = F.pad(visible, (0, rows - visible.shape[1]), value=False)
        attended = F.scaled_dot_product_attention(
            query, self._keys[:, :, :rows], self._values[:, :, :rows], attn_mask=visible[None, None], enable_gqa=True,
        )
        output = self.head.finish(attended, inputs[None])[0]  # (T, H)
        return output.cpu(), self.head.draft_logits(output[count - logits_wanted:]).cpu()

    def keep(self, kept: list[int]) -> None:
        index = torch.tensor(kept, device=self.device)
        self._keys[:, :, : len(kept)] = self._keys[:, :, index]
        self._values[:, :, : len(kept)] = self._values[:, :, index]

    def _grow(self, rows: int) -> None:
        if rows <= self._keys.shape[2]:
            return
        extra = max(GROWTH, rows - self._keys.shape[2])
        self._keys = torch.cat((self._keys, self._keys.new_zeros(*self._keys.shape[:2], extra, self._keys.shape[3])), dim=2)
        self._values = torch.cat((self._values, self._values.new_zeros(*self._values.shape[:2], extra, self._values.shape[3])), dim=2)


def _with_int8_matmuls(head: Eagle3Head) -> Eagle3Head:
    """`head` with INT8_MATRICES as dynamically quantised int8 linears (fbgemm: a weight scale
    per tensor, activations quantised per call)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's notice that the API moves to torchao
        return torch.ao.quantization.quantize_dynamic(head, INT8_MATRICES, dtype=torch.qint8)
