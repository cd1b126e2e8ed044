"""Redis user backend: one hash per user, read through redis-py's asyncio client."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from backends.base import (
    FLAG_FIELDS,
    StoreDataError,
    StoreIncomplete,
    User,
    UserBackend,
    UserExists,
    UserIncomplete,
    canonical_email,
    kept_fields,
    password_scheme_problem,
    stored_fields,
)
from backends.redis_connect import RedisConnection, load_in_transaction, text

logger = logging.getLogger(__name__)

# Create or replace the user's hash in one step, so concurrent add-user runs cannot both
# "win". KEYS[1] the hash; ARGV[1] "1" to overwrite; ARGV[2] "1" if the user must exist
# (its password or ident is kept); ARGV[3] n, then the n fields an overwrite removes;
# then field, value pairs to set. Other fields of an existing hash stay as they are.
# Returns 0 (exists, no overwrite), 1 (added), 2 (replaced) or -1 (must exist, does not).
ADD_USER_SCRIPT = """
local exists = redis.call('EXISTS', KEYS[1]) == 1
if exists and ARGV[1] ~= '1' then return 0 end
if not exists and ARGV[2] == '1' then return -1 end
local n = tonumber(ARGV[3])
if exists and n > 0 then redis.call('HDEL', KEYS[1], unpack(ARGV, 4, 3 + n)) end
if #ARGV > 3 + n then redis.call('HSET', KEYS[1], unpack(ARGV, 4 + n)) end
if exists then return 2 end
return 1
"""

# Set or clear `locked` of an existing user hash in one step. KEYS[1] the hash; ARGV[1]
# "1" to lock. Returns 0 when there is no such user.
SET_LOCKED_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '1' then redis.call('HSET', KEYS[1], 'locked', 'true') else redis.call('HDEL', KEYS[1], 'locked') end
return 1
"""

# The yes-or-no fields' values (`locked`, `admin`, `mfa_required`): "true" sets one (what
# `run.py lock` writes); the usual spellings of yes and no are read too. Anything else is a
# malformed record (an operator error).
FLAG_VALUES = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
               "off": False, "": False}


def flag_value(key: str, value: str | None, field: str) -> bool:
    """A yes-or-no field of the hash at `key`; a missing field is no."""
    if value is None:
        return False
    flag = FLAG_VALUES.get(value.strip().lower())
    if flag is None:
        raise StoreDataError(f"Redis key {key!r}: field {field!r} must be \"true\" or \"false\", not {value!r}")
    return flag


# A listing's SCAN steps ask for SCAN_COUNT keys; their hashes are read LIST_BATCH to a
# pipeline, so the loop is free between round trips: redis-py spends ~33 us of the loop's CPU
# on each reply, and the longest the loop ran one callback while listing 10,000 users grew
# with the batch (100: ~5 ms, 500: ~17 ms; bench/listing.py), the listing's time did not.
SCAN_COUNT = 1000
LIST_BATCH = 100
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(prefix: str) -> str:
    """`prefix` as a SCAN MATCH pattern that matches only itself."""
    return _GLOB_SPECIAL.sub(r"\\\1", prefix)


def hash_user(key: str, name: str, fields: dict[bytes, bytes]) -> User:
    """The User a user hash holds; StoreDataError for a malformed one."""
    try:
        record = {k.decode("utf-8"): v.decode("utf-8") for k, v in fields.items()}
    except UnicodeDecodeError:
        raise StoreDataError(f"Redis key {key!r}: a field is not UTF-8 text") from None
    missing = [field for field in ("password", "ident") if field not in record]
    if missing:
        raise StoreDataError(f"Redis key {key!r}: missing field {', '.join(missing)}")
    scheme = record.get("password_scheme") or None
    problem = password_scheme_problem(scheme)
    if problem:
        raise StoreDataError(f"Redis key {key!r}: field 'password_scheme' {problem}")
    return User(
        name=name,
        password=record["password"],
        ident=record["ident"],
        display_name=record.get("display_name"),
        avatar_url=record.get("avatar_url"),
        email=record.get("email"),
        locked=flag_value(key, record.get("locked"), "locked"),
        admin=flag_value(key, record.get("admin"), "admin"),
        mfa_required=flag_value(key, record.get("mfa_required"), "mfa_required"),
        password_scheme=scheme,
    )


