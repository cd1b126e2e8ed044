"""Targets: a measured figure against its limit, PASS or FAIL; the limits, written once."""

from __future__ import annotations

from dataclasses import dataclass, field

# Every limit the bench checks, in one place: (what, limit, unit, higher is better).
LIMITS: dict[str, tuple[str, float, str, bool]] = {
    "versions": ("/versions / bare Tornado floor", 0.95, "x", True),
    "profile": ("profile / bare Tornado floor", 0.9, "x", True),
    "capabilities": ("capabilities (session check, SQLite) / floor", 0.8, "x", True),
    "whoami": ("whoami (session check, SQLite) / floor", 0.7, "x", True),
    "errors": ("non-2xx + socket errors (throughput runs)", 0, "count", False),
    "login": ("login / bcrypt ceiling", 0.95, "x", True),
    "login_errors": ("login errors", 0, "count", False),
    "login_limits": ("login, shared rate limits on / bcrypt ceiling", 0.9, "x", True),
    "flood_p99": ("/versions p99 during login flood", 20, "ms", False),
    "memory": ("resident memory idle", 60, "MB", False),
    "big_ready": ("big users file: ready after spawn", 2, "s", False),
    "big_rss": ("big users file: resident memory", 150, "MB", False),
    "synapse": ("/ Synapse reference", 3, "x", True),
    "redis_profile": ("profile (Redis user backend) / floor", 0.6, "x", True),
    "redis_capabilities": ("capabilities (session check, Redis) / floor", 0.5, "x", True),
    "redis_whoami": ("whoami (session check, Redis) / floor", 0.5, "x", True),
    "redis_errors": ("redis runs: errors", 0, "count", False),
    "delegation_whoami": ("Synapse whoami: our tokens / its own tokens", 0.9, "x", True),
    "delegation_introspect": ("our introspection / our whoami", 0.7, "x", True),
    "delegation_errors": ("delegation runs: errors", 0, "count", False),
    "login_delegation": ("login with delegation / bcrypt ceiling", 0.85, "x", True),
    # bench/synapse_db.py: reading a Synapse of 10,000 users and 50,000 devices and tokens; a
    # quarter of the minute issue 35 gives the whole import.
    "synapse_read": ("read every account", 15, "s", False),
    # bench/synapse_import.py: the whole import of that Synapse (issue 35's minute), and the
    # introspection of an imported token against one of ours (no dearer: at least 0.9).
    "synapse_import": ("the whole import", 60, "s", False),
    "imported_introspect": ("introspection: imported syt_ tokens / ours", 0.9, "x", True),
    # --ab: B may cost at most this much more server CPU per request than A on any endpoint.
    "ab_cpu": ("A/B: B/A server CPU per request", 1.1, "x", False),
}


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
        return f"  {verdict}  {self.name:<48} {self.measured:>9.3f} {self.unit:<6} (target {op} {self.limit:g}) {self.note}"


def target(key: str, measured: float, note: str = "", name: str | None = None) -> Target:
    """The target `key` of LIMITS for a measured figure."""
    what, limit, unit, higher = LIMITS[key]
    return Target(name or what, measured, limit, unit, higher, note)
