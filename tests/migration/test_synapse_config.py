"""Reading Synapse's homeserver.yaml as Synapse reads it (backends/synapse/config.py)."""

from __future__ import annotations

import json

import pytest

from backends.synapse.config import SynapseConfigError, load_synapse_config, parse_synapse_config


def write(tmp_path, document, name="homeserver.yaml"):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def parse(**config):
    config.setdefault("server_name", "example.org")
    config.setdefault("database", {"name": "sqlite3", "args": {"database": "/var/lib/synapse/homeserver.db"}})
    return parse_synapse_config(config, paths=["/etc/synapse/homeserver.yaml"])


def test_a_plain_sqlite_synapse_config_with_synapses_defaults(tmp_path):
    path = write(tmp_path, "server_name: example.org\ndatabase:\n  name: sqlite3\n  args:\n    database: homeserver.db\n")
    config = load_synapse_config(str(path))
    assert config.server_name == "example.org"
    assert config.database is not None and config.database.engine == "sqlite3"
    # A relative path is taken from the config file's folder.
    assert config.database.sqlite_path == str(tmp_path / "homeserver.db")
    assert (config.allow_guest_access, config.enable_registration, config.password_enabled, config.password_localdb,
            config.pepper, config.bcrypt_rounds, config.ldap3, config.delegated) == (
        False, False, True, True, "", 12, False, False)


def test_a_config_without_server_name_is_refused():
    with pytest.raises(SynapseConfigError, match="server_name"):
        parse_synapse_config({"database": {"name": "sqlite3", "args": {"database": "x.db"}}})


@pytest.mark.parametrize(("database", "expected"), [
    # psycopg2.connect(**args): database is libpq's dbname; cp_* are Synapse's pool options.
    ({"user": "synapse", "password": "pw", "database": "synapse", "host": "db", "port": 5433, "cp_min": 5, "cp_max": 10},
     {"user": "synapse", "password": "pw", "dbname": "synapse", "host": "db", "port": "5433"}),
    ({"dbname": "synapse", "host": "/var/run/postgresql", "sslmode": "require", "options": None},
     {"dbname": "synapse", "host": "/var/run/postgresql", "sslmode": "require"}),
    ({}, {}),  # libpq's defaults and PG* variables
])
def test_postgres_args_become_libpq_keywords(database, expected):
    config = parse(database={"name": "psycopg2", "args": database})
    assert config.database is not None and config.database.engine == "psycopg2"
    assert dict(config.database.postgres) == expected


def test_postgres_dsn_and_the_description_without_the_password():
    config = parse(database={"name": "psycopg2", "args": {"dsn": "postgresql://u:hunter2@db/s", "password": "hunter3",
                                                           "host": "db", "database": "synapse"}})
    assert config.database is not None
    assert config.database.dsn == "postgresql://u:hunter2@db/s"
    described = config.database.describe() + repr(config)
    assert "hunter" not in described
    assert "synapse on db" in config.database.describe()


@pytest.mark.parametrize(("config", "problem"), [
    ({"database": {"name": "psycopg2", "args": {"database": "a", "dbname": "b"}}}, "both database and dbname"),
    ({"database": {"name": "mysql", "args": {}}}, "unsupported database type 'mysql'"),
    ({"database": {"name": "sqlite3", "args": {}}}, "SQLite file is not named"),
    ({"database": {"name": "sqlite3", "args": {"database": ":memory:"}}}, "no database file"),
    ({"database": None}, "names no database"),
    ({"databases": {"one": {"name": "sqlite3", "args": {"database": "x"}, "data_stores": ["state"]}}, "database": None},
     "none holds the main data store"),
    ({"databases": {"one": {"name": "sqlite3", "args": {"database": "x"}}}}, "refuses both"),
])
def test_a_database_it_cannot_read_is_a_problem_not_a_crash(config, problem):
    parsed = parse(**config)
    assert parsed.database is None
    assert problem in (parsed.database_problem or "")


def test_databases_and_database_path():
    parsed = parse(database=None, databases={
        "state_db": {"name": "sqlite3", "args": {"database": "/s.db"}, "data_stores": ["state"]},
        "main_db": {"name": "psycopg2", "args": {"database": "main"}, "data_stores": ["main"]},
    })
    assert parsed.database is not None and dict(parsed.database.postgres) == {"dbname": "main"}
    legacy = parse(database=None, database_path="/var/lib/synapse/old.db")
    assert legacy.database is not None and legacy.database.sqlite_path == "/var/lib/synapse/old.db"


def test_registration_as_synapse_reads_it():
    assert parse(enable_registration="true").enable_registration is True  # strtobool, as Synapse
    assert parse(enable_registration="off").enable_registration is False
    with pytest.raises(SynapseConfigError, match="enable_registration"):
        parse(enable_registration="maybe")
    assert parse(allow_guest_access=True).allow_guest_access is True
    assert parse(enable_registration_captcha=True, registration_requires_token=True).registration_captcha is True


