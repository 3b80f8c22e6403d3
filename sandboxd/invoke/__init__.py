"""The invoke path's parts outside the service: a call in its slot and workspace
(:mod:`~sandboxd.invoke.execute`), and what is said on its result afterwards
(:mod:`~sandboxd.invoke.steps`)."""
