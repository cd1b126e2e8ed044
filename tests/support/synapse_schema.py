"""Synapse's own database schema, made by the pinned Synapse, and rows written straight into it.

`create_schema` runs Synapse's `update_synapse_database` (what `synapse_homeserver` runs at
start before it listens) on an empty SQLite file or PostgreSQL database, so the tables,
columns and types are exactly Synapse's. `SynapseRows` then inserts users, devices and
tokens the way Synapse stores them (SMALLINT flags as 0/1, BOOLEAN columns as booleans),
for tests that need states a real Synapse is slow to reach and for the bench's 10,000
users. Tests that need Synapse to have made the rows itself use tests/support/synapse_before.py.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sqlite3
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.support.synapse import EXTRAS, SynapseUnavailable, synapse_extras, synapse_python

PSYCOPG2 = next(r for r in EXTRAS if r.startswith("psycopg2"))


def signing_key(folder: Path) -> Path:
    key = folder / "signing.key"
    if not key.exists():
        seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        key.write_text(f"ed25519 a_test {seed}\n")
    return key


def create_schema(folder: Path, database: dict[str, Any], server_name: str = "localhost") -> None:
    """Synapse's full schema on `database` (a `database:` section), made by Synapse itself."""
    folder.mkdir(parents=True, exist_ok=True)
    python = synapse_extras(PSYCOPG2) if database["name"] == "psycopg2" else synapse_python()
    config = folder / "schema.yaml"
    config.write_text(json.dumps({
        "server_name": server_name,
        "database": database,
        "signing_key_path": str(signing_key(folder)),
        "media_store_path": str(folder / "media_store"),
        "report_stats": False,
    }))
    done = subprocess.run(
        [str(python), "-m", "synapse._scripts.update_synapse_database", "--database-config", str(config)],
        capture_output=True, text=True, timeout=600, cwd=folder,
    )
    if done.returncode:
        raise SynapseUnavailable(f"Synapse could not make its schema: {done.stderr.strip()[-1500:]}")


class SynapseRows:
    """Insert rows into a Synapse database as Synapse stores them; `connection` is a sqlite3 or
    psycopg connection. Call `commit()` at the end."""

    def __init__(self, connection: Any, *, postgres: bool) -> None:
        self.conn = connection
        self.postgres = postgres
        self.mark = "%s" if postgres else "?"
        self.next_id = 1

    def ids(self, count: int) -> list[int]:
        first, self.next_id = self.next_id, self.next_id + count
        return list(range(first, first + count))

    def insert(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        if self.postgres:
            with self.conn.cursor() as cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join([self.mark] * len(columns))
            self.conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def users(self, rows: Iterable[dict[str, Any]]) -> None:
        """Each row: name (the full ID) and any of password_hash, admin, deactivated, locked,
        is_guest, appservice_id, user_type, approved, suspended, shadow_banned, creation_ts."""
        self.insert(
            "users",
            ("name", "password_hash", "creation_ts", "admin", "is_guest", "appservice_id", "user_type",
             "deactivated", "shadow_banned", "approved", "locked", "suspended"),
            ((r["name"], r.get("password_hash"), r.get("creation_ts", 1_700_000_000), int(r.get("admin", False)),
              int(r.get("is_guest", False)), r.get("appservice_id"), r.get("user_type"),
              int(r.get("deactivated", False)), r.get("shadow_banned"), r.get("approved"),
              bool(r.get("locked", False)), bool(r.get("suspended", False))) for r in rows),
        )

    def devices(self, rows: Iterable[dict[str, Any]]) -> None:
        self.insert(
            "devices", ("user_id", "device_id", "display_name", "last_seen", "ip", "user_agent", "hidden"),
            ((r["user_id"], r["device_id"], r.get("display_name"), r.get("last_seen"), r.get("ip"),
              r.get("user_agent"), bool(r.get("hidden", False))) for r in rows),
        )

    def access_tokens(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        ids = self.ids(len(rows))
        self.insert(
            "access_tokens",
            ("id", "user_id", "device_id", "token", "valid_until_ms", "puppets_user_id", "last_validated",
             "refresh_token_id", "used"),
            ((r.get("id", i), r["user_id"], r.get("device_id"), r["token"], r.get("valid_until_ms"),
              r.get("puppets_user_id"), r.get("last_validated"), r.get("refresh_token_id"), r.get("used"))
             for i, r in zip(ids, rows, strict=True)),
        )

    def refresh_tokens(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rows need their `id` (access tokens and successors point at it)."""
        self.insert(
            "refresh_tokens",
            ("id", "user_id", "device_id", "token", "next_token_id", "expiry_ts", "ultimate_session_expiry_ts"),
            ((r["id"], r["user_id"], r["device_id"], r["token"], r.get("next_token_id"), r.get("expiry_ts"),
              r.get("ultimate_session_expiry_ts")) for r in rows),
        )

    def threepids(self, rows: Iterable[dict[str, Any]]) -> None:
        self.insert(
            "user_threepids", ("user_id", "medium", "address", "validated_at", "added_at"),
            ((r["user_id"], r.get("medium", "email"), r["address"], r.get("validated_at", 1), r.get("added_at", 1))
             for r in rows),
        )

    def profiles(self, rows: Iterable[dict[str, Any]]) -> None:
        """Each row: localpart, full_user_id (None: an old row without it), displayname, avatar_url."""
        self.insert(
            "profiles", ("user_id", "full_user_id", "displayname", "avatar_url"),
            ((r["localpart"], r.get("full_user_id"), r.get("displayname"), r.get("avatar_url")) for r in rows),
        )

    def external_ids(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """(auth_provider, external_id, user_id) rows."""
        self.insert("user_external_ids", ("auth_provider", "external_id", "user_id"), rows)

    def commit(self) -> None:
        self.conn.commit()


def sqlite_rows(path: str | os.PathLike[str]) -> SynapseRows:
    return SynapseRows(sqlite3.connect(path), postgres=False)
