"""Public profiles: GET /profile/{userId} and its displayname / avatar_url parts."""

from __future__ import annotations

from homeserver.handlers.base import BaseHandler
from homeserver.profile import get_profile, get_profile_field


class ProfileHandler(BaseHandler):
    async def get(self, user_id: str) -> None:
        self.write_json(await get_profile(self.hs.users, user_id))


class ProfileFieldHandler(BaseHandler):
    """One field of the profile, as clients read it with GET /profile/{userId}/{field}."""

    async def get(self, user_id: str, field: str) -> None:
        self.write_json(await get_profile_field(self.hs.users, user_id, field))


ROUTES = [
    (r"/_matrix/client/v3/profile/([^/]+)", ProfileHandler),
    (r"/_matrix/client/v3/profile/([^/]+)/(displayname|avatar_url)", ProfileFieldHandler),
]
