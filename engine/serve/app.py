"""The server's routes, on Starlette (served by uvicorn: engine/serve/command.py).

    GET  /health               whether it is up, the loaded pair, the queue
    GET  /v1/models            the pairs a request's `model` may name
    POST /v1/chat/completions  a chat reply, whole or streamed (server-sent events)
    POST /v1/completions       a continuation of plain text, whole or streamed

With an API key, every /v1 request must carry `Authorization: Bearer KEY`. A request is
answered only once its prompt is known to fit (so a too-long prompt is a 400 even when it
asked for a stream); a client that goes away while it waits or streams cancels its job.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .api_errors import RequestError
from .limits import ServerLimits
from .pair_host import PairHost, unknown_model
from .requests import CompletionRequest, read_chat_request, read_completion_request
from .responses import CHAT, COMPLETION, Shape, event_stream, whole_response
from .work_queue import Done, Failed, GenerationQueue, Job, Prepared, Text


def create_app(pairs: PairHost, api_key: str | None = None, limits: ServerLimits = ServerLimits()) -> Starlette:
    """The server over `pairs`; its worker thread runs while the app is served (its lifespan)."""
    api = Api(pairs, GenerationQueue(pairs, limits.max_waiting), api_key, limits)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        api.queue.start()
        try:
            yield
        finally:
            api.queue.close()

    app = Starlette(
        routes=[
            Route("/health", api.health, methods=["GET"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
            Route("/v1/completions", api.completions, methods=["POST"]),
        ],
        exception_handlers={RequestError: _error_response, HTTPException: _http_error_response},
        lifespan=lifespan,
    )
    app.state.api = api
    return app


class Api:
    def __init__(self, pairs: PairHost, queue: GenerationQueue, api_key: str | None, limits: ServerLimits):
        self.pairs = pairs
        self.queue = queue
        self.api_key = api_key or None  # an empty key would let every request in with "Bearer "
        self.limits = limits
        self.started = int(time.time())

    async def health(self, request: Request) -> Response:
        queue = self.queue
        return JSONResponse({
            "status": "ok",
            "model": self.pairs.loaded_name,
            "busy": queue.running is not None,
            "waiting": queue.waiting,
            "served": queue.served,
            "cancelled": queue.cancelled,
            "failed": queue.failed,
        })

    async def models(self, request: Request) -> Response:
        self._check_key(request)
        loaded = self.pairs.loaded_name
        data = [
            {"id": name, "object": "model", "created": self.started, "owned_by": "tandem", "loaded": name == loaded}
            for name in self.pairs.names()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def chat_completions(self, request: Request) -> Response:
        return await self._reply(request, read_chat_request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._reply(request, read_completion_request, COMPLETION)

    async def _reply(self, request: Request, read: Callable[[dict, int], CompletionRequest], shape: Shape) -> Response:
        self._check_key(request)
        asked = read(await _json_body(request, self.limits.max_body_bytes), self.limits.max_tokens)
        if asked.model is not None and not self.pairs.knows(asked.model):
            raise unknown_model(asked.model)
        job = self.queue.submit(asked)
        watcher = asyncio.create_task(_cancel_when_client_leaves(request, job))
        try:
            first = await job.next_event()
            if isinstance(first, Failed):
                raise first.error
            if asked.stream:
                # From here the streaming response watches for the client leaving itself (two
                # readers of the connection's messages would each miss some).
                watcher.cancel()
                return JobStream(job, event_stream(shape, asked, first, job))
            return JSONResponse(await _whole_reply(shape, first, job))
        except BaseException:
            job.cancel()
            raise
        finally:
            watcher.cancel()

    def _check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            raise RequestError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'.", "invalid_api_key")


class JobStream(StreamingResponse):
    """A reply streamed as server-sent events. However the stream ends, its job is cancelled
    at the end: a no-op for a reply that is done; for a client that went away (Starlette
    stops sending, even before the first event), the engine stops after its current round."""

    def __init__(self, job: Job, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _whole_reply(shape: Shape, prepared: Prepared, job: Job) -> dict:
    parts = []
    while True:
        event = await job.next_event()
        if isinstance(event, Text):
            parts.append(event.text)
        elif isinstance(event, Done):
            return whole_response(shape, prepared, "".join(parts), event)
        elif isinstance(event, Failed):
            raise event.error


async def _cancel_when_client_leaves(request: Request, job: Job) -> None:
    """Once the body is read, the next message of a connection is its end."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def _json_body(request: Request, limit: int) -> dict:
    """The request's JSON object; a body over `limit` bytes is refused before it is all read."""
    declared = request.headers.get("content-length", "")
    too_large = RequestError(413, f"The request body is larger than this server's limit of {limit} bytes.", "request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(400, f"The request body is not valid JSON: {error}", "invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError(400, "The request body must be a JSON object.", "invalid_json")
    return data


async def _error_response(request: Request, error: RequestError) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error.to_json(), status_code=error.status, headers=headers)


async def _http_error_response(request: Request, error: HTTPException) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) in the same shape."""
    return JSONResponse(RequestError(error.status_code, error.detail, "not_found" if error.status_code == 404 else "invalid_request").to_json(),
                        status_code=error.status_code, headers=error.headers)
