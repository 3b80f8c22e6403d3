"""The daemon's own build of its missing sandbox images (setting ``build_images``: the
profiles to build, e.g. ``python,datascience``; ``make run`` sets it).

At start the container backend runs ``sandboxd images build --offline --if-missing --profile
P`` for each profile, one after the other, in the background: the daemon serves at once
(``python`` on the restricted backend), and until an image is built every tool that needs it
answers 503 saying so, with the build's progress (``image sandboxd/python:latest is being
built (step 5/15)``), as ``/readyz`` does. When a build ends the backend checks its images
again at once (no restart).

Bounded by construction: one build at a time, each a child process in its own process group
(killed with its children when the daemon stops, or after :data:`BUILD_TIMEOUT_S`; tied to
the daemon by ``PR_SET_PDEATHSIG``, so a daemon killed with SIGKILL leaves no build), its
output read line by line with a length bound, only its last lines kept. A failed build is
reported (the 503 and ``/readyz`` say why), never retried: ``sandboxd images build`` by hand,
or a restart, tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from sandboxd.backends.container.config import ContainerConfig
from sandboxd.config.images import DEFAULT_PROFILE, PROFILES
from sandboxd.util.deadline import stop_task, within

log = logging.getLogger("sandboxd.container")

#: longest one profile's build may take (a data-science build offline: minutes)
BUILD_TIMEOUT_S = 3600.0
#: longest output line read from a build (a longer one ends the build: not a build's output)
MAX_LINE = 64 * 1024
#: how many of a build's last output lines are kept for a failure's message
TAIL_LINES = 20
_STEP = re.compile(r"^\s*step: Step (\d+)/(\d+) :")
_STAGE = re.compile(r"^building (\S+[:/]\S*) ")  # "building sandboxd/python:latest FROM ..."
_BASE = re.compile(r"^building the base rootfs (\S+)")
#: names the daemon's pid to a build it started: the build dies with it (``images build``)
DIE_WITH_ENV = "SANDBOXD_BUILD_DIES_WITH"
#: the build states that make an image's tools wait (503)
PENDING = frozenset({"waiting", "checking", "building"})


@dataclass
class ImageBuild:
    """One profile's build as the daemon sees it."""

    profile: str
    images: tuple[str, ...]  # what it makes (the python profile: python_image and shell_image)
    state: str = "waiting"  # waiting, checking, building, built, up to date, failed
    stage: str | None = None  # the image being built now (a profile's package layer first)
    step: str | None = None  # "5/15": the engine's step of ``stage``
    detail: str | None = None  # why it failed
    #: how a build that did not fail ended (built, up to date), while its state stays
    #: "checking" until the backend has looked at its images since (:meth:`ImageBuilds.settle`)
    ended: str | None = None
    tail: list[str] = field(default_factory=list)

    def progress(self) -> str:
        """What the build is doing, in a few words."""
        if self.state != "building":
            return self.state
        where = (f"step {self.step}" if self.step and self.step[0].isdigit()
                 else self.step or "starting")
        if self.stage and self.stage not in self.images:
            where += f" of {self.stage}"
        return where

    def report(self) -> dict[str, object]:
        """The ``/readyz`` view."""
        return {"profile": self.profile, "state": self.state, "step": self.step,
                "stage": self.stage, "detail": self.unavailable(self.images[0])}

    def unavailable(self, image: str) -> str | None:
        """Why ``image`` cannot serve because of this build (None: the build is not why)."""
        if image not in self.images:
            return None
        if self.state in PENDING:
            return f"image {image} is being built ({self.progress()})"
        if self.state == "failed":
            return f"the build of image {image} failed: {self.detail}"
        return None


