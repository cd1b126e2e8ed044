"""The directory sweep (issue 36): what one sweep of 10,000 users costs, and what it costs the
requests served meanwhile.

- unchanged: a sweep of 10,000 users Synapse already has as they are, in each store (a
  private slapd behind a soft size limit of 500 that paged searches pass, a private Redis,
  the users file), with 1,000 of them holding a session here: its seconds and its calls to
  Synapse (the in-process fake, which counts them), and the loop's longest callback (CPU)
  meanwhile (bench/listing.py's probe). Goal: no call, under 10 s.
- new: a sweep of 10,000 users a real Synapse (the tests' pinned one, SQLite, warnings
  only) has never seen, from the users file: users provisioned per second, at the sweep's
  concurrency (2) and others over a sample (`--concurrency 2,1,4`).
- flood: wrk's /versions probe (-c10) during a login flood, with sweeps one after another
  (the first provisioning all 10,000) and without, alternating (bench/sweep_flood.py).
  Goal: /versions p99 under 50 ms; and the loop's longest callback in CPU time, which the
  machine's other load does not move.

    python3 bench/sweep.py [--users 10000] [--phases unchanged,new,flood] [--stores ldap,redis,file]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, VENV, bench_run, finish, interrupted

if __name__ == "__main__" and not os.environ.get("BENCH_NO_VENV") and Path(sys.prefix).resolve() != VENV.resolve():
    if not (VENV / "bin" / "python").exists():
        sys.exit("run scripts/test.sh or bench/run.py once first (they create .venv), or set BENCH_NO_VENV=1")
    os.execv(str(VENV / "bin" / "python"), [str(VENV / "bin" / "python"), str(Path(__file__).resolve()), *sys.argv[1:]])
sys.path.insert(0, str(ROOT))

from listing import PAGED_LIMIT, Probe
from sweep_flood import phase_flood
from targets import Target

from backends.sessions.base import Session
from homeserver.config import build_config
from homeserver.context import build_homeserver, create_backend, create_session_store
from tests.support.delegation_fakes import FakeSynapse
from tests.support.helpers import hex_hash
from tests.support.redis_servers import RedisProcess, require_redis_server
from tests.support.slapd import READER_DN, READER_PASSWORD, SUFFIX, Slapd, base_ldif, crypt_bcrypt, person
from tests.support.synapse import Synapse, free_port

UNCHANGED_SECONDS = 10.0  # the goal for a sweep of 10,000 unchanged users
FLOOD_P99_MS = 50.0  # the bound on /versions p99 during a sweep and a login flood
SESSIONS = 1000


def config_for(tmp: Path, backend: dict[str, Any], synapse_url: str, secret: str, **delegation: Any) -> Any:
    sections = {
        "auth": {"jwt_secret": "bench-secret-that-is-at-least-32-bytes-long", "bcrypt_rounds": 4},
        "backend": backend,
        "sessions": {"sqlite": {"path": str(tmp / f"sessions-{time.monotonic_ns()}.db")}},
        "delegation": {"enabled": True, "synapse_url": synapse_url, "secret": secret, "sync_interval": 3600.0,
                       "timeout": 30.0, **delegation},
    }
    return build_config(sections, path=str(tmp / "homeserver.toml"), environ={})


def file_backend(tmp: Path, users: int) -> dict[str, Any]:
    path = tmp / "users.json"
    hashed = hex_hash("bench-pw")
    path.write_text(json.dumps({"users": [
        {"name": f"user{i:05d}", "password": hashed, "ident": f" ({i})", "display_name": f"User {i}",
         "email": f"user{i}@example.org"} for i in range(users)]}))
    os.chmod(path, 0o600)
    return {"type": "file", "file": {"path": str(path)}}


async def sweep_unchanged(store: str, backend: dict[str, Any], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    fake = FakeSynapse()
    fake.start()
    config = config_for(tmp, backend, fake.url, fake.secret)
    user_backend, session_store = create_backend(config), create_session_store(config)
    await user_backend.start()
    await session_store.start()
    hs = build_homeserver(config, user_backend, session_store)
    try:
        first = await hs.sweeper.sweep_now()  # Synapse gets everyone: from now on they are unchanged
        now = int(time.time() * 1000)
        for i in range(min(SESSIONS, args.users)):
            name = f"user{i:05d}"
            await session_store.open(Session(f"{i:064x}", name, "DEVICE", now, "127.0.0.1", now), "bench")
        calls, seconds = len(fake.calls), []
        probe = Probe(user_backend, "user00042")

        async def sweeps() -> None:
            for _ in range(args.runs):
                start = time.perf_counter()
                report = await hs.sweeper.sweep_now()
                seconds.append(time.perf_counter() - start)
                assert report.unchanged == args.users, report

        await probe.around(sweeps)
        result = {"store": store, "first_sweep_seconds": round(first.seconds, 2), "seconds": [round(s, 2) for s in seconds],
                  "seconds_median": round(sorted(seconds)[len(seconds) // 2], 2), "calls_to_synapse": len(fake.calls) - calls,
                  "sessions_here": min(SESSIONS, args.users), **probe.summary()}
    finally:
        await hs.delegation.close()
        hs.checker.close()
        await session_store.close()
        await user_backend.close()
        await fake.stop()
    print(json.dumps(result), flush=True)
    return result


async def phase_unchanged(args: argparse.Namespace, tmp: Path, results: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    for store in args.stores.split(","):
        print(f"unchanged: {store}, {args.users} users, {args.runs} sweeps ...", flush=True)
        if store == "file":
            figures = await sweep_unchanged(store, file_backend(tmp, args.users), args, tmp)
        elif store == "redis":
            require_redis_server()
            server = RedisProcess(str(tmp / "redis"), []).start()
            try:
                client = server.client()
                pipe = client.pipeline(transaction=False)
                for i in range(args.users):
                    pipe.hset(f"bench:user:user{i:05d}", mapping={"password": hex_hash("bench-pw"), "ident": f" ({i})",
                                                                   "display_name": f"User {i}"})
                pipe.execute()
                client.close()
                figures = await sweep_unchanged(store, {"type": "redis", "redis": {
                    "url": server.url, "key_prefix": "bench:user:"}}, args, tmp)
            finally:
                server.stop()
        else:
            password = crypt_bcrypt("bench-pw")
            people = (person(f"user{i:05d}", displayName=f"User {i}", userPassword=password) for i in range(args.users))
            slapd = Slapd("\n".join([base_ldif(), *people]), tls=False, size_limit=PAGED_LIMIT)
            try:
                slapd.start()
                figures = await sweep_unchanged(store, {"type": "ldap", "ldap": {
                    "uri": slapd.uri, "base": SUFFIX, "bind_dn": READER_DN, "bind_password": READER_PASSWORD,
                    "attributes": {"ident": "uid"}}}, args, tmp)
            finally:
                slapd.cleanup()
        results[f"unchanged_{store}"] = figures
        out += [
            Target(f"{store}: sweep of {args.users} unchanged users", figures["seconds_median"], UNCHANGED_SECONDS, "s",
                   False),
            Target(f"{store}: calls to Synapse in it", figures["calls_to_synapse"], 0, "calls", False),
        ]
    return out


async def sweep_new(args: argparse.Namespace, tmp: Path, synapse: Synapse, secret: str, concurrency: int,
                    users: int) -> dict[str, Any]:
    folder = tmp / f"new-{concurrency}"
    folder.mkdir()
    backend = file_backend(folder, users)
    # Names of this run's own: Synapse keeps the users of the runs before.
    path = Path(backend["file"]["path"])
    text = path.read_text().replace('"name": "user', f'"name": "c{concurrency}u')
    path.write_text(text.replace('"email": "user', f'"email": "c{concurrency}u'))
    config = config_for(folder, backend, synapse.url, secret)
    user_backend, session_store = create_backend(config), create_session_store(config)
    await user_backend.start()
    await session_store.start()
    hs = build_homeserver(config, user_backend, session_store)
    assert hs.sweeper is not None
    hs.sweeper.sweep.concurrency = concurrency
    hs.sweeper.sweep._calls = asyncio.Semaphore(concurrency)
    try:
        report = await hs.sweeper.sweep_now()
    finally:
        await hs.delegation.close()
        hs.checker.close()
        await session_store.close()
        await user_backend.close()
    result = {"concurrency": concurrency, "users": users, "created": report.created, "failed": report.failed,
              "seconds": round(report.seconds, 1), "users_per_second": round(report.created / report.seconds, 1)}
    print(json.dumps(result), flush=True)
    return result


async def phase_new(args: argparse.Namespace, tmp: Path, results: dict[str, Any]) -> list[Target]:
    secret = "bench-sweep-secret-0123456789abcdef0123456789"
    synapse = Synapse(tmp / "synapse", mas_endpoint=f"http://127.0.0.1:{free_port()}/", mas_secret=secret,
                      log_level="WARNING")
    synapse.start()
    runs = []
    try:
        for index, concurrency in enumerate(int(c) for c in args.concurrency.split(",")):
            users = args.users if index == 0 else args.sample
            print(f"new: {users} users at Synapse, {concurrency} calls at once ...", flush=True)
            runs.append(await sweep_new(args, tmp, synapse, secret, concurrency, users))
    finally:
        synapse.stop()
    results["new"] = runs
    return [Target(f"new users provisioned per second ({r['concurrency']} at once, {r['users']} users)",
                   r["users_per_second"], 1, "/s", True) for r in runs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="unchanged sweeps per store")
    parser.add_argument("--phases", default="unchanged,new,flood")
    parser.add_argument("--stores", default="ldap,redis,file")
    parser.add_argument("--concurrency", default="2,1,4",
                        help="calls to Synapse at once in the new-users sweeps: the first over --users, the others "
                             "over --sample")
    parser.add_argument("--sample", type=int, default=2000, help="users of the new-users sweeps after the first")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each wrk run in the flood phase")
    parser.add_argument("--rounds", type=int, default=2, help="flood runs with and without sweeps, alternating")
    parser.add_argument("--bcrypt-cost", type=int, default=10)
    parser.add_argument("--output", help="results file (default bench/results/sweep-<time>.json)")
    args = parser.parse_args()
    args.warmup = 0
    results: dict[str, Any] = {"users": args.users}
    targets: list[Target] = []
    phases = args.phases.split(",")
    try:
        with bench_run("homeserver-sweep-") as (_, tmp):
            if "unchanged" in phases:
                targets += asyncio.run(phase_unchanged(args, tmp, results))
            if "new" in phases:
                targets += asyncio.run(phase_new(args, tmp, results))
            if "flood" in phases:
                targets += phase_flood(args, tmp, results)
    except KeyboardInterrupt:
        return interrupted()
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return finish(results, targets, args.output, "sweep")


if __name__ == "__main__":
    sys.exit(main())
