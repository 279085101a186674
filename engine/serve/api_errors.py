"""The error every refusal is sent as, in the shape OpenAI's API uses, so that clients show
its message:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": "invalid_value"}}
"""
from __future__ import annotations

ERROR_TYPES = {401: "authentication_error", 404: "invalid_request_error", 500: "server_error", 503: "server_error"}


class RequestError(Exception):
    """A request the server refuses or could not serve: the HTTP status and what to tell the client."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def to_json(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
