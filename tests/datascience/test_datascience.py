"""The data-science profile end to end: ``sandboxd/datascience:latest`` through the real daemon
with ``policies/examples/datascience.yaml`` (container backend, its confinement defaults): a
CSV written with ``write_file``, pandas, a matplotlib plot saved in the workspace and read
back (from the session's workspace on the host and as base64 through the python tool), and a
DataFrame's HTML."""

from __future__ import annotations

import base64
import os
import random
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.order import stream

from . import png

EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "examples" / "datascience.yaml"
MAX_PNG = 4 * 1024 * 1024
REGIONS = ["north", "south", "east", "west", "centre"]


@dataclass
class Analyst:
    """A daemon serving the example policy, its client, a session, and the CSV's truth."""

    daemon: RunningDaemon
    session: str
    totals: dict[str, int]

    def python(self, code: str) -> dict[str, Any]:
        r = self.daemon.invoke("python", {"code": code}, session=self.session)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def workspace_file(self, rel: str) -> bytes:
        """A file the sandbox wrote, read on the host side as hostile data: a regular file
        (no symlink followed), bounded in size."""
        path = self.daemon.state_dir / "workspaces" / self.session / rel
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            assert st.st_size <= MAX_PNG and (st.st_mode & 0o170000) == 0o100000, st
            return os.read(fd, MAX_PNG + 1)
        finally:
            os.close(fd)


@pytest.fixture(scope="module")
def analyst(datascience_image: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Analyst]:
    tmp = tmp_path_factory.mktemp("datascience")
    policies = tmp / "policies"
    policies.mkdir()
    shutil.copy(EXAMPLE, policies / "datascience.yaml")  # as its header says: copy, then adapt
    tokens = tmp / "tokens.yaml"
    token = add_token(tokens, "analyst")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_INSTANCE": f"ds{secrets.token_hex(4)}",
           "SANDBOXD_WARM_POOL_SIZE": "0"}
    rng = random.Random(secrets.randbits(64))
    rows = [(rng.choice(REGIONS), month, rng.randint(0, 10_000))
            for month in range(1, 13) for _ in range(rng.randint(3, 8))]
    totals: dict[str, int] = {}
    for region, _month, sales in rows:
        totals[region] = totals.get(region, 0) + sales
    csv = "region,month,sales\n" + "".join(f"{r},{m},{s}\n" for r, m, s in rows)
    with running_daemon(tmp, policies_dir=policies, env=env, token=token) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        w = d.invoke("write_file", {"path": "data/sales.csv", "content": csv}, session=sid)
        assert w.json()["status"] == "ok", w.text
        yield Analyst(d, sid, totals)


PLOT = """\
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt
from pathlib import Path
df = pd.read_csv('data/sales.csv')
totals = df.groupby('region')['sales'].sum().sort_index()
fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=100)
totals.plot.bar(ax=ax, title='sales by region')
Path('results').mkdir(exist_ok=True)
fig.savefig('results/sales.png', dpi=100)
{'totals': {k: int(v) for k, v in totals.items()}, 'backend': matplotlib.get_backend(),
 'configdir': matplotlib.get_configdir(), 'versions': [pd.__version__, matplotlib.__version__]}
"""


