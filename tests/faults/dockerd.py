"""A private Docker engine for fault tests: started, stopped and killed by the test itself."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker

from sandboxd.config import Settings
from tests.support.wait import wait_until

#: the image under test (SANDBOXD_PYTHON_IMAGE, as the daemons the tests start use it)
IMAGE = Settings().python_image
#: a ``docker save`` file that may hold IMAGE (tests/vm/guest/test-suite.sh sets it)
IMAGES_TAR_ENV = "SANDBOXD_TEST_IMAGES_TAR"


DOCKER = "/usr/bin/docker"  # Debian's client: a newer `docker` on PATH may not match the engine
#: The private engine's own bridge. Not `--bridge none`: an engine started with that deletes the
#: host engine's `docker0` on start-up, which breaks every later `docker build` on the host.
BRIDGE = "sbdfault0"
BRIDGE_ADDR = "172.31.254.1/24"


def _bridge(up: bool) -> None:
    if up:
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=False,
                       capture_output=True)
        subprocess.run(["ip", "addr", "replace", BRIDGE_ADDR, "dev", BRIDGE], check=True,
                       capture_output=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True, capture_output=True)
    else:
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)


class PrivateDockerd:
    """One ``dockerd`` on its own data root, socket and bridge (no iptables)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "daemon.json").write_text(json.dumps({}))

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            ["dockerd", "--config-file", str(self.root / "daemon.json"),
             "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "dockerd.pid"), "--host", self.url,
             "--bridge", BRIDGE, "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            wait_until(self._answers, timeout=timeout, interval=0.2,
                       what="the private dockerd to answer a ping")
        except AssertionError as exc:
            raise RuntimeError(f"private dockerd did not start ({exc}):\n"
                               + (self.root / "dockerd.log").read_text()[-3000:]) from None

    def _answers(self) -> bool:
        """True once the engine answers a ping; raises once its process has ended."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"dockerd exited with {self.proc.returncode}")
        with contextlib.suppress(Exception):
            client = docker.DockerClient(base_url=self.url, timeout=5)
            try:
                client.ping()
                return True
            finally:
                client.close()
        return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        """Stop the engine (SIGTERM: it stops its containers, as an engine restart does)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        # its containerd (and shims) are in its session: nothing may outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=60)

    def containers(self, label: str) -> list[dict]:
        client = self.client()
        try:
            return client.api.containers(all=True, filters={"label": label})
        finally:
            client.close()


def _unmount_below(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(str(root))), reverse=True):
        subprocess.run(["umount", "-l", target], check=False)


def _image_id(*host: str) -> str:
    run = subprocess.run([DOCKER, *host, "image", "inspect", "-f", "{{.Id}}", IMAGE],
                         capture_output=True, text=True, check=False)
    return run.stdout.strip() if run.returncode == 0 else ""


def _chain_ids(diff_ids: list[str]) -> list[str]:
    """The layer store's chain ids of an image's layers (the image spec's ChainID)."""
    chain: list[str] = []
    for diff in diff_ids:
        chain.append(diff if not chain else
                     "sha256:" + hashlib.sha256(f"{chain[-1]} {diff}".encode()).hexdigest())
    return chain


def _host_store() -> Path | None:
    """The host engine's data root when its storage driver is overlay2 (else None)."""
    info = subprocess.run([DOCKER, "info", "-f", "{{.DockerRootDir}} {{.Driver}}"],
                          capture_output=True, text=True, check=False).stdout.split()
    return Path(info[0]) if info[1:] == ["overlay2"] else None


def _linkable_dir(host: Path | None) -> str:
    """Where a private engine's root can hard-link the host engine's files: /tmp when a link
    from the host's data root into it works (one mount), else the data root's parent, else the
    data root itself (a mount of its own on some hosts); /tmp when none can (it loads then)."""
    if host is None:
        return "/tmp"
    source = host / "image" / "overlay2" / "repositories.json"
    for base in ("/tmp", str(host.parent), str(host)):
        probe = Path(base) / f".sbd-link-probe-{os.getpid()}"
        try:
            os.link(source, probe)
        except OSError:
            continue
        probe.unlink()
        return base
    return "/tmp"