class ImageBuilds:
    """The builds of :attr:`ContainerConfig.build_profiles`, run one after the other;
    ``done`` is called after each build that ended (the backend checks its images again)."""

    def __init__(self, config: ContainerConfig, done: Callable[[], None]) -> None:
        self.config = config
        self.done = done
        self.builds = [ImageBuild(name, self._images(name)) for name in config.build_profiles]
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None

    def _images(self, profile: str) -> tuple[str, ...]:
        """What a profile's build makes (the settings admit only known profiles)."""
        if profile == DEFAULT_PROFILE:
            return tuple(dict.fromkeys((self.config.python_image, self.config.shell_image)))
        return (PROFILES[profile].tag or self.config.python_image,)

    def start(self) -> None:
        """Begin the builds in the background (nothing to do without profiles)."""
        if self.builds and self._task is None:
            log.info("checking the images of %s; a missing one is built now, in the "
                        "background (its tools answer 503 until then)",
                        ", ".join(f"{b.profile} ({', '.join(b.images)})" for b in self.builds))
            self._task = asyncio.create_task(self._run(), name="image-builds")

    async def close(self) -> None:
        """Stop a build under way (its process group is killed) and wait for it."""
        self._kill()
        await stop_task(self._task)
        self._task = None

    def unavailable(self, image: str) -> str | None:
        """Why ``image`` cannot serve yet because of a build (None: no build stands in the
        way)."""
        for build in self.builds:
            why = build.unavailable(image)
            if why is not None:
                return why
        return None

    def awaiting_check(self) -> list[ImageBuild]:
        """The builds that ended since the backend last checked its images."""
        return [b for b in self.builds if b.ended is not None]

    def settle(self, builds: list[ImageBuild]) -> None:
        """The backend checked its images after ``builds`` ended: they report their end."""
        for build in builds:
            if build.ended is not None:
                build.state, build.ended = build.ended, None

    def pending(self, image: str) -> bool:
        """Whether a build of ``image`` is waiting or under way."""
        return any(image in b.images and b.state in PENDING for b in self.builds)

    def report(self) -> dict[str, dict[str, object]]:
        """Each build's state, by the image it makes."""
        return {b.images[0]: b.report() for b in self.builds}

    # ------------------------------------------------------------ the builds

    def _env(self) -> dict[str, str]:
        """The child's environment: the daemon's, with the settings the image is built from
        spelled out (the daemon's own may come from options or its config file)."""
        env = dict(os.environ)
        cfg = self.config
        env.update(SANDBOXD_PYTHON_IMAGE=cfg.python_image, SANDBOXD_SHELL_IMAGE=cfg.shell_image,
                   SANDBOXD_SANDBOX_UID=str(cfg.sandbox_uid),
                   SANDBOXD_SANDBOX_GID=str(cfg.sandbox_gid))
        if cfg.docker_url:
            env["SANDBOXD_DOCKER_URL"] = cfg.docker_url
        # the build dies with the daemon, even one killed with SIGKILL (``images build``)
        env[DIE_WITH_ENV] = str(os.getpid())
        return env

    async def _run(self) -> None:
        for build in self.builds:
            try:
                await self._build(build)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reported, never retried
                build.state, build.detail = "failed", f"{type(exc).__name__}: {exc}"
            if build.state == "failed":
                log.error("image build %s failed: %s", build.profile, build.detail)
            else:
                log.warning("image build %s: %s", build.profile, build.state)
                # until the backend has checked its images again, its last word on them
                # (an image missing) is older than the build: the build still stands in the
                # way, not a missing image
                build.ended, build.state = build.state, "checking"
            self.done()

    async def _build(self, build: ImageBuild) -> None:
        build.state = "checking"
        proc = self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sandboxd", "images", "build", "--offline", "--if-missing",
            "--profile", build.profile, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=self._env(), start_new_session=True, limit=MAX_LINE)
        try:
            finished, _ = await within(self._follow(build, proc), BUILD_TIMEOUT_S)
            if not finished:
                self._kill()
                build.detail = f"no end within {BUILD_TIMEOUT_S:g} s"
            code = await proc.wait()
        finally:
            self._kill()
            self._proc = None
        if build.detail is None and code != 0:
            build.detail = " | ".join(build.tail[-3:]) or f"exit status {code}"
        if build.detail is not None:
            build.state = "failed"
        else:
            build.state = "built" if build.stage is not None else "up to date"

    async def _follow(self, build: ImageBuild, proc: asyncio.subprocess.Process) -> None:
        """Read the build's output to its end: each line logged, the progress kept."""
        assert proc.stdout is not None
        while True:
            try:
                raw = await proc.stdout.readline()
            except ValueError:  # a line over MAX_LINE: not the builder's output
                self._kill()
                build.detail = f"an output line over {MAX_LINE} bytes"
                return
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            build.tail = [*build.tail, line][-TAIL_LINES:]
            log.info("image build %s: %s", build.profile, line.strip())
            stage, step, base = _STAGE.match(line), _STEP.match(line), _BASE.match(line)
            if base is not None:  # minutes of debootstrap, no steps to count
                build.state, build.stage, build.step = "building", base.group(1), "debootstrap"
            elif stage is not None:
                build.state, build.stage, build.step = "building", stage.group(1), None
            elif step is not None:
                build.state, build.step = "building", f"{step.group(1)}/{step.group(2)}"

    def _kill(self) -> None:
        """End the build's whole process group (the CLI and a debootstrap under it)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
