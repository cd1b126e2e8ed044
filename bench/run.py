#!/usr/bin/env python3
"""One-command benchmark: the homeserver against bare Tornado and the bcrypt ceiling, with wrk.

Phases, each a function below: throughput (against the bare-Tornado floor, interleaved
rounds), logins (against the bcrypt ceiling), /versions under a login flood, memory, a big
users file, sessions (logout throughput, the revocation check's cost), and optionally
Redis, shared rate limits, N processes, another homeserver side by side, and the delegation
(a real Synapse asking this server about tokens; bench/delegation.py).

A/B mode (`--ab REV_A [REV_B]`, or `--ab REV_A --worktree PATH`): only the throughput
endpoints, on two versions of the server at once (bench/ab.py). Each side is a commit
(checked out with `git worktree add --detach` into a temporary directory, removed after)
or a directory; B defaults to the tree this script runs from. Rounds interleave A and B
on every endpoint, and the report gives req/s and server CPU per request for each with
the B/A ratios and their spread over the rounds:

    python3 bench/run.py --ab 3c5e6c7                  # that commit against this tree
    python3 bench/run.py --ab main HEAD --rounds 6     # two commits
    python3 bench/run.py --ab main --worktree ../other # a commit against another tree

The realistic mix (2,000 sessions in turn, logins beside, default rate limits, a server
that did not open the sessions): `--mix` here, or bench/mix.py on its own (with its own
--ab for two versions under the mix).

For differences of a few per cent, which wall-clock CPU on a shared machine cannot resolve,
bench/instructions.py counts instructions per request under callgrind for the same kind of
versions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab import phase_ab
from common import (
    BENCH,
    CAPABILITIES,
    LOGIN,
    PROFILE,
    ROOT,
    SYNAPSE,
    VENV,
    VERSIONS,
    WHOAMI,
    Processes,
    bench_run,
    descendants,
    finish,
    free_port,
    interrupted,
    rss_mb,
    wait_ready,
    wrk_missing,
)
from delegation import bench_delegation
from mix import add_mix_options, phase_mix
from phases import bench_logout, bench_redis, bench_store_cost, bench_target
from servers import (
    bcrypt_niceness,
    checkpw_seconds,
    get_tokens,
    hash_once,
    load_average,
    machine,
    pool_capacity,
    start_homeserver,
    write_users,
)
from targets import Target, target
from wrk import parse_wrk, run_wrk, wrk_command, wrk_env

THROUGHPUT = (("versions", VERSIONS, False), ("profile", PROFILE, False), ("capabilities", CAPABILITIES, True),
              ("whoami", WHOAMI, True))


def ensure_venv() -> None:
    """Re-run under the project's .venv, creating it from requirements.txt when missing."""
    if os.environ.get("BENCH_NO_VENV") or Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV} and installing requirements.txt ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(ROOT / "requirements.txt")],
            check=True,
        )
    # The script that was run (oauth.py, ... import this), not run.py itself.
    os.execv(str(python), [str(python), str(Path(sys.argv[0]).resolve()), *sys.argv[1:]])


def start_floor(procs: Processes, tmp: Path, uvloop: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """bare_tornado.py: the framework's floor (the same /versions bytes, nothing else)."""
    port, log = free_port(), tmp / ("bare-uv.log" if uvloop else "bare.log")
    proc = procs.start([sys.executable, str(BENCH / "bare_tornado.py"), "--port", str(port)] + (["--uvloop"] if uvloop else []), log)
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, base, log)
    return proc, base


