"""The delegation phase (`--delegation`): this server as the authentication service of a real
Synapse, all ratios taken in one run on this machine.

- Synapse's `/account/whoami` with our tokens against a second, identical Synapse that checks
  its own tokens (no delegation; its user made by its shared-secret registration, its token
  from its own password login). Synapse keeps an introspection answer two minutes, so the
  steady state is its cache; what a token's first request costs (the introspection round
  trip to us) is timed on fresh tokens, beside the same for Synapse's own tokens.
- Our `POST /oauth2/introspect` (what Synapse calls) against our own `GET whoami`, same token.
- Logins with delegation (each one calls Synapse's `upsert_device` before it answers)
  against the bcrypt ceiling, as the plain login phase measures it.

Both Synapses are matrix-synapse from PyPI in the tests' cached virtualenv
(tests/support/synapse.py), on SQLite, logging warnings only, rate limits raised.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import BENCH_PASSWORD, BENCH_USER, ROOT, SERVER_NAME, WHOAMI, Processes, cpu_seconds, free_port, http
from servers import get_tokens, start_homeserver
from targets import Target, target
from wrk import WrkResult, parse_wrk, run_wrk, wrk_command

SECRET = "bench-secret-shared-with-synapse-" + secrets.token_hex(16)
INTROSPECT = "/oauth2/introspect"
FIRST_REQUESTS = 20


def run_wrk_form(name: str, url: str, args: argparse.Namespace, body: str, secret: str, pid: int) -> WrkResult:
    """wrk POSTing a form with a Bearer header (as Synapse introspects), after a warm-up."""
    env = dict(os.environ, WRK_METHOD="POST", WRK_BODY=body, WRK_CONTENT_TYPE="application/x-www-form-urlencoded")
    if args.warmup > 0:
        subprocess.run(wrk_command(url, args.warmup, args.connections, token=secret), env=env, capture_output=True,
                       check=True)
    before = cpu_seconds(pid)
    out = subprocess.run(wrk_command(url, args.duration, args.connections, token=secret), env=env,
                         capture_output=True, text=True, check=True).stdout
    result = parse_wrk(name, url, args.connections, out)
    if result.requests:
        result.server_cpu_us = (cpu_seconds(pid) - before) / result.requests * 1e6
    print(f"  {name:<28} {result.rps:>9.1f} req/s  p50 {result.p50_ms:>7.2f} ms  p99 {result.p99_ms:>7.2f} ms"
          f"  non-2xx {result.non_2xx}  socket errors {result.socket_errors}  server CPU "
          f"{result.server_cpu_us or 0:6.1f} us/req", flush=True)
    return result


def timed_get(url: str, token: str) -> float:
    """Milliseconds one GET takes on a new connection; it must answer 200."""
    started = time.perf_counter()
    status, body = http(url, None, {"Authorization": f"Bearer {token}"})
    elapsed = (time.perf_counter() - started) * 1000
    if status != 200:
        raise RuntimeError(f"{url}: {status} {body[:200]!r}")
    return elapsed


def first_and_cached(synapse_url: str, tokens: list[str]) -> dict[str, float]:
    """Median ms of a token's first whoami at Synapse, and of its second right after."""
    first, second = [], []
    for token in tokens:
        first.append(timed_get(synapse_url + WHOAMI, token))
        second.append(timed_get(synapse_url + WHOAMI, token))
    return {"first_ms": statistics.median(first), "cached_ms": statistics.median(second)}


