"""The host's capacity through the real API: ``GET /v1/capacity`` and its /metrics gauges,
the caps derived from the host's memory, and a full host's answers (503 ``host-full`` or 429
``too-many-kernels``, each with ``Retry-After`` naming what is full) while every session it
admitted goes on working. The memory headroom is the daemon's real reading of a meminfo file;
the tests point it at one they write to make the host full on purpose."""

from __future__ import annotations

from pathlib import Path

from sandboxd.capacity import read_memory
from sandboxd.config import Settings
from sandboxd.config import derived as defaults
from sandboxd.util.memory import MemoryReading
from tests.support.inprocess import inprocess_daemon

MIB = 1024 * 1024


def _meminfo(path: Path, total_mib: int, available_mib: int) -> Path:
    path.write_text(f"MemTotal:       {total_mib * 1024} kB\nMemFree:        1 kB\n"
                    f"MemAvailable:   {available_mib * 1024} kB\n")
    return path


def test_capacity_reports_sessions_kernels_and_memory(tmp_path: Path) -> None:
    from sandboxd.access.tokens import add_token

    tokens = tmp_path / "tokens.yaml"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)},
                          token=alice) as d:
        assert d.anon.get("/v1/capacity").status_code == 401
        sid = d.client.post("/v1/sessions").json()["id"]
        assert d.invoke("python", {"code": "x = 1"}, session=sid).status_code == 200
        view = d.client.get("/v1/capacity").json()
        assert view["sessions"]["live"] == 1 and view["sessions"]["yours"] == 1
        assert d.http(bob).get("/v1/capacity").json()["sessions"] == {
            "live": 1, "yours": 0, "max_per_client": d.settings.max_sessions_per_client,
            "ready": 0}
        assert view["kernels"]["live"] == 1
        assert view["kernels"]["max"] == d.settings.max_kernels
        memory = view["memory"]
        assert 0 < memory["available_bytes"] <= memory["total_bytes"]
        assert memory["reserve_bytes"] == d.settings.memory_reserve_bytes
        assert 0 <= memory["headroom_bytes"] <= memory["available_bytes"]
        assert memory["kernels_that_fit"] == memory["headroom_bytes"] // memory["kernel_bytes"]
        assert view["full"] == []
        metrics = d.client.get("/metrics").text
        for name in ("sandboxd_sessions_live 1.0", "sandboxd_kernels_live 1.0",
                     f"sandboxd_kernels_max {float(d.settings.max_kernels)}",
                     "sandboxd_memory_headroom_bytes", "sandboxd_memory_available_bytes"):
            assert name in metrics, name


def test_a_host_out_of_memory_headroom_refuses_new_work_and_keeps_what_it_admitted(
        tmp_path: Path) -> None:
    reserve = 1024 * MIB
    env = {"SANDBOXD_MEMORY_RESERVE_BYTES": str(reserve),
           "SANDBOXD_KERNEL_MEMORY_BYTES": str(8 * MIB)}
    meminfo = _meminfo(tmp_path / "meminfo", 4096, 2048)
    with inprocess_daemon(tmp_path, env=env) as d:
        d.service.capacity.meminfo = meminfo
        d.service.capacity.cgroup_root = tmp_path / "no-cgroup"
        warm = d.client.post("/v1/sessions").json()["id"]
        assert d.invoke("python", {"code": "x = 1"}, session=warm).status_code == 200
        idle = d.client.post("/v1/sessions").json()["id"]
        # 1028 MiB free: a session fits (above the reserve), a kernel (8 MiB) does not
        _meminfo(meminfo, 4096, 1028)
        refused = d.invoke("python", {"code": "x = 2"}, session=idle)
        assert refused.status_code == 503, refused.text
        problem = refused.json()
        assert problem["type"].endswith("/host-full") and problem["full"] == "memory"
        assert refused.headers["retry-after"] == str(problem["retry_after"])
        assert "memory_reserve_bytes" in problem["detail"]
        assert d.client.post("/v1/sessions").status_code == 201
        assert d.client.get("/v1/capacity").json()["full"] == ["memory"]
        # below the reserve: no new session either
        _meminfo(meminfo, 4096, 1000)
        full = d.client.post("/v1/sessions")
        assert full.status_code == 503 and full.json()["full"] == "memory"
        assert "Retry-After" in full.headers
        # what was admitted works: the live kernel, files of the idle session
        assert d.invoke("python", {"code": "x"}, session=warm).status_code == 200
        assert d.invoke("write_file", {"path": "f", "content": "x"},
                        session=idle).json()["status"] == "ok"
        rejected = [r for r in d.records() if r["event"] == "result"
                    and r["status"] == "rejected"]
        assert [r["session"] for r in rejected] == [idle]
        # room again: the refused kernel starts
        _meminfo(meminfo, 4096, 2048)
        assert d.invoke("python", {"code": "x = 2"}, session=idle).status_code == 200


