"""[backend.ldap] ident_template against a real slapd: "Alice (alice)" instead of a UUID glued on."""

from __future__ import annotations

import pytest

from homeserver.context import create_backend
from homeserver.errors import ConfigError
from tests.backends.test_ldap import (  # noqa: F401 (fixtures)
    UUID,
    config_overrides,
    fetch,
    ldap_attributes,
    ldap_extra,
    ldap_options,
    profile,
)


@pytest.mark.parametrize("ldap_extra", [{"ident_template": " ({ident})"}])
@pytest.mark.parametrize("ldap_attributes", [{"ident": "uid"}])
async def test_the_template_shapes_the_ident(backend, fetch):  # noqa: F811
    assert (await backend.get_user("alice")).ident == " (alice)"
    assert await profile(fetch, "alice") == {"displayname": "Alice (alice)", "avatar_url": "mxc://localhost/alice"}


@pytest.mark.parametrize("ldap_extra", [{"ident_template": " [{{{ident}}}]"}])
async def test_braces_are_written_doubled(backend):
    ident = (await backend.get_user("alice")).ident
    assert ident.startswith(" [{") and ident.endswith("}]") and UUID.fullmatch(ident[3:-2])


async def test_the_default_keeps_the_attribute_as_it_is(backend):
    assert UUID.fullmatch((await backend.get_user("alice")).ident)


@pytest.mark.parametrize("template", ["({uid})", "no field", "{ident}{ident}", "{ident!r}", "{ident"])
def test_a_template_without_exactly_one_ident_is_refused(make_config, config_overrides, template):  # noqa: F811
    overrides = {**config_overrides, "backend.ldap": {**config_overrides["backend.ldap"], "ident_template": template}}
    with pytest.raises(ConfigError, match=r"^backend\.ldap\.ident_template: .*\{ident\} exactly once"):
        create_backend(make_config(overrides))
