"""The one error family of clustertool.

Core code raises these; only ``clustertool.cli.app`` catches them and turns them into one
line on stderr plus an exit code.  Messages never carry secrets.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    UNREACHABLE = 255  # a node was unreachable or timed out
    INTERRUPTED = 130


class ToolError(Exception):
    """A failure the user can act on: one-line message plus an optional hint."""

    exit_code: int = ExitStatus.FAILURE

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class Declined(ToolError):
    """The user answered no to a question: nothing was done.  Said plainly, not as an error ("not torn down:
    cluster 'demo' is kept"), exit 1, the same for every question the tool asks."""


class UsageError(ToolError):
    """Bad input: flags, spec files, selections."""

    exit_code = ExitStatus.USAGE


class SpecError(UsageError):
    """A cluster spec or playbook that does not validate; the message names file and key."""


class NotSupported(UsageError):
    """A verb this provider (or machine) does not have; the hint says what to do instead."""


class StateError(ToolError):
    """Unknown cluster, corrupt or locked state."""


class ProviderError(ToolError):
    """A provider (local, static, aws) could not do what was asked."""


class RemoteError(ToolError):
    """SSH to a node failed in a way that stops the command."""

    exit_code = ExitStatus.UNREACHABLE


class MissingPrerequisite(ToolError):
    """A program or privilege this command needs is absent (e.g. sshd, root)."""