def phase_throughput(args: argparse.Namespace, procs: Processes, tmp: Path, bare: subprocess.Popen[bytes], bare_base: str,
                     hs: subprocess.Popen[bytes], base: str, runs: dict[str, Any]) -> list[Target]:
    """Interleaved rounds of the floor and every endpoint, so a drift in machine load hits all alike."""
    token = get_tokens(base, 1)[0]
    print(f"throughput, wrk -t1 -c{args.connections}, {args.warmup:g} s warm-up + {args.duration:g} s each:", flush=True)
    floor_runs = []
    for _ in range(args.rounds):
        floor_runs.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare.pid))
        for name, path, authed in THROUGHPUT:
            result = run_wrk(f"homeserver {name}", base + path, args, token=token if authed else None, pid=hs.pid)
            runs.setdefault(name, []).append(asdict(result))
        floor_runs.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare.pid))
    runs["bare_tornado_versions"] = [asdict(r) for r in floor_runs]
    if args.uvloop_floor:
        # Context only: the homeserver uses uvloop when installed; this is the floor on it.
        uv, uv_base = start_floor(procs, tmp, uvloop=True)
        runs["bare_tornado_uvloop_versions"] = [asdict(run_wrk("bare tornado+uvloop (context)", uv_base + VERSIONS, args, pid=uv.pid))]
        procs.stop(uv)
    floor = statistics.mean(r.rps for r in floor_runs)
    floor_cpu = statistics.mean(r.server_cpu_us or 0 for r in floor_runs)
    runs["floor_rps"] = floor
    targets = []
    for name, _, _ in THROUGHPUT:
        rps = statistics.mean(r["rps"] for r in runs[name])
        cpu = statistics.mean(r["server_cpu_us"] or 1 for r in runs[name])
        # Context for each ratio: server CPU per request, which other load moves much less.
        targets.append(target(name, rps / floor, f"(CPU per request: {floor_cpu / cpu:.2f})"))
        runs.setdefault("cpu_us", {})[name] = cpu
    runs["cpu_us"]["floor"] = floor_cpu
    errors = sum(r["non_2xx"] + r["socket_errors"] for name, _, _ in THROUGHPUT for r in runs[name])
    targets.append(target("errors", errors))
    for name in ("versions", "profile", "capabilities"):
        rps = statistics.mean(r["rps"] for r in runs[name])
        targets.append(target("synapse", rps / SYNAPSE[name], "(reference figure, not measured here)",
                              name=f"{name} / Synapse reference ({SYNAPSE[name]:g}/s)"))
    return targets


def phase_logins(args: argparse.Namespace, hashed: str, base: str, pid: int, runs: dict[str, Any],
                 label: str = "login", key: str = "login") -> list[Target]:
    """Logins with every bcrypt thread busy, against the ceiling measured just before and after."""
    cores = os.cpu_count() or 1
    conns = args.login_connections or 2 * cores
    t_before = checkpw_seconds(hashed, args.checkpw_repeat)
    capacity = pool_capacity(hashed, cores)
    print(f"bcrypt: one checkpw (cost {args.bcrypt_cost}) takes {t_before * 1000:.1f} ms; {cores} threads at nice "
          f"{bcrypt_niceness()} manage {capacity:.2f}/s right now", flush=True)
    login = run_wrk(f"homeserver {label}", base + LOGIN, args, connections=conns, duration=args.login_duration,
                    post=True, timeout="20s", pid=pid)
    t_check = (t_before + checkpw_seconds(hashed, args.checkpw_repeat)) / 2
    ceiling = cores / t_check
    print(f"bcrypt ceiling: {cores} cores / {t_check * 1000:.1f} ms = {ceiling:.2f} logins/s", flush=True)
    busy = capacity < 0.9 * ceiling
    if busy:
        print("  note: the machine is busy (the thread pool reaches under 90 % of the ceiling); rerun when `uptime` "
              "shows a load under 1", flush=True)
    runs[label] = [asdict(login)]
    runs[f"{label}_bcrypt"] = {"checkpw_ms": t_check * 1000, "cost": args.bcrypt_cost, "cores": cores,
                               "ceiling_per_s": ceiling, "pool_capacity_now_per_s": capacity, "machine_busy": busy}
    note = f"({login.rps:.2f} of {ceiling:.2f}/s; {login.rps / capacity:.2f} of what the pool managed now)"
    return [target(key, login.rps / ceiling, note), target("login_errors", login.errors, name=f"{label} errors")]