def test_csv_to_pandas_to_a_png_plot(analyst: Analyst) -> None:
    res = analyst.python(PLOT)
    assert res["status"] == "ok", (res["message"], res["stderr"][-2000:])
    assert res["backend"] == "container", res
    value = res["value"]
    assert value["totals"] == analyst.totals  # pandas computed what the CSV holds
    assert value["backend"].lower() == "agg", value
    assert value["configdir"] == "/tmp/matplotlib", value  # writable, off the read-only root
    # the first import neither failed nor warned (no read-only config dir, no display)
    assert "Matplotlib" not in res["stderr"] and "Warning" not in res["stderr"], res["stderr"]

    data = analyst.workspace_file("results/sales.png")
    image = png.decode(data)
    assert (image.width, image.height) == (640, 480)  # figsize x dpi, as the code asked
    assert image.distinct_bytes() > 8, "the plot is blank"

    # the same bytes come back through the python tool as base64 (until binary downloads)
    res = analyst.python("import base64\n"
                         "base64.b64encode(open('results/sales.png', 'rb').read()).decode()")
    assert res["status"] == "ok", res
    assert base64.b64decode(res["value"], validate=True) == data

    # the checker is not a rubber stamp: a damaged copy is refused
    broken = bytearray(data)
    broken[len(broken) // 2] ^= 0xFF
    with pytest.raises(png.BadPNG):
        png.decode(bytes(broken))
    with pytest.raises(png.BadPNG):
        png.decode(data[: len(data) // 2])


class _Table(HTMLParser):
    """The cells of an HTML table, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None


def test_dataframe_to_html_round_trip(analyst: Analyst) -> None:
    res = analyst.python(
        "import pandas as pd\n"
        "df = pd.read_csv('data/sales.csv')\n"
        "df.groupby('region', as_index=False)['sales'].sum().to_html(index=False)")
    assert res["status"] == "ok", res
    html = res["value"]
    assert html.lstrip().startswith("<table") and 'class="dataframe"' in html, html[:200]
    table = _Table()
    table.feed(html)
    assert table.rows[0] == ["region", "sales"], table.rows
    assert {r: int(s) for r, s in table.rows[1:]} == analyst.totals


def test_the_stack_imports_within_the_policy_limits(analyst: Analyst) -> None:
    """numpy, pandas, scipy, scikit-learn and matplotlib import under the example policy's
    memory and pids limits (the figures: bench/bench_datascience.py)."""
    res = analyst.python(
        "import numpy, pandas, scipy.stats, sklearn.linear_model, matplotlib.pyplot\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "model = sklearn.linear_model.LinearRegression().fit([[0], [1], [2]], [1, 3, 5])\n"
        "[int(status['VmHWM'].split()[0]), int(status['Threads']),"
        " [int(u) for u in status['Uid'].split()],"
        " round(float(model.coef_[0]), 6), round(float(scipy.stats.norm.cdf(0)), 6)]")
    assert res["status"] == "ok", (res["message"], res["stderr"][-2000:])
    peak_kib, threads, uids, slope, half = res["value"]
    assert (slope, half) == (2.0, 0.5)
    # the example policy keeps the container backend's confinement defaults
    limits = res["limits"]
    assert limits["network"] is False and limits["memory_bytes"] == 2 * 1024**3, limits
    assert limits["pids"] == 128, limits
    assert 0 not in uids, uids  # real, effective, saved, filesystem: never root
    assert peak_kib * 1024 < limits["memory_bytes"], (peak_kib, limits)
    assert threads < limits["pids"], (threads, limits)
    # no network: a connection attempt fails inside the container (socket is not even
    # importable under this policy, so through pandas' own URL reader)
    res = analyst.python("import pandas as pd\n"
                         "try:\n    pd.read_csv('http://1.1.1.1/x.csv')\n    r = 'open'\n"
                         "except Exception as e:\n    r = type(e).__name__\nr")
    assert res["status"] == "ok" and res["value"] != "open", res["value"]


DISPLAYS = """\
import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv('data/sales.csv')
totals = df.groupby('region', as_index=False)['sales'].sum()
display(totals)
fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=100)
ax.bar(totals['region'], totals['sales'])
plt.show()
print('shown')
fig2, ax2 = plt.subplots(figsize=(3, 2), dpi=100)
ax2.plot([1, 3, 2])
totals
"""


def test_a_plot_and_a_dataframe_come_back_as_display_items(analyst: Analyst) -> None:
    """``display(df)``, ``plt.show()``, a DataFrame as the cell's last value and a figure left
    open: four display items, in that order, each checked as hostile data."""
    res = analyst.python(DISPLAYS)
    assert res["status"] == "ok", (res["message"], res["stderr"][-2000:])
    assert res["stdout"] == "shown\n"
    kinds = [sorted(o["data"]) for o in res["outputs"]]
    assert kinds == [["text/html", "text/plain"], ["image/png", "text/plain"],
                     ["text/html", "text/plain"], ["image/png", "text/plain"]], kinds
    for table_item in (res["outputs"][0], res["outputs"][2]):
        table = _Table()
        table.feed(table_item["data"]["text/html"])
        assert table.rows[0][-2:] == ["region", "sales"], table.rows
        assert {row[-2]: int(row[-1]) for row in table.rows[1:]} == analyst.totals
        assert "region" in table_item["data"]["text/plain"]
    sizes = []
    for plot in (res["outputs"][1], res["outputs"][3]):
        image = png.decode(base64.b64decode(plot["data"]["image/png"], validate=True))
        assert image.distinct_bytes() > 8, "the plot is blank"
        sizes.append((image.width, image.height))
        assert plot["data"]["text/plain"].startswith("<Figure size")
    assert sizes == [(640, 480), (300, 200)]  # figsize x dpi, in the order they were shown
    # the figures were closed: the next call of the session shows nothing by itself
    again = analyst.python("len(plt.get_fignums())")
    assert again["status"] == "ok" and again["value"] == 0 and again["outputs"] == [], again


SHOW_BETWEEN_PRINTS = """\
import matplotlib.pyplot as plt
print('before')
plt.plot([1, 3, 2])
plt.show()
print('after')
"""


def test_a_plot_shown_between_two_prints_stays_between_them(analyst: Analyst) -> None:
    """The case that started it: an image from ``plt.show()`` came after prints that ran after it.
    In the result its position is after 'before' and before 'after', and the SSE stream
    sends stdout 'before', the image, stdout 'after' in that order."""
    res = analyst.python(SHOW_BETWEEN_PRINTS)
    assert res["status"] == "ok", (res["message"], res["stderr"][-2000:])
    assert res["stdout"] == "before\nafter\n"
    [plot] = res["outputs"]
    assert "image/png" in plot["data"] and plot["at"] == {"stdout": 7, "stderr": 0}, plot
    events = stream(analyst.daemon.url, analyst.daemon.headers,
                    {"arguments": {"code": SHOW_BETWEEN_PRINTS}, "session": analyst.session})
    shown: list[tuple[str, Any]] = []
    for kind, data in events:
        if kind == "stdout" and shown and shown[-1][0] == "stdout":  # a chunk may be cut
            shown[-1] = ("stdout", shown[-1][1] + data["text"])
        elif kind in ("stdout", "display"):
            shown.append((kind, data["text"] if kind == "stdout" else sorted(data["data"])))
    assert shown == [("stdout", "before\n"), ("display", ["image/png", "text/plain"]),
                     ("stdout", "after\n")], shown
