"""Wheels made on the spot, without a network: a tiny pure-Python package (its modules and
requirements given), and a wheel of the pip this venv runs (the installer ``install_packages``
runs from the wheelhouse)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str | bytes],
               requires: tuple[str, ...] = ()) -> Path:
    """``<directory>/<name>-<version>-py3-none-any.whl`` holding ``files`` (path -> content)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = {path: data.encode() if isinstance(data, str) else data
               for path, data in files.items()}
    entries[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}").encode()
    entries[f"{dist}.dist-info/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: sandboxd-tests\n"
                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = f"{dist}.dist-info/RECORD"
    lines = [_record_line(p, d) for p, d in entries.items()] + [f"{record},,"]
    entries[record] = ("\n".join(lines) + "\n").encode()
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in entries.items():
            zf.writestr(arc, data)
    path.chmod(0o644)
    return path


def make_pip_wheel(directory: Path) -> Path:
    """A wheel of this venv's pip (its package files as installed), in ``directory``."""
    import pip

    package = Path(pip.__file__).parent
    files: dict[str, str | bytes] = {
        f"pip/{p.relative_to(package).as_posix()}": p.read_bytes()
        for p in sorted(package.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".exe"}
    return make_wheel(directory, "pip", pip.__version__, files)
