"""Binary files on the container backend: a file uploaded raw is what the session's
container sees (``sha256sum`` inside it), and a file a program in the container wrote comes back
byte for byte through the raw download (real daemon, real Docker)."""

from __future__ import annotations

import hashlib
import random
import secrets
from pathlib import Path
from typing import Any

from tests.support.daemon import running_daemon

from .conftest import labelled
from .test_http import daemon_env

POLICY = """\
version: 1
name: container-files
clients: ["*"]
limits: {timeout: 30s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 1Mi, max_output: 8Mi}
network: none
tools:
  python:
    backend: container
    imports: {allow: []}
  shell:
    backend: container
    commands: {allow: [sha256sum, wc]}
  read_file: {paths: {allow: ["**"]}, max_bytes: 4Mi}
  write_file: {paths: {allow: ["**"]}, max_bytes: 4Mi}
"""


def test_uploaded_bytes_are_what_the_container_sees(docker_client: Any,
                                                    tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "files.yaml").write_text(POLICY)
    instance = f"files{secrets.token_hex(4)}"
    data = bytes(range(256)) + random.Random(7).randbytes(2 * 1024 * 1024)
    with running_daemon(tmp_path, policies_dir=policies, env=daemon_env(instance)) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        put = d.client.put(f"/v1/sessions/{sid}/files/in/blob.bin", content=data)
        assert put.status_code == 200, put.text
        r = d.invoke("shell", {"command": "sha256sum in/blob.bin"}, session=sid).json()
        assert r["status"] == "ok" and r["backend"] == "container", r
        assert r["stdout"].split()[0] == hashlib.sha256(data).hexdigest(), r
        r = d.invoke("shell", {"command": "wc -c in/blob.bin"}, session=sid).json()
        assert int(r["stdout"].split()[0]) == len(data), r
        # the other way: bytes a sandboxed program wrote, fetched raw
        code = ("with open('out.bin', 'wb') as f:\n"
                "    f.write(bytes(range(255, -1, -1)) * 1024)\n")
        r = d.invoke("python", {"code": code}, session=sid).json()
        assert r["status"] == "ok", r
        got = d.client.get(f"/v1/sessions/{sid}/files/out.bin")
        assert got.status_code == 200, got.text
        assert got.content == bytes(range(255, -1, -1)) * 1024
        assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''out.bin"
        assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert labelled(docker_client, instance) == []
