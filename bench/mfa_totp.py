"""The cost of one second-factor code check (issue 38: "a TOTP check itself well under 1 ms").

Measured in this process, in rounds that alternate with their baseline so machine load hits
both alike: the baseline is one HMAC-SHA1 of 8 bytes (what one TOTP code costs at its core);
then `totp.matching_step` (three codes of the ±1 window, constant-time compares), the
sealed secret opened with AES-256-GCM plus that check (what the service does per app), and
a recovery code's candidate digest. Reported: the median microseconds per call over the
rounds, their spread, and the ratio to the baseline.

    .venv/bin/python bench/mfa_totp.py [--rounds 15] [--calls 2000]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from homeserver.mfa import recovery, totp  # noqa: E402
from homeserver.mfa.sealing import Keyring, associated_data  # noqa: E402


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    secret = totp.new_secret()
    now = time.time()
    right = totp.code_at(secret, totp.current_step(now))
    wrong = next(f"{n:06d}" for n in range(10**6) if f"{n:06d}" != right
                 and totp.matching_step(secret, f"{n:06d}", now) is None)
    keys = Keyring("a bench key of at least thirty-two bytes")
    where = associated_data("totp", "alice", "factor-id")
    sealed = keys.seal(secret.encode(), where)
    raw_key = b"k" * 20
    counter = (12345).to_bytes(8, "big")

    def service_check() -> object:
        return totp.matching_step(keys.open(sealed, where).decode("ascii"), right, now)

    cases: dict[str, Callable[[], object]] = {
        "baseline: one HMAC-SHA1": lambda: hmac.new(raw_key, counter, hashlib.sha1).digest(),
        "totp.matching_step, right code": lambda: totp.matching_step(secret, right, now),
        "totp.matching_step, wrong code": lambda: totp.matching_step(secret, wrong, now),
        "open sealed secret + check": service_check,
        "recovery code candidate digests": lambda: recovery.candidate_digests(keys, "alice", "7kq2-m9xd-a4fw"),
    }
    for fn in cases.values():  # warm up
        per_call_us(fn, args.calls // 10)
    results: dict[str, list[float]] = {name: [] for name in cases}
    for index in range(args.rounds):
        order = list(cases.items())
        if index % 2:
            order.reverse()
        for name, fn in order:
            results[name].append(per_call_us(fn, args.calls))

    base = statistics.median(results["baseline: one HMAC-SHA1"])
    print(f"Python {sys.version.split()[0]}, {args.rounds} rounds x {args.calls} calls")
    print(f"{'case':40} {'median us':>10} {'min':>8} {'max':>8} {'x baseline':>11}")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:40} {median:10.2f} {min(values):8.2f} {max(values):8.2f} {median / base:11.1f}")


if __name__ == "__main__":
    main()
