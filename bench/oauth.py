#!/usr/bin/env python3
"""The OAuth 2.0 API's speed (issue 26), as ratios measured in one run on this machine:

- sign-ins through the code grant (the sign-in page, its form posted, the token exchange:
  one bcrypt each, as a password login) against the bcrypt ceiling measured around them;
- refresh-token grants (one store write each) against our whoami, wrk -t1 at the same
  connections, interleaved rounds. Each connection follows its own chain of refresh tokens
  (the Lua below takes the new refresh token from each answer for the next request), so the
  rotation path is what is measured, never the lost-answer retry;
- with `--introspection` (a real Synapse from the tests' cached virtualenv, tests/support/synapse.py,
  delegating to us): our POST /oauth2/introspect of an OAuth access token against our whoami
  with the same token.

Clients follow the interface contract only (tests/oauth_clients/flow.py: every endpoint from
`/_matrix/client/v1/auth_metadata`, the sign-in form as the contract describes it).

    python3 bench/oauth.py                                  # sign-ins and refresh
    python3 bench/oauth.py --introspection                  # and introspection (starts Synapse)
    python3 bench/oauth.py --duration 2 --warmup 1 --rounds 1 --signin-duration 4 --bcrypt-cost 10  # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BENCH_PASSWORD,
    BENCH_USER,
    LUA,
    ROOT,
    SERVER_NAME,
    WHOAMI,
    Processes,
    bench_run,
    finish,
    free_port,
    interrupted,
    wrk_missing,
)
from servers import checkpw_seconds, hash_once, load_average, machine, pool_capacity, start_homeserver, write_users
from targets import Target
from wrk import WrkResult, parse_wrk, run_wrk, wrk_command

from run import ensure_venv

sys.path.insert(0, str(ROOT))
from tests.oauth_clients.flow import OAuthClient

# Issue 26's floors: (what, limit, unit, higher is better).
LIMITS = {
    "signin": ("sign-ins through the code grant / bcrypt ceiling", 0.85, "x", True),
    "refresh": ("refresh grants / our whoami", 0.3, "x", True),
    "introspect": ("introspection of OAuth tokens / our whoami", 0.7, "x", True),
}
OAUTH = "[oauth]\nenabled = true\naccess_token_lifetime = {lifetime}\n"
SECRET = "bench-oauth-secret-shared-with-synapse-0123456789"

# Each connection's next refresh token is the one its last answer carried (a queue shared by
# the connections of wrk's one thread: as many tokens as connections, one in flight each).
REFRESH_LUA = """
dofile(os.getenv("WRK_REPORT"))
local tokens = {}
for t in string.gmatch(os.getenv("WRK_REFRESH_TOKENS"), "[^,]+") do tokens[#tokens + 1] = t end
local prefix = "grant_type=refresh_token&client_id=" .. os.getenv("WRK_CLIENT_ID") .. "&refresh_token="
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
-- wrk calls request() once before the run to check it, in the same Lua state with -t1, and
-- never sends that one: it must not take a token.
local checked = false
function request()
  if not checked then
    checked = true
    return wrk.format(nil, nil, nil, prefix .. "wrk-checks-the-request")
  end
  return wrk.format(nil, nil, nil, prefix .. (table.remove(tokens, 1) or "exhausted"))
end
function response(status, headers, body)
  local t = string.match(body, '"refresh_token"%s*:%s*"([^"]+)"')
  if t then tokens[#tokens + 1] = t end
end
"""


def limit(key: str, measured: float, note: str = "") -> Target:
    what, floor, unit, higher = LIMITS[key]
    return Target(what, measured, floor, unit, higher, note)


def sign_ins(client: OAuthClient, count: int, threads: int) -> list[Any]:
    """`count` sessions through the code grant, from `threads` threads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: client.sign_in(BENCH_USER, BENCH_PASSWORD), range(count)))


