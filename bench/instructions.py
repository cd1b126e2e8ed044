#!/usr/bin/env python3
"""Instructions per request under callgrind: a count other load on the machine does not move.

    python3 bench/instructions.py 3c5e6c7 HEAD          # two commits (detached worktrees, removed after)
    python3 bench/instructions.py main . --only profile # a commit against this tree, one endpoint
    python3 bench/instructions.py A B --only capabilities --tokens 200  # 200 sessions in turn, opened elsewhere

Each version (a commit or a directory, as for `run.py --ab`) runs under `valgrind
--tool=callgrind` on the bench's config; one keep-alive connection sends 300 requests to
warm up, the counters are zeroed, then `--requests` more are sent one after another and
the counters dumped. Instructions per request is the dump's total over those requests
(every thread of the server, user space only: system calls are not counted). Repeat runs
of one version agree within about 0.5 %, so a change of 1-2 % is visible where wall-clock
CPU per request, on a shared machine, moves by 10 %. Valgrind is about 50 times slower
than the real thing: a version and endpoint takes about 30 s at the default 500 requests.
Needs valgrind (`apt-get update && apt-get install -y valgrind`).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab import Side, materialize
from common import CAPABILITIES, PROFILE, VERSIONS, WHOAMI, Processes, bench_run, free_port, interrupted, wait_ready
from servers import get_tokens, hash_once, write_config, write_users

ENDPOINTS = {"versions": (VERSIONS, False), "profile": (PROFILE, False), "capabilities": (CAPABILITIES, True),
             "whoami": (WHOAMI, True)}
WARMUP_REQUESTS = 300
INSTALL_VALGRIND = "apt-get update && apt-get install -y valgrind"


def open_elsewhere(side: Side, config: Path, port: int, tokens: int, procs: Processes, tmp: Path) -> list[str]:
    """`tokens` sessions (users user000001 ...) opened by a server outside valgrind on the same
    config and file, then stopped: the measured server did not open them (a restart)."""
    log = tmp / f"opener-{side.label.lower()}.log"
    proc = procs.start([sys.executable, str(side.tree / "run.py"), "--config", str(config)], log, cwd=side.tree)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(proc, base, log)
        return [get_tokens(base, 1, user=f"user{i:06d}", threads=1)[0] for i in range(1, tokens + 1)]
    finally:
        procs.stop(proc)


def count(side: Side, endpoint: str, requests: int, procs: Processes, tmp: Path, users: Path, tokens: int = 1) -> float:
    """Instructions per request of one version on one endpoint (`tokens` > 1: that many
    sessions opened by another server, used in turn)."""
    path, authed = ENDPOINTS[endpoint]
    port = free_port()
    label = f"{side.label.lower()}-{endpoint}"
    config, log, out = tmp / f"{label}.toml", tmp / f"{label}.log", tmp / f"callgrind.{label}"
    write_config(config, port, users)
    several = open_elsewhere(side, config, port, tokens, procs, tmp) if authed and tokens > 1 else []
    proc = procs.start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                        str(side.tree / "run.py"), "--config", str(config)], log, cwd=side.tree)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(proc, base, log, timeout=300)
        if authed and not several:
            several = get_tokens(base, 1, threads=1)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        turn = itertools.cycle(several or [""])

        def send(n: int) -> None:
            for _ in range(n):
                token = next(turn)
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"{side.label} {endpoint}: status {response.status}")

        send(WARMUP_REQUESTS)
        time.sleep(0.5)
        subprocess.run(["callgrind_control", "--zero", str(proc.pid)], capture_output=True, check=True)
        send(requests)
        subprocess.run(["callgrind_control", "--dump", str(proc.pid)], capture_output=True, check=True)
        conn.close()
    finally:
        procs.stop(proc)
    dumps = sorted(tmp.glob(f"callgrind.{label}.*"), key=lambda p: p.stat().st_mtime)
    if not dumps:
        raise RuntimeError(f"callgrind wrote no dump for {label}; see {log}")
    for line in dumps[-1].read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1]) / requests
    raise RuntimeError(f"no totals in {dumps[-1]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("versions", nargs="+", metavar="REV_OR_DIR", help="commits or directories; the first is the base")
    p.add_argument("--only", nargs="+", choices=list(ENDPOINTS), metavar="ENDPOINT", help="only these endpoints")
    p.add_argument("--requests", type=int, default=500, help="requests counted per version and endpoint (default 500)")
    p.add_argument("--tokens", type=int, default=1,
                   help="sessions used in turn by the authenticated endpoints, opened by another server first "
                        "(a restart, as bench/mix.py; default 1: the server's own login)")
    args = p.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed. Install it with:\n  {INSTALL_VALGRIND}", file=sys.stderr)
            return 2
    endpoints = args.only or list(ENDPOINTS)
    counts: dict[str, list[float]] = {e: [] for e in endpoints}
    try:
        with bench_run("homeserver-instructions-") as (procs, tmp), contextlib.ExitStack() as stack:
            users = tmp / "users.json"
            write_users(users, hash_once(4), max(100, args.tokens + 1))
            sides = [stack.enter_context(materialize(chr(ord("A") + i), spec, tmp))
                     for i, spec in enumerate(args.versions)]
            for side in sides:
                print(side.describe(), flush=True)
            for endpoint in endpoints:
                for side in sides:
                    counts[endpoint].append(count(side, endpoint, args.requests, procs, tmp, users, args.tokens))
                    print(f"  {side.label} {endpoint:<13} {counts[endpoint][-1]:>12,.0f} instructions/request", flush=True)
    except KeyboardInterrupt:
        return interrupted()
    print("\ninstructions per request (ratio to A):")
    for endpoint, values in counts.items():
        cells = "  ".join(f"{chr(ord('A') + i)} {v:>10,.0f} ({v / values[0]:.3f})" for i, v in enumerate(values))
        print(f"  {endpoint:<13} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
