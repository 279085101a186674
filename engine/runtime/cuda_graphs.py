"""The CUDA graphs of the static forward (static_cache_forward.py), one per (token bucket, key
window), each captured at its first use (or at warm-up) and replayed after.

Why: an eager forward on a GPU is launch-bound (25-30 ms for the demo target whatever the
token count, docs/BENCHMARKS.md) while a replayed graph costs a few ms, so only with graphs
is a draft call cheap next to a target call and a tree nearly free to verify.

A graph replays the kernels it recorded over the same memory, so everything the forward reads
lives in static input buffers (torch_static.py fills them), and its outputs are static too:
every replay writes them again.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from .static_cache_forward import Outputs

# A captured forward: its graph and the static outputs each replay rewrites.
Captured = tuple[torch.cuda.CUDAGraph, Outputs]


class CudaGraphs:
    """The graphs of one static forward, by (token bucket, key window). `forward(bucket, window)`
    runs the forward over the first `bucket` rows (and `window` key columns) of `inputs`, the
    static (ids, positions, rows, visible) buffers. Given up for good, with a warning and the
    reason in `failure`, when a capture fails: the same forward then runs uncaptured."""

    def __init__(
        self, forward: Callable[[int, int], Outputs], inputs: tuple[torch.Tensor, ...], device: torch.device, enabled: bool
    ):
        self.forward = forward
        self.inputs = inputs
        self.device = device
        self.enabled = enabled  # until a capture fails or the runtime closes
        self.captured: dict[tuple[int, int], Captured] = {}  # by (token bucket, key window)
        self.pool = None  # the memory pool the graphs share (they never run at once), made at the first capture
        self.failure: str | None = None  # why graphs were given up, when they were

    def replay(self, bucket: int, window: int) -> Outputs | None:
        """The forward over the inputs in the buffers by its graph, captured now if this is its
        first use; None where graphs are off or were given up (the caller runs it uncaptured)."""
        captured = self.graph(bucket, window) if self.enabled else None
        if captured is None:
            return None
        graph, outputs = captured
        graph.replay()
        return outputs

    def warm_up(self, shapes: list[tuple[int, int]]) -> None:
        """Capture these (bucket, window) graphs now, unless a capture fails on the way."""
        with torch.inference_mode():
            for bucket, window in shapes:
                if not self.enabled:
                    break  # never enabled, or a capture failed and the forwards run eagerly
                self.graph(bucket, window)

    def graph(self, bucket: int, window: int) -> Captured | None:
        """The graph of this forward, captured at its first use; None once graphs were given up."""
        if (bucket, window) not in self.captured:
            try:
                self.captured[bucket, window] = self._capture(bucket, window)
            except RuntimeError as error:  # what torch raises for CUDA errors, out of memory included
                self._give_up(error)
                return None
        return self.captured[bucket, window]

    def close(self) -> None:
        """Free the graphs and their memory pool; none is captured after."""
        self._free()
        self.enabled = False

    def _give_up(self, error: RuntimeError) -> None:
        # A capture that fails (an operation no graph can hold, or no memory left for one)
        # should cost speed, not the load or the reply: the same static forward runs eagerly,
        # with the same results. Every graph goes, not only this one: the likely causes, an op
        # every capture meets or a full GPU, would fail the next capture too, and freeing the
        # graphs' memory helps the eager forwards that follow.
        # Ending a spoiled capture raises an error of its own; the one that spoiled it says why.
        cause = error.__context__ if isinstance(error.__context__, RuntimeError) else error
        self.failure = f"{type(cause).__name__}: {cause}"
        self._free()
        self.enabled = False
        warnings.warn(
            f"CUDA graph capture failed; the forwards run uncaptured (slower): {self.failure}",
            RuntimeWarning,
            stacklevel=2,
        )

    def _free(self) -> None:
        if self.captured and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # no replay may still be running in what is freed
        # The static outputs live in the graphs' pool: dropping them with the graphs lets it go.
        self.captured = {}
        self.pool = None

    def _capture(self, bucket: int, window: int) -> Captured:
        # Capture over padding-only inputs (scratch rows, each seeing itself), so the warm-up
        # and capture forwards write nothing a real token will read.
        ids, positions, rows, visible = self.inputs
        saved = [buffer[:bucket].clone() for buffer in self.inputs]
        ids[:bucket].zero_()
        positions[:bucket].zero_()
        rows[:bucket].copy_(torch.arange(bucket))
        visible[:bucket].zero_()
        visible[:bucket, :bucket].fill_diagonal_(True)
        try:
            return self._record(bucket, window)
        finally:
            # Restored even when the capture fails: a capture at first use (a wider key window
            # mid-conversation) parks the inputs of a real forward, which then runs.
            for buffer, values in zip(self.inputs, saved):
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
                    self.forward(bucket, window)
        finally:
            # Even after a failure: the buffers are restored next, and not under kernels still
            # reading them.
            torch.cuda.current_stream().wait_stream(side)
        stream = torch.cuda.current_stream()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.forward(bucket, window)  # static: every replay writes them again
        except RuntimeError:
            # When ending a spoiled capture raises, torch.cuda.graph leaves its capture stream
            # current; the eager forwards that follow belong on the usual one.
            torch.cuda.set_stream(stream)
            raise
        return graph, outputs
