"""The users file's format: a `{"users": [...]}` document checked record by record.

Shared by the reader (`backends.file`, the backend serving from the file) and the writer
(`backends.file_writer`, what `add-user` and `lock` change it with).
"""

from __future__ import annotations

from typing import Any

from backends.base import FLAG_FIELDS, ConfigError, User, password_scheme_problem
from backends.hashes import operator_mistake

REQUIRED = ("name", "password", "ident")
OPTIONAL = ("display_name", "avatar_url", "email")


def parse_users(document: Any, source: str, *, check_passwords: bool = True) -> dict[str, User]:
    """Validate a `{"users": [...]}` document into {name: User}; ConfigError names the record.

    With `check_passwords`, a password that is plainly an operator's slip (a bcrypt hash
    as plain text, or hex of something that is no bcrypt hash) is such an error too, so
    it stops start-up instead of failing every login of that user. Text that is not hex
    at all loads, and its logins answer the specification's rule 4.
    """
    if not isinstance(document, dict) or not isinstance(document.get("users"), list):
        raise ConfigError(f"users file {source}: expected an object with a \"users\" list")
    users: dict[str, User] = {}
    for index, record in enumerate(document["users"]):
        where = f"users file {source}: record {index}"
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected an object")
        if isinstance(record.get("name"), str):
            where = f"{where} ({record['name']!r})"
        for key in REQUIRED:
            if key not in record:
                raise ConfigError(f"{where}: missing required field {key!r}")
            if not isinstance(record[key], str):
                raise ConfigError(f"{where}: field {key!r} must be a string")
        for key in OPTIONAL:
            if record.get(key) is not None and not isinstance(record[key], str):
                raise ConfigError(f"{where}: field {key!r} must be a string")
        for key in FLAG_FIELDS:
            if record.get(key) is not None and not isinstance(record[key], bool):
                raise ConfigError(f"{where}: field {key!r} must be true or false")
        scheme_problem = password_scheme_problem(record.get("password_scheme"))
        if scheme_problem is not None:
            raise ConfigError(f"{where}: field 'password_scheme' {scheme_problem}")
        if record["name"] in users:
            raise ConfigError(f"{where}: duplicate name")
        problem = operator_mistake(record["password"]) if check_passwords else None
        if problem is not None:
            raise ConfigError(f"{where}: field 'password' cannot be used: {problem}")
        users[record["name"]] = User(
            name=record["name"],
            password=record["password"],
            ident=record["ident"],
            display_name=record.get("display_name"),
            avatar_url=record.get("avatar_url"),
            email=record.get("email"),
            locked=record.get("locked") is True,
            admin=record.get("admin") is True,
            mfa_required=record.get("mfa_required") is True,
            password_scheme=record.get("password_scheme"),
        )
    return users
