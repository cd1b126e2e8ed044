"""A/B: two versions of the server (commits or directories) side by side in one run.

Each side is a commit (materialized with `git worktree add --detach` into a temporary
directory, removed afterwards) or a directory holding a tree (a worktree with uncommitted
changes, another clone). Both servers run from their own tree on the same Python, with the
same config (file backend, SQLite sessions, rate limits off: servers.write_config), and
stay up for the whole phase. Every round measures each endpoint on A and on B back to
back (the order flips every round) after the bare-Tornado floor, so drift in machine load
hits both alike. Reported per endpoint: req/s and server CPU per request (utime + stime of
the server process and its children, from /proc, over the measured seconds, divided by
the requests done) for each side, and the B/A ratios with their spread over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import ROOT, VERSIONS, Processes
from servers import get_tokens, start_homeserver
from targets import Target, target
from wrk import WrkResult, run_wrk


@dataclass
class Side:
    label: str  # "A" or "B"
    spec: str  # what was asked for: a revision or a directory
    tree: Path  # where the server runs from
    commit: str  # the commit checked out there ("" when unknown), "+dirty" when it has changes

    def describe(self) -> str:
        return f"{self.label} = {self.spec} ({self.commit or 'not a git tree'}) in {self.tree}"


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def tree_commit(tree: Path) -> str:
    """The commit a directory has checked out, with "+dirty" when it differs from it."""
    try:
        commit = git("rev-parse", "--short=12", "HEAD", cwd=tree)
        dirty = git("status", "--porcelain", "--untracked-files=no", cwd=tree)
    except (subprocess.CalledProcessError, OSError):
        return ""
    return commit + ("+dirty" if dirty else "")


@contextlib.contextmanager
def materialize(label: str, spec: str, tmp: Path) -> Iterator[Side]:
    """A side from a directory (used as is) or a revision (a detached worktree, removed after)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "run.py").exists():
            raise SystemExit(f"--ab: {spec} has no run.py; give a homeserver tree or a revision")
        tree = path.resolve()
        yield Side(label, spec, tree, tree_commit(tree))
        return
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--ab: {spec!r} is neither a directory nor a revision of {ROOT}") from None
    tree = tmp / f"tree-{label.lower()}"
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        yield Side(label, spec, tree, commit[:12])
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tree, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "prune")


def spread(values: list[float], fmt: str = ".3f") -> str:
    """min-max over the rounds."""
    return f"{min(values):{fmt}}-{max(values):{fmt}}" if len(values) > 1 else f"{values[0]:{fmt}}"


def phase_ab(args: argparse.Namespace, procs: Processes, tmp: Path, users: Path, bare_pid: int, bare_base: str,
             endpoints: tuple[tuple[str, str, bool], ...], runs: dict[str, Any]) -> list[Target]:
    """A against B on every endpoint, interleaved rounds; targets on B/A CPU per request."""
    spec_a, spec_b = args.ab[0], (args.ab[1] if len(args.ab) > 1 else args.worktree or str(ROOT))
    with materialize("A", spec_a, tmp) as a, materialize("B", spec_b, tmp) as b:
        for side in (a, b):
            print(side.describe(), flush=True)
        servers = {}
        for side in (a, b):
            proc, base, _, _ = start_homeserver(procs, tmp, f"ab-{side.label.lower()}", users, tree=side.tree)
            servers[side.label] = (proc, base, get_tokens(base, 1)[0])
        print(f"A/B, {args.rounds} interleaved rounds, wrk -t1 -c{args.connections}, {args.warmup:g} s warm-up + "
              f"{args.duration:g} s each:", flush=True)
        measured: dict[str, dict[str, list[WrkResult]]] = {name: {"A": [], "B": []} for name, _, _ in endpoints}
        floors: list[WrkResult] = []
        try:
            for round_no in range(args.rounds):
                floors.append(run_wrk("bare tornado /versions", bare_base + VERSIONS, args, pid=bare_pid))
                order = ("A", "B") if round_no % 2 == 0 else ("B", "A")
                for name, path, authed in endpoints:
                    for label in order:
                        proc, base, token = servers[label]
                        result = run_wrk(f"{label} {name}", base + path, args, token=token if authed else None,
                                         pid=proc.pid)
                        measured[name][label].append(result)
        finally:
            for proc, _, _ in servers.values():
                procs.stop(proc)
    return report(a, b, measured, floors, runs)


def report(a: Side, b: Side, measured: dict[str, dict[str, list[WrkResult]]], floors: list[WrkResult],
           runs: dict[str, Any]) -> list[Target]:
    """The table of both sides and their ratios; the B/A CPU-per-request targets."""
    floor_rps = statistics.mean(f.rps for f in floors)
    floor_cpu = statistics.mean(f.server_cpu_us or 0 for f in floors)
    print(f"\n{a.describe()}\n{b.describe()}")
    print(f"floor (bare Tornado /versions): {floor_rps:,.0f} req/s, {floor_cpu:.1f} us CPU/req "
          f"(rounds {spread([f.server_cpu_us or 0 for f in floors], '.1f')})")
    print("server CPU per request: mean (min-max over the rounds); B/A of the means (min-max of the rounds' ratios)")
    print(f"  {'endpoint':<13}{'A req/s':>9}{'B req/s':>9}{'B/A':>7}  {'A us/req':<20}{'B us/req':<20}"
          f"{'B/A CPU':<20}{'A/floor':>8}{'B/floor':>8}")
    out: dict[str, Any] = {"a": asdict(a) | {"tree": str(a.tree)}, "b": asdict(b) | {"tree": str(b.tree)},
                           "floor": [asdict(f) for f in floors], "endpoints": {}}
    targets = []
    for name, sides in measured.items():
        ra, rb = sides["A"], sides["B"]
        rps_a, rps_b = statistics.mean(r.rps for r in ra), statistics.mean(r.rps for r in rb)
        cpu_a = [r.server_cpu_us or 0 for r in ra]
        cpu_b = [r.server_cpu_us or 0 for r in rb]
        per_round = [cb / ca for ca, cb in zip(cpu_a, cpu_b, strict=True) if ca]
        cpu_ratio = statistics.mean(cpu_b) / statistics.mean(cpu_a)
        cells = (f"{statistics.mean(cpu_a):.1f} ({spread(cpu_a, '.0f')})",
                 f"{statistics.mean(cpu_b):.1f} ({spread(cpu_b, '.0f')})", f"{cpu_ratio:.3f} ({spread(per_round)})")
        print(f"  {name:<13}{rps_a:>9,.0f}{rps_b:>9,.0f}{rps_b / rps_a:>7.3f}  {cells[0]:<20}{cells[1]:<20}{cells[2]:<20}"
              f"{rps_a / floor_rps:>8.3f}{rps_b / floor_rps:>8.3f}")
        errors = sum(r.errors for r in ra + rb)
        out["endpoints"][name] = {"a": [asdict(r) for r in ra], "b": [asdict(r) for r in rb], "rps_ratio": rps_b / rps_a,
                                  "cpu_ratio": cpu_ratio, "cpu_ratio_per_round": per_round, "errors": errors}
        targets.append(target("ab_cpu", cpu_ratio, f"(per round {spread(per_round)}; req/s B/A {rps_b / rps_a:.3f})",
                              name=f"A/B {name}: B/A server CPU per request"))
        targets.append(target("errors", errors, name=f"A/B {name}: non-2xx + socket errors"))
    runs["ab"] = out
    return targets
