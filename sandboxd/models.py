"""Typed models shared by every layer: requests, limits, invocations, decisions and results.

Nothing here knows about HTTP, Docker or RestrictedPython. The single result format
is :class:`Result`; every backend and every outcome produces it.

Status / termination mapping (the one place it is written down; :meth:`Result.build` applies
it, with :data:`LIMIT_MESSAGES` for what the model reads):

=============  =========================================================
status         termination.reason
=============  =========================================================
``ok``         ``exited`` with exit code 0 (python: no exception)
``error``      ``exited`` with a non-zero exit code or an exception
``denied``     ``policy`` (the policy engine said no; nothing ran)
``rejected``   ``policy`` (a backend refused before running, e.g. a path
               outside the workspace or forbidden syntax)
``timeout``    ``wall_timeout`` or ``cpu_limit``
``killed``     ``memory_limit``, ``pids_limit``, ``output_limit`` or
               ``cancelled``
=============  =========================================================
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from sandboxd.protocol.display import TOO_DEEP, too_deep
from sandboxd.protocol.limits import LIMITS
from sandboxd.protocol.limits import Limits as Limits  # re-exported: a call's limits
from sandboxd.protocol.plan import ExecutionPlan
from sandboxd.protocol.plan import ToolKind as ToolKind  # re-exported: the tools' kinds
from sandboxd.results.streaming import EventSink
from sandboxd.workspaces.transfer import Transfer
from sandboxd_client import models as results
from sandboxd_client.models import Approval as Approval
from sandboxd_client.models import Cleanup as Cleanup
from sandboxd_client.models import Kernel as Kernel
from sandboxd_client.models import PolicyRef as PolicyRef
from sandboxd_client.models import Reason as Reason
from sandboxd_client.models import Resources as Resources
from sandboxd_client.models import Status as Status
from sandboxd_client.models import Termination as Termination
from sandboxd_client.models import ToolSpec as ToolSpec
from sandboxd_client.models import Truncated as Truncated
from sandboxd_client.output_items import Output


def new_id(prefix: str, node: str | None = None) -> str:
    """A random, URL-safe identifier such as ``inv_3q9v...``; with ``node``, one that names
    the node it lives on, ``ses_<node>_3q9v...`` (same randomness: a proxy routes by the
    node part, :mod:`sandboxd.fleet`). The random part has no ``_``."""
    random = secrets.token_urlsafe(12).replace('-', 'x').replace('_', 'y')
    return f"{prefix}_{node}_{random}" if node else f"{prefix}_{random}"


def node_of(identifier: str) -> str | None:
    """The node part of an id made by :func:`new_id` with a node (None: an id without one,
    e.g. a session made by a version before fleets)."""
    parts = identifier.split("_")
    return parts[1] if len(parts) == 3 and parts[1] else None


STATUS_FOR_REASON: dict[Reason, Status] = {
    Reason.wall_timeout: Status.timeout,
    Reason.cpu_limit: Status.timeout,
    Reason.memory_limit: Status.killed,
    Reason.pids_limit: Status.killed,
    Reason.output_limit: Status.killed,
    Reason.cancelled: Status.killed,
}


#: what the model reads when a call ended on a limit (the same words from every backend)
LIMIT_MESSAGES: dict[Reason, str] = {
    Reason.wall_timeout: "the call exceeded its wall-clock limit of {timeout_s:g} s and was "
                         "stopped",
    Reason.cpu_limit: "the call used up its CPU time limit and was stopped",
    Reason.memory_limit: "the call ran out of memory (limit {memory_bytes} bytes) and was killed",
    Reason.pids_limit: "the call hit the process limit ({pids}) and was stopped",
    Reason.output_limit: "the output exceeded {output_bytes} bytes (stdout and stderr "
                         "together); the call was stopped",
    Reason.cancelled: "the call was cancelled (the client went away or asked for an "
                      "interrupt, or the daemon shut down)",
}


def status_for(reason: Reason, exit_code: int | None = None) -> Status:
    """The status that goes with a termination reason (see the module table)."""
    if reason is Reason.exited:
        return Status.ok if exit_code == 0 else Status.error
    if reason is Reason.policy:
        return Status.denied
    return STATUS_FOR_REASON[reason]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _strict_number(value: Any) -> Any:
    """Numbers of a request are JSON numbers: ``true`` or ``"5"`` is not a number (JSON Schema
    agrees; ``5.0`` is still the integer 5)."""
    if isinstance(value, bool | str | bytes):
        raise ValueError("must be a JSON number")
    return value


#: the (positive) number types of request bodies (one definition: see :func:`_strict_number`)
PositiveNumber = Annotated[float, Field(gt=0), BeforeValidator(_strict_number)]
PositiveInteger = Annotated[int, Field(gt=0), BeforeValidator(_strict_number)]


class _Request(_Model):
    """A request body (no unknown fields; numbers: :data:`PositiveNumber`, ...Integer)."""


# ---------------------------------------------------------------- limits


def _limit_field(name: str) -> Any:
    """The request field of limit ``name``: optional, described and bounded (in its JSON
    Schema too) as the limits table says."""
    info = LIMITS[name]
    return Field(default=None, description=info.doc, json_schema_extra={**info.bounds()})


class LimitsRequest(_Request):
    """Limits a caller asks for. Each may only lower the effective limit, never raise it.
    One field per limit of :data:`sandboxd.protocol.limits.LIMITS`, within its bounds."""

    timeout_s: PositiveNumber | None = _limit_field("timeout_s")
    memory_bytes: PositiveInteger | None = _limit_field("memory_bytes")
    cpus: PositiveNumber | None = _limit_field("cpus")
    pids: PositiveInteger | None = _limit_field("pids")
    output_bytes: PositiveInteger | None = _limit_field("output_bytes")
    open_files: PositiveInteger | None = _limit_field("open_files")

    @field_validator("*")
    @classmethod
    def _within_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.field_name is not None:
            LIMITS[info.field_name].check(info.field_name, value)
        return value

    def asked(self) -> dict[str, float]:
        """The limits asked for: ``{field: value}``."""
        return self.model_dump(exclude_none=True)


# ---------------------------------------------------------------- requests


class SessionInvokeRequest(_Request):
    """Body of ``POST /v1/sessions/{id}/tools/{name}/invoke``: the path names the session."""

    arguments: dict[str, Any] = Field(default_factory=dict)
    limits: LimitsRequest | None = None


class InvokeRequest(SessionInvokeRequest):
    """Body of ``POST /v1/tools/{name}/invoke``."""

    session: str | None = None


class Invocation(_Model):
    """One call as a backend receives it: who asks, where it runs, and the policy's
    :class:`~sandboxd.protocol.plan.ExecutionPlan` (what runs and how), passed on as the
    policy made it; the service adds nothing but the workspace and the sandbox uid."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    id: str = Field(default_factory=lambda: new_id("inv"))
    tool: str
    client: str
    session: str | None = None
    workspace: Path
    # the sandbox identity (uid = gid) of the call's sandbox, from the uid pool
    # (sandboxd.host.uids);
    # None when the daemon is not root
    uid: int | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    plan: ExecutionPlan
    # file tools: the bytes of a raw upload or download, in-process
    transfer: Transfer | None = Field(default=None, exclude=True)
    # a streaming caller's sink: the backend hands it output as it is produced (so a
    # caller sees a long call's progress); None for a plain call. In-process, never sent.
    events: EventSink | None = Field(default=None, exclude=True)


