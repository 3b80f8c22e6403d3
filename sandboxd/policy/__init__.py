"""The policy engine: YAML policy files, validation with file:line:column, decisions, reload.

Public interface: :class:`PolicyStore` (load / reload / watch / tools_for / decide) and
:class:`PolicyError`. See ``policies/default.yaml`` for the file format, annotated.
"""

from sandboxd.policy.loader import LoadedPolicy, PolicyError, PolicySet, load_file, load_set
from sandboxd.policy.store import PolicyStore, embedded_policies_dir

__all__ = [
    "LoadedPolicy",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "embedded_policies_dir",
    "load_file",
    "load_set",
]