def phase_flood(args: argparse.Namespace, base: str, runs: dict[str, Any]) -> list[Target]:
    """/versions latency while a login flood keeps every bcrypt thread busy.

    The probe uses fewer connections than the throughput runs: at -c50 a saturated loop
    queues 50 deep, so p99 there measures the queue, not whether logins stall the loop.
    """
    probe, login_conns = args.probe_connections, args.login_connections or 2 * (os.cpu_count() or 1)
    quiet = run_wrk(f"versions -c{probe} (no flood)", base + VERSIONS, args, connections=probe)
    flood_seconds = 2 * (args.duration + args.warmup) + 3
    flood = subprocess.Popen(wrk_command(base + LOGIN, flood_seconds, login_conns, timeout="20s"), env=wrk_env(True),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1)
        under = run_wrk(f"versions -c{probe} in login flood", base + VERSIONS, args, connections=probe)
        under_50 = run_wrk(f"versions -c{args.connections} in login flood", base + VERSIONS, args, warmup=False)
        flood_out, _ = flood.communicate(timeout=flood_seconds + 30)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    flood_result = parse_wrk("login flood", base + LOGIN, login_conns, flood_out)
    print(f"  {'(the login flood meanwhile)':<28} {flood_result.rps:>9.1f} req/s  non-2xx {flood_result.non_2xx}", flush=True)
    runs.update(versions_probe_no_flood=[asdict(quiet)], versions_under_login_flood=[asdict(under)],
                versions_c50_under_login_flood=[asdict(under_50)], login_flood=[asdict(flood_result)])
    return [target("flood_p99", under.p99_ms, f"(without the flood {quiet.p99_ms:.1f} ms)",
                   name=f"/versions p99 (-c{probe}) during login flood")]


def phase_big_users(args: argparse.Namespace, procs: Processes, tmp: Path, hashed: str, runs: dict[str, Any]) -> list[Target]:
    """A big users file: time from spawn to the first answer (imports included), and memory."""
    from common import SERVER_NAME, http

    big_users = tmp / "users-big.json"
    write_users(big_users, hashed, args.big_users)
    started = time.monotonic()
    big, big_base, _, _ = start_homeserver(procs, tmp, "big", big_users)
    seconds = time.monotonic() - started
    rss = rss_mb(big.pid)
    last = f"user{args.big_users - 1:06d}"
    status, _ = http(f"{big_base}/_matrix/client/v3/profile/@{last}:{SERVER_NAME}")
    procs.stop(big)
    print(f"{args.big_users} users: ready {seconds:.2f} s after spawn, {rss:.1f} MB resident (profile of {last}: {status})", flush=True)
    runs["big_users_file"] = {"users": args.big_users, "ready_s": seconds, "rss_mb": rss, "last_user_status": status}
    return [target("big_ready", seconds, name=f"{args.big_users} users: ready after spawn"),
            target("big_rss", rss, name=f"{args.big_users} users: resident memory")]


def phase_processes(args: argparse.Namespace, procs: Processes, tmp: Path, users: Path, hashed: str, runs: dict[str, Any]) -> None:
    """Logins and profile at each `[server] processes = N`."""
    cores = os.cpu_count() or 1
    scale: dict[str, Any] = {}
    for n in args.processes:
        print(f"[server] processes = {n}:", flush=True)
        hs, base, _, _ = start_homeserver(procs, tmp, f"processes{n}", users, extra=f"processes = {n}\n")
        try:
            time.sleep(0.5)
            workers = len(descendants(hs.pid))
            profile = run_wrk(f"profile, {n} process(es)", base + PROFILE, args, pid=hs.pid)
            ceiling = cores / checkpw_seconds(hashed, args.checkpw_repeat)
            login = run_wrk(f"login, {n} process(es)", base + LOGIN, args, connections=args.login_connections or 2 * cores * n,
                            duration=args.login_duration, post=True, timeout="20s")
        finally:
            procs.stop(hs)
        scale[str(n)] = {"child_processes": workers, "profile": asdict(profile), "login": asdict(login),
                         "bcrypt_ceiling_per_s": ceiling, "login_ratio": login.rps / ceiling}
    runs["processes"] = scale