# ---------------------------------------------------------------- decisions


class ApprovalRule(_Model):
    """An allowed call the policy gates on a person's yes (``approve:``, docs/policy.md):
    the rule that asks, who may answer, whether an MCP host's user may, how long it waits."""

    rule: str  # e.g. "tools.shell.approve.patterns[0]"
    by: list[str] = Field(default_factory=list)  # client names that may approve
    elicit: bool = False  # the calling MCP host's user may answer (elicitation)
    timeout_s: float = 300.0


class Decision(_Model):
    """What the policy engine decided for one call, and why; for an allowed call, ``plan``
    is what runs (every layer after the policy passes it on)."""

    allowed: bool
    source: str  # policy file, e.g. "policies/default.yaml"
    rule: str  # rule path, e.g. "tools.shell.commands.deny[2]"
    message: str = ""  # for a denial: phrased so that a model can act on it
    policy_name: str = ""
    backend: str | None = None  # "restricted" | "container" | "workspace"
    plan: ExecutionPlan | None = None  # allowed calls only
    #: an allowed call that waits for a person's yes first (None: it runs at once)
    approve: ApprovalRule | None = None
    #: how that wait ended (set by the service, never by the policy; the result carries it,
    #: not the public JSON of ``policy explain``)
    approval: Approval | None = Field(default=None, exclude=True)
    #: SHA-256 of the policy file that decided (the call's receipt names it; not in the
    #: public JSON of ``policy explain``)
    policy_sha256: str = Field(default="", exclude=True)

    @property
    def limits(self) -> Limits | None:
        """The effective limits (allowed calls only): the plan's."""
        return self.plan.limits if self.plan is not None else None

    @model_serializer(mode="wrap")
    def _public(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The public JSON (``policy explain``) keeps its flat form: the plan's fields as
        top-level keys, the command plan under ``plan``; a denial has no plan (nulls)."""
        out: dict[str, Any] = handler(self)
        out.pop("plan", None)
        p = self.plan
        out.update({
            "limits": p.limits.to_wire() if p is not None else None,
            "kind": p.kind.value if p is not None else None,
            "plan": p.command.to_wire() if p is not None and p.command is not None else None,
            "argv": p.argv if p is not None else None,
            "imports_allow": list(p.imports_allow) if p is not None else [],
            "imports_deny": list(p.imports_deny) if p is not None else [],
            "image": p.image if p is not None else None,
            "network": p.network if p is not None else None,
            "max_file_bytes": p.max_file_bytes if p is not None else 1024 * 1024,
            "path": p.path if p is not None else None,
        })
        return out

    @property
    def ref(self) -> PolicyRef:
        return PolicyRef(
            decision="allow" if self.allowed else "deny", source=self.source, rule=self.rule
        )


# ---------------------------------------------------------------- results


#: what the model reads when a call ended its session's kernel (one definition, every backend)
KERNEL_LOST_MESSAGE = ("the session's Python state was lost because {why}; the next call "
                       "starts a fresh interpreter in the same workspace (files are kept)")


#: what the model reads when its code was interrupted and the kernel kept (what
#: it can still use, so that it does not redo the work)
KERNEL_INTERRUPTED_MESSAGE = ("its code was interrupted (KeyboardInterrupt) and the session's "
                              "Python state is kept: variables defined before the interrupt "
                              "are still there")


def kernel_lost_message(result: Result) -> str:
    """The sentence that tells the model its session's Python state is gone, from the result's
    own message (a limit) or the kernel's termination reason."""
    kernel = result.kernel
    why = result.message or (kernel.reason if kernel and kernel.reason else "the interpreter "
                                                                           "ended")
    return KERNEL_LOST_MESSAGE.format(why=why)


class Explanation(_Model):
    """What ``policy explain`` answers: the decision and where its rule is written."""

    client: str
    decision: Decision
    location: str | None


class Result(results.Result):
    """The single result format of every backend and every outcome: the fields a client reads
    (:class:`sandboxd_client.models.Result`, their one definition), the effective limits typed,
    and how the daemon builds and sends one."""

    limits: Limits | None = None
    #: in-process only, never serialised (the wire, the audit log and receipts leave them out,
    #: as :attr:`Invocation.transfer`): the problem-table code of what stopped a file
    #: operation (its HTTP problem), and a raw download's bytes (the response body)
    problem: str | None = Field(default=None, exclude=True)
    body: bytes | None = Field(default=None, exclude=True, repr=False)

    @classmethod
    def build(cls, call: Invocation | tuple[str, str, str | None], backend: str | None,
              reason: Reason, *, limits: Limits | None = None, status: Status | None = None,
              exit_code: int | None = None, signal: int | None = None,
              message: str | None = None, started: float | None = None,
              resources: Resources | None = None, cleanup: Cleanup | None = None,
              **fields: Any) -> Result:
        """The one result builder of every backend and the service.

        ``call``: the invocation, or ``(id, tool, session)``. ``status`` defaults to
        :func:`status_for` ``(reason, exit_code)``; ``message`` to :data:`LIMIT_MESSAGES`
        for a limit (``limits`` filled in); ``resources`` to the wall time since ``started``
        (a ``time.monotonic()`` value) when given. Other ``fields`` (stdout, stderr,
        truncated, value, policy) are the result's own."""
        if isinstance(call, tuple):
            ident, tool, session = call
        else:
            ident, tool, session = call.id, call.tool, call.session
        if message is None and reason in LIMIT_MESSAGES:
            message = LIMIT_MESSAGES[reason].format(**(limits or Limits()).to_wire())
        if resources is None:
            resources = Resources(wall_ms=int((time.monotonic() - started) * 1000)
                                  if started is not None else 0)
        if too_deep(fields.get("value")):  # bounded at the border, for clients' parsers
            fields["value"] = None
            message = "; ".join(m for m in (message, f"value omitted: {TOO_DEEP}") if m)
        return cls(
            id=ident, tool=tool, session=session, backend=backend,
            status=status or status_for(reason, exit_code),
            termination=Termination(reason=reason, exit_code=exit_code, signal=signal),
            limits=limits, resources=resources, cleanup=cleanup or Cleanup(), message=message,
            **fields,
        )

    def wire_json(self) -> str:
        """The result as a client gets it (JSON text). Never fails: should a part of it not
        serialize after all, that part is replaced by a note (:meth:`deliverable`), so that
        the client always hears the audited result."""
        try:
            return self.model_dump_json()
        except (ValueError, RecursionError):  # pydantic's serialization error is a ValueError
            return self.deliverable().model_dump_json()

    def wire(self) -> dict[str, Any]:
        """:meth:`wire_json` as data (an SSE event, MCP's ``structuredContent``)."""
        try:
            return self.model_dump(mode="json")
        except (ValueError, RecursionError):
            return self.deliverable().model_dump(mode="json")

    def deliverable(self) -> Result:
        """This result with every display item and the value that do not serialize replaced
        by notes (``truncated``)."""
        outputs = []
        for item in self.outputs:
            try:
                item.model_dump_json()
                outputs.append(item)
            except (ValueError, RecursionError):
                outputs.append(Output(data={"text/plain": "[display item cut: it could not "
                                                          "be serialized]"}, truncated=True))
        update: dict[str, Any] = {"outputs": outputs}
        try:
            json.dumps(self.value)
        except (ValueError, TypeError, RecursionError):
            update["value"] = None
            update["message"] = "; ".join(
                m for m in (self.message, "value omitted: it could not be serialized") if m)
        return self.model_copy(update=update)

    @classmethod
    def denied(cls, invocation_id: str, tool: str, decision: Decision,
               session: str | None = None) -> Result:
        """A call the policy refused: nothing ran, so cleanup is trivially verified."""
        return cls.build((invocation_id, tool, session), decision.backend, Reason.policy,
                         status=Status.denied, policy=decision.ref, limits=decision.limits,
                         cleanup=Cleanup(verified=True), message=decision.message,
                         approval=decision.approval)


# ---------------------------------------------------------------- readiness


class ProbeCheck(_Model):
    name: str  # e.g. "socket_blocked", "write_outside_blocked", "memory_limit", "unprivileged"
    ok: bool
    detail: str = ""


class ProbeReport(_Model):
    """Whether a backend's confinement holds, as proven by running probes through it."""

    backend: str
    ok: bool
    checks: list[ProbeCheck] = Field(default_factory=list)
    detail: str = ""