def _link_image(host: Path, data: Path) -> None:
    """Hard-link the host engine's stored copy of IMAGE (in ``host``, its data root) into a
    private engine's data root before that engine starts: the image's overlay2 layers
    (read-only lower directories, never written in place), layer records, config and tags.
    Seconds, where a ``docker load`` of the image takes minutes under the VM job's emulation.
    The caller checks the image's id once the engine runs, and loads it if it differs."""
    run = subprocess.run([DOCKER, "image", "inspect", IMAGE], capture_output=True, text=True,
                         check=True)
    image = json.loads(run.stdout)[0]
    graph = image["GraphDriver"]["Data"]
    layers = [Path(graph["UpperDir"]).parent]
    layers += [Path(d).parent for d in graph.get("LowerDir", "").split(":") if d]
    (data / "overlay2" / "l").mkdir(parents=True)
    for layer in layers:
        # -a keeps the directories' overlay xattrs (opaque directories); files are links
        subprocess.run(["cp", "-al", str(layer), str(data / "overlay2")], check=True,
                       capture_output=True)
        short = (layer / "link").read_text().strip()
        (data / "overlay2" / "l" / short).symlink_to(f"../{layer.name}/diff")
    store = host / "image" / "overlay2"
    mine = data / "image" / "overlay2"
    (mine / "layerdb" / "sha256").mkdir(parents=True)
    for chain in _chain_ids(image["RootFS"]["Layers"]):
        hex_id = chain.removeprefix("sha256:")
        shutil.copytree(store / "layerdb" / "sha256" / hex_id, mine / "layerdb" / "sha256" / hex_id)
    config = mine / "imagedb" / "content" / "sha256"
    config.mkdir(parents=True)
    hex_image = image["Id"].removeprefix("sha256:")
    shutil.copy2(store / "imagedb" / "content" / "sha256" / hex_image, config / hex_image)
    repos: dict[str, dict[str, str]] = {}
    for tag in image["RepoTags"]:
        repos.setdefault(tag.rsplit(":", 1)[0], {})[tag] = image["Id"]
    (mine / "repositories.json").write_text(json.dumps({"Repositories": repos}))


def _copy_image(engine: PrivateDockerd) -> None:
    """The host engine's IMAGE into the running private one, unless it holds it already
    (_link_image): from the ``docker save`` file named by IMAGES_TAR_ENV when it holds that
    very image (the modern-host VM's payload, which its engine loaded: no second save under
    emulation), else saved from the host engine."""
    wanted = _image_id()

    def holds_it() -> bool:  # the private engine has the host engine's very image
        mine = _image_id("-H", engine.url)
        return bool(mine) and mine == wanted

    if holds_it():
        return
    tar = os.environ.get(IMAGES_TAR_ENV, "")
    if tar and os.path.isfile(tar):
        subprocess.run([DOCKER, "-H", engine.url, "load", "-q", "-i", tar], check=False,
                       stdout=subprocess.DEVNULL)
        if holds_it():
            return
    save = subprocess.Popen([DOCKER, "save", IMAGE], stdout=subprocess.PIPE)
    subprocess.run([DOCKER, "-H", engine.url, "load", "-q"], stdin=save.stdout,
                   check=True, stdout=subprocess.DEVNULL)
    assert save.stdout is not None
    save.stdout.close()
    assert save.wait() == 0


@contextlib.contextmanager
def private_dockerd() -> Iterator[PrivateDockerd]:
    """A running private engine with the sandbox image loaded; everything is removed after."""
    host = _host_store()
    root = Path(tempfile.mkdtemp(prefix="sbd-dk-", dir=_linkable_dir(host)))
    engine = PrivateDockerd(root)
    try:
        _bridge(True)
        if host is not None:
            try:
                _link_image(host, root / "data")
            except (OSError, subprocess.CalledProcessError, KeyError, ValueError):
                shutil.rmtree(root / "data", ignore_errors=True)  # all or nothing: load it
        engine.start()
        _copy_image(engine)
        yield engine
    finally:
        with contextlib.suppress(Exception):
            if engine.proc is not None and engine.proc.poll() is None:
                client = engine.client()
                for c in client.api.containers(all=True, quiet=True):
                    client.api.remove_container(c["Id"], force=True)
                client.close()
        engine.stop()
        _bridge(False)
        _unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)
