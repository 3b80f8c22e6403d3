"""A call's display items (:class:`Output`, :class:`Position`, :func:`in_order`): defined in the
client package, which reads them too (:mod:`sandboxd_client.output_items`)."""

from sandboxd_client.output_items import Output, Position, in_order

__all__ = ["Output", "Position", "in_order"]
