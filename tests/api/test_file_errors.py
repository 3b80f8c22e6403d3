"""No 500 from a client's mistake on the file routes. A directory, a path
through a file, a name longer than the filesystem's limit: each is its own 4xx problem from the
one problem table on ``GET``/``PUT /v1/sessions/{id}/files/{path}``, an error result naming
what to do instead on the JSON tools and over MCP, never an OS error text nor a host path.
On the daemon's app in process (tests/support/inprocess.py: a real policy, real workspaces on
disk; the file tools run in the daemon, not in a sandbox)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from sandboxd.access.tokens import add_token
from sandboxd.backends import workspace_errors as workspace
from tests.support.inprocess import InProcessDaemon, inprocess_daemon
from tests.support.mcp_raw import RawMcp

PROBLEM = "application/problem+json"
POLICY = """\
version: 1
name: files
clients: ["*"]
tools:
  read_file: {paths: {allow: ["**"]}}
  write_file: {paths: {allow: ["**"]}}
  list_files: {paths: {allow: ["**"]}}
"""
LONG = "n" * 256  # one more byte than NAME_MAX


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    tmp = tmp_path_factory.mktemp("file-errors")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "files.yaml").write_text(POLICY)
    token = add_token(tmp / "tokens.yaml", "alice")
    env = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_TOKENS_FILE": str(tmp / "tokens.yaml")}
    with inprocess_daemon(tmp, policies_dir=tmp / "policies", env=env, token=token) as d:
        yield d


@pytest.fixture
def session(daemon: InProcessDaemon) -> Iterator[str]:
    """A session whose workspace has ``dir/sub/``, ``dir/a.txt``, ``f.txt``, ``ln`` (a
    symlink to ``dir``) and ``fifo``."""
    sid = daemon.client.post("/v1/sessions").json()["id"]
    ws = daemon.state_dir / "workspaces" / sid
    (ws / "dir" / "sub").mkdir(parents=True)
    (ws / "dir" / "a.txt").write_text("a")
    (ws / "f.txt").write_text("f")
    os.symlink("dir", ws / "ln")
    os.mkfifo(ws / "fifo")
    yield sid
    daemon.client.delete(f"/v1/sessions/{sid}")


def problem(daemon: InProcessDaemon, method: str, url: str, status: int, slug: str) -> str:
    """The problem's detail, after checking status, type, request id and no internals."""
    # sent exactly as written: no client-side normalisation of "." or "//" (the in-process
    # transport's raw_target, which httpx's URL would normalise)
    r = daemon.client.request(method, url, content=b"data" if method == "PUT" else None,
                              extensions={"raw_target": url.encode()})
    text = r.text
    assert r.status_code == status, (method, url, r.status_code, text)
    assert r.headers.get("content-type") == PROBLEM, r.headers
    body = json.loads(text)
    assert body["type"].endswith(f"/{slug}") and body["request_id"].startswith("inv_"), body
    assert_no_internals(daemon, text)
    return body["detail"]


def assert_no_internals(daemon: InProcessDaemon, text: str) -> None:
    assert "Errno" not in text and "Traceback" not in text, text
    assert str(daemon.state_dir) not in text and "/workspaces/" not in text, text


def test_a_directory_is_409_naming_list_files(daemon: InProcessDaemon, session: str) -> None:
    base = f"/v1/sessions/{session}/files/"
    ws = daemon.state_dir / "workspaces" / session
    for path in ("dir", "dir/", "dir/sub", "./dir//sub/", ".", "/workspace"):
        detail = problem(daemon, "GET", base + path, 409, "is-a-directory")
        assert "is a directory" in detail and "list_files" in detail, detail
    for path in ("dir", "dir/sub/"):  # a file cannot replace a directory: nothing changes
        detail = problem(daemon, "PUT", base + path, 409, "is-a-directory")
        assert "list_files" in detail, detail
    assert (ws / "dir" / "sub").is_dir() and (ws / "dir" / "a.txt").read_text() == "a"
    assert not list(ws.rglob(".sandboxd-*"))
    assert daemon.client.get(base + "dir/a.txt").content == b"a"  # the daemon still serves
    r = daemon.client.delete(base + "dir")  # no DELETE route: nothing is removed
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, PUT", r.headers
    assert (ws / "dir" / "a.txt").exists()
    # the OpenAPI document says a GET may answer 409
    doc = daemon.client.get("/openapi.json").json()
    assert "409" in doc["paths"]["/v1/sessions/{session_id}/files/{path}"]["get"]["responses"]


def test_a_directory_through_the_json_tools_and_mcp(daemon: InProcessDaemon, session: str) -> None:
    for tool, args in (("read_file", {"path": "dir"}),
                       ("read_file", {"path": "dir", "encoding": "base64"}),
                       ("write_file", {"path": "dir/sub", "content": "x"})):
        r = daemon.invoke(tool, args, session=session)
        assert r.status_code == 200, r.text
        result = r.json()
        assert result["status"] == "error" and "list_files" in result["message"], result
        assert_no_internals(daemon, r.text)
    mcp = RawMcp(daemon.url, daemon.headers, transport=daemon.transport)
    try:
        mcp.call("write_file", {"path": "d/x", "content": "x"})
        answer = mcp.call("read_file", {"path": "d"}, ident=7)
    finally:
        mcp.close()
    assert answer["id"] == 7 and answer["result"]["isError"] is True, answer
    text = answer["result"]["content"][0]["text"]
    assert "'d' is a directory" in text and "list_files" in text, text
    assert "nothing ran" not in text
    assert_no_internals(daemon, str(answer))


