#!/usr/bin/env python3
"""One-command benchmark: the homeserver against bare Tornado and the bcrypt ceiling, with wrk."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
VENV = ROOT / ".venv"
LUA = BENCH / "wrk_report.lua"
RESULTS = BENCH / "results"

BENCH_USER = "bench"
BENCH_PASSWORD = "bench-password-123"
SERVER_NAME = "localhost"
VERSIONS = "/_matrix/client/versions"
PROFILE = f"/_matrix/client/v3/profile/@{BENCH_USER}:{SERVER_NAME}"
CAPABILITIES = "/_matrix/client/v3/capabilities"
LOGIN = "/_matrix/client/v3/login"
LOGIN_BODY = json.dumps(
    {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": BENCH_USER}, "password": BENCH_PASSWORD}
)
# Synapse 1.163 on a machine like this one, wrk -t1 -c50 (req/s); we aim for 3x.
SYNAPSE = {"versions": 2400.0, "profile": 1050.0, "capabilities": 1400.0}
INSTALL_WRK = "apt-get update && apt-get install -y wrk   (Debian/Ubuntu; as root or with sudo)"


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
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


# -- processes -----------------------------------------------------------------------------


class Processes:
    """Every server the bench starts; all are stopped on exit, Ctrl-C or failure."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(log_path, "wb")
        # Own session: a Ctrl-C reaches only the bench, which then stops the servers itself.
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            # The whole session: a multi-process server's workers go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Workers may outlive a parent that exited first.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(proc: subprocess.Popen[bytes] | None, base: str, log_path: Path | None, timeout: float = 30) -> float:
    """Poll /versions until it answers 200; return the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"server exited with {proc.returncode} before answering:\n{tail}")
        with contextlib.suppress(OSError):
            if http(base + VERSIONS, timeout=1)[0] == 200:
                return time.monotonic() - start
        time.sleep(0.02)
    raise RuntimeError(f"{base} did not answer within {timeout} s")


def rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB (MiB)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                for child in (task / "children").read_text().split():
                    out += [int(child), *descendants(int(child))]
    return out


# -- wrk -------------------------------------------------------------------------------------


@dataclass
class WrkResult:
    name: str
    url: str
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    socket_errors: int
    # Server CPU time per request: less sensitive to other load on the machine than req/s.
    server_cpu_us: float | None = None

    @property
    def errors(self) -> int:
        return self.non_2xx + self.socket_errors


def require_loopback(url: str) -> None:
    """Load goes to this machine only."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SystemExit(f"refusing to send load to {host!r}: only 127.0.0.0/8, ::1 or localhost")


def wrk_command(url: str, duration: float, connections: int, *, token: str | None = None, timeout: str = "5s") -> list[str]:
    args = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", f"--timeout={timeout}", "-s", str(LUA)]
    if token:
        args += ["-H", f"Authorization: Bearer {token}"]
    return args + [url]


def parse_wrk(name: str, url: str, connections: int, output: str) -> WrkResult:
    for line in output.splitlines():
        if line.startswith("BENCH_JSON "):
            data = json.loads(line[len("BENCH_JSON "):])
            break
    else:
        raise RuntimeError(f"wrk printed no result for {name}:\n{output}")
    seconds = data["duration_us"] / 1e6
    return WrkResult(
        name=name,
        url=url,
        connections=connections,
        rps=data["requests"] / seconds if seconds else 0.0,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        requests=data["requests"],
        non_2xx=data["non_2xx_3xx"],
        socket_errors=data["connect_errors"] + data["read_errors"] + data["write_errors"] + data["timeouts"],
    )


