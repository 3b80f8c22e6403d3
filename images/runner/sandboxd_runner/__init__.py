"""sandboxd runner: runs inside a sandbox container and starts a fresh process per call.

Started by the container's init (docker-init / tini) as uid 10001, before any user code
exists. It makes itself non-dumpable (same-uid code cannot read its memory or fds through
/proc, nor ptrace it), reads the 32-byte key the daemon left in /run/sandboxd/key, connects
once to /run/sandboxd/runner.sock and says hello with the key. The daemon then removes the
socket and the key: that one channel carries every call of the container, multiplexed by call
id (frames of sandboxd/protocol/wire.py). The import, path and output rules are
sandboxd/protocol/rules.py, from the same package: one definition.

Each call gets a *worker* process (its own session and process group, oom_score_adj 1000,
stdin /dev/null, the environment the request names and nothing else): a command plan that is
one plain program is started with posix_spawn; any other plan (pipes, ``&&``/``||``/``;``,
redirects, an exec restriction) runs in a fork that executes it (never through a shell: see
:mod:`.plans`); python code runs in a fork of this interpreter (modules pre-imported, GC
frozen). One select loop relays every worker's stdout/stderr as frames, stops a worker when
the output cap is reached, the pids limit is hit or the daemon says stop, and finally sends
the exit status, rusage and the cgroup's OOM/pids events.

A session's python calls (``"kernel": true``) run instead in the container's *kernel*: one
persistent interpreter forked like a worker and kept between calls, so that their globals
persist (see :mod:`.kernel`); ``{"kind": "kernel_stop"}`` ends it. A kernel
call ends only once the runner has proven from /proc that the kernel is idle, and the daemon
interrupts a kernel call (SIGINT: a KeyboardInterrupt in its code) before it kills it.

Restarts keep sessions (a daemon upgrade must not lose a session's state):
``{"kind": "suspend", "key": <hex>}``, sent by a daemon
that stops and keeps the session, is answered at once (``{"message": "suspended"}``); when the
daemon then hangs up with no call running, the runner keeps its kernel and connects again to
/run/sandboxd/runner.sock, which the next daemon binds anew, saying hello with that one-time
key (forgotten once sent); no daemon within 15 minutes: the kernel is stopped and it exits.

  daemon -> runner  b"R" JSON request (new call id), b"K" stop that call, b"I" interrupt that
                    call (a kernel call: see :mod:`.kernel`; other calls ignore it),
                    b"i" bytes for that call's stdin, b"c" its end (a plan with
                    ``"stdin": true``: its stdin is a pipe, else /dev/null; others ignore them)
  runner -> daemon  b"h" the key (call 0, once), b"o" stdout bytes, b"e" stderr bytes,
                    b"d" a display item (sandboxd/protocol/display.py), b"x" JSON exit record (ends
                    the call)

Display items: python code gets a ``display(*objs)`` builtin (IPython's rich-repr
conventions; a cell's rich last value and the matplotlib figures it leaves open, or shows
with ``plt.show()``, are displayed too). The user's process writes each item as a ``d``
frame on a pipe of its own; the runner reads that pipe with a bounded decoder (the call's
caps) and relays the frames; the daemon checks every item again (sandboxd/results/outputs.py).

Python only (standard library); runs on the image's python3 (3.11 or 3.12).

The modules, in the order a call meets them: :mod:`.channel` (key, connection, frames),
:mod:`.main` (the loop), :mod:`.calls` (a one-shot call), :mod:`.worker` (its process),
:mod:`.plans` and :mod:`.landlock` (command plans, exec restriction), :mod:`.execution`,
:mod:`.displays` and :mod:`.interrupts` (python code), :mod:`.kernel`, :mod:`.kernel_loop` and
:mod:`.kernel_calls` (the session kernel), :mod:`.base` (what they share).

In the image: ``/opt/sandboxd/runner.py`` (the entry point) puts ``/opt/sandboxd`` first on
``sys.path``, where this package and the contract, as ``sandboxd/protocol/`` (the daemon's own
package name: no clash with a user's ``protocol.py``), are installed. User code runs in forks
of the runner, so these modules are in its ``sys.modules`` (``/opt/sandboxd`` is taken off its
``sys.path``): importing one is subject to the policy's import rule like any module, and
gives nothing the process does not have already - it is the same uid in the same container,
the channel's fd is closed and the key is gone before user code runs.
"""
