"""The static-cache torch runtime: it keeps a preallocated KV cache, written at explicit slots,
and hands each chunk of rows to the forward its plan names (forward_plan.py), each a way of
running the static forward (static_cache_forward.py).

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
"""
from __future__ import annotations

import torch

from .base import ModelRuntime
from .compiled_forward import BackgroundCompile, shared_compile
from .cuda_graphs import CudaGraphs
from . import int8_kernel
from .forward_plan import COMPILED, CUDA_GRAPHS, NATIVE, ForwardPlan, ForwardSettings, plan_forward
from .native_forward import NativeForward
from .static_cache_forward import Outputs, StaticCacheForward
from .static_families import static_refusal

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
SCRATCH_ROWS = BUCKETS[-1]  # cache rows 0..63 take padding tokens; slot s lives in row 64 + s
SMALLEST_WINDOW = 256
WARM_WINDOWS = 1024  # key windows up to this wide are captured while the pair loads


def runs_static(model: torch.nn.Module) -> bool:
    """Whether this runtime can run `model` exactly (`static_refusal` says why not)."""
    return static_refusal(model) is None


class StaticTorchRuntime(ModelRuntime):
    """A torch model over a static KV cache, each chunk of rows run by the engine its forward
    plan names for that many rows (forward_plan.py): on CUDA each (token bucket, key window)
    forward is a CUDA graph (cuda_graphs.py); on the CPU an int8 Llama-layout model runs in one
    C call (native_forward.py), and another model's forward is compiled in the background
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
        buffers = (self.ids, self.positions, self.rows, self.visible)
        self.cuda_graphs = CudaGraphs(self._forward, buffers, device, enabled=CUDA_GRAPHS in plan.engines)
        self.compiler: BackgroundCompile | None = self._background_compile(model, rows)

    @property
    def name(self) -> str:
        """The plan's name, until CUDA graphs are given up and the same forward runs uncaptured."""
        return self.plan.name if self.cuda_graphs.failure is None else "torch (static cache)"

    def _background_compile(self, model: torch.nn.Module, rows: int) -> BackgroundCompile | None:
        """The compile of the shapes the plan compiles, shared with other runtimes of this model."""
        compiled_buckets = [bucket for bucket in BUCKETS if self.plan.engine_for(bucket) == COMPILED]
        if not compiled_buckets:
            return None
        # The step first, then an 8-token verify (the graph every count but one shares),
        # then every other shape, each a guard check away from those two.
        shapes = [(bucket, window) for window in self.windows for bucket in compiled_buckets]
        shapes.sort(key=lambda shape: (shape != (1, self.windows[0]), shape != (8, self.windows[0])))
        if self.device.type == "cpu":
            int8_kernel.unavailable_reason()  # built and loaded before the graphs are traced: they read whether it is there
        compiler = shared_compile(model, (self.feature_layers, rows), shapes)
        compiler.users += 1
        return compiler

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

    def _inputs(self, bucket: int, window: int) -> tuple[torch.Tensor, ...]:
        """What a (bucket, window) forward reads: the buffers' first `bucket` rows, `window` columns."""
        return self.ids[:bucket], self.positions[:bucket], self.rows[:bucket], self.visible[:bucket, :window]

    def _forward(self, bucket: int, window: int) -> Outputs:
        return self.forward_pass(*self._inputs(bucket, window))

    def _outputs(self, engine: str, bucket: int, window: int) -> Outputs:
        """The forward over the inputs in the buffers, by `engine`: its graph replayed, compiled,
        or run eagerly (also where its graph or its compile is not there, or failed)."""
        if engine == CUDA_GRAPHS:
            replayed = self.cuda_graphs.replay(bucket, window)
            if replayed is not None:
                return replayed
        compiled = self.compiler.compiled_for((bucket, window)) if engine == COMPILED and self.compiler is not None else None
        if compiled is not None:
            try:
                return compiled(self.forward_pass, *self._inputs(bucket, window))
            except Exception as error:  # noqa: BLE001 -- a compiled forward that fails costs speed, not the reply
                # It writes the same cache rows as the eager forward below, so running
                # that after a failure part-way through leaves the cache as it should be.
                self.compiler.give_up(error)
        return self._forward(bucket, window)

    @property
    def warm_up_message(self) -> str | None:
        return "Capturing CUDA graphs of the forwards…" if self.cuda_graphs.enabled else None

    def warm_up(self) -> None:
        """Capture the graphs of short conversations now, while the pair loads, rather than
        during a reply; wider key windows are captured when a conversation reaches them."""
        self.cuda_graphs.warm_up([(bucket, window) for window in self.windows if window <= WARM_WINDOWS for bucket in BUCKETS])

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
        self.cuda_graphs.close()
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
