"""bench/sweep.py's flood phase: /versions while a login flood runs, with and without directory
sweeps, on a server in this process (so the loop's own work can be clocked) and a fake
Synapse in a process of its own (so its work is not this process's).

The server is the assembly `run.py` serves (build_homeserver, make_app, settle_gc) on the
users file of `--users` users, SQLite sessions, delegation to the fake; wrk floods the login
(4 connections, every bcrypt thread busy) and probes /versions with 10 (as bench/run.py's
flood phase). "sweeping": one sweep after another for the whole probe, the first provisioning
every user (the fake answers in about a millisecond: the most work a sweep can ask of this
loop per second), the next finding them unchanged. The runs alternate, `--rounds` times, so
the machine's other load falls on both alike. Besides wrk's p99, the loop's longest callback
in CPU time of its thread (bench/listing.py's probe): what a sweep holding the loop would
show, whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH_USER, LOGIN, ROOT, VERSIONS, free_port
from listing import Probe
from servers import hash_once, write_users
from targets import Target
from tornado.httpserver import HTTPServer
from wrk import parse_wrk, wrk_command, wrk_env

from homeserver.app import make_app
from homeserver.config import build_config
from homeserver.context import build_homeserver, create_backend, create_session_store
from homeserver.process.server import settle_gc

FLOOD_P99_MS = 50.0  # the bound on /versions p99 during a sweep and a login flood
SECRET = "bench-sweep-flood-secret-0123456789abcdef"
FAKE = f"""
import asyncio, logging, sys
sys.path.insert(0, {str(ROOT)!r})
logging.getLogger("tornado.access").setLevel(logging.WARNING)
from tests.support.delegation_fakes import FakeSynapse
async def main():
    fake = FakeSynapse({SECRET!r})
    fake.port = int(sys.argv[1])
    fake.start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def wrk(url: str, seconds: float, connections: int, post: bool = False) -> str:
    proc = await asyncio.create_subprocess_exec(
        *wrk_command(url, seconds, connections, timeout="20s"), env=wrk_env(post),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return out.decode()


async def one_run(label: str, sweeping: bool, users: Path, tmp: Path, fake_url: str,
                  args: argparse.Namespace) -> dict[str, Any]:
    config = build_config({
        "server": {"host": "127.0.0.1"},
        "auth": {"jwt_secret": "bench-secret-that-is-at-least-32-bytes-long"},
        "backend": {"type": "file", "file": {"path": str(users)}},
        "sessions": {"sqlite": {"path": str(tmp / f"flood-{label}-{time.monotonic_ns()}.db")}},
        "rate_limit": {"enabled": False},
        "logging": {"level": "WARNING"},
        "delegation": {"enabled": True, "synapse_url": fake_url, "secret": SECRET, "sync_interval": 3600.0,
                       "timeout": 10.0},
    }, path=str(tmp / "homeserver.toml"), environ={})
    backend, store = create_backend(config), create_session_store(config)
    await backend.start()
    await store.start()
    hs = build_homeserver(config, backend, store)
    await hs.start()
    port = free_port()
    server = HTTPServer(make_app(hs))
    server.listen(port, "127.0.0.1")
    settle_gc()
    base = f"http://127.0.0.1:{port}"
    reports: list[Any] = []
    stop = asyncio.Event()

    async def sweeps() -> None:
        assert hs.sweeper is not None
        while not stop.is_set():
            reports.append(await hs.sweeper.sweep_now())

    try:
        flood = asyncio.ensure_future(wrk(base + LOGIN, args.duration + 2, 4, post=True))
        await asyncio.sleep(1)
        sweeper = asyncio.ensure_future(sweeps()) if sweeping else None
        probe = Probe(backend, BENCH_USER)
        versions_out = await probe.around(lambda: wrk(base + VERSIONS, args.duration, 10))
        stop.set()
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        logins = parse_wrk("login flood", base + LOGIN, 4, await flood)
        provisioned = len(await hs.delegation.state.provisioned_all()) if hs.delegation is not None else 0
    finally:
        server.stop()
        await hs.close()
    versions = parse_wrk("versions", base + VERSIONS, 10, versions_out)
    result = {"label": label, "versions_p50_ms": round(versions.p50_ms, 2), "versions_p99_ms": round(versions.p99_ms, 2),
              "versions_rps": round(versions.rps), "logins_per_second": round(logins.rps, 1),
              "login_errors": logins.non_2xx, "sweeps": len(reports),
              "sweep_seconds": [round(r.seconds, 2) for r in reports][:10],
              "provisioned": provisioned, **probe.summary()}
    print(f"  {label:<10} /versions p99 {result['versions_p99_ms']:>7.2f} ms, p50 {result['versions_p50_ms']:.2f} ms, "
          f"{result['versions_rps']} req/s; logins {result['logins_per_second']}/s; sweeps {result['sweeps']} "
          f"({result['provisioned']} users at Synapse); longest loop callback (CPU) {result['loop_callback_cpu_max_ms']} ms "
          f"({result['slowest']}); longest gc {result['gc_pause_max_ms']} ms", flush=True)
    return result


def phase_flood(args: argparse.Namespace, tmp: Path, results: dict[str, Any]) -> list[Target]:
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", FAKE, str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    users = tmp / "flood-users.json"
    write_users(users, hash_once(args.bcrypt_cost), args.users)
    runs: dict[str, list[dict[str, Any]]] = {"no_sweep": [], "sweeping": []}
    try:
        time.sleep(1)
        for _ in range(args.rounds):
            for label in runs:
                runs[label].append(asyncio.run(one_run(label, label == "sweeping", users, tmp,
                                                       f"http://127.0.0.1:{port}", args)))
    finally:
        fake.kill()
        fake.wait()
    results["flood"] = runs
    p99 = statistics.median(r["versions_p99_ms"] for r in runs["sweeping"])
    quiet = statistics.median(r["versions_p99_ms"] for r in runs["no_sweep"])
    cpu = max(r["loop_callback_cpu_max_ms"] for r in runs["sweeping"])
    quiet_cpu = max(r["loop_callback_cpu_max_ms"] for r in runs["no_sweep"])
    return [
        Target("/versions p99 (-c10), login flood, sweeping", p99, FLOOD_P99_MS, "ms", False,
               f"(median of {args.rounds}; without sweeps {quiet:.1f} ms)"),
        Target("longest loop callback (CPU), flood + sweeps", cpu, 10.0, "ms", False, f"(without sweeps {quiet_cpu} ms)"),
    ]
