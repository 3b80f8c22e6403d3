"""A result's in-process parts (a raw download's bytes, a file failure's problem code) are
never serialised: not in its JSON, not in its schema."""

from __future__ import annotations

import json

from sandboxd.models import Reason, Result


def _result() -> Result:
    result = Result.build(("inv_1", "read_file", "ses_1"), "workspace", Reason.exited,
                          exit_code=0, problem="file-missing")
    result.body = b"\x00secret bytes"
    return result


def test_body_and_problem_leave_no_trace_in_the_wire_forms() -> None:
    result = _result()
    assert result.problem == "file-missing" and result.body == b"\x00secret bytes"
    for form in (json.loads(result.wire_json()), result.wire(), result.model_dump(),
                 result.deliverable().wire()):
        assert "body" not in form and "problem" not in form
        assert "secret" not in json.dumps(form, default=str)


def test_they_survive_a_result_rewrite_and_stay_out_of_the_schema() -> None:
    copied = _result().model_copy(update={"message": "noted"})
    assert (copied.body, copied.problem) == (b"\x00secret bytes", "file-missing")
    schema = Result.model_json_schema(mode="serialization")["properties"]
    assert "body" not in schema and "problem" not in schema
