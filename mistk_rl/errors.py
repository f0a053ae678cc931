"""Errors the library raises, independent of HTTP; the service maps each to a status code."""

from __future__ import annotations

from mistk_rl._moved import renamed


class MistkError(Exception):
    """Base class: carries an HTTP-like status and a readable detail."""

    status = 500
    title = "Internal error"

    def __init__(self, detail: str, **extra: object) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidRequest(MistkError):
    """The caller asked for something malformed or not allowed (400); nothing changed."""

    status = 400
    title = "Invalid request"


class ResourceNotFound(MistkError):
    """What the caller asked for does not exist here (404)."""

    status = 404
    title = "Not found"


class IllegalState(MistkError):
    """The operation is illegal in the current state, or the service is busy (409)."""

    status = 409
    title = "Illegal in the current state"

    def __init__(
        self,
        operation: str,
        state: str,
        allowed: list[str],
        *,
        busy: bool = False,
        detail: str | None = None,
    ) -> None:
        why = "the service is busy" if busy else "not allowed"
        super().__init__(
            detail
            or f"{operation}: {why} in state '{state}'; "
            f"allowed now: {', '.join(allowed) or 'nothing but status'}",
            state=state,
            allowed=allowed,
        )
        self.state = state
        self.allowed = allowed


class StepsReset(MistkError):
    """Outcomes reported for step ids the agent handed out before it was reset (409): the
    lifecycle moved on, and those actions belong to an episode that no longer exists."""

    status = 409
    title = "Illegal in the current state"


class UpgradeRequired(MistkError):
    """A path that only an upgraded connection uses was asked without the upgrade (426);
    the answer names the protocol in its Upgrade header (RFC 9110 15.5.22)."""

    status = 426
    title = "Upgrade Required"

    def __init__(self, detail: str, protocol: str) -> None:
        super().__init__(detail)
        self.headers = ((b"upgrade", protocol.encode("ascii")),)


class HookFailed(MistkError):
    """A do_* hook raised; the service is now in state failed with the reason in status."""

    status = 500
    title = "Implementation failed"


class Rejected(MistkError):
    """Raised by a hook to refuse a request after all: the state goes back to where it was."""

    def __init__(self, detail: str, status: int = 400, **extra: object) -> None:
        super().__init__(detail, **extra)
        self.status = status
        self.title = "Rejected"


# 0.1's name, beside the SDK's `NotFound` (the 404 a caller catches) until the next release
__getattr__ = renamed(__name__, {"NotFound": "ResourceNotFound"}, globals())
