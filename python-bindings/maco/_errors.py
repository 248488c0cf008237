"""MACO's exceptions: one class per cause, all under :class:`MacoError`.

A failing MACO call raises the class of its status (``maco_status_t``), carrying the status
code in ``.status`` and MACO's own message (which call, which peer, why) as the text.
Argument checks done in Python before any MACO call raise the built-in :class:`TypeError`
or :class:`ValueError` instead, naming the argument.
"""

from __future__ import annotations

__all__ = [
    "MacoError",
    "InvalidArgumentError",
    "CudaError",
    "SystemCallError",
    "CommTimeoutError",
    "RemoteError",
    "UnsupportedError",
    "InternalError",
    "OutOfMemoryError",
    "InvalidUsageError",
    "RevokedError",
    "error_class",
]

# maco_status_t values (include/maco/status.h).
OK = 0
ERR_INVALID_ARGUMENT = -1
ERR_CUDA = -2
ERR_SYSTEM = -3
ERR_TIMEOUT = -4
ERR_REMOTE = -5
ERR_UNSUPPORTED = -6
ERR_INTERNAL = -7
ERR_NO_MEMORY = -8
ERR_INVALID_USAGE = -9
ERR_REVOKED = -10


class MacoError(RuntimeError):
    """A MACO call failed.

    Attributes:
        status: the ``maco_status_t`` code (negative int).
        message: MACO's message for the failure (also ``str(error)``).
    """

    status: int = 0

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message


class InvalidArgumentError(MacoError, ValueError):
    """MACO_ERR_INVALID_ARGUMENT: an argument out of its documented range."""

    status = ERR_INVALID_ARGUMENT


class CudaError(MacoError):
    """MACO_ERR_CUDA: a CUDA runtime or driver call failed (the message names it)."""

    status = ERR_CUDA


class SystemCallError(MacoError, OSError):
    """MACO_ERR_SYSTEM: an operating-system call failed (socket, mmap, ...)."""

    status = ERR_SYSTEM


class CommTimeoutError(MacoError, TimeoutError):
    """MACO_ERR_TIMEOUT: a bounded wait passed its deadline (the message says what for)."""

    status = ERR_TIMEOUT


class RemoteError(MacoError):
    """MACO_ERR_REMOTE: a peer failed, left or sent something invalid (its rank is named)."""

    status = ERR_REMOTE


class UnsupportedError(MacoError):
    """MACO_ERR_UNSUPPORTED: not available here (no GPU, several nodes, ...)."""

    status = ERR_UNSUPPORTED


class InternalError(MacoError):
    """MACO_ERR_INTERNAL: a bug in MACO; please report it with the message."""

    status = ERR_INTERNAL


class OutOfMemoryError(MacoError, MemoryError):
    """MACO_ERR_NO_MEMORY: a host allocation failed."""

    status = ERR_NO_MEMORY


class InvalidUsageError(MacoError):
    """MACO_ERR_INVALID_USAGE: the object's state forbids the call (closed, failed earlier)."""

    status = ERR_INVALID_USAGE


class RevokedError(MacoError):
    """MACO_ERR_REVOKED: the communicator was revoked, on this rank or by a peer (named):
    :meth:`Communicator.shrink` makes one of the ranks that go on, or close it."""

    status = ERR_REVOKED


_BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        CudaError,
        SystemCallError,
        CommTimeoutError,
        RemoteError,
        UnsupportedError,
        InternalError,
        OutOfMemoryError,
        InvalidUsageError,
        RevokedError,
    )
}


def error_class(status: int) -> type[MacoError]:
    """The exception class for a ``maco_status_t`` code (:class:`MacoError` if unknown)."""
    return _BY_STATUS.get(int(status), MacoError)


def _from_status(status: int, message: str) -> MacoError:
    """Builds the exception the extension raises for a failed call (internal)."""
    return error_class(status)(message, int(status))
