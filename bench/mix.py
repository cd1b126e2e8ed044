#!/usr/bin/env python3
"""The realistic mix (issue 29): many sessions in turn, logins beside, a server that did not open them.

The one-token throughput runs (bench/run.py) are the one shape where a per-process cache
of sessions always hits. This mix is what a server in production sees instead:

- `--tokens` sessions (default 2,000), one per user, opened by logins on an *opener*
  server, which then stops. The measured server starts afresh on the same SQLite file (a
  restart, or another worker): it did not open the sessions, so it writes each one's
  last-seen on first use and then every `touch_interval`, as in production;
- wrk -t1 -c`--connections` on `--path` (default GET /capabilities), each request with the
  next token in turn (cycling over all of them);
- the default rate limits on (`[rate_limit]` as shipped: shared buckets in the session
  store) and logins beside the reads, `--login-rate` a second (default 10), each as the
  next user from an address of its own (X-Forwarded-For from the trusted 127.0.0.1, so
  every login takes its buckets and none is refused for the bench's own address);
- the floor: bare Tornado (bench/bare_tornado.py) /versions, driven by the same wrk script
  (the same cycling Authorization header, so wrk's own cost is alike), in the same rounds.

Users are hashed at `--bcrypt-cost` (default 4): logins at cost 12 would spend the two
cores on bcrypt and measure that. Rounds interleave the floor and each server, so drift in
machine load hits all alike; every figure is given with its spread (min-max) over rounds.

Command line (stable; other branches reuse it for their own A/B):

    python3 bench/mix.py                              # this tree: mix / floor, p99, spread
    python3 bench/mix.py --ab REV_A [REV_B]           # two versions under the mix (B: this tree)
    python3 bench/mix.py --ab REV_A --worktree PATH   # a commit against another tree
    options: --rounds 4 --duration 4 --warmup 2 --connections 50 --tokens 2000
             --login-rate 10 --bcrypt-cost 4 --path /_matrix/client/v3/capabilities --output FILE

A side of --ab is a commit (checked out in a temporary worktree, bench/ab.py) or a
directory. `python3 bench/run.py --mix` runs the single-tree measurement inside the full
bench. Results go to bench/results/mix-<UTC time>.json (or --output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab import Side, materialize, spread
from common import (
    BENCH_PASSWORD,
    CAPABILITIES,
    LOGIN,
    LUA,
    ROOT,
    SERVER_NAME,
    VERSIONS,
    Processes,
    bench_run,
    cpu_seconds,
    finish,
    free_port,
    http,
    interrupted,
    require_loopback,
    wait_ready,
)
from servers import hash_once, load_average, login_body, machine, write_users
from targets import Target
from wrk import WrkResult, parse_wrk

# The limits for the mix: (what, limit, unit, higher is better).
MIX_LIMITS = {
    "mix": ("mix: {path} with {tokens} tokens + logins / floor", 0.8, "x", True),
    "mix_p99": ("mix: {path} p99", 50.0, "ms", False),
    "mix_errors": ("mix: non-2xx + socket errors of the reads", 0.0, "count", False),
}

# wrk: every request carries the next token of the file WRK_TOKENS (one per line), in turn;
# bench/wrk_report.lua is appended (the results as one JSON line).
MIX_LUA = r"""
local tokens = {}
local i = 0
function init(args)
  for line in io.lines(os.getenv("WRK_TOKENS")) do
    if #line > 0 then tokens[#tokens + 1] = "Bearer " .. line end
  end
  i = math.random(#tokens)
end
function request()
  i = i % #tokens + 1
  wrk.headers["Authorization"] = tokens[i]
  return wrk.format()
end
"""


def user_name(i: int) -> str:
    """The mix's users are bench/servers.write_users' user000001 .. user<tokens>."""
    return f"user{i:06d}"


def write_mix_config(path: Path, port: int, users: Path, database: Path, secret: str, *, opener: bool) -> None:
    """The default config on a loopback port, sessions in `database`. The opener has rate
    limits off (it logs every user in at once); the measured server keeps the defaults and
    trusts 127.0.0.1 for X-Forwarded-For."""
    limits = "[rate_limit]\nenabled = false\n" if opener else ""
    proxies = "" if opener else 'trusted_proxies = ["127.0.0.1/32"]\n'
    path.write_text(
        f"""[server]
host = "127.0.0.1"
port = {port}
server_name = "{SERVER_NAME}"
{proxies}
[auth]
jwt_secret = "{secret}"

[backend]
type = "file"

[backend.file]
path = "{users}"

[sessions.sqlite]
path = "{database}"

{limits}"""
    )


def start_server(procs: Processes, tmp: Path, label: str, tree: Path, users: Path, database: Path, secret: str,
                 *, opener: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = tmp / f"{label}.toml"
    write_mix_config(config, port, users, database, secret, opener=opener)
    log = tmp / f"{label}.log"
    proc = procs.start([sys.executable, str(tree / "run.py"), "--config", str(config)], log, cwd=tree)
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, base, log)
    return proc, base


def open_sessions(base: str, count: int, tokens_file: Path) -> None:
    """One login per user, from 8 threads; the tokens, one a line, into `tokens_file`."""

    def one(i: int) -> str:
        status, body = http(base + LOGIN, login_body(user_name(i), BENCH_PASSWORD), {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"login of {user_name(i)} failed: {status} {body[:200]!r}")
        return json.loads(body)["access_token"]

    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(one, range(1, count + 1)))
    tokens_file.write_text("\n".join(tokens) + "\n")


@dataclass
class MixServer:
    """A measured server: started afresh on sessions another process opened."""

    label: str
    proc: subprocess.Popen[bytes]
    base: str
    tokens_file: Path
    next_user: int = 1


def prepare(procs: Processes, tmp: Path, label: str, tree: Path, users: Path, tokens: int) -> MixServer:
    """Open `tokens` sessions on an opener server from `tree`, stop it, start the measured one."""
    database, secret = tmp / f"{label}-sessions.db", secrets.token_urlsafe(48)
    tokens_file = tmp / f"{label}-tokens.txt"
    started = time.monotonic()
    opener, opener_base = start_server(procs, tmp, f"{label}-opener", tree, users, database, secret, opener=True)
    try:
        open_sessions(opener_base, tokens, tokens_file)
    finally:
        procs.stop(opener)
    proc, base = start_server(procs, tmp, label, tree, users, database, secret, opener=False)
    print(f"{label}: {tokens} sessions opened by another server ({time.monotonic() - started:.1f} s), "
          f"served from {tree}", flush=True)
    return MixServer(label, proc, base, tokens_file)


class LoginsBeside:
    """Logins at a steady rate on one server, in a thread, while wrk reads: each the next
    user, from an address of its own. Counts the answers by status."""

    def __init__(self, server: MixServer, rate: float, users: int) -> None:
        self.server, self.rate, self.users = server, rate, users
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        interval, next_at = 1.0 / self.rate, time.monotonic()
        while not self._stop.is_set():
            server = self.server
            i = server.next_user
            server.next_user = i % self.users + 1
            address = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
            headers = {"Content-Type": "application/json", "X-Forwarded-For": address}
            try:
                status, _ = http(server.base + LOGIN, login_body(user_name(i), BENCH_PASSWORD), headers, timeout=10)
            except OSError:
                status = 0
            self.statuses[status] += 1
            next_at += interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> LoginsBeside:
        if self.rate > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)


@dataclass
class MixRun:
    result: WrkResult
    logins: dict[str, int] = field(default_factory=dict)


def wrk_mix(name: str, url: str, args: argparse.Namespace, lua: Path, tokens_file: Path, pid: int | None,
            beside: MixServer | None = None) -> MixRun:
    """Warm up, then measure `url` with the cycling tokens (and logins beside on `beside`)."""
    require_loopback(url)
    env = {**os.environ, "WRK_TOKENS": str(tokens_file)}

    def command(seconds: float) -> list[str]:
        return ["wrk", "-t1", f"-c{args.connections}", f"-d{seconds:g}s", "--timeout=5s", "-s", str(lua), url]

    logins = LoginsBeside(beside, args.login_rate, args.tokens) if beside is not None else contextlib.nullcontext()
    with logins:
        if args.warmup > 0:
            subprocess.run(command(args.warmup), env=env, capture_output=True, check=True)
        cpu_before = cpu_seconds(pid) if pid else 0.0
        out = subprocess.run(command(args.duration), env=env, capture_output=True, text=True, check=True).stdout
        result = parse_wrk(name, url, args.connections, out)
        if pid and result.requests:
            result.server_cpu_us = (cpu_seconds(pid) - cpu_before) / result.requests * 1e6
    statuses = dict(sorted((str(k), v) for k, v in logins.statuses.items())) if isinstance(logins, LoginsBeside) else {}
    cpu = f"  CPU {result.server_cpu_us:6.1f} us/req" if result.server_cpu_us else ""
    beside_text = f"  logins beside {statuses}" if statuses else ""
    print(f"  {name:<24} {result.rps:>9.1f} req/s  p50 {result.p50_ms:>6.2f} ms  p99 {result.p99_ms:>7.2f} ms"
          f"  errors {result.errors}{cpu}{beside_text}", flush=True)
    return MixRun(result, statuses)


def mix_target(key: str, measured: float, note: str, args: argparse.Namespace) -> Target:
    what, limit, unit, higher = MIX_LIMITS[key]
    return Target(what.format(path=args.path.rsplit("/", 1)[-1], tokens=args.tokens), measured, limit, unit, higher,
                  note)


def setup(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    """The users file (cheap hash) and the wrk script."""
    users, lua = tmp / "mix-users.json", tmp / "wrk_mix.lua"
    write_users(users, hash_once(args.mix_bcrypt_cost), args.tokens + 1)
    lua.write_text(MIX_LUA + LUA.read_text())
    return users, lua


def phase_mix(args: argparse.Namespace, procs: Processes, tmp: Path, bare_pid: int, bare_base: str,
              runs: dict[str, Any], tree: Path = ROOT) -> list[Target]:
    """This tree under the mix, in rounds interleaved with the floor: ratio, p99, spread."""
    users, lua = setup(args, tmp)
    server = prepare(procs, tmp, "mix", tree, users, args.tokens)
    floors: list[WrkResult] = []
    measured: list[MixRun] = []
    name = f"mix {args.path.rsplit('/', 1)[-1]}"
    print(f"mix, {args.rounds} rounds, wrk -t1 -c{args.connections}, {args.warmup:g} s warm-up + {args.duration:g} s "
          f"each, {args.tokens} tokens in turn, logins beside at {args.login_rate:g}/s:", flush=True)
    try:
        for _ in range(args.rounds):
            floors.append(wrk_mix("bare tornado /versions", bare_base + VERSIONS, args, lua, server.tokens_file,
                                  bare_pid).result)
            measured.append(wrk_mix(name, server.base + args.path, args, lua, server.tokens_file, server.proc.pid,
                                    beside=server))
        floors.append(wrk_mix("bare tornado /versions", bare_base + VERSIONS, args, lua, server.tokens_file,
                              bare_pid).result)
    finally:
        procs.stop(server.proc)
    # Each round against the floor just before and just after it.
    ratios = [m.result.rps / ((f.rps + g.rps) / 2) for m, f, g in zip(measured, floors, floors[1:], strict=False)]
    cpu_ratios = [((f.server_cpu_us or 0) + (g.server_cpu_us or 0)) / 2 / (m.result.server_cpu_us or 1)
                  for m, f, g in zip(measured, floors, floors[1:], strict=False)]
    p99s = [m.result.p99_ms for m in measured]
    ratio = statistics.median(ratios)
    runs["mix"] = {"floor": [asdict(f) for f in floors], "runs": [asdict(m) for m in measured], "ratio": ratio,
                   "ratio_per_round": ratios, "cpu_ratio_per_round": cpu_ratios, "p99_ms": p99s}
    errors = sum(m.result.errors for m in measured)
    return [mix_target("mix", ratio, f"(median; rounds {spread(ratios)}; floor CPU / mix CPU a request "
                       f"{statistics.median(cpu_ratios):.3f}, rounds {spread(cpu_ratios)})", args),
            mix_target("mix_p99", statistics.median(p99s), f"(median; rounds {spread(p99s, '.1f')})", args),
            mix_target("mix_errors", errors, "", args)]


def phase_mix_ab(args: argparse.Namespace, procs: Processes, tmp: Path, bare_pid: int, bare_base: str,
                 runs: dict[str, Any]) -> list[Target]:
    """A against B under the mix: each with its own sessions (opened by another server of its
    tree), interleaved rounds with the order flipped every round; B/A req/s and CPU per request."""
    users, lua = setup(args, tmp)
    spec_a, spec_b = args.ab[0], (args.ab[1] if len(args.ab) > 1 else args.worktree or str(ROOT))
    with materialize("A", spec_a, tmp) as a, materialize("B", spec_b, tmp) as b:
        sides: dict[str, tuple[Side, MixServer]] = {}
        for side in (a, b):
            print(side.describe(), flush=True)
            sides[side.label] = (side, prepare(procs, tmp, f"mix-{side.label.lower()}", side.tree, users, args.tokens))
        print(f"mix A/B, {args.rounds} interleaved rounds, wrk -t1 -c{args.connections}, {args.warmup:g} s warm-up + "
              f"{args.duration:g} s each, {args.tokens} tokens in turn, logins beside at {args.login_rate:g}/s:",
              flush=True)
        floors: list[WrkResult] = []
        measured: dict[str, list[MixRun]] = {"A": [], "B": []}
        try:
            for round_no in range(args.rounds):
                floors.append(wrk_mix("bare tornado /versions", bare_base + VERSIONS, args, lua,
                                      sides["A"][1].tokens_file, bare_pid).result)
                for label in ("A", "B") if round_no % 2 == 0 else ("B", "A"):
                    server = sides[label][1]
                    measured[label].append(wrk_mix(f"{label} mix", server.base + args.path, args, lua,
                                                   server.tokens_file, server.proc.pid, beside=server))
        finally:
            for _, server in sides.values():
                procs.stop(server.proc)
    return report_ab(args, a, b, measured, floors, runs)


def report_ab(args: argparse.Namespace, a: Side, b: Side, measured: dict[str, list[MixRun]], floors: list[WrkResult],
              runs: dict[str, Any]) -> list[Target]:
    ra, rb = [m.result for m in measured["A"]], [m.result for m in measured["B"]]
    floor_rps = statistics.mean(f.rps for f in floors)
    rps_a, rps_b = statistics.mean(r.rps for r in ra), statistics.mean(r.rps for r in rb)
    cpu_a, cpu_b = [r.server_cpu_us or 0 for r in ra], [r.server_cpu_us or 0 for r in rb]
    rps_rounds = [y.rps / x.rps for x, y in zip(ra, rb, strict=True) if x.rps]
    cpu_rounds = [y / x for x, y in zip(cpu_a, cpu_b, strict=True) if x]
    cpu_ratio = statistics.mean(cpu_b) / statistics.mean(cpu_a)
    print(f"\n{a.describe()}\n{b.describe()}")
    print(f"floor (bare Tornado /versions, same wrk script): {floor_rps:,.0f} req/s (rounds "
          f"{spread([f.rps for f in floors], '.0f')})")
    for label, results, cpu in (("A", ra, cpu_a), ("B", rb, cpu_b)):
        p99 = [r.p99_ms for r in results]
        print(f"  {label}: {statistics.mean(r.rps for r in results):,.0f} req/s (rounds "
              f"{spread([r.rps for r in results], '.0f')}), {statistics.mean(r.rps for r in results) / floor_rps:.3f} "
              f"of the floor, CPU {statistics.mean(cpu):.1f} us/req ({spread(cpu, '.1f')}), p99 "
              f"{statistics.mean(p99):.1f} ms ({spread(p99, '.1f')})")
    print(f"  B/A req/s {rps_b / rps_a:.3f} (rounds {spread(rps_rounds)}); B/A CPU per request {cpu_ratio:.3f} "
          f"(rounds {spread(cpu_rounds)})")
    runs["mix_ab"] = {"a": asdict(a) | {"tree": str(a.tree)}, "b": asdict(b) | {"tree": str(b.tree)},
                      "floor": [asdict(f) for f in floors],
                      "runs": {k: [asdict(m) for m in v] for k, v in measured.items()},
                      "rps_ratio": rps_b / rps_a, "rps_ratio_per_round": rps_rounds,
                      "cpu_ratio": cpu_ratio, "cpu_ratio_per_round": cpu_rounds}
    errors = sum(r.errors for r in ra + rb)
    return [Target("mix A/B: B/A server CPU per request", cpu_ratio, 1.1, "x", False,
                   f"(rounds {spread(cpu_rounds)}; req/s B/A {rps_b / rps_a:.3f}, rounds {spread(rps_rounds)})"),
            mix_target("mix_errors", errors, "", args)]


def add_mix_options(p: argparse.ArgumentParser, *, standalone: bool) -> None:
    """The mix's own options (also on bench/run.py for --mix)."""
    p.add_argument("--tokens", type=int, default=2000, help="sessions used in turn, one per user (default 2000)")
    p.add_argument("--login-rate", type=float, default=10.0, help="logins a second beside the reads (default 10)")
    p.add_argument("--path", default=CAPABILITIES, help="the authenticated GET endpoint read (default capabilities)")
    p.add_argument("--bcrypt-cost" if standalone else "--mix-bcrypt-cost", dest="mix_bcrypt_cost", type=int, default=4,
                   help="cost of the mix users' hash (default 4: cost 12 would measure bcrypt)")
    if standalone:
        p.add_argument("--duration", type=float, default=4, help="seconds measured per run (default 4)")
        p.add_argument("--warmup", type=float, default=2, help="seconds of warm-up before each (default 2)")
        p.add_argument("--connections", type=int, default=50, help="wrk connections, one thread (default 50)")
        p.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
        p.add_argument("--ab", nargs="+", metavar="REV_OR_DIR", help="A/B: REV_A [REV_B]; B defaults to --worktree "
                       "or this tree")
        p.add_argument("--worktree", metavar="PATH", help="with --ab REV_A: the directory to measure as B")
        p.add_argument("--output", help="result file (default bench/results/mix-<time>.json)")


def main() -> int:
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    python = ROOT / ".venv" / "bin" / "python"
    if not os.environ.get("BENCH_NO_VENV") and Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        if not python.exists():
            print("run bench/run.py once first (it creates .venv), or set BENCH_NO_VENV=1", file=sys.stderr)
            return 2
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])
    from run import start_floor

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mix_options(p, standalone=True)
    args = p.parse_args()
    if args.ab and (len(args.ab) > 2 or (len(args.ab) == 2 and args.worktree)):
        p.error("--ab takes REV_A and at most one of REV_B and --worktree PATH")
    if args.worktree and not args.ab:
        p.error("--worktree goes with --ab REV_A")
    results: dict[str, Any] = {"machine": machine(), "settings": vars(args).copy(), "runs": {}}
    print(f"machine: load average {results['machine']['load_average_at_start']}", flush=True)
    try:
        with bench_run("homeserver-mix-") as (procs, tmp):
            bare, bare_base = start_floor(procs, tmp)
            phase = phase_mix_ab if args.ab else phase_mix
            targets = phase(args, procs, tmp, bare.pid, bare_base, results["runs"])
    except KeyboardInterrupt:
        return interrupted()
    results["targets"] = [asdict(t) for t in targets]
    results["load_average_at_end"] = load_average()
    return finish(results, targets, args.output, "mix")


if __name__ == "__main__":
    sys.exit(main())
