"""Moving a Synapse here, the reading half: a generated Synapse database of 10,000 users,
50,000 devices and 50,000 access tokens (and refresh tokens, addresses, profiles), read
through backends/synapse, from SQLite and from PostgreSQL, in rows per second.

The schema is Synapse's own, made by the pinned Synapse (tests/support/synapse_schema.py runs
its update_synapse_database on the empty database); the rows are bulk-inserted as Synapse
stores them (executemany on SQLite, COPY on PostgreSQL), devices and tokens in shuffled
order, as years of logins leave them. PostgreSQL is a private cluster (tests/support/postgres.py).

    .venv/bin/python bench/synapse_db.py [--users 10000] [--devices 50000] [--keep DIR]

`--keep DIR` leaves the SQLite file and the cluster's data there (for the import bench);
otherwise everything is removed. Rates are of this machine in this run; the issue's budget is
the whole import in under a minute, so reading gets a quarter of it (LIMITS["synapse_read"]).
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import resource
import secrets
import shutil
import sqlite3
import statistics
import string
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT
from targets import Target, target

sys.path.insert(0, str(ROOT))
from backends.synapse.config import DatabaseSettings
from backends.synapse.database import SynapseDatabase
from homeserver.synapse_tokens import base62
from tests.support.postgres import PostgresCluster, PostgresUnavailable
from tests.support.synapse import SynapseUnavailable
from tests.support.synapse_schema import SynapseRows, create_schema

SERVER = "localhost"
HASH = "$2b$12$" + "N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"  # bcrypt's shape; never checked here
DAY = 86_400_000


def synapse_token(prefix: str, localpart: str) -> str:
    """A token as Synapse makes it (`syt_`/`syr_`, base64 localpart, 20 random letters, base62 CRC)."""
    b64local = base64.b64encode(localpart.encode("utf-8")).decode("ascii").rstrip("=")
    base = f"{prefix}_{b64local}_{''.join(secrets.choice(string.ascii_letters) for _ in range(20))}"
    return f"{base}_{base62(zlib.crc32(base.encode('ascii')))}"


def generate(rows: SynapseRows, users: int, devices: int, seed: int = 35) -> dict[str, int]:
    """Users (1 % admins, 1 % locked, 1 % deactivated without devices), `devices` devices over
    the active ones with one access token each (every fifth refreshable, with a refresh token;
    a few expired or an admin's impersonation), a hidden cross-signing row for every fifth
    user, an address for every other, a profile for each."""
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    names = [f"user{i:05d}" for i in range(users)]
    uid = "@{}:localhost".format
    rows.users({
        "name": uid(n), "password_hash": None if i % 100 == 99 else HASH, "admin": i % 100 == 0,
        "locked": i % 100 == 50, "deactivated": i % 100 == 99, "creation_ts": 1_600_000_000 + i,
    } for i, n in enumerate(names))
    active = [n for i, n in enumerate(names) if i % 100 != 99]
    owners = [active[i % len(active)] for i in range(devices)]
    order = list(range(devices))
    rng.shuffle(order)
    rows.devices([{"user_id": uid(owners[i]), "device_id": f"DEV{i:06d}", "display_name": f"Device {i}",
                   "last_seen": now - rng.randrange(90 * DAY), "ip": "10.0.0.1", "user_agent": "Element/1.11"}
                  for i in order]
                 + [{"user_id": uid(n), "device_id": f"master-key-{n}", "hidden": True} for n in active[::5]])
    refreshable = [i for i in order if i % 5 == 0]
    rows.refresh_tokens({"id": 1_000_000 + i, "user_id": uid(owners[i]), "device_id": f"DEV{i:06d}",
                         "token": synapse_token("syr", owners[i])} for i in refreshable)
    rows.access_tokens({
        "user_id": uid(owners[i]), "device_id": f"DEV{i:06d}", "token": synapse_token("syt", owners[i]),
        "valid_until_ms": (now + 300_000 if i % 10 else now - DAY) if i % 5 == 0 else None,
        "refresh_token_id": 1_000_000 + i if i % 5 == 0 else None, "last_validated": now - rng.randrange(DAY),
        "used": True if i % 5 == 0 else None,
    } for i in order)
    rows.access_tokens([{"user_id": uid(active[0]), "device_id": None, "token": synapse_token("syt", active[0]),
                         "puppets_user_id": uid(n)} for n in active[1:11]])
    rows.threepids({"user_id": uid(n), "address": f"{n}@example.org"} for n in names[::2])
    rows.profiles({"localpart": n, "full_user_id": uid(n), "displayname": f"User {n[4:]}"} for n in names)
    rows.commit()
    return {"users": users, "devices": devices, "access_tokens": devices + 10, "refresh_tokens": len(refreshable),
            "threepids": len(names[::2]), "profiles": users, "hidden_devices": len(active[::5])}


def timed(runs: int, work: Callable[[], int]) -> tuple[float, int]:
    """The median seconds of `runs` runs of `work` (which returns the rows it read)."""
    times, count = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        count = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), count


def read_all(settings: DatabaseSettings, runs: int) -> dict[str, Any]:
    """Rows per second of each stream alone, and of the whole accounts() merge."""

    def stream(name: str) -> Callable[[], int]:
        def work() -> int:
            with SynapseDatabase.open(settings) as db:
                rows: Iterator[Any] = getattr(db, name)(SERVER) if name == "profiles" else getattr(db, name)()
                return sum(1 for _ in rows)
        return work

    def accounts() -> int:
        with SynapseDatabase.open(settings) as db:
            total = 0
            for account in db.accounts(SERVER):
                total += 1 + len(account.devices) + len(account.access_tokens) + len(account.refresh_tokens)
                total += len(account.threepids) + (account.profile is not None)
            return total

    result: dict[str, Any] = {}
    for name in ("users", "devices", "access_tokens", "refresh_tokens", "threepids", "profiles"):
        seconds, count = timed(runs, stream(name))
        result[name] = {"rows": count, "seconds": round(seconds, 3), "rows_per_second": round(count / seconds)}
    seconds, count = timed(runs, accounts)
    result["accounts"] = {"rows": count, "seconds": round(seconds, 3), "rows_per_second": round(count / seconds)}
    return result


def report(kind: str, made: float, result: dict[str, Any]) -> None:
    print(f"\n{kind}: generated in {made:.1f} s")
    for name, figures in result.items():
        print(f"  {name:<15} {figures['rows']:>7} rows  {figures['seconds']:>7.3f} s  {figures['rows_per_second']:>9,} rows/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each read; the median is kept")
    parser.add_argument("--keep", help="leave the databases in this folder")
    parser.add_argument("--output", help="results file (default bench/results/synapse_db-<time>.json)")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="synapse-db-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"users": args.users, "devices": args.devices, "runs": args.runs, "cpus": os.cpu_count()}
    targets: list[Target] = []
    cluster: PostgresCluster | None = None
    try:
        path = folder / "homeserver.db"
        path.unlink(missing_ok=True)
        started = time.perf_counter()
        create_schema(folder / "sqlite", {"name": "sqlite3", "args": {"database": str(path)}})
        connection = sqlite3.connect(path)
        results["generated"] = generate(SynapseRows(connection, postgres=False), args.users, args.devices)
        connection.close()
        made = time.perf_counter() - started
        results["sqlite"] = read_all(DatabaseSettings("sqlite3", sqlite_path=str(path)), args.runs)
        report("SQLite", made, results["sqlite"])
        targets.append(target("synapse_read", results["sqlite"]["accounts"]["seconds"], name="SQLite: read every account"))
        try:
            cluster = PostgresCluster(str(folder / "postgres-cluster") if args.keep else None)
            cluster.start()
        except PostgresUnavailable as exc:
            print(f"\nPostgreSQL skipped: {exc}")
            cluster = None
        if cluster is not None:
            import psycopg

            started = time.perf_counter()
            cluster.create_database("synapse")
            create_schema(folder / "postgres", {"name": "psycopg2", "args": cluster.args("synapse")})
            with psycopg.connect(cluster.conninfo("synapse")) as conn:
                generate(SynapseRows(conn, postgres=True), args.users, args.devices)
                conn.execute("ANALYZE")
            made = time.perf_counter() - started
            settings = DatabaseSettings("psycopg2", postgres={"host": "127.0.0.1", "port": str(cluster.port),
                                                              "user": "postgres", "dbname": "synapse"})
            results["postgres"] = read_all(settings, args.runs)
            report("PostgreSQL", made, results["postgres"])
            targets.append(target("synapse_read", results["postgres"]["accounts"]["seconds"],
                                  name="PostgreSQL: read every account"))
    except SynapseUnavailable as exc:
        print(f"Synapse cannot be had for its schema: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        if cluster is not None and args.keep:
            cluster.stop()
            print(f"kept: {folder / 'homeserver.db'} and the PostgreSQL cluster in {cluster.data} (database synapse)")
        elif cluster is not None:
            cluster.cleanup()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    results["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\npeak resident memory of this process: {results['max_rss_mb']} MB")
    from common import finish

    return finish(results, targets, args.output, "synapse_db")


if __name__ == "__main__":
    raise SystemExit(main())
