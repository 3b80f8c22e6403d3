"""The restricted backend: RestrictedPython inside a confined, pre-forked worker process.

Two layers, both required (design section 7, issue 3):

* :mod:`.lang` - the language layer (RestrictedPython, guards, module proxies, output cap,
  workspace-confined ``open``), running inside the worker;
* :mod:`.confine` / :mod:`.zygote` - the process layer: a single-threaded zygote forks one
  fresh worker per call, which confines itself (process group, cgroup, chroot, no_new_privs,
  unprivileged uid, rlimits, seccomp) before compiling the user's code;
* :mod:`.backend` - :class:`RestrictedBackend`, the daemon side (``Backend`` protocol).
"""

from sandboxd.backends.restricted.backend import RestrictedBackend

__all__ = ["RestrictedBackend"]
