"""The container backend: Docker containers with a warm pool and fork-per-call session
containers (see :mod:`sandboxd.backends.container.backend`)."""

from sandboxd.backends.container.backend import ContainerBackend

__all__ = ["ContainerBackend"]
