"""Every fenced block of README.md and docs/*.md, reviewed: run, the output of one that runs,
or skipped with the reason. tests/docs/test_catalogue.py fails on a block that no entry names
(a new example cannot escape) and on an entry that names no block or several.

An entry names its block by a marker: a piece of text found in that block alone (of its file).
``run`` is the runner of tests/docs/test_examples.py that executes it; ``output`` the marker
of the block that shows its output, when that is a block of its own; ``volatile`` the result
paths whose values differ from run to run; ``patterns`` the ``(regex, replacement)`` pairs
applied to both sides of a text output before the comparison."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    file: str
    marker: str
    run: str | None = None
    skip: str | None = None
    output_of: str | None = None
    output: str | None = None
    volatile: tuple[str, ...] = ()
    patterns: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.file}:{self.run}:{self.marker[:40]}"


R, OPS = "README.md", "docs/operations.md"
#: doctor: backend, check and result of every row; details are the host's own
DOCTOR_COLUMNS = ((r"(?m)^(BACKEND|host|restricted|container) +(\S+) +(\S+).*$", r"\1 \2 \3"),)

CATALOGUE: tuple[Entry, ...] = (
    # README.md
    Entry(R, "make run    # virtualenv", skip="host set-up: apt packages, the Docker engine "
          "and images, a daemon on the fixed port 8765; the second line is the suite itself"),
    Entry(R, "\"print(6*7)\"}}'", run="console",
          volatile=("id", "resources", "node", "receipt")),
    Entry(R, "jq -c '[.status, .message, .policy.rule]'", run="console"),
    Entry(R, "{\"arguments\":{\"code\":5}}", run="console"),
    Entry(R, "\"status\": \"ok | error | denied", run="result_shape"),
    Entry(R, "-H 'Accept: text/event-stream'", run="console"),
    Entry(R, "--data-binary @photo.jpg", run="transfer"),
    Entry(R, "from sandboxd_client import Agent, SandboxClient", run="client"),
    Entry(R, "make run PROFILE=datascience", skip="make run serves on the fixed port 8765: "
          "tests/datascience/test_profile.py runs it on a free one; the Python it names is "
          "the next block, run here"),
    Entry(R, "s.write_file(\"data/sales.csv\"", run="datascience", output="ok 1195 ms",
          patterns=((r"^ok \d+ ms", "ok N ms"), (r"\d+ bytes", "N bytes"))),
    Entry(R, "ok 1195 ms", output_of="s.write_file(\"data/sales.csv\""),
    Entry(R, "\"command\": \"/opt/sandboxd/bin/sandboxd\"", run="mcp_stdio"),
    Entry(R, "\"url\": \"http://127.0.0.1:8765/mcp\"", run="mcp_http"),
    Entry(R, "sandboxd/               at the top", run="layout"),
    # docs/e2b.md
    Entry("docs/e2b.md", "export E2B_SANDBOX_URL", skip="the environment of the next block: "
          "tests/e2b/test_docs.py sets the same variables for the daemon it starts"),
    Entry("docs/e2b.md", "print(sbx.commands.run(\"echo hi\").stdout)",
          skip="E2B's SDK against a daemon with the container backend: tests/e2b/test_docs.py "
          "runs this block in a process of its own and checks what it prints"),
    Entry("docs/e2b.md", "e2b_templates: {code-interpreter-v1",
          skip="a setting's default: tests/e2b/test_docs.py compares it with the daemon's"),
    # docs/egress.md
    Entry("docs/languages.md", "modules: {allow: [\"*\"], deny: [os]}",
          skip="a fragment of a policy (its tools: block); tests/javascript/conftest.py's "
          "policy loads the same keys and runs them"),
    Entry("docs/egress.md", '"*.pypi.org:443"', skip="a fragment of a policy (its tools: "
          "only); tests/egress/test_egress_policy.py parses such entries and "
          "tests/support/egress.py's policy runs the same keys through a daemon"),
    # docs/fleet.md
    Entry("docs/fleet.md", "sandboxd fleet haproxy-config --node n1=10.0.0.11:8765",
          skip="writes /etc/haproxy and reloads a host's HAProxy: tests/fleet generates the "
          "configuration with the same command and runs a real HAProxy with it"),
    # docs/operations.md
    Entry(OPS, "python3 -m venv /opt/sandboxd", skip="installs into /opt, /etc and systemd as "
          "root: tests/vm/guest/service-checks.sh runs it verbatim in the Debian 12 VM "
          "(make test-vm)"),
    Entry(OPS, "sandboxd-docker.conf /etc/systemd", skip="a systemd drop-in on the host: the "
          "VM's service checks install it (the container backend under the unit)"),
    Entry(OPS, "apt-get install docker.io rootlesskit", skip="installs packages, a system "
          "user and a rootless Docker engine on the host"),
    Entry(OPS, "docker build -t sandboxd/daemon .", skip="builds the daemon's image: "
          "tests/service/test_dockerfile.py builds and runs it"),
    Entry(OPS, "docker run -d --name sandboxd", skip="the daemon's container under a fixed "
          "name with the host's cgroup directories: tests/service/test_dockerfile.py runs "
          "the image with the same capabilities and confinement flags"),
    Entry(OPS, "$ sudo sandboxd doctor", run="doctor", patterns=DOCTOR_COLUMNS),
)
