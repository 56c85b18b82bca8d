"""Domain errors of the server, raised at any layer; each front end answers them with the status
server/frontends/statuses.py gives them."""


class ServerError(Exception):
    """Base: the message is shown to the client and must say what to change."""

    retry_after_s: float | None = None  # when a retry may succeed, where known


class InvalidRequestError(ServerError):
    """The request can never succeed as sent (INVALID_ARGUMENT)."""


class QueueFullError(ServerError):
    """Admission control refused the request (a full queue, a client over its quota); retrying
    later may succeed (RESOURCE_EXHAUSTED, HTTP 429), after retry_after_s where known."""


class StepOutOfMemory(ServerError):
    """The engine ran out of memory in the step this request was part of: that step's requests
    fail and free their KV slots, the server goes on (RESOURCE_EXHAUSTED, HTTP 503)."""


class UnavailableError(ServerError):
    """The server is draining for shutdown or its engine stopped (UNAVAILABLE)."""


class ShutdownError(UnavailableError):
    """The server gave up on a request still open when its drain ran out: the stream ends
    with finish reason ABORT rather than an error."""
