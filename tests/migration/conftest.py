"""Fixtures of the migration tests: a private PostgreSQL cluster, Synapse's schema made by the
pinned Synapse on SQLite and on PostgreSQL (once per session, copied per test),
`synapse_db`, an empty Synapse database of either kind for a test to fill, and
`synapse_before`, a real Synapse on either that made its own state (once per session)."""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.synapse.config import DatabaseSettings, database_settings
from tests.support.helpers import ci
from tests.support.postgres import PostgresCluster, PostgresUnavailable
from tests.support.redis_servers import redis_server
from tests.support.slapd import Slapd, slapd
from tests.support.synapse import SynapseUnavailable
from tests.support.synapse_before import BeforeState, SynapseBefore, make_state
from tests.support.synapse_schema import SynapseRows, create_schema

# The test directory, for matrix-synapse-ldap3 and the LDAP store; a private Redis for the move into Redis.
__all__ = ["redis_server", "slapd"]

TEMPLATE = "synapse_template"
_names = itertools.count(1)


def unavailable(exc: Exception) -> None:
    """Skip for want of a real part, but fail on CI, where every part must be there."""
    if ci():
        pytest.fail(f"{exc} (CI is set: the migration tests must run)")
    pytest.skip(str(exc))


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One private PostgreSQL cluster for the session, on a free port."""
    try:
        cluster = PostgresCluster()
        cluster.start()
    except PostgresUnavailable as exc:
        unavailable(exc)
    yield cluster
    cluster.cleanup()


@pytest.fixture(scope="session")
def synapse_schema_sqlite(tmp_path_factory) -> Path:
    """An empty SQLite database with Synapse's schema (made once; tests copy it)."""
    folder = tmp_path_factory.mktemp("synapse-schema-sqlite")
    path = folder / "homeserver.db"
    try:
        create_schema(folder, {"name": "sqlite3", "args": {"database": str(path)}})
    except SynapseUnavailable as exc:
        unavailable(exc)
    return path


@pytest.fixture(scope="session")
def synapse_schema_postgres(tmp_path_factory, postgres_cluster) -> str:
    """A PostgreSQL database with Synapse's schema, the template of each test's own."""
    postgres_cluster.create_database(TEMPLATE)
    database = {"name": "psycopg2", "args": postgres_cluster.args(TEMPLATE)}
    try:
        create_schema(tmp_path_factory.mktemp("synapse-schema-postgres"), database)
    except SynapseUnavailable as exc:
        unavailable(exc)
    return TEMPLATE


@dataclass
class SchemaDatabase:
    """An empty Synapse database for one test: `rows` writes into it, `settings` reads it."""

    kind: str
    section: dict[str, Any]  # Synapse's `database:` section for it
    settings: DatabaseSettings
    rows: SynapseRows

    def finish(self) -> None:
        """Commit and, for SQLite, close: as a stopped Synapse leaves it (no -wal file)."""
        self.rows.commit()
        if self.kind == "sqlite":
            self.rows.conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def synapse_db(request, tmp_path) -> Iterator[SchemaDatabase]:
    if request.param == "sqlite":
        path = tmp_path / "homeserver.db"
        shutil.copy(request.getfixturevalue("synapse_schema_sqlite"), path)
        section: dict[str, Any] = {"name": "sqlite3", "args": {"database": str(path)}}
        connection: Any = sqlite3.connect(path)
    else:
        import psycopg

        cluster = request.getfixturevalue("postgres_cluster")
        name = f"synapse_{next(_names)}"
        cluster.create_database(name, template=request.getfixturevalue("synapse_schema_postgres"))
        section = {"name": "psycopg2", "args": cluster.args(name)}
        connection = psycopg.connect(cluster.conninfo(name))
    rows = SynapseRows(connection, postgres=request.param == "postgres")
    yield SchemaDatabase(request.param, section, database_settings({"database": section}, str(tmp_path)), rows)
    connection.close()
    if request.param == "postgres":
        cluster.drop_database(name)


@dataclass
class Before:
    """A stopped Synapse that made its own state (tests/support/synapse_before.py)."""

    kind: str
    synapse: SynapseBefore
    state: BeforeState
    slapd: Slapd

    @property
    def config_path(self) -> Path:
        return self.synapse.config_path


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def synapse_before(request, tmp_path_factory, slapd) -> Iterator[Before]:
    """Synapse on SQLite or PostgreSQL with matrix-synapse-ldap3 on the test slapd, brought
    into its state by its own APIs, then stopped (the migration reads a stopped Synapse)."""
    folder = tmp_path_factory.mktemp(f"synapse-before-{request.param}")
    database = None
    if request.param == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")
        cluster.create_database("synapse_before")
        database = {"name": "psycopg2", "args": {**cluster.args("synapse_before"), "cp_min": 1, "cp_max": 5}}
    synapse = SynapseBefore(folder, database=database, ldap_uri=slapd.uri)
    try:
        synapse.start()
    except SynapseUnavailable as exc:
        synapse.stop()
        unavailable(exc)
    try:
        state = make_state(synapse)
    finally:
        synapse.stop()
    yield Before(request.param, synapse, state, slapd)
    synapse.stop()