class RedisBackend(UserBackend):
    """Users as Redis hashes at `<key_prefix><name>`, on a standalone server, Sentinel or Cluster."""

    name = "redis"

    def __init__(
        self, connection: RedisConnection, key_prefix: str, email_key_prefix: str = "homeserver:email:"
    ) -> None:
        self.connection = connection
        self.key_prefix = key_prefix
        # `<email_key_prefix><canonical address>`: a set of the names holding the address.
        self.email_key_prefix = email_key_prefix

    @classmethod
    def from_config(cls, options: dict[str, Any], *, config_dir: str) -> RedisBackend:
        connection = RedisConnection(options, section="backend.redis", store="user store")
        return cls(connection, options["key_prefix"], options["email_key_prefix"])

    @property
    def client(self) -> Redis | RedisCluster | None:
        return self.connection.client

    async def start(self) -> None:
        """Create this process's client (after any fork) and report whether Redis answers."""
        await self.connection.start()

    async def close(self) -> None:
        await self.connection.close()

    def _redis(self) -> Redis | RedisCluster:
        if self.client is None:
            raise RuntimeError("RedisBackend used before start()")
        return self.client

    # -- users --------------------------------------------------------------------

    def key(self, name: str) -> str:
        """The hash key of `name`. The service never passes a name no account can have
        (homeserver.names.possible_name), so no odd key is ever built."""
        return self.key_prefix + name

    async def check_health(self) -> None:
        with self.connection.errors():
            await self._redis().ping()

    async def get_user(self, name: str, *, case_insensitive: bool = False) -> User | None:
        """HGETALL the user's hash; with `case_insensitive`, then the lower-cased name's."""
        user = await self._lookup(name)
        if user is None and case_insensitive and name.lower() != name:
            user = await self._lookup(name.lower())
        return user

    async def _lookup(self, name: str) -> User | None:
        key = self.key(name)
        fields = await self.connection.hgetall(key)
        if not fields:
            return None
        return hash_user(key, name, fields)

    async def list_users(self) -> list[User]:
        """Every user hash under the key prefix: SCAN (on every primary of a Cluster) for hashes,
        read LIST_BATCH at a time, one pipeline each. Keys of other types are no users (a
        lookup of them fails too); a hash that is malformed, or any Redis error, makes the
        listing `StoreIncomplete`."""
        client = self.connection.connect()  # the CLI lists without start()
        lister = _Listing(self, client)
        try:
            await lister.run()
        except (RedisError, RedisClusterException) as exc:
            raise StoreIncomplete(
                f"Redis ({self.connection.where()}) failed after {len(lister.users)} users were read: {exc}",
                users=lister.users, unreadable=lister.unreadable,
            ) from None
        if lister.unreadable:
            raise StoreIncomplete(
                f"{len(lister.unreadable)} user hashes in Redis cannot be read, e.g. {lister.problem}",
                users=lister.users, unreadable=lister.unreadable,
            )
        return lister.users

    async def get_users_by_email(self, address: str) -> list[User]:
        """The names in the address's index set whose hash still holds that address.

        The index is only a pointer: a stale entry (the hash changed by hand) is skipped.
        """
        index = self.email_key_prefix + address
        with self.connection.errors(index):
            names = await self._redis().smembers(index)
        found = []
        for raw in sorted(names):
            user = await self._lookup(text(raw))
            if user is not None and user.email is not None and canonical_email(user.email) == address:
                found.append(user)
        return found

    async def set_locked(self, name: str, locked: bool) -> bool:
        key = self.key(name)
        self.connection.connect()  # the CLI runs without start()
        with self.connection.errors(key):
            done = await self._redis().eval(SET_LOCKED_SCRIPT, 1, key, "1" if locked else "0")
        return bool(done)

    async def add_user(self, user: User, *, overwrite: bool = False, keep: Collection[str] = ()) -> bool:
        key = self.key(user.name)
        self.connection.connect()  # the CLI provisions without start()
        # The hash holds every field of User but the name (it is in the key).
        kept = kept_fields(keep)
        fields = {name: value for name, value in stored_fields(user).items() if name not in ("name", *kept)}
        for flag in FLAG_FIELDS:
            if fields.get(flag) is not None:
                fields[flag] = "true"
        if "password" in fields:
            fields["password"] = fields["password"] or ""
        removed = [name for name, value in fields.items() if value is None]
        pairs = [part for name, value in fields.items() if value is not None for part in (name, str(value))]
        must_exist = "1" if {"password", "ident"} & set(keep) else "0"
        args = ["1" if overwrite else "0", must_exist, str(len(removed)), *removed, *pairs]
        client = self._redis()
        with self.connection.errors(key):
            old_email = await client.hget(key, "email")
            outcome = await client.eval(ADD_USER_SCRIPT, 1, key, *args)
        if outcome == 0:
            raise UserExists(user.name)
        if outcome == -1:
            raise UserIncomplete(user.name, [k for k in ("password", "ident") if k in keep])
        if "email" not in keep:
            # The address index lives in other keys (other Cluster slots): kept in separate
            # steps, which is safe because a lookup checks the hash itself.
            old = canonical_email(text(old_email)) if old_email else None
            new = canonical_email(user.email) if user.email else None
            with self.connection.errors():
                if old and old != new:
                    await client.srem(self.email_key_prefix + old, user.name)
                if new:
                    await client.sadd(self.email_key_prefix + new, user.name)
        logger.info("stored user %r at Redis key %r", user.name, key)
        return outcome == 2


    async def add_users(self, users: list[User]) -> list[str]:
        """ADD_USER_SCRIPT (never overwriting) for each, and the address index, in one MULTI/EXEC
        (standalone, Sentinel: all or none); on a Cluster, whose keys spread over nodes, one
        pipeline, each user's hash before its address."""
        if not users:
            return []
        client = self.connection.connect()  # the CLI provisions without start()
        cluster = isinstance(client, RedisCluster)
        with self.connection.errors():
            present = set()
            pipe = client.pipeline(transaction=False)
            for user in users:
                pipe.exists(self.key(user.name))
            for user, exists in zip(users, await pipe.execute(), strict=True):
                if exists:
                    present.add(user.name)
            added = [user for user in users if user.name not in present]
            if cluster:  # a Cluster pipelines no scripts: each user's, some at a time, then the addresses
                step = self.connection.cluster_in_flight(len(added))
                outcomes = []
                for start in range(0, len(added), step):
                    outcomes += await asyncio.gather(*(
                        client.eval(ADD_USER_SCRIPT, 1, self.key(user.name), "0", "0", "0", *_pairs(user))
                        for user in added[start:start + step]
                    ))
                pipe = client.pipeline(transaction=False)
            else:
                pipe = client.pipeline(transaction=True)
                sha = load_in_transaction(pipe, ADD_USER_SCRIPT)
                for user in added:
                    pipe.evalsha(sha, 1, self.key(user.name), "0", "0", "0", *_pairs(user))
            for user in added:
                address = canonical_email(user.email) if user.email else None
                if address:
                    pipe.sadd(self.email_key_prefix + address, user.name)
            replies = await pipe.execute()
        if not cluster:
            outcomes = replies[1:1 + len(added)]  # after the SCRIPT LOAD's reply
        return [user.name for user, outcome in zip(added, outcomes, strict=True) if outcome == 1]


