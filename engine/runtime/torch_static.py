"""The torch runtime for CUDA: a preallocated KV cache written at explicit slots, and each
forward captured once as a CUDA graph per token-count bucket, then replayed.

Why: an eager forward on a GPU is launch-bound (25-30 ms for the demo target whatever the
token count, docs/BENCHMARKS.md) while a replayed graph costs a few ms, so only with graphs
is a draft call cheap next to a target call and a tree nearly free to verify.

Shapes must not change between replays, so everything a forward reads lives in static
buffers: the token ids, their positions, the cache slot each one writes, and a boolean
(tokens x cache rows) matrix saying which rows each token sees (its ancestors and
itself). A forward of n tokens pads up to its bucket (1, 2, 4, ... 64); padding tokens write
to scratch rows at the front of the cache and see only themselves, so they disturb nothing.
Longer forwards (a prompt) run in bucket-sized chunks. Attention reads only a window of the
cache wide enough for the tokens so far (256, 512, ... rows): over a whole 8k-token cache it
took two thirds of a one-token forward of the demo target on an H100. So a graph is one
(token bucket, key window) pair, the small windows captured while the pair loads and the
wider ones when a conversation first grows into them.

The model's own modules (embeddings, norms, projections, MLPs, rotary embedding) do the
arithmetic; only attention and the cache are ours, because transformers' StaticCache writes
at an internal counter rather than at given positions (which a tree needs). What differs
between the families it runs (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and 3) is a
recipe in static_families.py. The cache keeps every position, sliding-window layers too:
their mask hides what lies more than a window behind each token, so trees are compacted by
slot as in any other model.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import ModelRuntime
from .compiled_forward import BackgroundCompile, shared_compile
from .exact_attention import exact_attention
from . import int8_kernel
from .forward_plan import COMPILED, CUDA_GRAPHS, NATIVE, ForwardPlan, ForwardSettings, plan_forward
from .int8_weights import Int8Linear, join_rows
from .rms_norm_cuda import fused_norm
from .native_forward import NativeForward
from .static_families import recipe_for, rotary_function, static_refusal

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
SCRATCH_ROWS = BUCKETS[-1]  # cache rows 0..63 take padding tokens; slot s lives in row 64 + s
SMALLEST_WINDOW = 256
WARM_WINDOWS = 1024  # key windows up to this wide are captured while the pair loads
# A captured forward: its graph and the static outputs each replay rewrites, (bucket, V)
# logits, the (bucket, D) final-norm hidden states they came from, and the (bucket, F)
# inputs of the feature layers (F = 0 without any).
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Captured = tuple[torch.cuda.CUDAGraph, Outputs]


@dataclass(frozen=True)
class JoinedProjections:
    """A layer's int8 projections that read the same input, joined into one matmul each
    (`join_rows`): 4 integer matmuls per layer instead of 7. None where they are not int8."""

    qkv: Int8Linear | None = None  # q, k and v side by side
    gate_up: Int8Linear | None = None  # the MLP's gate and up side by side


def joined_projections(layer: torch.nn.Module, qkv_fused_already: bool) -> JoinedProjections:
    attention, mlp = layer.self_attn, layer.mlp
    qkv = None
    if not qkv_fused_already:
        parts = [attention.q_proj, attention.k_proj, attention.v_proj]
        qkv = join_rows(parts) if all(isinstance(part, Int8Linear) for part in parts) else None
    # Every covered family's MLP but Phi-3's (whose gate_up_proj is joined already) computes
    # down(act(gate(x)) * up(x)); _mlp does the same over the joined pair.
    parts = [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]
    gate_up = join_rows(parts) if all(isinstance(part, Int8Linear) for part in parts) else None
    return JoinedProjections(qkv, gate_up)


def _mlp(mlp: torch.nn.Module, joined: JoinedProjections, x: torch.Tensor) -> torch.Tensor:
    if joined.gate_up is None:
        return mlp(x)
    gate, up = joined.gate_up(x).chunk(2, dim=-1)
    return mlp.down_proj(mlp.act_fn(gate) * up)


# A decoder layer's norms, by the names transformers gives them (Gemma's sandwich has all four).
NORM_NAMES = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def runs_static(model: torch.nn.Module) -> bool:
    """Whether this runtime can run `model` exactly (`static_refusal` says why not)."""
    return static_refusal(model) is None


class StaticCacheForward:
    """One forward of a decoder over a preallocated KV cache of `rows` rows, in the way its
    family's recipe says (static_families.py); ValueError for a model it cannot run."""

    def __init__(self, model: torch.nn.Module, rows: int, device: torch.device, feature_layers: tuple[int, ...] = ()):
        self.model = model
        self.recipe = recipe_for(model)
        self.rows = rows
        self.feature_layers = tuple(feature_layers)
        config = model.config
        attention = model.model.layers[0].self_attn
        dtype = model.dtype  # the compute dtype (an int8-wo model: float32 on the CPU, bf16 on CUDA)
        kv_heads = config.num_key_value_heads
        self.query_groups = config.num_attention_heads // kv_heads  # query heads per key/value head
        self.rotate = rotary_function(model)
        self.sliding_windows = self.recipe.layer_windows(config)  # per layer; None: it sees every position
        # The rotary embedding each layer reads: by layer type (Gemma 3), else the one under None.
        self.rotary_kinds = list(config.layer_types) if self.recipe.rotary_by_layer_type else [None] * len(model.model.layers)
        self.attention_cap = config.attn_logit_softcapping if self.recipe.caps_attention_logits else None
        self.joined = [joined_projections(layer, self.recipe.fused_qkv) for layer in model.model.layers]
        # On a GPU each Llama-style norm is one Triton kernel rather than seven (rms_norm_cuda.py).
        norm_of = fused_norm if device.type == "cuda" else (lambda norm: norm)
        self.norms = [
            {name: norm_of(getattr(layer, name)) for name in NORM_NAMES if hasattr(layer, name)} for layer in model.model.layers
        ]
        self.final_norm = norm_of(model.model.norm)
        self.logit_cap = config.final_logit_softcapping if self.recipe.caps_final_logits else None
        shape = (1, kv_heads, rows, attention.head_dim)
        with torch.inference_mode():
            self.cache = [
                (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in model.model.layers
            ]
            # The position of the token in each row, which sliding windows are measured in.
            self.row_positions = torch.zeros(rows, dtype=torch.long, device=device) if any(self.sliding_windows) else None

    @property
    def cache_bytes(self) -> int:
        return sum(keys.numel() * keys.element_size() * 2 for keys, _ in self.cache)

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor
    ) -> Outputs:
        """ids, positions, rows: (n,); visible: (n, window) bool over the cache's first
        `window` rows. Writes each token's keys and values at its row, then attends within
        the window. Returns (n, V) logits, the (n, D) final-norm hidden states the LM head
        read and the (n, F) inputs of the feature layers, all in the model's dtype."""
        decoder = self.model.model
        count, window = visible.shape
        hidden = decoder.embed_tokens(ids[None])  # (1, n, H)
        rotations = self._rotations(hidden, positions)
        masks = self._masks(visible, positions, rows, hidden.dtype)
        captured = []  # the residual stream entering each feature layer
        for index, (layer, (keys, values)) in enumerate(zip(decoder.layers, self.cache)):
            if index in self.feature_layers:
                captured.append(hidden[0])
            attention, joined, norms = layer.self_attn, self.joined[index], self.norms[index]
            query, key, value = self._project(attention, joined, norms["input_layernorm"](hidden))  # (1, heads or kv_heads, n, d)
            query, key = self.rotate(query, key, *rotations[self.rotary_kinds[index]])
            keys.index_copy_(2, rows, key)
            values.index_copy_(2, rows, value)
            mask = masks[self.sliding_windows[index]]
            attended = _attend(query, keys[:, :, :window], values[:, :, :window], mask, attention.scaling, self.attention_cap)
            attended = attention.o_proj(attended.transpose(1, 2).reshape(1, count, -1))
            if self.recipe.sandwich_norms:
                hidden = hidden + norms["post_attention_layernorm"](attended)
                hidden = hidden + norms["post_feedforward_layernorm"](_mlp(layer.mlp, joined, norms["pre_feedforward_layernorm"](hidden)))
            else:
                hidden = hidden + attended
                hidden = hidden + _mlp(layer.mlp, joined, norms["post_attention_layernorm"](hidden))
        final = self.final_norm(hidden)[0]  # (n, D)
        in_order = sorted(self.feature_layers)  # the order the loop met them
        features = torch.cat([captured[in_order.index(layer)] for layer in self.feature_layers], dim=-1) if captured else final[:, :0]
        logits = self.model.lm_head(final)  # (n, V)
        if self.logit_cap is not None:
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits, final, features

    def _project(
        self, attention: torch.nn.Module, joined: JoinedProjections, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of the normed input `x` (1, n, H), each (1, heads, n, d)."""
        count, head_dim, config = x.shape[1], attention.head_dim, self.model.config
        fused = attention.qkv_proj if self.recipe.fused_qkv else joined.qkv
        if fused is not None:
            widths = [config.num_attention_heads * head_dim] + [config.num_key_value_heads * head_dim] * 2
            query, key, value = fused(x).split(widths, dim=-1)
        else:
            query, key, value = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)
        heads = (1, count, -1, head_dim)
        query, key, value = query.view(heads), key.view(heads), value.view(heads)  # (1, n, heads, d)
        if self.recipe.qk_norm:
            query, key = attention.q_norm(query), attention.k_norm(key)
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def _rotations(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) by layer type (Gemma 3's local layers have their own base), else under None."""
        rotary = self.model.model.rotary_emb
        if not self.recipe.rotary_by_layer_type:
            return {None: rotary(hidden, positions[None])}
        return {kind: rotary(hidden, positions[None], kind) for kind in set(self.rotary_kinds)}

    def _masks(
        self, visible: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype
    ) -> dict[int | None, torch.Tensor]:
        """`_attend`'s mask by sliding window (None: the layers that see every position). A
        sliding layer's token sees the rows it sees anyway whose position is less than a
        window behind its own, the rule transformers' sliding masks follow."""
        masks = {None: _grouped_mask(visible, self.query_groups, dtype)}
        if self.row_positions is None:
            return masks
        self.row_positions.index_copy_(0, rows, positions)
        row_positions = self.row_positions[: visible.shape[1]]  # (window,)
        for size in {size for size in self.sliding_windows if size is not None}:
            recent = row_positions[None, :] > positions[:, None] - size  # (n, window)
            masks[size] = _grouped_mask(visible & recent, self.query_groups, dtype)
        return masks

    def move(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        for keys, values in self.cache:
            # The right-hand side is gathered before the write, so overlaps are safe.
            keys[:, :, destination] = keys[:, :, source]
            values[:, :, destination] = values[:, :, source]
        if self.row_positions is not None:
            self.row_positions[destination] = self.row_positions[source]


def _grouped_mask(visible: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """`_attend`'s mask: `visible` (n, window) once per query group, as the additive mask SDPA
    would make of a boolean one (0 or -inf; no row is fully masked, since every token sees
    itself). Made once a forward rather than converted again by every layer."""
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
    return additive.repeat(groups, 1)[None, None]  # (1, 1, groups * n, window)


def _attend(query, keys, values, mask, scale, cap=None):
    """query (1, heads, n, d) over keys and values (1, kv_heads, window, d): (1, heads, n, d).

    Query head h reads key/value head h // groups (transformers' `repeat_kv`). Each group's
    query heads are folded into the query length, one (groups * n)-row block per key/value
    head: no copy of the cache per group, and no `enable_gqa`, which with a mask sends CUDA
    to the slow math kernel rather than the memory-efficient one. With a soft cap (Gemma 2)
    the scores become cap * tanh(scores / cap) before the mask, which SDPA cannot do, so
    that attention is spelled out as transformers' eager attention computes it. On the CPU
    each token attends on its own (exact_attention.py): MKL sums a batch of query rows in
    another order than one row, and a verify must give each token a step's bits."""
    if query.device.type == "cpu":  # a token's bits must not depend on the batch (exact_attention.py)
        return exact_attention(query, keys, values, mask, scale, cap)
    _, heads, count, dim = query.shape
    kv_heads = keys.shape[1]
    folded = query.reshape(1, kv_heads, heads // kv_heads * count, dim)  # (1, kv_heads, groups * n, d)
    if cap is None:
        attended = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
    else:
        scores = folded @ keys.transpose(2, 3) * scale  # (1, kv_heads, groups * n, window)
        scores = torch.tanh(scores / cap) * cap + mask
        attended = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype) @ values
    return attended.reshape(1, heads, count, dim)  # CUDA's kernels may hand back a transposed layout


class StaticTorchRuntime(ModelRuntime):
    """A torch model over a static KV cache, each chunk of rows run by the engine its forward
    plan names for that many rows (forward_plan.py): on CUDA each (token bucket, key window)
    forward is a CUDA graph; on the CPU an int8 Llama-layout model runs in one C call
    (native_forward.py), and another model's forward is compiled in the background
    (compiled_forward.py) once `start_background_work` is called, eager until then. Handed no
    plan, it makes one from `graphs`, `compile` and `native` (`graphs=False` runs the same static
    forward eagerly: the CPU tests check it against the eager runtime; `native=False` keeps
    every forward in torch). Opened with `hidden_states`, it keeps the final-norm hidden states
    of the rows it returned logits for, a second output of the same graph."""

    def __init__(
        self, model: torch.nn.Module, device: torch.device, capacity: int, graphs: bool | None = None, hidden_states: bool = False,
        feature_layers: tuple[int, ...] = (), compile: bool = False, native: bool = True, plan: ForwardPlan | None = None,
    ):
        super().__init__(model.get_output_embeddings().weight.shape[0])
        self.device = device
        self.returns_hidden = hidden_states
        self.feature_layers = tuple(feature_layers)
        self._hidden: torch.Tensor | None = None
        self._new_features: torch.Tensor | None = None
        if plan is None:
            plan = plan_forward(model, device, ForwardSettings(compile=compile, graphs=graphs, native=native, static_cache=True))
        self.plan = plan
        self.name = plan.name
        self.graphs_enabled = CUDA_GRAPHS in plan.engines  # until a capture fails
        self.capacity = capacity
        rows = SCRATCH_ROWS + capacity
        self.windows = _windows(rows)
        self.forward_pass: StaticCacheForward | None = StaticCacheForward(model, rows, device, self.feature_layers)  # None once closed
        self.native: NativeForward | None = NativeForward(self.forward_pass) if NATIVE in plan.engines else None
        widest = BUCKETS[-1]
        with torch.inference_mode():
            # One set of input buffers; a graph reads the first rows (and columns) it needs.
            self.ids = torch.zeros(widest, dtype=torch.long, device=device)
            self.positions = torch.zeros(widest, dtype=torch.long, device=device)
            self.rows = torch.zeros(widest, dtype=torch.long, device=device)
            self.visible = torch.zeros(widest, rows, dtype=torch.bool, device=device)
        self.graphs: dict[tuple[int, int], Captured] = {}  # by (token bucket, key window)
        self.pool = None  # the memory pool the graphs share (they never run at once), made at the first capture
        self.graphs_failure: str | None = None  # why graphs were given up, when they were
        self.compiler: BackgroundCompile | None = None
        compiled_buckets = [bucket for bucket in BUCKETS if plan.engine_for(bucket) == COMPILED]
        if compiled_buckets:
            # The step first, then an 8-token verify (the graph every count but one shares),
            # then every other shape, each a guard check away from those two.
            shapes = [(bucket, window) for window in self.windows for bucket in compiled_buckets]
            shapes.sort(key=lambda shape: (shape != (1, self.windows[0]), shape != (8, self.windows[0])))
            if device.type == "cpu":
                int8_kernel.unavailable_reason()  # built and loaded before the graphs are traced: they read whether it is there
            self.compiler = shared_compile(model, (self.feature_layers, rows), shapes)
            self.compiler.users += 1

    # ModelRuntime

    def forward(self, new_ids: list[int], logits_wanted: int = 1) -> torch.Tensor:
        self._check_room(len(new_ids))
        return super().forward(new_ids, logits_wanted)

    def forward_tree(self, new_ids: list[int], parents: list[int], logits_wanted: int) -> torch.Tensor:
        self._check_room(len(new_ids))
        return super().forward_tree(new_ids, parents, logits_wanted)

    def _run_chain(self, new_ids: list[int], logits_wanted: int) -> torch.Tensor:
        start, count = len(self), len(new_ids)
        columns = torch.arange(start + count)
        visible = columns[None, :] <= torch.arange(start, start + count)[:, None]  # causal
        return self._run(new_ids, list(range(start, start + count)), visible, logits_wanted)

    def _run_tree(self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int) -> torch.Tensor:
        return self._run(new_ids, positions, self.visible_slots(parents), logits_wanted)  # (token, slot)

    def _keep(self, prefix: int, extra_slots: list[int]) -> None:
        self._check_open()
        moved = [(slot, prefix + offset) for offset, slot in enumerate(extra_slots) if slot != prefix + offset]
        if moved:
            source = torch.tensor([SCRATCH_ROWS + slot for slot, _ in moved], device=self.device)
            destination = torch.tensor([SCRATCH_ROWS + to for _, to in moved], device=self.device)
            with torch.inference_mode():
                self.forward_pass.move(source, destination)
        # Rows past the kept slots are simply overwritten later: no token sees them until then.

    def _clear(self) -> None:
        pass  # stale rows are never visible; the next tokens overwrite them

    def last_hidden_states(self) -> torch.Tensor:
        if self._hidden is None:
            return super().last_hidden_states()
        return self._hidden

    # Running

    def _check_room(self, count: int) -> None:
        # Checked before the forward rather than in it: the base class forgets the cache of a
        # forward that fails, and a reply too long to fit is no reason to lose the context.
        self._check_open()
        if len(self) + count > self.capacity:
            raise ValueError(f"the context is full: {len(self) + count} tokens do not fit this model's {self.capacity}")

    def _check_open(self) -> None:
        if self.forward_pass is None:
            raise ValueError("this runtime was closed")

    def _run(self, new_ids: list[int], positions: list[int], visible: torch.Tensor, logits_wanted: int) -> torch.Tensor:
        """`visible`: (tokens, slots) bool over the slots up to the last new token."""
        start, count = len(self), len(new_ids)
        first_wanted = max(count - logits_wanted, 0)
        widest = BUCKETS[-1]
        pieces = []
        for begin in range(0, count, widest):
            end = min(begin + widest, count)
            chunk_visible = visible[begin:end, : start + end]
            wanted_from = min(max(first_wanted - begin, 0), end - begin)  # the chunk's first row whose logits are wanted
            pieces.append(self._run_chunk(new_ids[begin:end], positions[begin:end], start + begin, chunk_visible, wanted_from))
        logits, hidden, features = zip(*pieces)
        if self.returns_hidden:
            self._hidden = _joined(hidden)
        if self.feature_layers:
            self._new_features = torch.cat(features)
        return _joined(logits)

    def _last_features(self) -> torch.Tensor:
        return self._new_features

    def _run_chunk(
        self, ids: list[int], positions: list[int], first_slot: int, visible: torch.Tensor, wanted_from: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Run up to a bucket of tokens. Returns the float32 logits of its rows from
        `wanted_from` on, their hidden states when the runtime returns them, and every row's
        features when it records them (else None)."""
        count, slots = visible.shape
        engine = self.plan.engine_for(count)
        if engine == NATIVE:
            rows = list(range(SCRATCH_ROWS + first_slot, SCRATCH_ROWS + first_slot + count))
            return self.native(ids, positions, rows, visible, SCRATCH_ROWS, wanted_from, self.returns_hidden)
        bucket = next(size for size in BUCKETS if size >= count)
        window = next(width for width in self.windows if width >= SCRATCH_ROWS + slots)
        padding = bucket - count
        rows = list(range(SCRATCH_ROWS + first_slot, SCRATCH_ROWS + first_slot + count)) + list(range(padding))
        padded_visible = torch.zeros(bucket, window, dtype=torch.bool)
        padded_visible[:count, SCRATCH_ROWS : SCRATCH_ROWS + slots] = visible
        padded_visible[torch.arange(count, bucket), torch.arange(padding)] = True  # padding sees itself only
        with torch.inference_mode():
            self.ids[:bucket].copy_(torch.tensor(ids + [0] * padding), non_blocking=True)
            self.positions[:bucket].copy_(torch.tensor(positions + [0] * padding), non_blocking=True)
            self.rows[:bucket].copy_(torch.tensor(rows), non_blocking=True)
            self.visible[:bucket, :window].copy_(padded_visible, non_blocking=True)
            logits, hidden, features = self._outputs(engine, bucket, window)
            # Only the wanted rows are upcast. Copies even when already float32: the next
            # replay reuses the graph's output memory.
            wanted = slice(wanted_from, count)
            hidden_rows = hidden[wanted].to(torch.float32, copy=True) if self.returns_hidden else None
            feature_rows = features[:count].to(torch.float32, copy=True).cpu() if self.feature_layers else None
            return logits[wanted].to(torch.float32, copy=True), hidden_rows, feature_rows

    def _forward(self, bucket: int, window: int) -> Outputs:
        return self.forward_pass(self.ids[:bucket], self.positions[:bucket], self.rows[:bucket], self.visible[:bucket, :window])

    def _outputs(self, engine: str, bucket: int, window: int) -> Outputs:
        """The forward over the inputs in the buffers, by `engine`: its graph replayed, compiled,
        or run eagerly (also where its graph or its compile is not there, or failed)."""
        captured = self._graph(bucket, window) if engine == CUDA_GRAPHS and self.graphs_enabled else None
        if captured is None:
            compiled = self.compiler.compiled_for((bucket, window)) if engine == COMPILED and self.compiler is not None else None
            if compiled is not None:
                inputs = self.ids[:bucket], self.positions[:bucket], self.rows[:bucket], self.visible[:bucket, :window]
                try:
                    return compiled(self.forward_pass, *inputs)
                except Exception as error:  # noqa: BLE001 -- a compiled forward that fails costs speed, not the reply
                    # It writes the same cache rows as the eager forward below, so running
                    # that after a failure part-way through leaves the cache as it should be.
                    self.compiler.give_up(error)
            return self._forward(bucket, window)
        graph, outputs = captured
        graph.replay()
        return outputs

    def _graph(self, bucket: int, window: int) -> Captured | None:
        """The graph of this forward, captured at its first use; None once graphs were given up."""
        if (bucket, window) not in self.graphs:
            try:
                self.graphs[bucket, window] = self._capture(bucket, window)
            except RuntimeError as error:  # what torch raises for CUDA errors, out of memory included
                self._give_up_graphs(error)
                return None
        return self.graphs[bucket, window]

    def _give_up_graphs(self, error: RuntimeError) -> None:
        # A capture that fails (an operation no graph can hold, or no memory left for one)
        # should cost speed, not the load or the reply: the same static forward runs eagerly,
        # with the same results. Every graph goes, not only this one: the likely causes, an op
        # every capture meets or a full GPU, would fail the next capture too, and freeing the
        # graphs' memory helps the eager forwards that follow.
        # Ending a spoiled capture raises an error of its own; the one that spoiled it says why.
        cause = error.__context__ if isinstance(error.__context__, RuntimeError) else error
        self.graphs_failure = f"{type(cause).__name__}: {cause}"
        self._free_graphs()
        self.graphs_enabled = False
        self.name = "torch (static cache)"
        warnings.warn(
            f"CUDA graph capture failed; the forwards run uncaptured (slower): {self.graphs_failure}",
            RuntimeWarning,
            stacklevel=2,
        )

    def _free_graphs(self) -> None:
        if self.graphs and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # no replay may still be running in what is freed
        # The static outputs live in the graphs' pool: dropping them with the graphs lets it go.
        self.graphs = {}
        self.pool = None

    def _capture(self, bucket: int, window: int) -> Captured:
        # Capture over padding-only inputs (scratch rows, each seeing itself), so the warm-up
        # and capture forwards write nothing a real token will read.
        buffers = (self.ids, self.positions, self.rows, self.visible)
        saved = [buffer[:bucket].clone() for buffer in buffers]
        self.ids[:bucket].zero_()
        self.positions[:bucket].zero_()
        self.rows[:bucket].copy_(torch.arange(bucket))
        self.visible[:bucket].zero_()
        self.visible[:bucket, :bucket].fill_diagonal_(True)
        try:
            return self._record(bucket, window)
        finally:
            # Restored even when the capture fails: a capture at first use (a wider key window
            # mid-conversation) parks the inputs of a real forward, which then runs.
            for buffer, values in zip(buffers, saved):
                buffer[:bucket].copy_(values)

    def _record(self, bucket: int, window: int) -> Captured:
        """Capture the forward as it stands in the buffers: the only CUDA-specific step."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graphs require
                for _ in range(2):
                    self._forward(bucket, window)
        finally:
            # Even after a failure: the buffers are restored next, and not under kernels still
            # reading them.
            torch.cuda.current_stream().wait_stream(side)
        stream = torch.cuda.current_stream()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self._forward(bucket, window)  # static: every replay writes them again
        except RuntimeError:
            # When ending a spoiled capture raises, torch.cuda.graph leaves its capture stream
            # current; the eager forwards that follow belong on the usual one.
            torch.cuda.set_stream(stream)
            raise
        return graph, outputs

    @property
    def warm_up_message(self) -> str | None:
        return "Capturing CUDA graphs of the forwards…" if self.graphs_enabled else None

    def warm_up(self) -> None:
        """Capture the graphs of short conversations now, while the pair loads, rather than
        during a reply; wider key windows are captured when a conversation reaches them."""
        shapes = [(bucket, window) for window in self.windows if window <= WARM_WINDOWS for bucket in BUCKETS]
        with torch.inference_mode():
            for bucket, window in shapes:
                if not self.graphs_enabled:
                    break  # never enabled, or a capture failed and the forwards run eagerly
                self._graph(bucket, window)

    def start_background_work(self) -> None:
        if self.compiler is None or self.forward_pass is None:
            return
        with torch.inference_mode():  # inference tensors as the runtime's are: dynamo guards on the difference
            buffers = tuple(torch.zeros_like(buffer) for buffer in (self.ids, self.positions, self.rows, self.visible))
        self.compiler.start(self.forward_pass, buffers)

    def when_background_work_changes(self, listener) -> None:
        if self.compiler is not None:
            self.compiler.when_finished(listener)

    @property
    def background_note(self) -> str | None:
        return self.compiler.note if self.compiler is not None else None

    def close(self) -> None:
        """Free the graphs, their memory pool and the cache; the runtime cannot run after."""
        if self.compiler is not None:
            self.compiler.users -= 1
            if self.compiler.users == 0:
                self.compiler.cancel()  # a compile still running lets the model (and this cache) go
            self.compiler = None
        self._free_graphs()
        self.graphs_enabled = False
        self.forward_pass = None
        self.native = None
        self._hidden = None


def _joined(pieces: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _windows(rows: int) -> tuple[int, ...]:
    """Key windows: powers of two from SMALLEST_WINDOW, and the whole cache last."""
    widths, width = [], SMALLEST_WINDOW
    while width < rows:
        widths.append(width)
        width *= 2
    return (*widths, rows)
