"""The import (homeserver/migration/importer.py, plan.py) on Synapse databases of both kinds filled
row by row: the cases a real Synapse of a few users does not show (an older Synapse's macaroon, a
device left with no live token, an expired access token with a live refresh token, two refresh
chains on one device, an address someone here holds, a hash that is no bcrypt, hidden devices),
what a second run carries after Synapse made more tokens, and the counts."""

from __future__ import annotations

import bcrypt
import pytest

from backends.synapse.config import database_settings
from backends.synapse.database import SynapseDatabase
from homeserver.errors import MatrixError
from homeserver.migration.importer import Importer
from homeserver.users import Users
from tests.migration.test_check import MACAROON
from tests.migration.test_synapse_tokens import synapse_made
from tests.support.helpers import record

NOW_HASH = bcrypt.hashpw(b"secret-pw", bcrypt.gensalt(4)).decode()
u = "@{}:localhost".format


@pytest.fixture
def user_records():
    # Here already: someone else holds the address Synapse's dan has.
    return [record("zed", "zed-pw", email="dan@example.org")]


def fill(rows, now: int) -> dict[str, str]:
    tokens = {name: synapse_made(name.split("_")[0]) for name in ("ann", "ann_old", "dan", "dan_next", "eve")}
    tokens["eve_refresh_1"], tokens["eve_refresh_2"] = "syr_one_x", "syr_two_x"
    tokens["dan_refresh"] = "syr_dan_x"
    rows.users([
        {"name": u("ann"), "password_hash": NOW_HASH, "admin": True},
        {"name": u("bad"), "password_hash": "md5:0123456789abcdef"},
        {"name": u("dan"), "password_hash": NOW_HASH, "locked": True},
        {"name": u("eve"), "password_hash": NOW_HASH},
    ])
    rows.devices([
        {"user_id": u("ann"), "device_id": "PHONE", "display_name": "Ann's phone", "last_seen": now - 5, "ip": "10.1.1.1"},
        {"user_id": u("ann"), "device_id": "OLDTABLET", "display_name": "Old tablet"},  # no live token left
        {"user_id": u("ann"), "device_id": "master-key", "hidden": True},  # cross-signing kept as a device
        {"user_id": u("dan"), "device_id": "LAPTOP", "display_name": "Dan's laptop"},
        {"user_id": u("eve"), "device_id": "WATCH"},
        {"user_id": u("eve"), "device_id": "TV"},
    ])
    rows.refresh_tokens([
        {"id": 10, "user_id": u("dan"), "device_id": "LAPTOP", "token": tokens["dan_refresh"]},
        {"id": 22, "user_id": u("eve"), "device_id": "WATCH", "token": tokens["eve_refresh_2"]},
        # Rotated, its successor's access token used: spent, as Synapse has it.
        {"id": 21, "user_id": u("eve"), "device_id": "WATCH", "token": tokens["eve_refresh_1"], "next_token_id": 22},
        # Two logins' chains on one device: the newer is the device's grant.
        {"id": 31, "user_id": u("eve"), "device_id": "TV", "token": "syr_tv_old"},
        {"id": 32, "user_id": u("eve"), "device_id": "TV", "token": "syr_tv_new"},
    ])
    rows.access_tokens([
        {"user_id": u("ann"), "device_id": "PHONE", "token": MACAROON},  # an older Synapse's
        {"user_id": u("ann"), "device_id": "OLDTABLET", "token": tokens["ann_old"], "valid_until_ms": now - 1},
        {"user_id": u("dan"), "device_id": "LAPTOP", "token": tokens["dan"], "valid_until_ms": now - 1,
         "refresh_token_id": 10},  # expired: the refresh token is what keeps the session
        {"user_id": u("eve"), "device_id": "WATCH", "token": tokens["eve"], "valid_until_ms": now + 60_000,
         "refresh_token_id": 22, "used": True},
    ])
    rows.threepids([{"user_id": u("dan"), "address": "dan@example.org"}, {"user_id": u("eve"), "address": "eve@x.org"}])
    rows.profiles([{"localpart": "ann", "full_user_id": u("ann"), "displayname": "Ann"}])
    return tokens


async def move(hs, settings):
    importer = Importer(users=Users(hs.backend), backend=hs.backend, imported=hs.sessions.store.imported(),
                        credentials=hs.credentials, directory=False)
    with SynapseDatabase.open(settings) as database:
        return await importer.run(database, "localhost")