def wrk_env(post: bool) -> dict[str, str]:
    env = dict(os.environ)
    if post:
        env.update(WRK_METHOD="POST", WRK_BODY=LOGIN_BODY, WRK_CONTENT_TYPE="application/json")
    return env


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its descendants so far."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_wrk(
    name: str, url: str, args: argparse.Namespace, *, connections: int | None = None, duration: float | None = None,
    token: str | None = None, post: bool = False, timeout: str = "5s", warmup: bool = True, pid: int | None = None,
) -> WrkResult:
    """Warm up, then measure one endpoint with wrk -t1; prints one line."""
    require_loopback(url)
    conns = connections or args.connections
    env = wrk_env(post)
    if warmup and args.warmup > 0:
        subprocess.run(wrk_command(url, args.warmup, conns, token=token, timeout=timeout), env=env, capture_output=True, check=True)
    cpu_before = cpu_seconds(pid) if pid else 0.0
    out = subprocess.run(
        wrk_command(url, duration or args.duration, conns, token=token, timeout=timeout),
        env=env, capture_output=True, text=True, check=True,
    ).stdout
    result = parse_wrk(name, url, conns, out)
    if pid and result.requests:
        result.server_cpu_us = (cpu_seconds(pid) - cpu_before) / result.requests * 1e6
    cpu = f"  server CPU {result.server_cpu_us:6.1f} us/req" if result.server_cpu_us else ""
    print(
        f"  {name:<28} {result.rps:>9.1f} req/s  p50 {result.p50_ms:>7.2f} ms  p99 {result.p99_ms:>7.2f} ms"
        f"  non-2xx {result.non_2xx}  socket errors {result.socket_errors}{cpu}",
        flush=True,
    )
    return result


# -- set-up ----------------------------------------------------------------------------------


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


def write_config(path: Path, port: int, users: Path, *, backend: str = "file", extra: str = "") -> None:
    """The default config, but on a free loopback port, a fixed secret and rate limits off."""
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