def bench(args: argparse.Namespace, procs: Processes, tmp: Path) -> dict[str, Any]:
    info = machine()
    print(f"machine: {info['nproc']} cores, {info['cpu']}, Python {info['python']}, tornado {info['tornado']}, "
          f"bcrypt {info['bcrypt']}; load average {info['load_average_at_start']}", flush=True)
    results: dict[str, Any] = {"machine": info, "settings": vars(args).copy(), "runs": {}, "targets": []}
    runs: dict[str, Any] = results["runs"]
    print(f"hashing the bench password at cost {args.bcrypt_cost} ...", flush=True)
    hashed = hash_once(args.bcrypt_cost)
    users = tmp / "users.json"
    write_users(users, hashed, args.users)

    if args.delegation_only:
        targets = bench_delegation(args, procs, tmp, users, hashed, runs, phase_logins)
        results["targets"] = [asdict(t) for t in targets]
        results["load_average_at_end"] = load_average()
        return results | {"_targets": targets}

    bare, bare_base = start_floor(procs, tmp)
    if args.ab:
        endpoints = tuple(e for e in THROUGHPUT if not args.only or e[0] in args.only)
        targets = phase_ab(args, procs, tmp, users, bare.pid, bare_base, endpoints, runs)
        results["targets"] = [asdict(t) for t in targets]
        results["load_average_at_end"] = load_average()
        return results | {"_targets": targets}
    hs, base, _, _ = start_homeserver(procs, tmp, "homeserver", users)
    time.sleep(0.5)
    idle_start = rss_mb(hs.pid)
    targets = phase_throughput(args, procs, tmp, bare, bare_base, hs, base, runs)
    if args.target_url:
        bench_target(args, runs)
    if not args.throughput_only:
        targets += phase_logins(args, hashed, base, hs.pid, runs)
        targets += phase_flood(args, base, runs)
        time.sleep(1)
        idle_after = rss_mb(hs.pid)
        print(f"resident memory idle: {idle_start:.1f} MB after start, {idle_after:.1f} MB after the load", flush=True)
        runs["memory"] = {"idle_after_start_mb": idle_start, "idle_after_load_mb": idle_after}
        targets.append(target("memory", max(idle_start, idle_after)))
    procs.stop(hs)
    if not args.throughput_only:
        targets += phase_big_users(args, procs, tmp, hashed, runs)
        bench_logout(args, procs, tmp, runs)
        bench_store_cost(args, runs)
        if args.rate_limits:
            limited, limited_base, _, _ = start_homeserver(procs, tmp, "limits", users, rate_limits=True)
            try:
                targets += phase_logins(args, hashed, limited_base, limited.pid, runs, "login (rate limits on)", "login_limits")
            finally:
                procs.stop(limited)
    if args.redis:
        targets += bench_redis(args, procs, tmp, hashed, bare.pid, bare_base, runs)
    if args.mix:
        targets += phase_mix(args, procs, tmp, bare.pid, bare_base, runs)
    if args.processes:
        phase_processes(args, procs, tmp, users, hashed, runs)
    if args.delegation:
        targets += bench_delegation(args, procs, tmp, users, hashed, runs, phase_logins)
    results["floor_rps"] = runs.pop("floor_rps")
    results["targets"] = [asdict(t) for t in targets]
    results["load_average_at_end"] = load_average()
    return results | {"_targets": targets}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=4, help="seconds measured per endpoint and round (default 4)")
    p.add_argument("--warmup", type=float, default=2, help="seconds of warm-up before each (default 2)")
    p.add_argument("--connections", type=int, default=50, help="wrk connections, one thread (default 50, as for Synapse)")
    p.add_argument("--rounds", type=int, default=4,
                   help="interleaved rounds of the throughput runs, averaged (default 4: load drift hits all "
                        "alike, and two rounds left the ratios within +-0.1 of noise on 2 cores)")
    p.add_argument("--login-duration", type=float, default=10, help="seconds of the login run (default 10)")
    p.add_argument("--probe-connections", type=int, default=10,
                   help="connections of the /versions latency probe during the login flood (default 10)")
    p.add_argument("--login-connections", type=int, default=0, help="login connections (default 2 x cores)")
    p.add_argument("--bcrypt-cost", type=int, default=12, help="cost of the stored hash (default 12, as hash-password)")
    p.add_argument("--checkpw-repeat", type=int, default=5, help="checkpw timings for the ceiling (median)")
    p.add_argument("--users", type=int, default=100, help="users in the file for the throughput runs")
    p.add_argument("--big-users", type=int, default=100_000, help="users in the load-time / memory file")
    p.add_argument("--logouts", type=int, default=2000, help="tokens made, then logged out, for the logout run")
    p.add_argument("--redis", action="store_true",
                   help="also measure profile on the Redis user backend and the session check on the Redis session store")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--rate-limits", action="store_true",
                   help="also measure logins with the (shared) rate limits on, bursts too high to refuse")
    p.add_argument("--processes", type=int, nargs="*", default=[], metavar="N",
                   help="also measure login and profile at [server] processes = N for each N (e.g. 1 2)")
    p.add_argument("--delegation", action="store_true",
                   help="also measure the delegation: Synapse's whoami with our tokens against its own, our "
                        "introspection against our whoami, logins that tell Synapse (two Synapse from PyPI, "
                        "tests/support/synapse.py installs them in a cached virtualenv)")
    p.add_argument("--delegation-only", action="store_true", help="only the delegation phase")
    p.add_argument("--mix", action="store_true",
                   help="also measure the realistic mix (bench/mix.py): --tokens sessions in turn, logins beside at "
                        "--login-rate, default rate limits, a server that did not open the sessions")
    add_mix_options(p, standalone=False)
    p.add_argument("--target-url", help="also drive another homeserver on this machine (e.g. Synapse) side by side")
    p.add_argument("--target-user", help="a user ID whose profile exists on --target-url")
    p.add_argument("--target-token", help="an access token valid on --target-url, for capabilities")
    p.add_argument("--no-uvloop-floor", dest="uvloop_floor", action="store_false",
                   help="skip the context run of bare Tornado on uvloop")
    p.add_argument("--ab", nargs="+", metavar="REV_OR_DIR",
                   help="A/B mode: REV_A [REV_B], each a commit or a directory; B defaults to --worktree or this "
                        "tree. Only the throughput endpoints, interleaved rounds, B/A CPU per request and req/s")
    p.add_argument("--worktree", metavar="PATH", help="with --ab REV_A: the directory to measure as B")
    p.add_argument("--only", nargs="+", choices=[name for name, _, _ in THROUGHPUT], metavar="ENDPOINT",
                   help="with --ab: only these endpoints (versions, profile, capabilities, whoami)")
    p.add_argument("--throughput-only", action="store_true", help="only the floor and the throughput runs")
    p.add_argument("--output", help="result file (default bench/results/bench-<time>.json)")
    args = p.parse_args()
    if args.ab and (len(args.ab) > 2 or (len(args.ab) == 2 and args.worktree)):
        p.error("--ab takes REV_A and at most one of REV_B and --worktree PATH")
    if args.worktree and not args.ab:
        p.error("--worktree goes with --ab REV_A")
    return args


def main() -> int:
    if wrk_missing():  # before any venv set-up: say what is missing first
        return 2
    ensure_venv()
    args = parse_args()
    try:
        with bench_run("homeserver-bench-") as (procs, tmp):
            results = bench(args, procs, tmp)
    except KeyboardInterrupt:
        return interrupted()
    targets: list[Target] = results.pop("_targets")
    note = " (other work on the machine skews absolute figures)"
    return finish(results, targets, args.output, "ab" if args.ab else "bench", note)


if __name__ == "__main__":
    sys.exit(main())
