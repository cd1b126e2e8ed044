"""docs/ldap.md's "Admins from a group, and large directories", run as written after the recipe
of "A directory to try it on" (its private slapd, tests/docs/test_ldap.py's `directory`): the
memberof overlay, the group with alice in it, the check, the filter added to the config,
the limits that let paged searches past the size limit. Then the backend the config makes
reads alice as an admin, in a lookup and in the whole-directory listing a sweep reads."""

from __future__ import annotations

import shlex
import urllib.parse

from homeserver.config import load_config
from homeserver.context import create_backend
from tests.docs.test_ldap import DOC, directory, run  # noqa: F401  (fixture)
from tests.support.doc_blocks import code_blocks, section, shell_commands

HEADING = "Admins from a group, and large directories"


def steps() -> list[str]:
    blocks = code_blocks(section(DOC.read_text(), HEADING), "sh")
    for block in blocks:
        shell_commands(block)  # each block splits into whole commands
    assert len(blocks) == 5, blocks
    return blocks


async def test_the_group_recipe_makes_alice_an_admin(directory):  # noqa: F811
    home, folder, log = directory["home"], directory["folder"], directory["log"]
    # The recipe's shell, as the reader still has it: its variables (the directory's folder,
    # its configuration socket, as option B set them) and the steps, one after the other.
    socket = urllib.parse.quote(str(folder / "ldapi"), safe="")
    variables = directory["variables"] + f"D={shlex.quote(str(folder))}\nLDAP_CONFIG=ldapi://{socket}\n"
    run(variables + "\n".join(steps()), home, log)
    said = log.read_text()
    # The check step: the service account sees alice's memberOf, asked for by name.
    assert "memberOf: cn=matrix-admins,ou=groups,dc=example,dc=org" in said, said
    config = load_config(str(folder / "homeserver.toml"))
    assert config.get("backend.ldap", "admin_filter") == "(memberOf=cn=matrix-admins,ou=groups,dc=example,dc=org)"
    backend = create_backend(config)
    await backend.start()
    try:
        alice = await backend.get_user("alice")
        assert alice is not None and alice.admin
        assert [(user.name, user.admin) for user in await backend.list_users()] == [("alice", True)]
    finally:
        await backend.close()
