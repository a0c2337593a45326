"""Errors in each API's own shape: the Anthropic Messages API's
(``{"type": "error", "error": {"type", "message"}}``) on its routes, OpenAI's
(``{"error": {"message", "type", "param", "code"}}``) everywhere else.

Why a rejection is shaped by its path: a client's SDK reads an error by its API's shape
(the ``anthropic`` SDK raises the error type it finds there), and the gateway's rejections
come from everywhere (the policy hooks inside stagelens's gateway stage, the size limit,
the router, a failing backend), all raised as ``stagelens.Rejected``. Each way out shapes
the rejection for the request's path once, here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from stagelens import Rejected

MESSAGES_PATH: Final = "/v1/messages"
"""The Messages API's routes start with it (``/v1/messages/count_tokens`` too)."""

ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""The Messages API's error type of each status (any other: ``invalid_request_error`` for a
4xx, ``api_error`` for a 5xx), as Anthropic documents them."""


def anthropic_type(status: int) -> str:
    """The Messages API's error type for ``status``."""
    return ANTHROPIC_TYPES.get(status) or (
        "api_error" if status >= 500 else "invalid_request_error"
    )


class MessagesRejected(Rejected):
    """A rejection answered in the Messages API's error shape."""

    def body(self) -> dict[str, Any]:
        """The JSON error body: ``{"type": "error", "error": {"type", "message"}}``."""
        return {
            "type": "error",
            "error": {"type": anthropic_type(self.status_code), "message": self.message},
        }


def for_path(path: str, rejection: Rejected) -> Rejected:
    """``rejection`` in the shape of the API ``path`` belongs to."""
    if not path.startswith(MESSAGES_PATH) or isinstance(rejection, MessagesRejected):
        return rejection
    shaped = MessagesRejected(
        rejection.status_code,
        rejection.message,
        type=rejection.type,
        code=rejection.code,
        param=rejection.param,
        headers=rejection.headers,
    )
    return shaped


Hook = Callable[..., Any]


def shaping(hook: Hook) -> Callable[..., Awaitable[Any]]:
    """``hook`` (a gateway-stage hook: ``hook(scope, ...)``, sync or async) with the
    rejections it raises shaped for the request's path."""

    async def shaped(scope: dict[str, Any], *args: Any) -> Any:
        try:
            found = hook(scope, *args)
            if isinstance(found, Awaitable):
                found = await found
            return found
        except Rejected as rejection:
            raise for_path(str(scope.get("path", "")), rejection) from rejection

    return shaped


def event_error(api: str, message: str, code: str, kind: str = "api_error") -> dict[str, Any]:
    """An error event's data inside an answered stream, in ``api``'s shape: the Messages
    API's (``kind`` its error type) or the Responses API's (``code`` its code)."""
    if api == "messages":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"type": "error", "code": code, "message": message, "param": None}