def synapse_login(url: str, user: str, password: str) -> str:
    body = json.dumps({"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                       "password": password}).encode()
    status, answer = http(url + "/_matrix/client/v3/login", body, {"Content-Type": "application/json"})
    if status != 200:
        raise RuntimeError(f"login at the plain Synapse: {status} {answer[:200]!r}")
    return str(json.loads(answer)["access_token"])


def measure_logins(args: argparse.Namespace, procs: Processes, tmp: Path, users: Path, hashed: str, base: str,
                   hs_pid: int, synapse_pid: int, runs: dict[str, Any], phase_logins: Any) -> list[Target]:
    """Logins with delegation against the bcrypt ceiling (the login phase's own measure), in
    two rounds interleaved with logins on a server without delegation, the same minute, so a
    busy machine shows as such; and Synapse's CPU per login (its upsert_device)."""
    plain, plain_base, _, _ = start_homeserver(procs, tmp, "no-delegation", users)
    rounds: dict[str, list[dict[str, float]]] = {"delegation": [], "no_delegation": []}
    try:
        for _ in range(2):
            before = cpu_seconds(synapse_pid)
            phase_logins(args, hashed, base, hs_pid, runs, "login (delegation)", "login_delegation")
            done = runs["login (delegation)"][0]
            rounds["delegation"].append({
                "rps": done["rps"], "requests": done["requests"], "errors": done["non_2xx"] + done["socket_errors"],
                "ceiling": runs["login (delegation)_bcrypt"]["ceiling_per_s"],
                "synapse_cpu_us": (cpu_seconds(synapse_pid) - before) / max(done["requests"], 1) * 1e6,
            })
            phase_logins(args, hashed, plain_base, plain.pid, runs, "login (no delegation)", "login")
            done = runs["login (no delegation)"][0]
            rounds["no_delegation"].append({"rps": done["rps"], "requests": done["requests"],
                                            "errors": done["non_2xx"] + done["socket_errors"],
                                            "ceiling": runs["login (no delegation)_bcrypt"]["ceiling_per_s"]})
    finally:
        procs.stop(plain)
    runs["login_delegation_rounds"] = rounds
    with_d = statistics.mean(r["rps"] for r in rounds["delegation"])
    without = statistics.mean(r["rps"] for r in rounds["no_delegation"])
    ceiling = statistics.mean(r["ceiling"] for r in rounds["delegation"])
    synapse_cpu = statistics.mean(r["synapse_cpu_us"] for r in rounds["delegation"])
    print(f"  logins: {with_d:.2f}/s with delegation, {without:.2f}/s without, interleaved; Synapse CPU per login "
          f"{synapse_cpu / 1000:.1f} ms", flush=True)
    note = (f"({with_d:.2f} of {ceiling:.2f}/s; without delegation, same minutes: {without:.2f}/s, "
            f"ratio {with_d / without:.2f}; Synapse CPU per login {synapse_cpu / 1000:.1f} ms)")
    return [target("login_delegation", with_d / ceiling, note),
            target("login_errors", sum(r["errors"] for r in rounds["delegation"]), name="login (delegation) errors")]


def bench_delegation(args: argparse.Namespace, procs: Processes, tmp: Path, users: Path, hashed: str,
                     runs: dict[str, Any], phase_logins: Any) -> list[Target]:
    sys.path.insert(0, str(ROOT))
    from tests.support.synapse import SYNAPSE_VERSION, Synapse, SynapseUnavailable

    synapse_port = free_port()
    section = (f'[delegation]\nenabled = true\nsynapse_url = "http://127.0.0.1:{synapse_port}"\n'
               f'secret = "{SECRET}"\nretry_interval = 1.0\n')
    # Ours first (it waits for Synapse), then Synapse pointing at it, as docs/delegation.md says.
    hs, base, _, _ = start_homeserver(procs, tmp, "delegation", users, sections=section)
    delegated = Synapse(tmp / "synapse-delegated", SERVER_NAME, port=synapse_port, mas_endpoint=base + "/",
                        mas_secret=SECRET, log_level="WARNING")
    plain = Synapse(tmp / "synapse-plain", SERVER_NAME, log_level="WARNING")
    started = []
    try:
        print(f"delegation: starting two Synapse {SYNAPSE_VERSION} (one delegating to us, one on its own tokens) ...",
              flush=True)
        for synapse in (delegated, plain):
            synapse.start()
            started.append(synapse)
        plain.register(BENCH_USER, BENCH_PASSWORD)
        ours_token = get_tokens(base, 1)[0]
        own_token = synapse_login(plain.url, BENCH_USER, BENCH_PASSWORD)
        synapse_pids = {"delegated": delegated.proc.pid if delegated.proc else 0,
                        "plain": plain.proc.pid if plain.proc else 0}

        # A token's first request: the delegated Synapse introspects it (a round trip to us).
        first = {
            "delegated": first_and_cached(delegated.url, get_tokens(base, FIRST_REQUESTS)),
            "plain": first_and_cached(plain.url, [synapse_login(plain.url, BENCH_USER, BENCH_PASSWORD)
                                                  for _ in range(FIRST_REQUESTS)]),
        }
        print(f"  first whoami of a fresh token (median of {FIRST_REQUESTS}): our token at Synapse "
              f"{first['delegated']['first_ms']:.1f} ms (then {first['delegated']['cached_ms']:.1f} ms), "
              f"Synapse's own token {first['plain']['first_ms']:.1f} ms (then {first['plain']['cached_ms']:.1f} ms)",
              flush=True)

        print(f"delegation: Synapse whoami, wrk -t1 -c{args.connections}, {args.rounds} interleaved rounds:", flush=True)
        whoami: dict[str, list[WrkResult]] = {"delegated": [], "plain": []}
        for _ in range(args.rounds):
            whoami["delegated"].append(run_wrk("Synapse whoami, our token", delegated.url + WHOAMI, args,
                                               token=ours_token, pid=synapse_pids["delegated"]))
            whoami["plain"].append(run_wrk("Synapse whoami, its token", plain.url + WHOAMI, args, token=own_token,
                                           pid=synapse_pids["plain"]))
        plain.stop()  # its share of the CPU back for the rest
        started.remove(plain)

        print("delegation: our introspection against our own whoami, same token:", flush=True)
        form = f"token={ours_token}&token_type_hint=access_token"
        ours: dict[str, list[WrkResult]] = {"introspect": [], "whoami": []}
        for _ in range(args.rounds):
            ours["introspect"].append(run_wrk_form("homeserver introspect", base + INTROSPECT, args, form, SECRET,
                                                   hs.pid))
            ours["whoami"].append(run_wrk("homeserver whoami", base + WHOAMI, args, token=ours_token, pid=hs.pid))
        check = http(base + INTROSPECT, form.encode(), {"Authorization": f"Bearer {SECRET}",
                                                        "Content-Type": "application/x-www-form-urlencoded"})
        if json.loads(check[1]).get("active") is not True:
            raise RuntimeError(f"introspection did not answer active: {check}")

        logins = measure_logins(args, procs, tmp, users, hashed, base, hs.pid, synapse_pids["delegated"], runs,
                                phase_logins)
        status, answer = http(f"{delegated.url}/_synapse/mas/query_user?localpart={BENCH_USER}", None,
                               {"Authorization": f"Bearer {SECRET}"})
        if status != 200:
            raise RuntimeError(f"the bench user is not at Synapse after the logins: {status} {answer[:200]!r}")
    except SynapseUnavailable as exc:
        print(f"delegation: Synapse cannot be had ({exc}); skipping the delegation phase", flush=True)
        return []
    finally:
        for synapse in started:
            synapse.stop()
        procs.stop(hs)

    def mean(results: list[WrkResult]) -> float:
        return statistics.mean(r.rps for r in results)

    cpu = {name: statistics.mean(r.server_cpu_us or 0 for r in results) for name, results in whoami.items()}
    runs["delegation"] = {
        "synapse_version": SYNAPSE_VERSION,
        "first_request": first,
        "synapse_whoami": {name: [asdict(r) for r in results] for name, results in whoami.items()},
        "homeserver": {name: [asdict(r) for r in results] for name, results in ours.items()},
    }
    errors = sum(r.errors for results in [*whoami.values(), *ours.values()] for r in results)
    first_note = (f"(first request of a token {first['delegated']['first_ms']:.1f} ms vs "
                  f"{first['plain']['first_ms']:.1f} ms; Synapse CPU per request {cpu['delegated']:.0f} vs "
                  f"{cpu['plain']:.0f} us)")
    return [
        target("delegation_whoami", mean(whoami["delegated"]) / mean(whoami["plain"]), first_note),
        target("delegation_introspect", mean(ours["introspect"]) / mean(ours["whoami"]),
               f"({mean(ours['introspect']):.0f} vs {mean(ours['whoami']):.0f} req/s)"),
        target("delegation_errors", errors),
        *logins,
    ]
