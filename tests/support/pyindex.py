"""A tiny Python package index on the fake internet (:mod:`.fakenet`): a wheel built here
(a zip with the package, its METADATA, WHEEL and RECORD; no build backend, no PyPI) and the
PEP 503 simple pages that link it, served over HTTPS by the fake internet's servers."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile

from tests.support.fakenet import FakeNet


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def build_wheel(name: str, version: str, source: str) -> bytes:
    """A pure-Python wheel of one package ``name`` whose ``__init__.py`` is ``source``."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sandboxd-tests\n"
                         b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return out.getvalue()


def publish(net: FakeNet, name: str, version: str, source: str) -> str:
    """Put the wheel and its simple pages on ``net`` (``/simple/``, ``/simple/<name>/``,
    ``/files/<wheel>``, the link carrying the wheel's sha256); returns the wheel's name."""
    wheel = build_wheel(name, version, source)
    filename = f"{name}-{version}-py3-none-any.whl"
    sha = hashlib.sha256(wheel).hexdigest()
    html = "<!DOCTYPE html><html><body>{}</body></html>\n"
    net.files[f"/files/{filename}"] = ("application/octet-stream", wheel)
    net.files["/simple/"] = ("text/html", html.format(f'<a href="{name}/">{name}</a>').encode())
    net.files[f"/simple/{name}/"] = ("text/html", html.format(
        f'<a href="/files/{filename}#sha256={sha}">{filename}</a>').encode())
    return filename
