"""A call's outputs on their way back: display items and their rules, streamed events, and
the audit bookkeeping that no result is lost and no execution unaudited."""
