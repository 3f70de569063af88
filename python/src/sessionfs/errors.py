"""The errors the functions raise: the binary's error object, typed."""

from __future__ import annotations

from typing import Any


class SessionfsError(Exception):
    """A command failed: the ``sessionfs.error/1`` object it printed.

    ``kind`` is stable and meant for programs (docs/CLI.md lists every kind
    with its exit code); ``message`` names the offending path or value;
    ``path`` names what is at fault, when one thing is; ``hint`` says what to
    do. ``exit_code`` is the process's exit code.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        exit_code: int,
        path: str | None = None,
        hint: str | None = None,
        raw: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exit_code = exit_code
        self.path = path
        self.hint = hint
        self.raw: dict[str, Any] = raw if raw is not None else {}

    @classmethod
    def from_json(cls, obj: dict[str, Any], exit_code: int) -> SessionfsError:
        """The error of a run that printed `obj` and exited `exit_code`."""
        return cls(
            str(obj.get("kind", "internal")),
            str(obj.get("message", "")),
            exit_code=int(obj.get("exit_code", exit_code)),
            path=obj.get("path"),
            hint=obj.get("hint"),
            raw=obj,
        )

    def __str__(self) -> str:
        return f"{self.message} [{self.kind}, exit {self.exit_code}]"

    def __repr__(self) -> str:
        return (
            f"SessionfsError(kind={self.kind!r}, exit_code={self.exit_code}, "
            f"path={self.path!r}, message={self.message!r})"
        )


class BinaryNotFoundError(SessionfsError, FileNotFoundError):
    """The ``sessionfs`` binary is not on ``PATH``, nor where ``SESSIONFS`` says."""

    def __init__(self, message: str) -> None:
        SessionfsError.__init__(
            self,
            "binary_not_found",
            message,
            exit_code=127,
            hint="install sessionfs, or set SESSIONFS to the binary's path",
        )


class ProtocolError(SessionfsError):
    """The binary's output was not the one JSON object it promises (a bug,
    or not the sessionfs binary)."""

    def __init__(self, message: str, exit_code: int) -> None:
        SessionfsError.__init__(self, "protocol", message, exit_code=exit_code)


class CommandTimeoutError(SessionfsError):
    """A command ran past the ``timeout`` it was given: it was stopped with
    SIGTERM (so it removes what it half-wrote), then killed."""

    def __init__(self, message: str) -> None:
        SessionfsError.__init__(
            self,
            "timeout",
            message,
            exit_code=124,
            hint="give the command more time, or look at why it is slow",
        )
