"""The status each domain error (server/errors.py) gets at either front end, in one table: a
gRPC status code and an HTTP status with OpenAI's error type. An error outside the table is the
engine's own failure (INTERNAL, HTTP 500), and says the server needs a restart."""

from __future__ import annotations

from dataclasses import dataclass

from server.errors import (
    InvalidRequestError,
    QueueFullError,
    ServerError,
    StepOutOfMemory,
    UnavailableError,
)
from server.scheduling.faults import DroppedStream, InjectedFault


@dataclass(frozen=True)
class Status:
    grpc: str  # the name of a grpc.StatusCode
    http: int
    kind: str  # OpenAI's error type


# The first entry an error is an instance of decides: subclasses before their bases.
STATUSES = {
    DroppedStream: Status("UNAVAILABLE", 503, "service_unavailable"),
    InjectedFault: Status("INTERNAL", 500, "internal_error"),
    InvalidRequestError: Status("INVALID_ARGUMENT", 400, "invalid_request_error"),
    QueueFullError: Status("RESOURCE_EXHAUSTED", 429, "rate_limit_exceeded"),
    StepOutOfMemory: Status("RESOURCE_EXHAUSTED", 503, "service_unavailable"),
    UnavailableError: Status("UNAVAILABLE", 503, "service_unavailable"),
}
ENGINE_FAILED = Status("INTERNAL", 500, "internal_error")


def status_of(error: Exception) -> tuple[Status, str]:
    """The error's status and the message the client gets."""
    for kind, status in STATUSES.items():
        if isinstance(error, kind):
            return status, str(error)
    return ENGINE_FAILED, f"engine failed: {error!r}; the server needs a restart"


def retry_after_s(error: Exception) -> float | None:
    """When a retry may succeed, where the error knows (a full queue, a client over its quota)."""
    return error.retry_after_s if isinstance(error, ServerError) else None
