"""Policy on the past: every call the audit log holds a ``decision`` record of, decided again
under other policies (``sandboxd policy replay``), with what would change.

What an audit record allows to re-decide: the record keeps ``args_preview`` (the arguments'
JSON, redacted and cut to 1024 characters) and ``args_sha256`` (the digest of the full
arguments' canonical JSON). A call is re-decided only when the preview parses and its digest is
the recorded one: the preview *is* the arguments. Otherwise (long code or content was cut, a
secret-looking value was redacted) the call is *undecidable*, counted and listed, never taken
as unchanged. The limits a call asked for are not recorded: replay takes the limits a call got
as what it asked for, so it finds the limits a stricter policy lowers, not those a looser one
would raise. Calls refused before any decision (an unknown tool, invalid arguments) have no
decision record and are not replayed.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.audit.encoding import canonical_json
from sandboxd.audit.files import chain_files
from sandboxd.audit.reader import read_records
from sandboxd.models import Decision, LimitsRequest
from sandboxd.protocol.limits import LIMITS

#: the decision of one call under the new policies: ``(client, tool, arguments, requested)``
Decider = Callable[[str, str, dict[str, Any], LimitsRequest | None], Decision]

#: what the daemon names its audit log in the state directory (:attr:`Settings.audit_path`)
AUDIT_NAME = "audit.jsonl"


class AuditPathError(ValueError):
    """``--audit`` names no audit log (the message is one line naming the path)."""


def audit_log_path(path: Path) -> Path:
    """The audit log ``path`` names: a log file (its rotated files are read too), or a
    directory holding ``audit.jsonl`` or exactly one ``*.jsonl`` log."""
    if path.is_dir():
        return _log_in(path)
    if not chain_files(path):
        raise AuditPathError(f"{path}: no such audit log")
    return path


def _log_in(directory: Path) -> Path:
    """The audit log a directory holds: ``audit.jsonl`` (or its rotated files), else its one
    ``*.jsonl`` file."""
    if (directory / AUDIT_NAME).exists() or chain_files(directory / AUDIT_NAME):
        return directory / AUDIT_NAME
    logs = sorted(directory.glob("*.jsonl"))
    if len(logs) != 1:
        raise AuditPathError(f"{directory}: no audit log in this directory (expected "
                             f"{AUDIT_NAME}{', found ' + str(len(logs)) if logs else ''})")
    return logs[0]


def decision_records(path: Path, client: str | None = None) -> Iterator[dict[str, Any]]:
    """The ``decision`` records of the log at ``path`` (rotated files first), oldest first."""
    for record in read_records(audit_log_path(path)):
        if record.get("event") == "decision" and (client is None
                                                  or record.get("client") == client):
            yield record


def recorded_arguments(record: dict[str, Any]) -> dict[str, Any] | str:
    """The call's full arguments, or why the record does not hold them."""
    text = record.get("args_preview")
    if not isinstance(text, str):
        return "no arguments recorded"
    try:
        args = json.loads(text)
    except ValueError:
        return "arguments cut in the record (too long to record whole)"
    if not isinstance(args, dict):
        return "arguments recorded are not an object"
    if hashlib.sha256(canonical_json(args)).hexdigest() != record.get("args_sha256"):
        return "arguments redacted in the record (a value looked like a secret)"
    return args


def recorded_request(record: dict[str, Any]) -> LimitsRequest | None:
    """The limits the call got, as what it asked for (requests are not recorded)."""
    limits = record.get("limits")
    if not isinstance(limits, dict):
        return None
    try:
        return LimitsRequest.model_validate({k: limits[k] for k in LIMITS if k in limits})
    except ValueError:
        return None


@dataclass
class Change:
    """One call whose decision changes (or that cannot be re-decided)."""

    kind: str  # one of KINDS
    request_id: str
    client: str
    tool: str
    was_rule: str
    rule: str  # the new rule; the reason for an undecidable call
    detail: str  # the new denial's message, the limits that change

    @classmethod
    def of(cls, record: dict[str, Any], kind: str, rule: str, detail: str) -> Change:
        """The change ``kind`` of the call ``record`` holds."""
        return cls(kind, str(record.get("request_id")), str(record.get("client")),
                   str(record.get("tool")), str(record.get("rule")), rule, detail)

    def to_json(self) -> dict[str, str]:
        return self.__dict__.copy()