def test_a_path_through_a_file_is_409(daemon: InProcessDaemon, session: str) -> None:
    base = f"/v1/sessions/{session}/files/"
    for method in ("GET", "PUT"):
        detail = problem(daemon, method, base + "f.txt/x", 409, "not-a-directory")
        assert "'f.txt' is a file, not a directory" in detail, detail
        detail = problem(daemon, method, base + "f.txt/x/y", 409, "not-a-directory")
        assert "so 'f.txt/x/y' cannot exist" in detail, detail
    detail = problem(daemon, "GET", base + "fifo/x", 409, "not-a-directory")
    assert "'fifo' is a special file" in detail, detail
    assert problem(daemon, "GET", base + "fifo", 403, "path-refused")  # never opened to read
    assert (daemon.state_dir / "workspaces" / session / "f.txt").read_text() == "f"
    # list_files on a file: an error that says to read it (not a policy refusal)
    result = daemon.invoke("list_files", {"path": "f.txt"}, session=session).json()
    assert result["status"] == "error", result
    assert result["message"] == "'f.txt' is a file, not a directory; read it with read_file"


def test_a_symlink_on_the_path_is_still_refused(daemon: InProcessDaemon, session: str) -> None:
    base = f"/v1/sessions/{session}/files/"
    for method in ("GET", "PUT"):
        detail = problem(daemon, method, base + "ln/a.txt", 403, "path-refused")
        assert "'ln' is a symbolic link" in detail, detail
    result = daemon.invoke("list_files", {"path": "ln"}, session=session).json()
    assert result["status"] == "rejected" and "symbolic link" in result["message"], result


def test_a_name_too_long_is_refused_before_the_filesystem(daemon: InProcessDaemon,
                                                          session: str) -> None:
    """Over 255 bytes (NAME_MAX): the one path normalisation refuses it, like '..'."""
    base = f"/v1/sessions/{session}/files/"
    for method in ("GET", "PUT"):
        for path in (LONG, f"dir/{LONG}", f"{LONG}/x", quote("é" * 128)):
            detail = problem(daemon, method, base + path, 403, "path-refused")
            assert "names may be at most 255 bytes" in detail, detail
    assert problem(daemon, "GET", base + quote("é" * 127), 404, "file-not-found")  # 254 bytes
    result = daemon.invoke("list_files", {"path": LONG}, session=session).json()
    assert result["status"] == "denied" and "255 bytes" in result["message"], result


@pytest.mark.parametrize(("code", "error"), [
    (errno.EISDIR, workspace.IsADirectory), (errno.ENOTEMPTY, workspace.IsADirectory),
    (errno.ENOTDIR, workspace.NotADirectory), (errno.ENAMETOOLONG, workspace.PathRefused),
    (errno.EACCES, workspace.NotPermitted), (errno.EPERM, workspace.NotPermitted),
    (errno.ENOENT, workspace.FileMissing), (errno.EFBIG, workspace.TooLarge),
    (errno.EEXIST, workspace.FileToolError),
    (errno.ELOOP, workspace.PathRefused)])
def test_each_os_error_a_client_can_cause_has_its_error(code: int, error: type) -> None:
    """Without the OS's text nor the host path; the table gives each a 4xx."""
    from sandboxd.api.problems import PROBLEMS

    explained = workspace.explain(OSError(code, os.strerror(code), "/host/state/x"), "a/b")
    assert isinstance(explained, error), explained
    assert "/host" not in str(explained) and os.strerror(code) not in str(explained)
    if error is not workspace.PathRefused:
        assert 400 <= PROBLEMS[error.code][0] < 500


def test_an_os_error_no_client_causes_is_raised_as_it_is() -> None:
    """EIO, EMFILE...: the service's last resort, a 500 without internals, logs it."""
    exc = OSError(errno.EIO, "Input/output error")
    assert workspace.explain(exc, "a") is exc


def test_a_download_claims_no_charset_and_any_type_is_documented(daemon: InProcessDaemon,
                                                                 session: str) -> None:
    """The type is guessed from the name, but the bytes are the file's: no ``charset`` is
    claimed for them (latin-1 text stays latin-1), and the OpenAPI document allows any type."""
    url = f"/v1/sessions/{session}/files/latin1.txt"
    assert daemon.client.put(url, content=b"caf\xe9").status_code == 200
    got = daemon.client.get(url)
    assert got.status_code == 200 and got.content == b"caf\xe9"
    assert got.headers["content-type"] == "text/plain", got.headers
    doc = daemon.client.get("/openapi.json").json()
    ok = doc["paths"]["/v1/sessions/{session_id}/files/{path}"]["get"]["responses"]["200"]
    assert list(ok["content"]) == ["*/*"], ok
