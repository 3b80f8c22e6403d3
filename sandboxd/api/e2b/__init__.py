"""E2B's wire protocol, so that E2B's own SDKs (and what is built on them) run against
sandboxd by their environment alone (docs/e2b.md): the control plane
(:mod:`~sandboxd.api.e2b.control`), the code interpreter (:mod:`~sandboxd.api.e2b.interpreter`) and
envd's process and filesystem services (:mod:`~sandboxd.api.e2b.process`,
:mod:`~sandboxd.api.e2b.files`). Every operation is a call of the service's own (policy,
limits, slots, audit, cleanup) by the client the presented token names."""

from __future__ import annotations

from fastapi import FastAPI

from sandboxd.service import Sandboxd


def install(app: FastAPI, service: Sandboxd) -> None:
    """Mount E2B's routes on the daemon's app (both planes at its root, as one URL)."""
    from sandboxd.api.e2b import control, files, interpreter, process
    from sandboxd.api.e2b.sandboxes import Sandboxes

    app.state.e2b = Sandboxes(service)
    for module in (control, interpreter, process, files):
        app.include_router(module.router)
