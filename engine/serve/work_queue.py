"""One worker thread runs every generation, one at a time, in the order requests arrived: the
models and their caches are not thread-safe, and one reply at a time is also what the
engine is fastest at (each reply gets every core). A request waits in a bounded queue;
beyond its bound the server says it is busy instead of keeping clients waiting for minutes.

A request's coroutine and the worker talk through a Job: the worker posts JobEvents to the
request's event loop, and the request cancels its job when its client goes away, which
stops the generation after its current round (the flag the decode loop checks, as the app's
Stop button does). A job still waiting when it is cancelled never starts.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass

from ..config import ConfigError
from ..errors import ContextOverflowError, OutOfMemoryError, PromptError, TandemError
from ..events import Finished, PromptPrepared, TextDelta
from ..session import Generation
from ..stats import GenerationStats
from .api_errors import RequestError
from .pair_host import PairHost
from .requests import CompletionRequest
from .stop_strings import StopStrings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """The prompt fits and the reply is starting: the request can answer 200 from here."""

    model: str
    prompt_tokens: int


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Done:
    finish_reason: str  # OpenAI's: "stop" (a stop token or string) or "length"
    stats: GenerationStats
    queue_s: float  # how long the request waited for the worker


@dataclass(frozen=True)
class Failed:
    error: RequestError


JobEvent = Prepared | Text | Done | Failed


class Job:
    """One request's generation, seen from both sides: the worker thread posts events, the
    request's coroutine awaits them."""

    def __init__(self, request: CompletionRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.queued_at = time.perf_counter()
        self._loop = loop
        self._events: asyncio.Queue[JobEvent] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._generation: Generation | None = None

    async def next_event(self) -> JobEvent:
        return await self._events.get()

    def cancel(self) -> None:
        """Stop the generation after its current round, or before it starts. Safe from any thread."""
        self._cancelled.set()
        generation = self._generation
        if generation is not None:
            generation.stop()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # The worker's side

    def attach(self, generation: Generation) -> None:
        """The generation that `cancel()` stops, once the worker has made it."""
        self._generation = generation
        if self.cancelled:  # cancelled between the check before the start and now
            generation.stop()

    def post(self, event: JobEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            pass  # the server's loop has closed: nobody is left to read it


class GenerationQueue:
    def __init__(self, pairs: PairHost, max_waiting: int):
        self.pairs = pairs
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_waiting)
        self._worker = threading.Thread(target=self._work, name="tandem-serve-worker", daemon=True)
        self.running: Job | None = None
        # What /health reports: requests answered, cancelled by their client, or failed.
        self.served = self.cancelled = self.failed = 0

    def start(self) -> None:
        self._worker.start()

    def close(self) -> None:
        """Refuse what still waits, stop what runs, and end the worker thread."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post(Failed(RequestError(503, "The server is shutting down.", "shutting_down")))
        running = self.running
        if running is not None:
            running.cancel()
        self._jobs.put(None)
        if self._worker.is_alive():
            self._worker.join()

    def submit(self, request: CompletionRequest) -> Job:
        """Queue a request (from the server's event loop); a 503 when the queue is full."""
        job = Job(request, asyncio.get_running_loop())
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise RequestError(
                503, f"The server is busy: {self._jobs.maxsize} requests are already waiting. Try again shortly.", "server_busy"
            ) from None
        return job

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def _work(self) -> None:
        try:
            self.pairs.load_first()  # the models' threads are this thread's (PairHost.load_first)
        except Exception:  # noqa: BLE001 -- said here; each request then gets the reason as its error
            log.exception("the pair could not be loaded")
        while (job := self._jobs.get()) is not None:
            self.running = job
            try:
                self._run(job)
            finally:
                self.running = None

    def _run(self, job: Job) -> None:
        started = time.perf_counter()
        if job.cancelled:  # its client left while it waited
            self.cancelled += 1
            job.post(Failed(RequestError(499, "The client closed the request before it started.", "cancelled")))
            return
        prompt_field = "prompt" if job.request.prompt is not None else "messages"
        try:
            done = self._generate(job, queue_s=started - job.queued_at)
        except RequestError as error:
            self._fail(job, error)
            return
        except (PromptError, ConfigError) as error:  # what the request asked for: no fault of the engine
            self._fail(job, _as_request_error(error, prompt_field))
            return
        except Exception as error:  # an engine fault must reach the client as a 500, not end the worker
            log.exception("generation failed")
            self._fail(job, _as_request_error(error, prompt_field))
            return
        if job.cancelled:
            self.cancelled += 1
        else:
            self.served += 1
        job.post(done)

    def _fail(self, job: Job, error: RequestError) -> None:
        self.failed += 1
        job.post(Failed(error))

    def _generate(self, job: Job, queue_s: float) -> Done:
        request = job.request
        pair = self.pairs.pair_for(request.model)
        settings = request.decode_settings(pair)
        if request.prompt is not None:
            generation = pair.complete(request.prompt, settings)
        else:
            generation = pair.generate(list(request.messages), settings)
        job.attach(generation)
        stops = StopStrings(request.stop)
        for event in generation:
            if isinstance(event, PromptPrepared):
                if event.dropped_turns:
                    # The app leaves the oldest turns out to fit; an API client sent them to be read.
                    raise RequestError(
                        400, f"The messages do not fit in the model's context of {event.context_length} tokens beside a reply "
                        f"of max_tokens={settings.max_new_tokens}: shorten them, or ask for fewer tokens.",
                        "context_length_exceeded", "messages",
                    )
                job.post(Prepared(pair.config.name, event.prompt_tokens))
            elif isinstance(event, TextDelta):
                text = stops.feed(event.text)
                if text:
                    job.post(Text(text))
                if stops.stopped:
                    generation.stop()
            elif isinstance(event, Finished):
                rest = stops.flush()
                if rest:
                    job.post(Text(rest))
                stopped = stops.stopped or event.stop_reason == "eos"
                return Done("stop" if stopped else "length", event.stats, queue_s)
        raise RuntimeError("the generation ended without a Finished event")


def _as_request_error(error: Exception, prompt_field: str) -> RequestError:
    """What the client is told of an error the engine raised."""
    if isinstance(error, ContextOverflowError):
        return RequestError(400, str(error), "context_length_exceeded", prompt_field)
    if isinstance(error, PromptError):
        return RequestError(400, str(error), "invalid_value", prompt_field)
    if isinstance(error, ConfigError):
        return RequestError(400, str(error), "invalid_value")
    if isinstance(error, OutOfMemoryError):
        return RequestError(503, str(error), "out_of_memory")
    if isinstance(error, TandemError):
        return RequestError(500, str(error), "engine_error")
    return RequestError(500, f"The engine failed: {type(error).__name__}: {error}", "engine_error")