def _pairs(user: User) -> list[str]:
    """The field, value pairs of a new user's hash (add_users; flags as "true")."""
    fields = {k: v for k, v in stored_fields(user).items() if k != "name" and v is not None}
    for flag in FLAG_FIELDS:
        if flag in fields:
            fields[flag] = "true"
    return [part for k, v in fields.items() for part in (k, str(v))]


class _Listing:
    """One listing's progress: the users read so far, the names whose hashes are malformed."""

    def __init__(self, backend: RedisBackend, client: Redis | RedisCluster) -> None:
        self.backend = backend
        self.client = client
        self.users: list[User] = []
        self.unreadable: list[str] = []
        self.problem = ""  # the first malformed hash's error, for the reason line

    async def run(self) -> None:
        prefix = self.backend.key_prefix.encode("utf-8")
        seen: set[bytes] = set()
        batch: list[bytes] = []
        pattern = glob_escape(self.backend.key_prefix) + "*"
        async for key in self.client.scan_iter(match=pattern, count=SCAN_COUNT, _type="hash"):
            if key in seen or not key.startswith(prefix):
                continue  # SCAN may return a key twice
            seen.add(key)
            batch.append(key)
            if len(batch) >= LIST_BATCH:
                await self._read(batch, len(prefix))
                batch = []
        if batch:
            await self._read(batch, len(prefix))

    async def _read(self, keys: list[bytes], cut: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        # Per-command errors (a key replaced by another type since SCAN) come back as values.
        replies = await pipe.execute(raise_on_error=False)
        for raw, reply in zip(keys, replies, strict=True):
            where = text(raw)
            try:
                if isinstance(reply, Exception):
                    raise StoreDataError(f"Redis key {where!r}: {reply}")
                if not reply:
                    continue  # removed since SCAN saw it: gone
                try:
                    name = raw[cut:].decode("utf-8")
                except UnicodeDecodeError:
                    raise StoreDataError(f"Redis key {where!r}: the name is not UTF-8 text") from None
                self.users.append(hash_user(where, name, reply))
            except StoreDataError as exc:
                self.unreadable.append(text(raw[cut:]))
                self.problem = self.problem or str(exc)
