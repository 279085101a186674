"""The static-cache forward under torch.compile, compiled on a background thread while the
pair already chats on the same forward run eagerly.

Why: on the CPU an eager forward spends much of its time between kernels. Compiled, the demo
pair on torch decodes 1.20-1.22x faster on the 2-core development CPU (docs/BENCHMARKS.md,
"The torch runtime compiled in the background"). But a compile takes minutes there (294 s
for the demo pair the first time, 95 s once the kernels are in the disk cache), far too long
to make a user wait before the first reply.

How:
- `torch.compile(dynamic=True)` gives four graphs per model: one token (dynamo specialises
  sizes 0 and 1) and every other token count, each once more for the widest key window
  (its slice of the cache is contiguous, which dynamo guards on).
- A thread runs one padding-only forward of every (bucket, key window) shape the runtime
  uses, through the compiled function, on input buffers of its own. Padding writes only the
  scratch rows of the cache, which no real token sees, so it can run while a reply does.
- The runtime calls the compiled function for a shape only once that shape's warm call has
  returned on the thread, and then in dynamo's run-only mode: no reply waits for a compile,
  and a shape whose guards miss after all runs eagerly. The compiled and eager forwards give
  the same logits (tests: fp32 within 1e-4 for every covered family).
- Dynamo keeps compiled code per Python function, with guards on shapes and dtypes: a runtime
  opened later over the same model (or another cache of it) finds the graphs compiled, and
  its warm calls take milliseconds. One compile serves every runtime over the same model,
  features and cache size (`shared_compile`); when the last of them closes, a compile still
  running stops at its next shape and lets the model go.
- Inductor keeps the generated kernels on disk (TORCHINDUCTOR_CACHE_DIR, which
  `paths.keep_compiled_kernels` points into Tandem's cache folder at start): a later start
  skips the C++ compilation, though not dynamo's tracing. A corrupt file there is compiled
  again by inductor itself (a test corrupts every file).
- Dynamo guards every graph on torch's thread count, so the graphs are compiled and run at
  one count, the most the thread budget gives (cpu.torch_threads_held): where the budget has
  taken a core, the int8 products inside still run on the threads it allows, the compiled
  kernels on all of them. Run at another count, each call would have run eagerly, and a reply
  whose budget changed mid-way verified with one forward and stepped with the other.
- Any failure (no C++ compiler, an operation inductor cannot lower, a torch or Python that
  cannot compile) keeps the eager forward and says why in `note`, which the speed panel
  shows next to the runtime's name.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable

import torch

from .cpu import most_forward_threads, torch_threads_held

# What turns compiling off whatever a pair's setting says: TANDEM_COMPILE=0.
COMPILE_ENVIRONMENT = "TANDEM_COMPILE"
# The most graphs dynamo keeps per compiled function before it gives up (its default is 8).
# Every model the process loads adds four: a target, a draft, and the pairs a user switches
# between in one session.
RECOMPILE_LIMIT = 64

# How often Python hands the GIL to another thread while a compile runs (the default is 5 ms).
COMPILE_SWITCH_INTERVAL_S = 0.0001

# Shapes: (token bucket, key window); a forward's inputs are the first `bucket` ids,
# positions and cache rows, and the (bucket, window) corner of the visibility matrix.
Shape = tuple[int, int]


def compile_allowed(setting: bool = True) -> bool:
    """Whether to compile: the pair's setting, unless TANDEM_COMPILE=0 says no for every pair."""
    return setting and os.environ.get(COMPILE_ENVIRONMENT, "1") != "0"


