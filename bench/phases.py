"""The optional phases: Redis, logout throughput, the session check's cost, another homeserver."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import (
    BENCH_USER,
    CAPABILITIES,
    LOGOUT,
    PROFILE,
    ROOT,
    VERSIONS,
    WHOAMI,
    Processes,
    cpu_seconds,
    http,
    require_loopback,
)
from servers import get_tokens, hash_once, start_homeserver, write_users
from targets import Target, target
from wrk import run_wrk


def bench_redis(args: argparse.Namespace, procs: Processes, tmp: Path, hashed: str, bare_pid: int, bare_base: str,
                runs: dict[str, Any]) -> list[Target]:
    """Profile on the Redis user backend; capabilities and whoami with the session check on
    the Redis session store (users from the file, so only the session store changes from
    the default run). Keys under prefixes of their own, deleted afterwards."""
    import redis

    url = args.redis_url
    require_loopback(url.replace("redis://", "http://"))
    tag = f"bench-{os.getpid()}-{secrets.token_hex(4)}"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        print(f"redis at {url} unreachable ({exc}); skipping the Redis runs", flush=True)
        return []
    results = {}
    try:
        prefix = f"{tag}:user:"
        client.hset(prefix + BENCH_USER, mapping={"password": hashed, "ident": " (bench)", "display_name": "Bench User",
                                                  "avatar_url": "mxc://localhost/bench"})
        users_section = f'[backend.redis]\nurl = "{url}"\nkey_prefix = "{prefix}"\n'
        sessions_section = f'[sessions]\nstore = "redis"\n[sessions.redis]\nurl = "{url}"\nkey_prefix = "{tag}:session:"\n'
        print(f"redis ({url}, prefix {tag}): the user backend, then the session store:", flush=True)
        # The floor again, just before and after: minutes have passed since the first.
        floors = [run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare_pid)]
        hs, base, _, _ = start_homeserver(procs, tmp, "redis-users", tmp / "users.json", backend="redis",
                                          sections=users_section)
        try:
            results["profile"] = run_wrk("homeserver profile (redis users)", base + PROFILE, args, pid=hs.pid)
        finally:
            procs.stop(hs)
        hs, base, _, _ = start_homeserver(procs, tmp, "redis-sessions", tmp / "users.json", sections=sessions_section)
        try:
            token = get_tokens(base, 1)[0]
            for name, path in (("capabilities", CAPABILITIES), ("whoami", WHOAMI)):
                results[name] = run_wrk(f"homeserver {name} (redis sessions)", base + path, args, token=token, pid=hs.pid)
        finally:
            procs.stop(hs)
        floors.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare_pid))
    finally:
        keys = list(client.scan_iter(match=tag + ":*"))
        if keys:
            client.delete(*keys)
        client.close()
    for name, result in results.items():
        runs[f"{name}_redis"] = [asdict(result)]
    runs["bare_tornado_versions_around_redis"] = [asdict(f) for f in floors]
    floor = statistics.mean(f.rps for f in floors)
    return [target(f"redis_{name}", result.rps / floor) for name, result in results.items()] + [
        target("redis_errors", sum(r.errors for r in results.values()))
    ]


def bench_logout(args: argparse.Namespace, procs: Processes, tmp: Path, runs: dict[str, Any]) -> None:
    """Logout throughput: fresh tokens made first (a cheap hash, so that is quick), then each
    logged out once from 8 threads; req/s and server CPU per logout. No target: recorded."""
    users = tmp / "users-logout.json"
    write_users(users, hash_once(4), 1)
    hs, base, _, _ = start_homeserver(procs, tmp, "logout", users)
    try:
        tokens = get_tokens(base, args.logouts)
        cpu_before, started = cpu_seconds(hs.pid), time.perf_counter()

        def logout(token: str) -> int:
            return http(base + LOGOUT, b"{}", {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})[0]

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(logout, tokens))
        elapsed = time.perf_counter() - started
        cpu = (cpu_seconds(hs.pid) - cpu_before) / len(tokens) * 1e6
        dead = http(base + WHOAMI, None, {"Authorization": f"Bearer {tokens[0]}"})[0]
    finally:
        procs.stop(hs)
    failed = sum(status != 200 for status in statuses)
    rate = len(tokens) / elapsed
    print(f"  {'logout (SQLite, 8 clients)':<28} {rate:>9.1f} req/s  server CPU {cpu:6.1f} us/req  failed {failed}; "
          f"a logged-out token then gets {dead}", flush=True)
    runs["logout"] = {"tokens": len(tokens), "per_s": rate, "server_cpu_us": cpu, "failed": failed, "after": dead}


def bench_store_cost(args: argparse.Namespace, runs: dict[str, Any]) -> None:
    """The revocation check's cost: one session lookup (what every authenticated request
    adds), timed in-process on SQLite and, with --redis, on Redis."""
    sys.path.insert(0, str(ROOT))
    from backends.sessions import Session, create_session_store
    from homeserver.config import build_config

    async def per_lookup(kind: str, options: dict[str, Any], directory: str) -> float:
        store = create_session_store(kind, options, config_dir=directory)
        await store.start()
        try:
            now = int(time.time() * 1000)
            await store.open(Session("bench", "bench", "D", now, "127.0.0.1", now), None)
            for _ in range(500):
                await store.get("bench", "bench")
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                for _ in range(5000):
                    await store.get("bench", "bench")
                best = min(best, (time.perf_counter() - started) / 5000 * 1e6)
            await store.end_devices("bench", None)
            return best
        finally:
            await store.close()

    cost: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        sqlite = dict(build_config({}).section("sessions.sqlite"), path=os.path.join(directory, "s.db"))
        cost["sqlite_us"] = asyncio.run(per_lookup("sqlite", sqlite, directory))
        if args.redis:
            redis_options = dict(build_config({"sessions": {"redis": {"url": args.redis_url,
                                 "key_prefix": f"bench-{secrets.token_hex(4)}:"}}}).section("sessions.redis"))
            cost["redis_us"] = asyncio.run(per_lookup("redis", redis_options, directory))
    print("  session check (one lookup, in-process): " + ", ".join(f"{k[:-3]} {v:.1f} us" for k, v in cost.items()), flush=True)
    runs["session_check"] = cost


def bench_target(args: argparse.Namespace, runs: dict[str, Any]) -> None:
    """The same wrk shape against another homeserver on this machine, for a side-by-side."""
    base = args.target_url.rstrip("/")
    require_loopback(base)
    print(f"other server at {base}:", flush=True)
    out = {"versions": asdict(run_wrk("target versions", base + VERSIONS, args))}
    if args.target_user:
        out["profile"] = asdict(run_wrk("target profile", f"{base}/_matrix/client/v3/profile/{args.target_user}", args))
    if args.target_token:
        out["capabilities"] = asdict(run_wrk("target capabilities", base + CAPABILITIES, args, token=args.target_token))
    runs["target"] = out
