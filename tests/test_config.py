"""Config: defaults, TOML, environment overrides and one-line start-up errors."""

import logging

import pytest

from homeserver.config import DEFAULT_CONFIG, build_config, load_config
from homeserver.context import create_backend
from homeserver.errors import ConfigError


def test_shipped_config_serves_the_file_backend_on_8008():
    config = load_config(DEFAULT_CONFIG, environ={})
    server = config.section("server")
    assert (server["host"], server["port"], server["server_name"]) == ("127.0.0.1", 8008, "localhost")
    assert config.get("backend", "type") == "file"
    assert config.resolve_path(config.get("backend.file", "path")).endswith("conf/users.json")


def test_defaults_without_a_file():
    config = build_config({}, environ={})
    assert config.get("backend.redis", "key_prefix") == "homeserver:user:"
    assert config.get("rate_limit", "enabled") is True
    assert config.get("auth", "jwt_secret") == ""


def test_environment_overrides_any_key_with_its_type():
    environ = {
        "HOMESERVER_SERVER__PORT": "9000",
        "HOMESERVER_AUTH__JWT_SECRET": "s" * 40,
        "HOMESERVER_BACKEND__TYPE": "redis",
        "HOMESERVER_BACKEND__REDIS__URL": "redis://cache:6379/2",
        "HOMESERVER_RATE_LIMIT__ENABLED": "false",
        "HOMESERVER_SERVER__SERVER_NAME": "true",  # a string key keeps the raw text
        "UNRELATED": "x",
    }
    config = build_config({"server": {"port": 1234}}, environ=environ)
    assert config.get("server", "port") == 9000
    assert config.get("auth", "jwt_secret") == "s" * 40
    assert config.get("backend", "type") == "redis"
    assert config.get("backend.redis", "url") == "redis://cache:6379/2"
    assert config.get("rate_limit", "enabled") is False
    assert config.get("server", "server_name") == "true"


def test_cli_overrides_beat_the_environment(tmp_path):
    path = tmp_path / "hs.toml"
    path.write_text("[server]\nport = 1\n")
    config = load_config(str(path), environ={"HOMESERVER_SERVER__PORT": "2"}, overrides={"server": {"port": 3, "host": None}})
    assert config.get("server", "port") == 3 and config.get("server", "host") == "127.0.0.1"


@pytest.mark.parametrize(
    "document, environ, key",
    [
        ({"server": {"port": "8008"}}, {}, "server.port"),
        ({"server": {"port": 70000}}, {}, "server.port"),
        ({"server": {"port": True}}, {}, "server.port"),
        ({}, {"HOMESERVER_SERVER__PORT": "eighty"}, "server.port"),
        ({}, {"HOMESERVER_RATE_LIMIT__ENABLED": "maybe"}, "rate_limit.enabled"),
        ({"server": {"base_url": "localhost:8008"}}, {}, "server.base_url"),
        ({"auth": {"bcrypt_rounds": 3}}, {}, "auth.bcrypt_rounds"),
        ({"logging": {"level": "LOUD"}}, {}, "logging.level"),
        ({"backend": {"type": 5}}, {}, "backend.type"),
    ],
)
def test_bad_values_are_errors_naming_the_key(document, environ, key):
    with pytest.raises(ConfigError) as info:
        build_config(document, environ=environ)
    message = str(info.value)
    assert message.startswith(key + ":") and "\n" not in message


def test_short_secret_is_refused():
    with pytest.raises(ConfigError, match=r"^auth\.jwt_secret: must be at least 32 bytes"):
        build_config({"auth": {"jwt_secret": "short"}}, environ={})
    with pytest.raises(ConfigError, match=r"^auth\.jwt_secret"):
        build_config({}, environ={"HOMESERVER_AUTH__JWT_SECRET": "x" * 31})


@pytest.mark.parametrize(
    "document, environ, key, secret",
    [
        ({"auth": {"previous_jwt_secrets": ["hunter2-old-secret"]}}, {}, "auth.previous_jwt_secrets", "hunter2"),
        ({"mfa": {"key": "hunter2-short"}}, {}, "mfa.key", "hunter2"),
        ({"mfa": {"previous_keys": ["hunter2-short"]}}, {}, "mfa.previous_keys", "hunter2"),
        ({"auth": {"jwt_secret": 12345678}}, {}, "auth.jwt_secret", "12345678"),
        ({"backend": {"ldap": {"bind_password": ["hunter2"]}}}, {}, "backend.ldap.bind_password", "hunter2"),
        ({}, {"HOMESERVER_DELEGATION__SECRET": "x"}, None, None),
        ({"backend": {"redis": {"url": "http://:hunter2@redis.example:6379/0"}}}, {}, "backend.redis.url", "hunter2"),
        ({"sessions": {"redis": {"sentinel_password": 7}}}, {}, "sessions.redis.sentinel_password", "got 7"),
    ],
)
def test_config_errors_never_show_a_secret_value(document, environ, key, secret):
    """An error's line goes to logs and terminals: it names the key, never a secret's value
    (nor the password in a Redis URL)."""
    if key is None:
        build_config(document, environ=environ)  # any string is a valid secret
        return
    with pytest.raises(ConfigError) as info:
        build_config(document, environ=environ)
    message = str(info.value)
    assert message.startswith(key + ":")
    assert secret not in message


def test_a_redis_url_in_an_error_keeps_its_host():
    with pytest.raises(ConfigError) as info:
        build_config({"backend": {"redis": {"url": "http://user:hunter2@redis.example:6379/0"}}}, environ={})
    assert "hunter2" not in str(info.value) and "redis.example:6379" in str(info.value)


def test_unknown_keys_are_warnings_not_errors(caplog):
    with caplog.at_level(logging.WARNING):
        config = build_config({"server": {"colour": "blue"}, "extras": {"a": 1}}, environ={"HOMESERVER_NOPE__KEY": "1"})
    assert config.get("server", "port") == 8008
    text = caplog.text
    assert "server.colour" in text and "extras.a" in text and "nope.key" in text


def test_malformed_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nport = 1")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(str(bad), environ={})
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.toml"), environ={})


def test_unknown_backend_names_the_key_and_the_choices():
    config = build_config({"backend": {"type": "mongo"}}, environ={})
    with pytest.raises(ConfigError, match=r"^backend\.type: unknown backend 'mongo' \(known: file, ldap, redis\)"):
        create_backend(config)


def test_backend_file_path_is_relative_to_the_config_file(tmp_path):
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "hs.toml"
    path.write_text('[backend.file]\npath = "people.json"\n')
    backend = create_backend(load_config(str(path), environ={}))
    assert backend.path == str(tmp_path / "conf" / "people.json")
