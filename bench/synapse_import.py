"""Moving a Synapse here, the whole import, and what an imported token costs afterwards; one run.

1. The import (`migrate-synapse run`'s Importer, in this process): bench/synapse_db.py's
   generated Synapse (10,000 users, 50,000 devices with a token each, 10,000 refresh tokens,
   addresses and profiles), from SQLite and from PostgreSQL, into a users file and this
   server's SQLite session store, each into fresh stores: total seconds and rows read per
   second (users, devices, tokens, addresses, profiles), and what was written.
2. Introspection (`POST /oauth2/introspect`, what Synapse asks at every token it has not seen
   for two minutes) of imported `syt_` tokens against tokens of ours (JWTs, sessions opened as
   a login opens them), on the same server, the same users, the same store: `--tokens` of each
   kind, sent in turn by wrk (bench/wrk_report.lua's WRK_BODIES_FILE), rounds alternating; the
   ratio of the median rates (imported / ours, LIMITS["imported_introspect"]).

    .venv/bin/python bench/synapse_import.py [--users 10000] [--devices 50000] [--tokens 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, Processes, cpu_seconds, free_port, http, wait_ready
from synapse_db import generate
from targets import Target, target
from wrk import parse_wrk, wrk_command

sys.path.insert(0, str(ROOT))
from backends.synapse.config import DatabaseSettings
from backends.synapse.database import SynapseDatabase
from homeserver.config import load_config
from homeserver.context import build_credentials, create_backend, create_session_store
from homeserver.migration.importer import Importer
from homeserver.sessions import token_digest
from homeserver.tokens import TokenIssuer
from homeserver.users import Users
from tests.support.postgres import PostgresCluster, PostgresUnavailable
from tests.support.synapse import SynapseUnavailable
from tests.support.synapse_schema import SynapseRows, create_schema

SECRET = "bench-jwt-secret-that-is-long-enough-0123456789"
SHARED = "bench-delegation-secret-0123456789abcdef0123"
INTROSPECT = "/oauth2/introspect"


def our_config(folder: Path, port: int = 8008) -> Path:
    """This server on a users file and the SQLite session store, with delegation on (introspection
    answers; Synapse itself is never called by it)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "users.json").exists():
        (folder / "users.json").write_text('{"users": []}')
    path = folder / "homeserver.toml"
    path.write_text(
        f'[server]\nport = {port}\nserver_name = "localhost"\n[auth]\njwt_secret = "{SECRET}"\n'
        '[backend.file]\npath = "users.json"\nreload_interval = 0\n[rate_limit]\nenabled = false\n'
        f'[logging]\nlevel = "WARNING"\n[delegation]\nenabled = true\nsynapse_url = "http://127.0.0.1:9"\n'
        f'secret = "{SHARED}"\n'
    )
    return path


async def import_into(folder: Path, source: DatabaseSettings) -> dict[str, Any]:
    config = load_config(str(our_config(folder)))
    backend, store = create_backend(config, quiet=True), create_session_store(config)
    await backend.start()
    await store.start()
    try:
        importer = Importer(users=Users(backend), backend=backend, imported=store.imported(),
                            credentials=build_credentials(config, SECRET), directory=False)
        started = time.perf_counter()
        with SynapseDatabase.open(source) as database:
            counts = await importer.run(database, "localhost")
            rows = sum(database.count(t) for t in ("users", "devices", "access_tokens", "refresh_tokens",
                                                    "user_threepids", "profiles"))
        seconds = time.perf_counter() - started
    finally:
        await store.close()
        await backend.close()
    return {"seconds": round(seconds, 2), "rows_read": rows, "rows_per_second": round(rows / seconds),
            "users_added": counts.added, "sessions": counts.access, "refresh_tokens": counts.refresh,
            "devices_without_token": counts.device_only, "deactivated": counts.deactivated}


def report_import(kind: str, figures: dict[str, Any]) -> None:
    print(f"  {kind:<11} {figures['seconds']:>6.2f} s  {figures['rows_per_second']:>8,} rows/s "
          f"({figures['rows_read']:,} rows read; {figures['users_added']:,} users, {figures['sessions']:,} sessions, "
          f"{figures['refresh_tokens']:,} refresh tokens, {figures['devices_without_token']:,} devices kept "
          "without a token)", flush=True)


async def plant_ours(folder: Path, synapse_db: Path, count: int) -> tuple[list[str], list[str]]:
    """`count` live imported tokens (not expiring) and as many of ours, opened as a login opens
    them, for the same users, on devices of their own."""
    conn = sqlite3.connect(synapse_db)
    rows = conn.execute(
        "SELECT token, substr(user_id, 2, instr(user_id, ':') - 2) FROM access_tokens WHERE valid_until_ms IS NULL"
        " AND puppets_user_id IS NULL AND device_id IS NOT NULL ORDER BY id LIMIT ?", (count,)).fetchall()
    conn.close()
    config = load_config(str(folder / "homeserver.toml"))
    backend, store = create_backend(config, quiet=True), create_session_store(config)
    await backend.start()
    await store.start()
    try:
        issuer, credentials = TokenIssuer(SECRET), build_credentials(config, SECRET)
        ours = []
        now = int(time.time() * 1000)
        from backends.sessions.records import Session

        for i, (_, name) in enumerate(rows):
            user = await backend.get_user(name)
            assert user is not None, name
            token = issuer.issue(name, f"OURS{i:05d}")
            fp = credentials.of(user)
            await store.open(Session(token_digest(token), name, f"OURS{i:05d}", now, "10.0.0.1", now,
                                     identity_fp=fp.identity, password_fp=fp.password), "ours")
            ours.append(token)
    finally:
        await store.close()
        await backend.close()
    return [r[0] for r in rows], ours