def phase_signins(args: argparse.Namespace, procs: Processes, tmp: Path, hashed: str, runs: dict[str, Any]) -> list[Target]:
    """Sign-ins with every bcrypt thread busy, against the ceiling measured before and after."""
    users = tmp / "users-signin.json"
    write_users(users, hashed, 1)
    hs, base, _, _ = start_homeserver(procs, tmp, "signin", users, sections=OAUTH.format(lifetime=300))
    try:
        cores = os.cpu_count() or 1
        threads = args.signin_connections or 2 * cores
        client = OAuthClient(base, client_name="bench")
        client.sign_in(BENCH_USER, BENCH_PASSWORD)  # warm: the page, the form, the exchange
        t_before = checkpw_seconds(hashed, args.checkpw_repeat)
        capacity = pool_capacity(hashed, cores)
        done, errors = [0], [0]
        stop = time.monotonic() + args.signin_duration

        def loop() -> None:
            while time.monotonic() < stop:
                try:
                    client.sign_in(BENCH_USER, BENCH_PASSWORD)
                    done[0] += 1
                except Exception as exc:
                    errors[0] += 1
                    if errors[0] == 1:
                        print(f"  first sign-in error: {exc!r}"[:400], flush=True)

        started = time.monotonic()
        pool = [threading.Thread(target=loop) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        rate = done[0] / (time.monotonic() - started)
        t_check = (t_before + checkpw_seconds(hashed, args.checkpw_repeat)) / 2
        ceiling = cores / t_check
        print(f"sign-ins through the code grant, {threads} clients: {rate:.2f}/s; bcrypt ceiling {cores} cores / "
              f"{t_check * 1000:.1f} ms = {ceiling:.2f}/s (the pool managed {capacity:.2f}/s just before); "
              f"errors {errors[0]}", flush=True)
        runs["signin"] = {"per_s": rate, "count": done[0], "errors": errors[0], "threads": threads,
                          "checkpw_ms": t_check * 1000, "cost": args.bcrypt_cost, "ceiling_per_s": ceiling,
                          "pool_capacity_per_s": capacity}
        if capacity < 0.9 * ceiling:
            print("  note: the machine is busy (the thread pool reaches under 90 % of the ceiling); rerun when "
                  "`uptime` shows a load under 1", flush=True)
        note = f"({rate:.2f} of {ceiling:.2f}/s; {rate / capacity:.2f} of what the pool managed now)"
        return [limit("signin", rate / ceiling, note),
                Target("sign-in errors", errors[0], 0, "count", False)]
    finally:
        procs.stop(hs)


def run_refresh(args: argparse.Namespace, base: str, client: OAuthClient, lua: Path, pid: int) -> WrkResult:
    """One wrk run of refresh grants, on as many fresh sessions as connections."""

    def once(duration: float) -> str:
        tokens = [t.refresh_token for t in sign_ins(client, args.connections, 4)]
        env = dict(os.environ, WRK_REPORT=str(LUA), WRK_REFRESH_TOKENS=",".join(tokens), WRK_CLIENT_ID=client.client_id)
        command = wrk_command(client.metadata["token_endpoint"], duration, args.connections)
        command[command.index("-s") + 1] = str(lua)
        return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout

    from common import cpu_seconds

    if args.warmup > 0:
        once(args.warmup)
    before = cpu_seconds(pid)
    result = parse_wrk("homeserver refresh", client.metadata["token_endpoint"], args.connections, once(args.duration))
    if result.requests:
        result.server_cpu_us = (cpu_seconds(pid) - before) / result.requests * 1e6
    print(f"  {result.name:<28} {result.rps:>9.1f} req/s  p50 {result.p50_ms:>7.2f} ms  p99 {result.p99_ms:>7.2f} ms"
          f"  non-2xx {result.non_2xx}  socket errors {result.socket_errors}  server CPU "
          f"{result.server_cpu_us or 0:6.1f} us/req", flush=True)
    return result


def phase_refresh(args: argparse.Namespace, procs: Processes, tmp: Path, runs: dict[str, Any]) -> list[Target]:
    """Refresh grants against whoami, interleaved rounds; the sessions' password at bcrypt's
    lowest cost (sign-ins are set-up here, not what is measured)."""
    users = tmp / "users-refresh.json"
    write_users(users, hash_once(4), 1)
    hs, base, _, _ = start_homeserver(procs, tmp, "refresh", users, sections=OAUTH.format(lifetime=3600))
    lua = tmp / "refresh.lua"
    lua.write_text(REFRESH_LUA)
    try:
        client = OAuthClient(base, client_name="bench refresh")
        token = client.sign_in(BENCH_USER, BENCH_PASSWORD).access_token
        print(f"refresh grants against whoami, wrk -t1 -c{args.connections}, {args.rounds} interleaved rounds:",
              flush=True)
        results: dict[str, list[WrkResult]] = {"refresh": [], "whoami": []}
        for _ in range(args.rounds):
            results["refresh"].append(run_refresh(args, base, client, lua, hs.pid))
            results["whoami"].append(run_wrk("homeserver whoami", base + WHOAMI, args, token=token, pid=hs.pid))
    finally:
        procs.stop(hs)
    runs.update({name: [asdict(r) for r in rs] for name, rs in results.items()})
    refresh = statistics.mean(r.rps for r in results["refresh"])
    whoami = statistics.mean(r.rps for r in results["whoami"])
    errors = sum(r.errors for rs in results.values() for r in rs)
    return [limit("refresh", refresh / whoami, f"({refresh:.0f} vs {whoami:.0f} req/s)"),
            Target("refresh runs: errors", errors, 0, "count", False)]


def phase_introspection(args: argparse.Namespace, procs: Processes, tmp: Path, runs: dict[str, Any]) -> list[Target]:
    """Our introspection of an OAuth access token (as Synapse asks) against our whoami."""
    from delegation import run_wrk_form

    from tests.support.synapse import Synapse, SynapseUnavailable

    users = tmp / "users-introspect.json"
    write_users(users, hash_once(4), 1)
    synapse_port = free_port()
    section = (f'[delegation]\nenabled = true\nsynapse_url = "http://127.0.0.1:{synapse_port}"\n'
               f'secret = "{SECRET}"\nretry_interval = 1.0\n' + OAUTH.format(lifetime=3600))
    hs, base, _, _ = start_homeserver(procs, tmp, "introspect", users, sections=section)
    synapse = Synapse(tmp / "synapse", SERVER_NAME, port=synapse_port, mas_endpoint=base + "/", mas_secret=SECRET,
                      log_level="WARNING")
    try:
        print("introspection: starting Synapse (delegating to us) ...", flush=True)
        synapse.start()
        token = OAuthClient(base, client_name="bench introspection").sign_in(BENCH_USER, BENCH_PASSWORD).access_token
        form = f"token={token}&token_type_hint=access_token"
        print(f"introspection of an OAuth token against whoami, wrk -t1 -c{args.connections}:", flush=True)
        results: dict[str, list[WrkResult]] = {"introspect": [], "whoami": []}
        for _ in range(args.rounds):
            results["introspect"].append(run_wrk_form("homeserver introspect (OAuth)", base + "/oauth2/introspect",
                                                      args, form, SECRET, hs.pid))
            results["whoami"].append(run_wrk("homeserver whoami (OAuth)", base + WHOAMI, args, token=token, pid=hs.pid))
    except SynapseUnavailable as exc:
        print(f"introspection: Synapse cannot be had ({exc}); skipped", flush=True)
        return []
    finally:
        synapse.stop()
        procs.stop(hs)
    runs.update({f"oauth_{name}": [asdict(r) for r in rs] for name, rs in results.items()})
    introspect = statistics.mean(r.rps for r in results["introspect"])
    whoami = statistics.mean(r.rps for r in results["whoami"])
    errors = sum(r.errors for rs in results.values() for r in rs)
    return [limit("introspect", introspect / whoami, f"({introspect:.0f} vs {whoami:.0f} req/s)"),
            Target("introspection runs: errors", errors, 0, "count", False)]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=4, help="seconds measured per wrk run (default 4)")
    p.add_argument("--warmup", type=float, default=2, help="seconds of warm-up before each (default 2)")
    p.add_argument("--connections", type=int, default=50, help="wrk connections, one thread (default 50)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each pair (default 3)")
    p.add_argument("--signin-duration", type=float, default=10, help="seconds of the sign-in run (default 10)")
    p.add_argument("--signin-connections", type=int, default=0, help="sign-in clients (default 2 x cores)")
    p.add_argument("--bcrypt-cost", type=int, default=12, help="cost of the stored hash (default 12)")
    p.add_argument("--checkpw-repeat", type=int, default=5, help="checkpw timings for the ceiling (median)")
    p.add_argument("--introspection", action="store_true",
                   help="also measure introspection of OAuth tokens (starts a Synapse delegating to us)")
    p.add_argument("--output", help="result file (default bench/results/oauth-<time>.json)")
    return p.parse_args()


def main() -> int:
    if wrk_missing():
        return 2
    ensure_venv()
    args = parse_args()
    info = machine()
    print(f"machine: {info['nproc']} cores, {info['cpu']}; load average {info['load_average_at_start']}", flush=True)
    results: dict[str, Any] = {"machine": info, "settings": vars(args).copy(), "runs": {}}
    targets: list[Target] = []
    try:
        with bench_run("homeserver-bench-oauth-") as (procs, tmp):
            print(f"hashing the bench password at cost {args.bcrypt_cost} ...", flush=True)
            targets += phase_signins(args, procs, tmp, hash_once(args.bcrypt_cost), results["runs"])
            targets += phase_refresh(args, procs, tmp, results["runs"])
            if args.introspection:
                targets += phase_introspection(args, procs, tmp, results["runs"])
    except KeyboardInterrupt:
        return interrupted()
    results["targets"] = [asdict(t) for t in targets]
    results["load_average_at_end"] = load_average()
    return finish(results, targets, args.output, "oauth")


if __name__ == "__main__":
    sys.exit(main())