async def test_the_cases_a_small_synapse_does_not_show(hs, synapse_db, tmp_path):
    now = int(__import__("time").time() * 1000)
    tokens = fill(synapse_db.rows, now)
    synapse_db.rows.commit()
    settings = database_settings({"database": synapse_db.section}, str(tmp_path))
    counts = await move(hs, settings)
    assert (counts.users, counts.added, counts.kept, counts.deactivated) == (4, 3, 0, 0)
    assert str(counts.not_moved) == "bad (bad hash)"
    assert str(counts.emails_taken) == "dan (dan@example.org)"
    # ann's macaroon and eve's watch; dan's expired token stays behind (his refresh token carries him).
    assert (counts.access, counts.refresh, counts.device_only, counts.dropped_refresh) == (2, 3, 1, 1)
    # Her devices by name (the hidden cross-signing row is none), last seen as Synapse saw them.
    assert {d.device_id: d.display_name for d in await hs.devices.list_devices("ann")} == {
        "PHONE": "Ann's phone", "OLDTABLET": "Old tablet"}
    [phone] = [d for d in await hs.devices.list_devices("ann") if d.device_id == "PHONE"]
    assert (phone.last_seen_ip, phone.last_seen_ts) == ("10.1.1.1", now - 5)
    ann = await hs.auth.requester(MACAROON, None)
    assert (ann.user.name, ann.device_id, ann.user.admin) == ("ann", "PHONE", True)
    dan = await hs.users.get("dan")
    assert dan is not None and dan.locked and dan.email is None
    # dan's laptop refreshes here (a new access token of ours, expiring); his lock then answers.
    answer = await hs.refresh.refresh(b'{"refresh_token": "%s"}' % tokens["dan_refresh"].encode(), "10.0.0.1")
    with pytest.raises(MatrixError) as locked:
        await hs.auth.requester(answer["access_token"], None)
    assert locked.value.errcode == "M_USER_LOCKED"
    # eve's spent refresh token and the TV's older chain were not carried; the TV's newer refreshes.
    for spent in ("syr_one_x", "syr_tv_old"):
        with pytest.raises(MatrixError) as refused:
            await hs.refresh.refresh(b'{"refresh_token": "%s"}' % spent.encode(), "10.0.0.1")
        assert refused.value.errcode == "M_UNKNOWN_TOKEN"
    tv = await hs.refresh.refresh(b'{"refresh_token": "syr_tv_new"}', "10.0.0.1")
    assert (await hs.auth.requester(tv["access_token"], None)).device_id == "TV"
    assert (await hs.users.get("eve")).email == "eve@x.org"

    # Synapse made more tokens meanwhile (it was started again before the switch): a second
    # run carries those alone.
    synapse_db.rows.access_tokens([{"user_id": u("ann"), "device_id": "PHONE", "token": synapse_made("ann")}])
    synapse_db.rows.commit()
    again = await move(hs, settings)
    assert (again.added, again.kept, again.access, again.refresh, again.device_only) == (0, 3, 1, 0, 0)
    assert again.already >= 4


async def test_the_store_is_asked_a_few_users_at_a_time(hs, synapse_db, tmp_path):
    # An LDAP store runs lookups on a small pool and counts the wait in each one's timeout:
    # a batch of a thousand users asked at once would time out on a slow directory.
    import asyncio

    from homeserver.migration.survey import LOOKUPS

    synapse_db.rows.users([{"name": u(f"user{i:03}"), "password_hash": NOW_HASH} for i in range(3 * LOOKUPS)])
    synapse_db.rows.commit()

    class Counting:
        name = "file"

        def __init__(self, backend):
            self.backend, self.in_flight, self.most = backend, 0, 0

        async def get_user(self, name, *, case_insensitive=False):
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                await asyncio.sleep(0)
                return await self.backend.get_user(name, case_insensitive=case_insensitive)
            finally:
                self.in_flight -= 1

        async def get_users_by_email(self, address):
            return await self.backend.get_users_by_email(address)

    counting = Counting(hs.backend)
    importer = Importer(users=Users(counting), backend=hs.backend, imported=hs.sessions.store.imported(),
                        credentials=hs.credentials, directory=False)
    with SynapseDatabase.open(database_settings({"database": synapse_db.section}, str(tmp_path))) as database:
        counts = await importer.run(database, "localhost")
    assert counts.added == 3 * LOOKUPS
    assert 1 < counting.most <= LOOKUPS