def wrk_rounds(base: str, pid: int, bodies: dict[str, Path], args: argparse.Namespace) -> dict[str, list[float]]:
    """Rounds of wrk on introspection, the kinds alternating; req/s of each round, by kind."""
    rates: dict[str, list[float]] = {kind: [] for kind in bodies}
    for round_ in range(args.rounds):
        for kind, path in (bodies.items() if round_ % 2 == 0 else reversed(bodies.items())):
            env = dict(os.environ, WRK_METHOD="POST", WRK_BODIES_FILE=str(path),
                       WRK_CONTENT_TYPE="application/x-www-form-urlencoded")
            command = wrk_command(base + INTROSPECT, args.duration, args.connections, token=SHARED)
            subprocess.run(wrk_command(base + INTROSPECT, 1, args.connections, token=SHARED), env=env,
                           capture_output=True, check=True)
            before = cpu_seconds(pid)
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            result = parse_wrk(kind, base + INTROSPECT, args.connections, out)
            cpu = (cpu_seconds(pid) - before) / max(result.requests, 1) * 1e6
            if result.errors:
                raise RuntimeError(f"{kind}: {result.errors} errors in {result.requests} requests")
            rates[kind].append(result.rps)
            print(f"  {kind:<9} {result.rps:>9.1f} req/s  p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms"
                  f"  server CPU {cpu:6.1f} us/req", flush=True)
    return rates


def introspection(folder: Path, synapse_db: Path, args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    imported, ours = asyncio.run(plant_ours(folder, synapse_db, args.tokens))
    bodies = {}
    for kind, tokens in (("imported", imported), ("ours", ours)):
        path = folder / f"{kind}.bodies"
        path.write_text("".join(f"token={t}&token_type_hint=access_token\n" for t in tokens))
        bodies[kind] = path
    port = free_port()
    config = our_config(folder, port)
    proc = procs.start([sys.executable, str(ROOT / "run.py"), "--config", str(config)], folder / "server.log")
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, base, folder / "server.log")
    for token in (imported[0], ours[0]):  # both answer active before anything is measured
        status, body = http(base + INTROSPECT, f"token={token}".encode(),
                            {"Authorization": f"Bearer {SHARED}", "Content-Type": "application/x-www-form-urlencoded"})
        if status != 200 or b'"active":true' not in body:
            raise RuntimeError(f"introspection did not answer active: {status} {body[:200]!r}")
    rates = wrk_rounds(base, proc.pid, bodies, args)
    procs.stop(proc)
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    return {"tokens": len(imported), "rates": rates, "medians": medians,
            "ratio": round(medians["imported"] / medians["ours"], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=50_000)
    parser.add_argument("--tokens", type=int, default=1000, help="tokens of each kind at introspection")
    parser.add_argument("--rounds", type=int, default=4, help="wrk rounds of each kind, alternating")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--output", help="results file (default bench/results/synapse_import-<time>.json)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="synapse-import-bench-"))
    results: dict[str, Any] = {"users": args.users, "devices": args.devices, "cpus": os.cpu_count()}
    targets: list[Target] = []
    cluster: PostgresCluster | None = None
    procs = Processes()
    try:
        path = folder / "synapse.db"
        create_schema(folder / "schema", {"name": "sqlite3", "args": {"database": str(path)}})
        connection = sqlite3.connect(path)
        results["generated"] = generate(SynapseRows(connection, postgres=False), args.users, args.devices)
        connection.close()
        print("the import (into a users file and the SQLite session store):", flush=True)
        results["sqlite"] = asyncio.run(import_into(folder / "from-sqlite", DatabaseSettings("sqlite3",
                                                                                         sqlite_path=str(path))))
        report_import("SQLite", results["sqlite"])
        targets.append(target("synapse_import", results["sqlite"]["seconds"], name="import from SQLite"))
        try:
            cluster = PostgresCluster()
            cluster.start()
        except PostgresUnavailable as exc:
            print(f"  PostgreSQL skipped: {exc}")
            cluster = None
        if cluster is not None:
            import psycopg

            cluster.create_database("synapse")
            create_schema(folder / "pg-schema", {"name": "psycopg2", "args": cluster.args("synapse")})
            with psycopg.connect(cluster.conninfo("synapse")) as conn:
                generate(SynapseRows(conn, postgres=True), args.users, args.devices)
                conn.execute("ANALYZE")
            settings = DatabaseSettings("psycopg2", postgres={"host": "127.0.0.1", "port": str(cluster.port),
                                                              "user": "postgres", "dbname": "synapse"})
            results["postgres"] = asyncio.run(import_into(folder / "from-postgres", settings))
            report_import("PostgreSQL", results["postgres"])
            targets.append(target("synapse_import", results["postgres"]["seconds"], name="import from PostgreSQL"))
        print(f"introspection, {args.tokens} tokens of each kind (imported syt_ / ours):", flush=True)
        results["introspection"] = introspection(folder / "from-sqlite", path, args, procs)
        targets.append(target("imported_introspect", results["introspection"]["ratio"],
                              f"({results['introspection']['medians']['imported']:.0f} vs "
                              f"{results['introspection']['medians']['ours']:.0f} req/s)"))
    except SynapseUnavailable as exc:
        print(f"Synapse cannot be had for its schema: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        procs.stop_all()
        if cluster is not None:
            cluster.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
    results["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    from common import finish

    return finish(results, targets, args.output, "synapse_import")


if __name__ == "__main__":
    raise SystemExit(main())
