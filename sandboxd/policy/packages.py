"""``install_packages``: the decision and the command it runs in a container session.

The python tool's ``packages.allow`` lists what may be installed (``name`` or
``name==version``, compared after PEP 503 normalisation). A call naming anything else is
denied before anything runs, with the allowed set in its message. An allowed call runs pip
inside the session's container, from the wheel of pip in the admin's wheelhouse (the image
needs no pip), with ``--no-index --find-links`` on the read-only wheelhouse mount and
``--only-binary=:all:`` (no build step, so no code of a package runs while it is installed),
into :data:`~sandboxd.protocol.packages.SITE_DIR` of the session's workspace. Dependencies
are whatever the requested packages require, resolved by pip from the wheelhouse alone: the
wheelhouse is the closed set the admin published.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from sandboxd.models import Decision
from sandboxd.policy.checks import fixed_modules, open_python_backends
from sandboxd.policy.models import PythonTool, allowed_packages, normalise_package
from sandboxd.policy.specs import listing
from sandboxd.protocol.packages import SITE_DIR, WHEELHOUSE_MOUNT, WORKSPACE
from sandboxd.protocol.plan import Plan

if TYPE_CHECKING:
    from sandboxd.policy.engine import _Ctx

#: runs pip from the newest pip wheel of the wheelhouse (``python3 -I -c BOOTSTRAP args``)
BOOTSTRAP = f"""\
import glob, os, sys
def version(path):
    return [int(p) if p.isdigit() else -1 for p in os.path.basename(path).split("-")[1].split(".")]
if not os.path.isdir({WHEELHOUSE_MOUNT!r}):
    sys.exit("install_packages: no wheelhouse is mounted in this session's container")
wheels = sorted(glob.glob({WHEELHOUSE_MOUNT + '/pip-*-py3-none-any.whl'!r}), key=version)
if not wheels:
    sys.exit("install_packages: the wheelhouse holds no wheel of pip (the installer); the "
             "administrator can add one with: sandboxd wheelhouse add pip")
sys.path.insert(0, wheels[-1])
from pip._internal.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def install_argv(requirements: list[str]) -> list[str]:
    """The argv that installs ``requirements`` (checked names, or ``name==version`` from the
    policy) from the wheelhouse into the session's site directory."""
    return ["python3", "-I", "-c", BOOTSTRAP, "install", "--isolated", "--no-index",
            "--find-links", WHEELHOUSE_MOUNT, "--only-binary=:all:",
            "--target", posixpath.join(WORKSPACE, SITE_DIR), "--no-cache-dir",
            "--disable-pip-version-check", "--no-input", "--no-compile",
            "--no-warn-script-location", "--progress-bar", "off", *requirements]


def decide_packages(ctx: _Ctx, cfg: PythonTool, arguments: dict[str, Any]) -> Decision:
    """The decision for one ``install_packages`` call ."""
    allowed = allowed_packages(cfg.packages.allow)
    shown = listing(sorted(allowed.values()))
    if fixed_modules(cfg.backend) is not None:
        return ctx.deny("tools.python.backend", (
            f"install_packages needs a container session: python runs on the {cfg.backend} "
            f"backend here, which offers a fixed set of modules; use a policy whose python "
            f"tool has backend: {open_python_backends()}."))
    requested = [str(name) for name in arguments.get("packages") or ()]
    refused = [name for name in requested if normalise_package(name) not in allowed]
    if refused:
        names = ", ".join(f"`{name}`" for name in refused)
        return ctx.deny("tools.python.packages.allow",
                        f"Installing {names} is not allowed here; allowed packages: {shown}.")
    requirements = list(dict.fromkeys(allowed[normalise_package(n)] for n in requested))
    return ctx.allow("tools.python.packages.allow", cfg.limits, None,
                     command=Plan.single(install_argv(requirements)), image=cfg.image)