class BackgroundCompile:
    """Compiles a static-cache forward for the given shapes on a daemon thread.

    `start(forward, buffers)`: `forward` is a StaticCacheForward; `buffers` are empty inference
    tensors shaped like the runtime's input buffers (ids, positions, rows: (widest,); visible:
    (widest, cache rows)), so the warm calls see what the runtime's calls will. Listeners
    (`when_finished`) are called on the thread when the compile ends, well or not."""

    def __init__(self, shapes: list[Shape]):
        self._shapes = list(shapes)
        self._ready: set[Shape] = set()  # shapes whose warm call has returned
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._done = threading.Event()
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self.users = 0  # runtimes open over this compile; the last to close cancels it
        self.failure: str | None = None  # why the compile was given up, when it was
        # torch's thread count the graphs are compiled at and always run at (cpu.torch_threads_held).
        self.threads = most_forward_threads()

    def start(self, forward: Callable, buffers: tuple[torch.Tensor, ...]) -> None:
        with self._lock:
            if self._thread is not None or self._done.is_set():
                return
            self._thread = threading.Thread(
                target=self._compile_every_shape, args=(forward, buffers), name="tandem-compile", daemon=True
            )
        self._thread.start()

    def cancel(self) -> None:
        """Stop at the next shape (a shape's compile cannot be interrupted) and drop the
        forward: nothing will run it compiled any more."""
        self._cancelled.set()
        if self._thread is None:
            self._finish("closed before it began")

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the compile ends (tests, the bench); False on timeout."""
        return self._done.wait(timeout)

    def when_finished(self, listener: Callable[[], None]) -> None:
        """Call `listener()` once the compile ends (at once, if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._listeners.append(listener)
                return
        listener()

    @property
    def note(self) -> str:
        """What the user is shown next to the runtime's name."""
        if self.failure is not None:
            return f"not compiled: {self.failure}"
        return "compiled" if self._done.is_set() else "compiling in the background"

    def compiled_for(self, shape: Shape) -> Callable | None:
        """forward(self, ids, positions, rows, visible) compiled for `shape`, or None while
        it is not (yet): the caller runs the eager forward then."""
        return self._run_compiled if self.failure is None and shape in self._ready else None

    def _run_compiled(self, *arguments):
        with torch_threads_held(self.threads):
            return self._compiled(*arguments)

    def give_up(self, error: Exception) -> None:
        """A compiled call failed on the runtime's thread: every shape runs eagerly from now on."""
        self.failure = _reason(error)
        self._cancelled.set()

    def _compile_every_shape(self, forward: Callable, buffers: tuple[torch.Tensor, ...]) -> None:
        failure = None
        try:
            with _quick_gil_handover():
                self._compile(forward, buffers)
        except Exception as error:  # noqa: BLE001 -- whatever stops a compile, the eager forward still works
            failure = _reason(error)
        if failure is None and self._cancelled.is_set():
            failure = "stopped: its pair was closed"
        self._finish(failure)

    def _compile(self, forward: Callable, buffers: tuple[torch.Tensor, ...]) -> None:
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        # Past the limit dynamo would quietly run the forward uncompiled and say "compiled";
        # raising instead lets the failure be seen and shown.
        dynamo.fail_on_recompile_limit_hit = True
        unbound = type(forward).__call__  # the runtime calls it with its own forward (and cache)
        compile_and_run = torch.compile(unbound, dynamic=True)  # the warm calls: compile what is missing
        # The runtime's calls only run what is compiled: a shape whose guards miss anyway runs
        # eagerly rather than compile on the thread a reply waits on.
        self._compiled = torch._dynamo.run(unbound)
        ids, positions, rows, visible = buffers
        with torch.inference_mode(), torch_threads_held(self.threads):
            for bucket, window in self._shapes:
                if self._cancelled.is_set():
                    return
                # Padding only: token 0 at position 0 in scratch row i, seeing only itself.
                rows[:bucket].copy_(torch.arange(bucket))
                visible[:bucket].zero_()
                visible[:bucket, :bucket].fill_diagonal_(True)
                compile_and_run(forward, ids[:bucket], positions[:bucket], rows[:bucket], visible[:bucket, :window])
                self._ready.add((bucket, window))

    def _finish(self, failure: str | None) -> None:
        if failure is not None and self.failure is None:
            self.failure = failure
        with self._lock:
            if self._done.is_set():
                return
            self._done.set()
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            try:
                listener()
            except Exception as error:  # noqa: BLE001 -- one listener's failure must not silence the others
                warnings.warn(f"a listener of the background compile failed: {_reason(error)}", RuntimeWarning, stacklevel=1)


_compiles_running = 0
_running_lock = threading.Lock()
_switch_interval_before: float | None = None


@contextlib.contextmanager
def _quick_gil_handover():
    """Python's switch interval at COMPILE_SWITCH_INTERVAL_S while any compile runs (the
    target's and the draft's overlap), and back to what it was after the last one.

    Tracing is pure Python and holds the GIL; a reply's eager forward needs it back between
    every two ops, and waited up to the 5 ms default each time: a reply during a compile ran
    at 0.8 tok/s against 30 uncompiled; at 0.1 ms, 3.9 (docs/BENCHMARKS.md)."""
    global _compiles_running, _switch_interval_before
    with _running_lock:
        if _compiles_running == 0:
            _switch_interval_before = sys.getswitchinterval()
            sys.setswitchinterval(COMPILE_SWITCH_INTERVAL_S)
        _compiles_running += 1
    try:
        yield
    finally:
        with _running_lock:
            _compiles_running -= 1
            if _compiles_running == 0:
                sys.setswitchinterval(_switch_interval_before)


def _reason(error: BaseException) -> str:
    """The first line of what went wrong at the root: dynamo wraps the backend's error in its
    own, and inductor's messages run to pages."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# One compile per model, its recorded feature layers and its cache rows: the graphs (and the
# warm shapes) are the same for every runtime opened over them. The compile holds the model
# only while its thread runs, so an entry never keeps its key alive.
_compiles: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, BackgroundCompile]] = weakref.WeakKeyDictionary()


def shared_compile(model: torch.nn.Module, key: tuple, shapes: list[Shape]) -> BackgroundCompile:
    """The compile of `model` under `key` for `shapes`, made (not started) the first time;
    a compile that was cancelled is made afresh."""
    by_key = _compiles.setdefault(model, {})
    existing = by_key.get(key)
    if existing is None or existing.cancelled:
        by_key[key] = BackgroundCompile(shapes)
    return by_key[key]
