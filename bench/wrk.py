"""wrk runs: one endpoint at a time, a JSON line of results from wrk_report.lua, server CPU per request."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import dataclass

from common import LOGIN_BODY, LUA, cpu_seconds, require_loopback


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


def wrk_command(url: str, duration: float, connections: int, *, token: str | None = None, timeout: str = "5s") -> list[str]:
    args = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", f"--timeout={timeout}", "-s", str(LUA)]
    if token:
        args += ["-H", f"Authorization: Bearer {token}"]
    return [*args, url]


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