def test_the_kernel_cap_and_the_uid_range_answer_with_retry_after(tmp_path: Path) -> None:
    env = {"SANDBOXD_MAX_KERNELS": "1", "SANDBOXD_MAX_CONCURRENCY": "1",
           "SANDBOXD_SANDBOX_UID_COUNT": "4", "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "10"}
    with inprocess_daemon(tmp_path, env=env) as d:
        one = d.client.post("/v1/sessions").json()["id"]
        assert d.invoke("python", {"code": "x"}, session=one).status_code == 200
        two = d.client.post("/v1/sessions").json()["id"]
        capped = d.invoke("python", {"code": "x"}, session=two)
        assert capped.status_code == 429
        assert capped.json()["full"] == "max_kernels" and "Retry-After" in capped.headers
        if d.service.uids is None:
            return  # not root: no uid range to fill
        # four uids, one kept free for a one-shot call: the third session finds none
        assert d.client.post("/v1/sessions").status_code == 201
        full = d.client.post("/v1/sessions")
        assert full.status_code == 503, full.text
        assert full.json()["full"] == "sandbox_uids" and "Retry-After" in full.headers
        assert set(d.client.get("/v1/capacity").json()["full"]) == {"sandbox_uids",
                                                                     "max_kernels"}
        assert d.invoke("python", {"code": "x"}, session=one).status_code == 200


def test_caps_left_unset_are_derived_from_the_hosts_memory() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    memory = read_memory()
    assert settings.derived == {"max_kernels", "sandbox_uid_count", "memory_reserve_bytes"}
    assert settings.memory_reserve_bytes == max(512 * MIB, memory.total // 20)
    assert settings.max_kernels == (memory.total - settings.memory_reserve_bytes) \
        // settings.kernel_memory_bytes
    assert settings.sandbox_uid_count == max(900, min(50000, settings.max_kernels + 256))
    # the same range whatever the scheduler's settings (a container test computes it alone)
    assert Settings(warm_pool_size=1).sandbox_uid_count == settings.sandbox_uid_count  # type: ignore[call-arg]
    chosen = Settings(max_kernels=7, sandbox_uid_count=950)  # type: ignore[call-arg]
    assert (chosen.max_kernels, chosen.sandbox_uid_count) == (7, 950)
    assert chosen.derived == {"memory_reserve_bytes"}
    small = MemoryReading(total=2048 * MIB, available=1024 * MIB, source="meminfo")
    assert defaults.reserve_bytes(0, small) == 512 * MIB
    assert defaults.max_kernels(small, 512 * MIB, 8 * MIB) == 192
    assert defaults.uid_count(192, 9) == 900
    assert defaults.uid_count(3000, 9) == 3256 and defaults.uid_count(10, 1200) == 1200


def test_the_tightest_cgroup_memory_limit_bounds_the_headroom(tmp_path: Path) -> None:
    meminfo = _meminfo(tmp_path / "meminfo", 8192, 6000)
    own = tmp_path / "self_cgroup"
    own.write_text("0::/system.slice/sandboxd.service\n")
    root = tmp_path / "cgroup"
    unit = root / "system.slice" / "sandboxd.service"
    unit.mkdir(parents=True)
    (root / "system.slice" / "memory.max").write_text("max\n")
    (unit / "memory.max").write_text(f"{2048 * MIB}\n")
    (unit / "memory.current").write_text(f"{512 * MIB}\n")
    reading = read_memory(root, meminfo=meminfo, self_cgroup=own)
    assert reading == MemoryReading(2048 * MIB, 1536 * MIB, "cgroup /system.slice/sandboxd.service")
    (unit / "memory.max").write_text("max\n")
    assert read_memory(root, meminfo=meminfo, self_cgroup=own) == MemoryReading(
        8192 * MIB, 6000 * MIB, "meminfo")
