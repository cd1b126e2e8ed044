#!/usr/bin/env python3
"""OAuth sign-ins with a second factor against sign-ins without one (issue 38: with TOTP at
least 0.9 of the rate without; both are bcrypt-bound, and the second step adds one page and one
code check, no second bcrypt), as a ratio measured in one run on this machine.

Two servers side by side on the same users file (every user's password hashed at the cost
given): `[oauth]` alone, and `[oauth]` with `[mfa]`, where every user has an authenticator app
(added in the server's own store before the run, as the security page adds one). The rounds
alternate between the two, each for the same time, from the same number of client threads, in
the order AB BA AB ... so that a machine growing busier or quieter weighs on both alike; the
figure is the median of the rounds' ratios;
each sign-in is the whole code grant as the contract's client makes it (tests/oauth_clients/
flow.py: the sign-in page, its form, with a second factor the second step's page and its code,
the redirect, the token exchange). A code is taken once, so the clients sign in as many users
in turn, each with a code of a time step it has not used (tests/support/second_factors.py).

    python3 bench/mfa_signin.py                        # default: 6 rounds of 5 s each way, cost 12
    python3 bench/mfa_signin.py --rounds 1 --round-duration 3 --bcrypt-cost 8   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BENCH_PASSWORD, Processes, bench_run, cpu_seconds, finish, interrupted
from servers import checkpw_seconds, hash_once, load_average, machine, start_homeserver, write_users
from targets import Target

from run import ensure_venv

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.oauth_clients.flow import OAuthClient  # noqa: E402
from tests.support.second_factors import App  # noqa: E402

KEY = "the bench's second-factor key, at least 32 bytes long"
OAUTH = "[oauth]\nenabled = true\n"
MFA = OAUTH + f'[mfa]\nenabled = true\nkey = "{KEY}"\n'
LIMIT = 0.9


def enrol(config: Path, names: list[str]) -> dict[str, App]:
    """An authenticator app for each person, kept in the running server's session file (another
    process on the same SQLite file, as `run.py mfa` commands are), its first code typed."""
    from backends.sessions.sqlite import SqliteSessionStore
    from homeserver.config import load_config
    from homeserver.mfa.service import SecondFactors

    async def work() -> dict[str, App]:
        loaded = load_config(str(config))
        store = SqliteSessionStore(loaded.resolve_path(loaded.get("sessions.sqlite", "path")))
        await store.start()
        try:
            factors = SecondFactors.from_config(loaded, store.factors(), None)
            apps: dict[str, App] = {}
            for name in names:
                enrolment = await factors.begin_totp(name)
                apps[name] = App.from_uri(enrolment.uri)
                await factors.finish_totp(name, enrolment.pending, apps[name].code())
            return apps
        finally:
            await store.close()

    return asyncio.run(work())


def one_round(client: OAuthClient, people: queue.Queue[str], apps: dict[str, App] | None, threads: int,
              seconds: float) -> tuple[int, int, float]:
    """Sign-ins from `threads` threads for `seconds`, each person in turn: (done, errors, seconds)."""
    done, errors = [0], [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < stop:
            name = people.get()
            app = apps[name] if apps is not None else None
            if app is not None and not app.ready():  # its codes of this window are used: the next person
                people.put(name)
                time.sleep(0.001)
                continue
            try:
                client.sign_in(name, BENCH_PASSWORD, second_factor=app.code if app is not None else None)
                with lock:
                    done[0] += 1
            except Exception as exc:
                with lock:
                    errors[0] += 1
                    if errors[0] == 1:
                        print(f"  first sign-in error: {exc!r}"[:400], flush=True)
            finally:
                people.put(name)

    started = time.monotonic()
    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return done[0], errors[0], time.monotonic() - started


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="rounds each way, alternating (default 6)")
    p.add_argument("--round-duration", type=float, default=5, help="seconds of each round (default 5)")
    p.add_argument("--threads", type=int, default=0, help="client threads (default 2 x cores)")
    p.add_argument("--users", type=int, default=200, help="people signing in in turn (default 200)")
    p.add_argument("--bcrypt-cost", type=int, default=12, help="cost of the stored hashes (default 12)")
    p.add_argument("--output", help="result file (default bench/results/mfa-signin-<time>.json)")
    return p.parse_args()


def main() -> int:
    ensure_venv()
    args = parse_args()
    info = machine()
    cores = os.cpu_count() or 1
    threads = args.threads or 2 * cores
    print(f"machine: {info['nproc']} cores, {info['cpu']}; load average {info['load_average_at_start']}", flush=True)
    results: dict[str, Any] = {"machine": info, "settings": {**vars(args), "threads": threads}, "runs": {}}
    try:
        with bench_run("homeserver-bench-mfa-") as (procs, tmp):
            print(f"hashing the bench password at cost {args.bcrypt_cost} ...", flush=True)
            hashed = hash_once(args.bcrypt_cost)
            users = tmp / "users.json"
            write_users(users, hashed, args.users + 1)
            names = [f"user{i:06d}" for i in range(1, args.users + 1)]
            targets = measure(args, procs, tmp, users, names, threads, hashed, results["runs"])
    except KeyboardInterrupt:
        return interrupted()
    results["targets"] = [t.__dict__ for t in targets]
    results["load_average_at_end"] = load_average()
    return finish(results, targets, args.output, "mfa-signin")


def measure(args: argparse.Namespace, procs: Processes, tmp: Path, users: Path, names: list[str], threads: int,
            hashed: str, runs: dict[str, Any]) -> list[Target]:
    plain_hs, plain_base, _, _ = start_homeserver(procs, tmp, "plain", users, sections=OAUTH)
    mfa_hs, mfa_base, _, _ = start_homeserver(procs, tmp, "mfa", users, sections=MFA)
    print(f"adding an authenticator app for {len(names)} people ...", flush=True)
    apps = enrol(tmp / "mfa.toml", names)
    plain = OAuthClient(plain_base, client_name="bench without a second factor")
    mfa = OAuthClient(mfa_base, client_name="bench with TOTP")
    people: queue.Queue[str] = queue.Queue()
    for name in names:
        people.put(name)
    # Warm: each server's pages, form, second step and exchange once.
    plain.sign_in(names[0], BENCH_PASSWORD)
    mfa.sign_in(names[1], BENCH_PASSWORD, second_factor=apps[names[1]].code)
    rates: dict[str, list[float]] = {"plain": [], "totp": []}
    cpu: dict[str, list[float]] = {"plain": [0.0, 0.0], "totp": [0.0, 0.0]}  # server CPU seconds, sign-ins
    pids = {"plain": plain_hs.pid, "totp": mfa_hs.pid}
    errors = 0
    print(f"OAuth sign-ins, {threads} client threads, {args.rounds} alternating rounds of {args.round_duration:g} s:",
          flush=True)
    sides = [("plain", plain, None), ("totp", mfa, apps)]
    for index in range(args.rounds):
        for label, client, with_apps in sides if index % 2 == 0 else sides[::-1]:
            before = cpu_seconds(pids[label])
            done, failed, seconds = one_round(client, people, with_apps, threads, args.round_duration)
            cpu[label][0] += cpu_seconds(pids[label]) - before
            cpu[label][1] += done
            rates[label].append(done / seconds)
            errors += failed
            print(f"  {label:<6} {done / seconds:6.2f} sign-ins/s  ({done} in {seconds:.1f} s, errors {failed})",
                  flush=True)
    t_check = checkpw_seconds(hashed, 5)
    ceiling = (os.cpu_count() or 1) / t_check
    procs.stop(plain_hs)
    procs.stop(mfa_hs)
    plain_rate, totp_rate = statistics.mean(rates["plain"]), statistics.mean(rates["totp"])
    ratios = [t / p for t, p in zip(rates["totp"], rates["plain"], strict=True)]
    per_signin = {label: spent / max(count, 1) * 1000 for label, (spent, count) in cpu.items()}
    print(f"server CPU per sign-in: {per_signin['plain']:.1f} ms without, {per_signin['totp']:.1f} ms with TOTP "
          f"(+{per_signin['totp'] - per_signin['plain']:.1f} ms: the second step's page and check)", flush=True)
    print(f"bcrypt ceiling: {os.cpu_count()} cores / {t_check * 1000:.1f} ms = {ceiling:.2f}/s; the rounds' ratios "
          f"{', '.join(f'{r:.3f}' for r in ratios)}", flush=True)
    runs.update(plain=rates["plain"], totp=rates["totp"], ratios=ratios, errors=errors, checkpw_ms=t_check * 1000,
                ceiling_per_s=ceiling, server_cpu_ms_per_signin=per_signin)
    note = (f"(median of {len(ratios)} rounds; mean rates {totp_rate:.2f} vs {plain_rate:.2f}/s; "
            f"bcrypt ceiling {ceiling:.2f}/s)")
    return [Target("OAuth sign-ins with TOTP / without a second factor", statistics.median(ratios), LIMIT, "x", True,
                   note),
            Target("sign-in errors", errors, 0, "count", False)]


if __name__ == "__main__":
    sys.exit(main())
