from tests.helpers import assert_json


async def test_versions(fetch):
    body = assert_json(await fetch("/_matrix/client/versions"))
    assert body == {"versions": ["v1.12"]}


async def test_login_and_capabilities(fetch, login):
    token = (await login())["access_token"]
    body = assert_json(await fetch("/_matrix/client/v3/capabilities", token=token))
    assert body["capabilities"]["m.change_password"] == {"enabled": False}
