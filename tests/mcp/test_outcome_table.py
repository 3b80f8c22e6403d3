"""The MCP outcome table beside the HTTP problem table: the same problems, and each answered
as the MCP spec divides them (a JSON-RPC error for a request MCP cannot serve, a tool error
the model reads for a call that could not run)."""

from __future__ import annotations

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

import sandboxd.api.mcp.handles  # noqa: F401  # its HandleLimit too, for the walk below
from sandboxd.api.mcp.meta import ARGUMENT_ERRORS_AS_RESULTS
from sandboxd.api.mcp.results import problem_answer
from sandboxd.api.problems import INVALID_PARAMS, INVALID_REQUEST, MCP_ANSWERS, PROBLEMS
from sandboxd.errors import AuditFailure, SandboxdError, ServiceError, UnknownTool
from sandboxd.models import Reason, Result
from sandboxd.scheduler import Overloaded
from sandboxd.sessions.record import SessionError, SessionNotFound
from sandboxd.tools import ArgumentsInvalid

OLD = "2025-06-18"  # a revision before bad arguments became tool errors


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(c) for c in found))


def test_both_tables_cover_the_same_problems() -> None:
    assert set(MCP_ANSWERS) == set(PROBLEMS)


def test_every_refusal_of_a_call_has_an_answer() -> None:
    """Every service and session error (what a call's ``invoke`` raises) has a row: none
    leaves MCP as the SDK's internal error."""
    raised = {c for c in _subclasses(SandboxdError) if issubclass(c, ServiceError | SessionError)
              and c.code not in ("service-error", "session-error")}  # bases, never raised
    assert raised and {c.code for c in raised} <= set(MCP_ANSWERS)


def test_json_rpc_codes_are_the_sdks() -> None:
    assert (INVALID_PARAMS, INVALID_REQUEST) == (types.INVALID_PARAMS, types.INVALID_REQUEST)
    assert {a.rpc for a in MCP_ANSWERS.values()} == {None, INVALID_PARAMS, INVALID_REQUEST}


def test_an_unknown_tool_is_invalid_params_in_every_revision() -> None:
    exc = UnknownTool("nope", ["python"])
    for version in (OLD, ARGUMENT_ERRORS_AS_RESULTS):
        with pytest.raises(MCPError) as raised:
            problem_answer(exc, MCP_ANSWERS[exc.code], version, "ses_1")
        assert raised.value.error.code == INVALID_PARAMS
        assert raised.value.error.data == {"tool": "nope", "available": ["python"]}


def test_bad_arguments_are_a_tool_error_from_sep_1303_on() -> None:
    exc = ArgumentsInvalid("python", "code", "is required")
    answer = MCP_ANSWERS[exc.code]
    with pytest.raises(MCPError) as raised:
        problem_answer(exc, answer, OLD, "ses_1")
    assert raised.value.error.data == {"tool": "python", "field": "code",
                                       "problem": "is required"}
    result = problem_answer(exc, answer, ARGUMENT_ERRORS_AS_RESULTS, "ses_1")
    assert result.is_error and len(result.content) == 1  # names no session: nothing ran
    assert result.content[0].text == (f"nothing ran: {exc}; fix the arguments and call "
                                      "again")


def test_tool_errors_say_what_happened_and_name_the_session() -> None:
    busy = problem_answer(Overloaded("queue full", 0), MCP_ANSWERS["overloaded"], OLD, "s1")
    assert busy.content[0].text == "sandboxd is busy, nothing ran: queue full; retry in 1 s"
    assert "s1" in busy.content[-1].text
    gone = problem_answer(SessionNotFound("no session s1"), MCP_ANSWERS["unknown-session"],
                          OLD, "s1")
    assert [c.text for c in gone.content] == ["nothing ran: no session s1"]
    ran = Result.build(("inv_1", "python", None), "restricted", Reason.exited, exit_code=0,
                       stdout="42")
    audit = problem_answer(AuditFailure("audit log unwritable", storage=False, result=ran),
                           MCP_ANSWERS["audit-failure"], OLD, None)
    assert audit.is_error and audit.content[0].text == "audit log unwritable"
    assert audit.structured_content is not None and audit.structured_content["id"] == "inv_1"