ALLOWED_DENIED, DENIED_ALLOWED = "allowed → denied", "denied → allowed"
LIMITS_CHANGED, UNDECIDABLE = "limits changed", "undecidable"
#: an allowed call that would now wait for a person's yes (``approve:``), or no longer would
NEEDS_APPROVAL, APPROVAL_DROPPED = "needs approval", "no longer needs approval"
KINDS = (ALLOWED_DENIED, DENIED_ALLOWED, NEEDS_APPROVAL, APPROVAL_DROPPED, LIMITS_CHANGED,
         UNDECIDABLE)


@dataclass
class Replay:
    """What :func:`replay` found."""

    calls: int = 0
    unchanged: int = 0
    changes: list[Change] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for c in self.changes if c.kind == kind)

    @property
    def changed(self) -> bool:
        return any(c.kind != UNDECIDABLE for c in self.changes)

    def by_rule(self) -> Counter[tuple[str, str]]:
        """``(kind, rule) -> count`` of the changes (the new rule; the reason if undecidable)."""
        return Counter((c.kind, c.rule) for c in self.changes)

    def by_client(self) -> Counter[tuple[str, str]]:
        """``(client, kind) -> count``."""
        return Counter((c.client, c.kind) for c in self.changes)

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "unchanged": self.unchanged,
                "counts": {k: self.count(k) for k in KINDS},
                "changes": [c.to_json() for c in self.changes],
                "by_rule": [{"kind": k, "rule": r, "count": n}
                            for (k, r), n in sorted(self.by_rule().items())],
                "by_client": [{"client": c, "kind": k, "count": n}
                              for (c, k), n in sorted(self.by_client().items())]}


def _fmt(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _granted(limits: Any, network: Any, backend: Any) -> dict[str, Any]:
    """What a call gets, by name: its limits, its network and its backend."""
    return {**(limits if isinstance(limits, dict) else {}), "network": network,
            "backend": backend}


def _limit_changes(record: dict[str, Any], decision: Decision) -> str:
    """``timeout_s 60 → 30, network none → lab`` for what the new decision changes."""
    plan = decision.plan  # (a decision's limits are its plan's)
    was = _granted(record.get("limits"), record.get("network"), record.get("backend"))
    now = (_granted(plan.limits.to_wire(), plan.network, decision.backend) if plan is not None
           else _granted(None, None, decision.backend))
    return ", ".join(f"{name} {_fmt(was[name])} → {_fmt(now[name])}"
                     for name in (*LIMITS, "network", "backend")
                     if name in was and name in now and was[name] != now[name])


#: what a changed call's :class:`Change` says besides its record: ``(kind, rule, detail)``
_Found = tuple[str, str, str]


def _change(record: dict[str, Any], decision: Decision) -> _Found | None:
    """How ``decision`` differs from the one ``record`` holds, or None: allowed or denied
    now, else (a call allowed before and now) its approval or its limits."""
    was_allowed = record.get("decision") == "allow"
    if was_allowed != decision.allowed:
        return ((ALLOWED_DENIED, decision.rule, decision.message or "") if was_allowed
                else (DENIED_ALLOWED, decision.rule, ""))
    return _allowed_change(record, decision) if was_allowed else None


def _allowed_change(record: dict[str, Any], decision: Decision) -> _Found | None:
    """What changes for a call allowed before and now: whether it waits for a person's yes,
    else its limits, network or backend."""
    gate, was_gated = decision.approve, record.get("approve")
    if gate is not None and not was_gated:
        return NEEDS_APPROVAL, gate.rule, "approvers: " + (", ".join(gate.by) or "-")
    if gate is None and was_gated:
        return APPROVAL_DROPPED, decision.rule, f"was {was_gated}"
    detail = _limit_changes(record, decision)
    return (LIMITS_CHANGED, decision.rule, detail) if detail else None


def replay(records: Iterable[dict[str, Any]], decide: Decider) -> Replay:
    """Decide every recorded call again with ``decide`` and collect what changes."""
    out = Replay()
    # a log repeats itself (the same `ls`, the same import): one decision per distinct call
    seen: dict[tuple[str, str, str, str], Decision] = {}
    for record in records:
        out.calls += 1
        args = recorded_arguments(record)
        if isinstance(args, str):
            out.changes.append(Change.of(record, UNDECIDABLE, args, ""))
            continue
        client, tool = str(record.get("client")), str(record.get("tool"))
        key = (client, tool, str(record.get("args_sha256")),
               json.dumps(record.get("limits"), sort_keys=True))
        if key not in seen:
            seen[key] = decide(client, tool, args, recorded_request(record))
        found = _change(record, seen[key])
        if found is None:
            out.unchanged += 1
        else:
            out.changes.append(Change.of(record, *found))
    return out
