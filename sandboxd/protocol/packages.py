"""Where a session's packages live, defined once for the daemon and the container runner
(``install_packages``: if the two disagreed, an installed package would not import).
Standard library only, like the rest of the contract.

A container session's ``install_packages`` call installs into :data:`SITE_DIR` of its
workspace (so its bytes and files count against the session's quota and the files go with
the workspace); every python call of a container (one-shot or kernel) finds that directory on
``sys.path`` right after the workspace itself. The admin's wheelhouse is mounted read-only at
:data:`WHEELHOUSE_MOUNT` in session containers when the ``wheelhouse`` setting is set.
"""

from __future__ import annotations

WORKSPACE = "/workspace"
#: the installed packages of a session, relative to its workspace
SITE_DIR = ".site-packages"
#: the wheelhouse in a session container (read-only)
WHEELHOUSE_MOUNT = "/opt/wheelhouse"

#: an ``install_packages`` call of a session whose container was made before the wheelhouse
#: existed (a container keeps the mounts it was made with)
WHEELHOUSE_CAME_LATER = (
    "install_packages cannot install in this session: its container was made before the "
    "administrator's wheelhouse existed, and a container keeps the mounts it was made with; "
    "create a new session (its container gets the wheelhouse) and install there")