def test_password_settings():
    config = parse(password_config={"enabled": "only_for_reauth", "localdb_enabled": False, "pepper": "p3pp3r"},
                   bcrypt_rounds=14)
    assert (config.password_enabled, config.password_login, config.password_localdb, config.pepper,
            config.bcrypt_rounds) == ("only_for_reauth", False, False, "p3pp3r", 14)
    assert "p3pp3r" not in repr(config)
    assert parse(password_config={"enabled": False}).password_login is False
    assert parse(password_config=None).password_login is True
    with pytest.raises(SynapseConfigError, match="bcrypt_rounds"):
        parse(bcrypt_rounds="12")


def test_single_sign_on_as_synapse_enables_it():
    config = parse(
        oidc_providers=[{"idp_id": "keycloak", "issuer": "https://kc/"}, {"issuer": "https://x/", "enabled": False},
                        {"issuer": "https://plain/"}],
        oidc_config={"enabled": True, "idp_id": "legacy", "issuer": "https://old/"},
        saml2_config={"sp_config": {}}, cas_config={"enabled": False}, jwt_config={"secret": "x"},
    )
    assert [(p.idp_id, p.issuer) for p in config.oidc_providers] == [
        ("oidc-keycloak", "https://kc/"), ("oidc", "https://plain/"), ("oidc-legacy", "https://old/")]
    assert (config.saml2, config.cas, config.jwt) == (True, False, False)
    assert parse(oidc_config={"issuer": "https://old/"}).oidc_providers == ()  # the old form is off unless enabled
    assert parse(jwt_config={"enabled": True}, cas_config={"server_url": "x"}).jwt is True


@pytest.mark.parametrize("config", [
    {"modules": [{"module": "ldap_auth_provider.LdapAuthProviderModule", "config": {}}]},
    {"password_providers": [{"module": "ldap_auth_provider.LdapAuthProvider", "config": {}}]},
    {"ldap_config": {"enabled": True}},
])
def test_matrix_synapse_ldap3_in_each_of_its_forms(config):
    assert parse(**config).ldap3 is True


def test_other_modules_and_settings_synapse_refuses_under_delegation():
    config = parse(modules=[{"module": "my.Module"}], password_providers=[{"module": "rest_auth.RestAuthProvider"}],
                   session_lifetime="24h", refresh_token_lifetime="1d", user_consent={"version": "1"},
                   login_via_existing_session={"enabled": True}, enable_3pid_changes=True)
    assert (config.modules, config.password_providers, config.ldap3) == (("my.Module",), ("rest_auth.RestAuthProvider",), False)
    assert config.lifetimes == ("refresh_token_lifetime", "session_lifetime")
    assert (config.user_consent, config.login_via_existing_session, config.enable_3pid_changes) == (True, True, True)
    assert parse().enable_3pid_changes is None
    with pytest.raises(SynapseConfigError, match="modules, item 0"):
        parse(modules=["not a mapping"])


def test_already_delegating():
    assert parse(matrix_authentication_service={"enabled": True}).delegated is True
    assert parse(experimental_features={"msc3861": {"enabled": True}}).delegated is True


def test_several_files_and_a_folder_merge_at_the_top_level(tmp_path):
    folder = tmp_path / "conf.d"
    folder.mkdir()
    write(folder, {"server_name": "example.org", "database": {"name": "sqlite3", "args": {"database": "/a.db"}}}, "10-base.yaml")
    write(folder, {"enable_registration": True, "database": {"name": "sqlite3", "args": {"database": "/b.db"}}}, "20-more.yaml")
    write(folder, {"server_name": "ignored.org"}, "notes.txt")
    config = load_synapse_config(str(folder))
    assert (config.server_name, config.enable_registration) == ("example.org", True)
    assert config.database is not None and config.database.sqlite_path == "/b.db"  # later files win, whole keys
    both = load_synapse_config([str(folder / "20-more.yaml"), str(folder / "10-base.yaml")])
    assert both.database is not None and both.database.sqlite_path == "/a.db"


@pytest.mark.parametrize(("content", "problem"), [
    ("server_name: x\npassword_config:\n  pepper: 'sec\n", "not valid YAML at line"),
    ("- a list\n", "expected a mapping at the top"),
    (b"server_name: \xff\n", "not UTF-8"),
])
def test_unreadable_configs_are_one_line_without_their_content(tmp_path, content, problem):
    path = tmp_path / "homeserver.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SynapseConfigError) as caught:
        load_synapse_config(str(path))
    message = str(caught.value)
    assert problem in message and str(path) in message
    assert "\n" not in message and "sec" not in message.replace(str(path), "")


def test_a_missing_config_file(tmp_path):
    with pytest.raises(SynapseConfigError, match="cannot be read"):
        load_synapse_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(SynapseConfigError, match="no Synapse config files"):
        load_synapse_config(str(tmp_path))