[rate_limit]
enabled = false
"""
    )


def start_homeserver(procs: Processes, tmp: Path, label: str, users: Path, *, backend: str = "file",
                     extra: str = "", redis_section: str = "") -> tuple[subprocess.Popen[bytes], str, Path, float]:
    port = free_port()
    config = tmp / f"{label}.toml"
    write_config(config, port, users, backend=backend, extra=extra)
    if redis_section:
        config.write_text(config.read_text() + redis_section)
    log = tmp / f"{label}.log"
    proc = procs.start([sys.executable, str(ROOT / "run.py"), "--config", str(config)], log)
    base = f"http://127.0.0.1:{port}"
    waited = wait_ready(proc, base, log)
    return proc, base, log, waited


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
    import threading

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


# -- targets ---------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    measured: float
    limit: float
    unit: str
    higher_is_better: bool = True
    note: str = ""
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.passed = self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "PASS" if self.passed else "FAIL"
        return f"  {verdict}  {self.name:<44} {self.measured:>9.3f} {self.unit:<6} (target {op} {self.limit:g}) {self.note}"


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


# -- the bench -------------------------------------------------------------------------------


def bench(args: argparse.Namespace, procs: Processes, tmp: Path) -> dict[str, Any]:
    info = machine()
    print(f"machine: {info['nproc']} cores, {info['cpu']}, Python {info['python']}, tornado {info['tornado']}, "
          f"bcrypt {info['bcrypt']}; load average {info['load_average_at_start']}", flush=True)
    cores = os.cpu_count() or 1
    results: dict[str, Any] = {"machine": info, "settings": vars(args).copy(), "runs": {}, "targets": []}
    runs: dict[str, Any] = results["runs"]
    targets: list[Target] = []

    print(f"hashing the bench password at cost {args.bcrypt_cost} ...", flush=True)
    hashed = hash_once(args.bcrypt_cost)
    users = tmp / "users.json"
    write_users(users, hashed, args.users)

    bare_port = free_port()
    bare_log = tmp / "bare.log"
    bare = procs.start([sys.executable, str(BENCH / "bare_tornado.py"), "--port", str(bare_port)], bare_log)
    bare_base = f"http://127.0.0.1:{bare_port}"
    wait_ready(bare, bare_base, bare_log)
    hs, base, hs_log, _ = start_homeserver(procs, tmp, "homeserver", users)
    time.sleep(0.5)
    idle_start = rss_mb(hs.pid)
    token = get_token(base)

    # Baseline before and after the homeserver's runs, so a drift in machine load shows.
    print(f"throughput, wrk -t1 -c{args.connections}, {args.warmup:g} s warm-up + {args.duration:g} s each:", flush=True)
    floor_runs = []
    for rnd in range(args.rounds):
        floor_runs.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare.pid))
        for name, path, tok in (("versions", VERSIONS, None), ("profile", PROFILE, None), ("capabilities", CAPABILITIES, token)):
            runs.setdefault(name, []).append(asdict(run_wrk(f"homeserver {name}", base + path, args, token=tok, pid=hs.pid)))
        floor_runs.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare.pid))
    runs["bare_tornado_versions"] = [asdict(r) for r in floor_runs]
    floor = statistics.mean(r.rps for r in floor_runs)
    if args.uvloop_floor:
        # Context only: the homeserver uses uvloop when installed; this is the floor on it.
        uv_port = free_port()
        uv = procs.start([sys.executable, str(BENCH / "bare_tornado.py"), "--port", str(uv_port), "--uvloop"], tmp / "bare-uv.log")
        wait_ready(uv, f"http://127.0.0.1:{uv_port}", tmp / "bare-uv.log")
        runs["bare_tornado_uvloop_versions"] = [asdict(run_wrk("bare tornado+uvloop (context)", f"http://127.0.0.1:{uv_port}{VERSIONS}", args, pid=uv.pid))]
        procs.stop(uv)
    best = {name: statistics.mean(r["rps"] for r in runs[name]) for name in ("versions", "profile", "capabilities")}
    # Context for each ratio: the same comparison in server CPU per request, which other
    # load on the machine moves much less than req/s.
    floor_cpu = statistics.mean(r.server_cpu_us or 0 for r in floor_runs)
    cpu_note = {name: f"(CPU per request: {floor_cpu / statistics.mean(r['server_cpu_us'] or 1 for r in runs[name]):.2f})"
                for name in best}
    errors = sum(r["non_2xx"] + r["socket_errors"] for name in best for r in runs[name])

    if args.target_url:
        bench_target(args, runs)
    if args.throughput_only:
        procs.stop(hs)
        targets += [
            Target("/versions / bare Tornado floor", best["versions"] / floor, 0.9, "x", note=cpu_note["versions"]),
            Target("profile / bare Tornado floor", best["profile"] / floor, 0.8, "x", note=cpu_note["profile"]),
            Target("capabilities / bare Tornado floor", best["capabilities"] / floor, 0.7, "x", note=cpu_note["capabilities"]),
        ]
        results["floor_rps"] = floor
        results["targets"] = [asdict(t) for t in targets]
        results["load_average_at_end"] = load_average()
        return results | {"_targets": targets}

    # Logins: enough connections to keep every bcrypt thread busy, few enough to stay
    # far below max_pending_logins and wrk's timeout.
    login_conns = args.login_connections or 2 * cores
    t_before = checkpw_seconds(hashed, args.checkpw_repeat)
    capacity = pool_capacity(hashed, cores)
    print(f"bcrypt: one checkpw (cost {args.bcrypt_cost}) takes {t_before * 1000:.1f} ms; {cores} threads at nice "
          f"{bcrypt_niceness()} manage {capacity:.2f}/s right now", flush=True)
    login = run_wrk("homeserver login", base + LOGIN, args, connections=login_conns, duration=args.login_duration,
                    post=True, timeout="20s", pid=hs.pid)
    t_after = checkpw_seconds(hashed, args.checkpw_repeat)
    t_check = (t_before + t_after) / 2
    ceiling = cores / t_check
    print(f"bcrypt ceiling: {cores} cores / {t_check * 1000:.1f} ms (mean of before and after) = {ceiling:.2f} logins/s", flush=True)
    busy = capacity < 0.9 * ceiling
    if busy:
        print("  note: the machine is busy (the thread pool reaches under 90 % of the ceiling); rerun when `uptime` "
              "shows a load under 1", flush=True)
    runs["login"] = [asdict(login)]
    runs["bcrypt"] = {"checkpw_ms_before": t_before * 1000, "checkpw_ms_after": t_after * 1000, "cost": args.bcrypt_cost,
                      "cores": cores, "ceiling_per_s": ceiling, "pool_capacity_now_per_s": capacity, "machine_busy": busy}

    # /versions latency while a login flood keeps every bcrypt thread busy. The probe uses
    # fewer connections than the throughput runs: at -c50 a saturated loop queues 50 deep,
    # so p99 there measures the queue, not whether logins stall the loop.
    probe = args.probe_connections
    quiet = run_wrk(f"versions -c{probe} (no flood)", base + VERSIONS, args, connections=probe)
    flood_seconds = 2 * (args.duration + args.warmup) + 3
    flood = subprocess.Popen(
        wrk_command(base + LOGIN, flood_seconds, login_conns, timeout="20s"), env=wrk_env(True),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        time.sleep(1)
        under_flood = run_wrk(f"versions -c{probe} in login flood", base + VERSIONS, args, connections=probe)
        under_flood_50 = run_wrk(f"versions -c{args.connections} in login flood", base + VERSIONS, args, warmup=False)
        flood_out, _ = flood.communicate(timeout=flood_seconds + 30)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    flood_result = parse_wrk("login flood", base + LOGIN, login_conns, flood_out)
    print(f"  {'(the login flood meanwhile)':<28} {flood_result.rps:>9.1f} req/s  non-2xx {flood_result.non_2xx}", flush=True)
    runs["versions_probe_no_flood"] = [asdict(quiet)]
    runs["versions_under_login_flood"] = [asdict(under_flood)]
    runs["versions_c50_under_login_flood"] = [asdict(under_flood_50)]
    runs["login_flood"] = [asdict(flood_result)]

    time.sleep(1)
    idle_after = rss_mb(hs.pid)
    procs.stop(hs)
    print(f"resident memory idle: {idle_start:.1f} MB after start, {idle_after:.1f} MB after the load", flush=True)
    runs["memory"] = {"idle_after_start_mb": idle_start, "idle_after_load_mb": idle_after}

    # A big users file: time from spawn to the first answer (imports included), and RSS.
    big_users = tmp / "users-big.json"
    write_users(big_users, hashed, args.big_users)
    big_start = time.monotonic()
    big, big_base, big_log, _ = start_homeserver(procs, tmp, "big", big_users)
    big_seconds = time.monotonic() - big_start
    big_rss = rss_mb(big.pid)
    last = f"user{args.big_users - 1:06d}"
    status, _ = http(f"{big_base}/_matrix/client/v3/profile/@{last}:{SERVER_NAME}")
    procs.stop(big)
    print(f"{args.big_users} users: ready {big_seconds:.2f} s after spawn, {big_rss:.1f} MB resident (profile of {last}: {status})", flush=True)
    runs["big_users_file"] = {"users": args.big_users, "ready_s": big_seconds, "rss_mb": big_rss, "last_user_status": status}

    # Ratios and verdicts.
    targets += [
        Target("/versions / bare Tornado floor", best["versions"] / floor, 0.9, "x", note=cpu_note["versions"]),
        Target("profile / bare Tornado floor", best["profile"] / floor, 0.8, "x", note=cpu_note["profile"]),
        Target("capabilities / bare Tornado floor", best["capabilities"] / floor, 0.7, "x", note=cpu_note["capabilities"]),
        Target("non-2xx + socket errors (3 endpoints)", errors, 0, "count", higher_is_better=False),
        Target("login / bcrypt ceiling", login.rps / ceiling, 0.95, "x",
               note=f"({login.rps:.2f} of {ceiling:.2f}/s; {login.rps / capacity:.2f} of what the pool managed now)"),
        Target("login errors", login.errors, 0, "count", higher_is_better=False),
        Target(f"/versions p99 (-c{probe}) during login flood", under_flood.p99_ms, 20, "ms", higher_is_better=False,
               note=f"(without the flood {quiet.p99_ms:.1f} ms)"),
        Target("resident memory idle", max(idle_start, idle_after), 60, "MB", higher_is_better=False),
        Target(f"{args.big_users} users: ready after spawn", big_seconds, 2, "s", higher_is_better=False),
        Target(f"{args.big_users} users: resident memory", big_rss, 150, "MB", higher_is_better=False),
    ]
    for name in ("versions", "profile", "capabilities"):
        targets.append(Target(f"{name} / Synapse reference ({SYNAPSE[name]:g}/s)", best[name] / SYNAPSE[name], 3, "x",
                              note="(reference figure, not measured here)"))

    if args.redis:
        targets += bench_redis(args, procs, tmp, hashed, bare.pid, bare_base, runs)
    if args.processes:
        bench_processes(args, procs, tmp, users, hashed, runs)

    results["floor_rps"] = floor
    results["targets"] = [asdict(t) for t in targets]
    results["load_average_at_end"] = load_average()
    return results | {"_targets": targets}


def bench_redis(args: argparse.Namespace, procs: Processes, tmp: Path, hashed: str, bare_pid: int, bare_base: str,
                runs: dict[str, Any]) -> list[Target]:
    """Profile on the Redis backend, with a key prefix of its own that is deleted afterwards."""
    import redis

    url = args.redis_url
    require_loopback(url.replace("redis://", "http://"))
    prefix = f"bench-{os.getpid()}-{secrets.token_hex(4)}:user:"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        print(f"redis at {url} unreachable ({exc}); skipping the Redis run", flush=True)
        return []
    try:
        client.hset(prefix + BENCH_USER, mapping={"password": hashed, "ident": " (bench)", "display_name": "Bench User",
                                                  "avatar_url": "mxc://localhost/bench"})
        section = f'\n[backend.redis]\nurl = "{url}"\nkey_prefix = "{prefix}"\n'
        print(f"redis backend ({url}, prefix {prefix}):", flush=True)
        hs, base, _, _ = start_homeserver(procs, tmp, "redis", tmp / "users.json", backend="redis", redis_section=section)
        try:
            # The floor again, just before and after: minutes have passed since the first.
            floors = [run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare_pid)]
            result = run_wrk("homeserver profile (redis)", base + PROFILE, args, pid=hs.pid)
            floors.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare_pid))
        finally:
            procs.stop(hs)
    finally:
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
    runs["profile_redis"] = [asdict(result)]
    runs["bare_tornado_versions_around_redis"] = [asdict(f) for f in floors]
    floor = statistics.mean(f.rps for f in floors)
    return [
        Target("redis profile / bare Tornado floor", result.rps / floor, 0.6, "x"),
        Target("redis profile errors", result.errors, 0, "count", higher_is_better=False),
    ]


def bench_processes(args: argparse.Namespace, procs: Processes, tmp: Path, users: Path, hashed: str,
                    runs: dict[str, Any]) -> None:
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
            login = run_wrk(f"login, {n} process(es)", base + LOGIN, args,
                            connections=args.login_connections or 2 * cores * n, duration=args.login_duration,
                            post=True, timeout="20s")
        finally:
            procs.stop(hs)
        scale[str(n)] = {"child_processes": workers, "profile": asdict(profile), "login": asdict(login),
                         "bcrypt_ceiling_per_s": ceiling, "login_ratio": login.rps / ceiling}
    runs["processes"] = scale


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


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
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
    p.add_argument("--redis", action="store_true", help="also measure profile on the Redis backend")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--processes", type=int, nargs="*", default=[], metavar="N",
                   help="also measure login and profile at [server] processes = N for each N (e.g. 1 2)")
    p.add_argument("--target-url", help="also drive another homeserver on this machine (e.g. Synapse) side by side")
    p.add_argument("--target-user", help="a user ID whose profile exists on --target-url")
    p.add_argument("--target-token", help="an access token valid on --target-url, for capabilities")
    p.add_argument("--no-uvloop-floor", dest="uvloop_floor", action="store_false",
                   help="skip the context run of bare Tornado on uvloop")
    p.add_argument("--throughput-only", action="store_true", help="only the floor, /versions, profile, capabilities")
    p.add_argument("--output", help="result file (default bench/results/bench-<time>.json)")
    return p.parse_args()


def main() -> int:
    if shutil.which("wrk") is None:  # before any venv set-up: say what is missing first
        print(f"wrk is not installed. Install it with:\n  {INSTALL_WRK}", file=sys.stderr)
        return 2
    ensure_venv()
    args = parse_args()
    procs = Processes()
    # SIGTERM takes the same clean-up path as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = Path(tempfile.mkdtemp(prefix="homeserver-bench-"))
    try:
        results = bench(args, procs, tmp)
    except KeyboardInterrupt:
        print("\ninterrupted; servers stopped", file=sys.stderr)
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    targets: list[Target] = results.pop("_targets")
    print("\ntargets (ratios measured in this run):")
    for target in targets:
        print(target.line())
    print(f"load average at end: {results['load_average_at_end']} (other work on the machine skews absolute figures)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.output) if args.output else RESULTS / time.strftime("bench-%Y%m%dT%H%M%SZ.json", time.gmtime())
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {out}")
    return 0 if all(t.passed for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
