"""`run.py delegation sync --all [--dry-run] [--allow-deactivations]`: one sweep of the whole user
store now, from the command line, on a server's stores, against the fake Synapse."""

from __future__ import annotations

import asyncio

import pytest

from homeserver.cli import delegation as delegation_cli
from homeserver.cli.common import CommandError
from tests.delegation.test_delegation import (  # noqa: F401  (fixtures)
    config_overrides,
    delegated,
    delegation_section,
    edit_users,
    run_py,
)
from tests.support.helpers import DEFAULT_USERS, record

MORE = [record(name, ident=f" [{name}]") for name in ("carol", "dave", "erin")]


@pytest.fixture
def user_records():
    return [dict(r) for r in DEFAULT_USERS + MORE]


async def test_sync_all_dry_run_then_for_real(tmp_path, synapse, login, session_store, users_path):
    await login()  # alice has a session; the others never logged in
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync", "--all", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert sorted(lines[:-1]) == [f"@{name}:localhost: would create at Synapse" for name in ("bob", "carol", "dave",
                                                                                             "erin")]
    assert lines[-1].startswith("directory sweep (dry run): 5 users in the user store: 4 to provision (4 new), "
                                "0 to deactivate, 0 to reactivate, 1 unchanged; ")
    assert set(synapse.users) == {"alice"}

    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync", "--all")
    assert code == 0, err
    # One line per user as Synapse answers (two calls at once: in any order).
    assert sorted(out.splitlines()[:-1]) == [f"@{name}:localhost: created at Synapse"
                                             for name in ("bob", "carol", "dave", "erin")]
    assert set(synapse.users) == {"alice", "bob", "carol", "dave", "erin"}

    # Most of the store gone: the guard holds the deactivations back (deactivate_after 0 here).
    edit_users(users_path, lambda users: [u for u in users if u["name"] in ("alice", "bob")])
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync", "--all",
                                  extra="deactivate_after = 0\n")
    assert code == 0, err
    assert out.splitlines()[-1] == (
        "deactivated no one at Synapse: it found 2 users, fewer than half of the 5 the previous sweep found; if "
        "the store is right, confirm with `run.py delegation sync --all --allow-deactivations`")
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync", "--all",
                                  "--allow-deactivations", extra="deactivate_after = 0\n")
    assert code == 0, err
    assert sorted(line.split(" (")[0] for line in out.splitlines()[:-1]) == [
        f"@{name}:localhost: deactivated at Synapse" for name in ("carol", "dave", "erin")]
    assert sorted(n for n, u in synapse.users.items() if u.get("deactivated")) == ["carol", "dave", "erin"]
    # Standard error (not a terminal) holds their audit lines, by the command line.
    assert err.count('audit deactivate user="') == 3 and 'client="cli"' in err, err


async def test_sync_all_with_synapse_away_is_one_error_line(tmp_path, synapse, session_store, users_path):
    await synapse.stop()
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync", "--all")
    assert code == 1 and err.startswith("homeserver: error: Synapse did not take it: provision_user: "), err
    assert err.count("\n") == 1, err
    assert "; 5 failed (left to the next sweep); " in out.splitlines()[-1], out


async def test_the_sweeps_flags_need_all(tmp_path, synapse, session_store, users_path):
    code, out, err = await run_py(tmp_path, synapse, users_path, "delegation", "sync", "--dry-run")
    assert (code, out) == (1, "")
    assert err == "homeserver: error: --dry-run and --allow-deactivations go with --all (a sweep of the whole " \
                  "user store)\n"



@pytest.fixture
def short_lease(monkeypatch):
    """The command's sweepers, each with a lease of 0.3 s (renewed every 0.1 s; waited for as long)."""
    made, build = [], delegation_cli.build_sweeper

    def build_sweeper(*args, **kwargs):
        sweeper = build(*args, **kwargs)
        sweeper.lease_ttl = 0.3
        made.append(sweeper)
        return sweeper

    monkeypatch.setattr(delegation_cli, "build_sweeper", build_sweeper)
    return made


async def test_a_sweep_that_loses_its_lease_is_one_error_line(config, synapse, session_store, short_lease):
    synapse.mode = "hang"  # Synapse keeps the sweep waiting while another process takes its lease
    task = asyncio.ensure_future(delegation_cli.sweep_all(config, lambda line: None))
    while not short_lease:
        await asyncio.sleep(0.01)
    state = session_store.delegation()
    await state.release_sweep(short_lease[0].holder)
    assert await state.claim_sweep("another process", 60_000, None)
    with pytest.raises(CommandError) as info:  # run.py's one error line, exit status 1; not a traceback
        await task
    assert str(info.value) == "the sweep stopped part-way: another process took its lease; the next sweep does the rest"


async def test_a_sweep_kept_waiting_by_another_is_one_error_line(config, synapse, session_store, short_lease):
    assert await session_store.delegation().claim_sweep("another process", 60_000, None)
    lines: list[str] = []
    with pytest.raises(CommandError) as info:
        await delegation_cli.sweep_all(config, lines.append)
    assert str(info.value) == "another process is sweeping the user store; try again when it is done"
    assert lines == ["Another process is sweeping the user store; waiting for it to finish."]
    assert synapse.calls == []


async def test_a_dry_run_goes_beside_a_running_servers_sweep(config, synapse, session_store, short_lease):
    # It changes nothing, so it takes no lease: it neither waits for the server's sweep nor holds
    # one back (the server may be mid-sweep, or due to start one).
    state = session_store.delegation()
    assert await state.claim_sweep("the server", 60_000, None)
    lines: list[str] = []
    assert await delegation_cli.sweep_all(config, lines.append, dry_run=True) is None
    assert lines[-1].startswith("directory sweep (dry run): 5 users in the user store: 5 to provision (5 new), ")
    assert synapse.calls == []
    assert await state.renew_sweep("the server", 60_000)  # still the server's
