"""The one deadline idiom (:func:`within`, :func:`stop_task`): defined in the client package,
whose agent loop bounds its local tools with it too (:mod:`sandboxd_client.deadline`)."""

from sandboxd_client.deadline import stop_task, within

__all__ = ["stop_task", "within"]
