"""The daemon's answers as typed models, defined once here and shared with the daemon (its
:mod:`sandboxd.models` builds on them): a call's :class:`Result` and its parts, and a tool's
:class:`ToolSpec`. Pydantic only: a client reads them without the server stack.

The status / termination mapping is written down (and applied) by :mod:`sandboxd.models`;
here are the names a client reads.
"""

from __future__ import annotations

import base64
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandboxd_client.output_items import Output, in_order


class Status(StrEnum):
    """Outcome of an invocation as a whole."""

    ok = "ok"
    error = "error"
    denied = "denied"
    timeout = "timeout"
    killed = "killed"
    rejected = "rejected"


class Reason(StrEnum):
    """Why the execution ended."""

    exited = "exited"
    wall_timeout = "wall_timeout"
    cpu_limit = "cpu_limit"
    memory_limit = "memory_limit"
    pids_limit = "pids_limit"
    output_limit = "output_limit"
    policy = "policy"
    cancelled = "cancelled"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PolicyRef(_Model):
    """Which policy file and rule made a decision."""

    decision: Literal["allow", "deny"]
    source: str
    rule: str


class Approval(_Model):
    """How the wait of a call the policy held for a person's yes ended (``approve:`` in the
    daemon's policy): approved (it ran), denied or expired (it did not), or withdrawn (the
    caller went away)."""

    id: str
    state: Literal["approved", "denied", "expired", "withdrawn"]
    by: str | None = None  # the approver (a client name, or "<client> (elicitation)")
    reason: str | None = None
    at: str | None = None  # when it was decided (UTC, ISO 8601)
    scope: Literal["call", "session"] = "call"


class Termination(_Model):
    reason: Reason
    exit_code: int | None = None
    signal: int | None = None


class Truncated(_Model):
    stdout: bool = False
    stderr: bool = False


class Resources(_Model):
    wall_ms: int = 0
    cpu_ms: int = 0
    peak_memory_bytes: int = 0


class Cleanup(_Model):
    verified: bool = False
    detail: str | None = None


class Kernel(_Model):
    """The session's persistent Python interpreter, as a session ``python`` call left it
    (so that a caller knows whether its variables are still there). One-shot calls carry
    ``kernel: null``.

    ``fresh``: this call started a new kernel (an empty namespace; the workspace files are
    kept). ``calls``: calls run in this kernel so far, this one included. ``lost``: this call
    ended the kernel (``reason``: the termination reason, e.g. ``wall_timeout``,
    ``memory_limit``, ``crashed``); the next call starts a fresh one. ``interrupted``: the
    call's code was interrupted (a ``KeyboardInterrupt`` at its wall-clock limit, a cancel or
    an interrupt request) and its kernel came back within the grace: the session's
    variables are kept."""

    fresh: bool = False
    calls: int = 0
    lost: bool = False
    reason: str | None = None
    interrupted: bool = False


class Result(_Model):
    """The single result format of every backend and every outcome.

    ``limits``: the call's effective limits as the daemon sends them (``{"timeout_s": 60.0,
    "memory_bytes": ..., "network": false}``); the daemon's own model types them
    (:class:`sandboxd.protocol.limits.Limits`)."""

    id: str
    tool: str
    session: str | None = None
    node: str | None = None  # the node the call ran on (a fleet routes by it)
    backend: str | None = None
    status: Status
    termination: Termination
    stdout: str = ""
    stderr: str = ""
    truncated: Truncated = Field(default_factory=Truncated)
    value: Any = None
    resources: Resources = Field(default_factory=Resources)
    limits: Any = None
    policy: PolicyRef | None = None
    cleanup: Cleanup = Field(default_factory=Cleanup)
    message: str | None = None  # human/model-readable explanation for non-ok outcomes
    kernel: Kernel | None = None  # session python calls: the session's kernel
    outputs: list[Output] = Field(default_factory=list)  # display items, in order
    # Python's repr of the last value when its JSON (``value``) would change it: a tuple
    # reads as a list, so a model would be told the wrong type; None when ``value`` says it all
    value_repr: str | None = None
    # the signed receipt of this call (docs/receipts.md): checked offline with the daemon's
    # public key; None when the result was never audited (it could not be written)
    receipt: dict[str, Any] | None = None
    # a call the daemon's policy held for a person's yes: who said yes or no, or that nobody did
    approval: Approval | None = None

    def images(self) -> list[bytes]:
        """The call's images (its PNG and JPEG display items, in order), decoded."""
        return [base64.b64decode(item.image[1]) for item in self.outputs if item.image]

    def sequence(self) -> list[tuple[Literal["stdout", "stderr"], str] | Output]:
        """Everything the call printed and displayed, in execution order, as a notebook shows it:
        ``("stdout", text)``, ``("stderr", text)`` and display items, cut at each item's
        :attr:`Output.at` (:func:`in_order`)."""
        return in_order(self.stdout, self.stderr, self.outputs)


class ToolSpec(_Model):
    """A tool as ``GET /v1/tools`` lists it."""

    name: str
    description: str
    parameters: dict[str, Any]
    backend: str | None = None
    available: bool = True
    unavailable_reason: str | None = None
    title: str | None = None
    #: MCP's tool annotations (readOnlyHint, destructiveHint, idempotentHint, openWorldHint)
    annotations: dict[str, bool] = Field(default_factory=dict)

    def openai(self) -> dict[str, Any]:
        """This tool exactly as the OpenAI ``tools`` request field expects it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }
