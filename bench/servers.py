"""Setting up what is measured: users, configs, homeserver processes, tokens, the bcrypt ceiling, the machine."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    BENCH_PASSWORD,
    BENCH_USER,
    LOGIN,
    LOGIN_BODY,
    ROOT,
    SERVER_NAME,
    Processes,
    free_port,
    http,
    wait_ready,
)


def hash_once(cost: int) -> str:
    import bcrypt

    return bcrypt.hashpw(BENCH_PASSWORD.encode(), bcrypt.gensalt(cost)).hex()


def write_users(path: Path, hashed: str, count: int) -> None:
    """The bench user plus `count - 1` more, all with the same hash (hashing 100k is slow)."""
    users = [{"name": BENCH_USER, "password": hashed, "ident": " (bench)", "display_name": "Bench User",
              "avatar_url": "mxc://localhost/bench"}]
    users += [{"name": f"user{i:06d}", "password": hashed, "ident": f" (user{i})", "display_name": f"User {i}"}
              for i in range(1, count)]
    path.write_text(json.dumps({"users": users}))


# Rate limits on, but with bursts no bench reaches: the shared-limit step is measured, not 429s.
RATE_LIMITS_ON = """[rate_limit]
enabled = true
address_burst = 1000000000
account_burst = 1000000000
failed_attempts_burst = 1000000000
"""


def write_config(path: Path, port: int, users: Path, *, backend: str = "file", extra: str = "",
                 sections: str = "", rate_limits: bool = False) -> None:
    """The default config, on a free loopback port, a fixed secret, rate limits off unless asked,
    and sessions in an SQLite file of this config's own (`sections` may choose Redis)."""
    limits = RATE_LIMITS_ON if rate_limits else "[rate_limit]\nenabled = false\n"
    path.write_text(
        f"""[server]
host = "127.0.0.1"
port = {port}
server_name = "{SERVER_NAME}"
{extra}
[auth]
jwt_secret = "{secrets.token_urlsafe(48)}"

[backend]
type = "{backend}"

[backend.file]
path = "{users}"

[sessions.sqlite]
path = "{path.stem}-sessions.db"

{limits}{sections}"""
    )


def start_homeserver(procs: Processes, tmp: Path, label: str, users: Path, *, backend: str = "file",
                     extra: str = "", sections: str = "", rate_limits: bool = False, tree: Path = ROOT
                     ) -> tuple[subprocess.Popen[bytes], str, Path, float]:
    """A homeserver on a config of its own (`label`); its process, base URL, log and start time.
    `tree`: the source tree whose run.py serves (another commit's, for --ab)."""
    port = free_port()
    config = tmp / f"{label}.toml"
    write_config(config, port, users, backend=backend, extra=extra, sections=sections, rate_limits=rate_limits)
    log = tmp / f"{label}.log"
    proc = procs.start([sys.executable, str(tree / "run.py"), "--config", str(config)], log, cwd=tree)
    base = f"http://127.0.0.1:{port}"
    waited = wait_ready(proc, base, log)
    return proc, base, log, waited


def login_body(user: str, password: str) -> bytes:
    return json.dumps({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                       "password": password}).encode()


def get_tokens(base: str, count: int, user: str = BENCH_USER, password: str = BENCH_PASSWORD, threads: int = 8) -> list[str]:
    """`count` fresh access tokens (one login each), logged in from `threads` threads."""
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> str:
        status, body = http(base + LOGIN, login_body(user, password), {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"login failed: {status} {body[:200]!r}")
        return json.loads(body)["access_token"]

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(count)))


def get_token(base: str) -> str:
    status, body = http(base + LOGIN, LOGIN_BODY.encode(), {"Content-Type": "application/json"})
    if status != 200:
        raise RuntimeError(f"login failed: {status} {body[:200]!r}")
    return json.loads(body)["access_token"]


def bcrypt_niceness() -> int:
    """The niceness of the server's bcrypt threads (homeserver/passwords.py)."""
    sys.path.insert(0, str(ROOT))
    from homeserver.passwords import BCRYPT_NICENESS

    return BCRYPT_NICENESS


def pool_capacity(hashed_hex: str, threads: int, per_thread: int = 3) -> float:
    """Checks per second that `threads` threads at the pool's niceness manage right now."""

    import bcrypt

    hashed = bytes.fromhex(hashed_hex)
    niceness = bcrypt_niceness()

    def work() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
        for _ in range(per_thread):
            bcrypt.checkpw(BENCH_PASSWORD.encode(), hashed)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return threads * per_thread / (time.perf_counter() - start)


def checkpw_seconds(hashed_hex: str, repeat: int) -> float:
    """Median wall time of one bcrypt.checkpw at the stored cost, measured now."""
    import bcrypt

    hashed = bytes.fromhex(hashed_hex)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        bcrypt.checkpw(BENCH_PASSWORD.encode(), hashed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def machine() -> dict[str, Any]:
    import bcrypt
    import tornado

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    wrk_version = "not installed"  # the benches that send no load with wrk (mfa_signin, sweep) run without it
    with contextlib.suppress(OSError):
        wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "tornado": tornado.version,
        "bcrypt": bcrypt.__version__,
        "wrk": wrk_version.strip(),
        "kernel": platform.release(),
        "load_average_at_start": load_average(),
    }
