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
        if (path / AUDIT_NAME).exists() or chain_files(path / AUDIT_NAME):
            return path / AUDIT_NAME
        logs = sorted(p for p in path.glob("*.jsonl"))
        if len(logs) != 1:
            raise AuditPathError(f"{path}: no audit log in this directory (expected "
                                 f"{AUDIT_NAME}{', found ' + str(len(logs)) if logs else ''})")
        return logs[0]
    if not chain_files(path):
        raise AuditPathError(f"{path}: no such audit log")
    return path


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


def _limit_changes(record: dict[str, Any], decision: Decision) -> str:
    """``timeout_s 60 → 30, network none → lab`` for what the new decision changes."""
    out: list[str] = []
    old = record.get("limits")
    old = old if isinstance(old, dict) else {}
    new = decision.limits.to_wire() if decision.limits is not None else {}
    for name in LIMITS:
        if name in old and name in new and old[name] != new[name]:
            out.append(f"{name} {_fmt(old[name])} → {_fmt(new[name])}")
    plan = decision.plan
    was_net, net = record.get("network"), plan.network if plan is not None else None
    if was_net != net:
        out.append(f"network {_fmt(was_net)} → {_fmt(net)}")
    if record.get("backend") != decision.backend:
        out.append(f"backend {_fmt(record.get('backend'))} → {_fmt(decision.backend)}")
    return ", ".join(out)


def replay(records: Iterable[dict[str, Any]], decide: Decider) -> Replay:
    """Decide every recorded call again with ``decide`` and collect what changes."""
    out = Replay()
    # a log repeats itself (the same `ls`, the same import): one decision per distinct call
    seen: dict[tuple[str, str, str, str], Decision] = {}
    for record in records:
        out.calls += 1
        rid, client = str(record.get("request_id")), str(record.get("client"))
        tool, was_rule = str(record.get("tool")), str(record.get("rule"))
        args = recorded_arguments(record)
        if isinstance(args, str):
            out.changes.append(Change(UNDECIDABLE, rid, client, tool, was_rule, args, ""))
            continue
        key = (client, tool, str(record.get("args_sha256")),
               json.dumps(record.get("limits"), sort_keys=True))
        if key not in seen:
            seen[key] = decide(client, tool, args, recorded_request(record))
        decision = seen[key]
        was_allowed = record.get("decision") == "allow"
        if was_allowed and not decision.allowed:
            out.changes.append(Change(ALLOWED_DENIED, rid, client, tool, was_rule,
                                      decision.rule, decision.message or ""))
        elif not was_allowed and decision.allowed:
            out.changes.append(Change(DENIED_ALLOWED, rid, client, tool, was_rule,
                                      decision.rule, ""))
        elif was_allowed and decision.approve is not None and not record.get("approve"):
            out.changes.append(Change(NEEDS_APPROVAL, rid, client, tool, was_rule,
                                      decision.approve.rule, "approvers: " + (
                                          ", ".join(decision.approve.by) or "-")))
        elif was_allowed and decision.approve is None and record.get("approve"):
            out.changes.append(Change(APPROVAL_DROPPED, rid, client, tool, was_rule,
                                      decision.rule, f"was {record.get('approve')}"))
        elif was_allowed and (detail := _limit_changes(record, decision)):
            out.changes.append(Change(LIMITS_CHANGED, rid, client, tool, was_rule,
                                      decision.rule, detail))
        else:
            out.unchanged += 1
    return out
