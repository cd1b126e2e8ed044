"""Public profiles: GET /profile/{userId} and its displayname / avatar_url parts."""

from __future__ import annotations

from homeserver.errors import MatrixError
from homeserver.handlers.base import BaseHandler
from homeserver.profile import profile_body, profile_name

# A Matrix user ID is at most 255 bytes; longer text names nobody, so skip the store.
MAX_USER_ID = 255


class ProfileHandler(BaseHandler):
    async def fetch_profile(self, user_id: str) -> dict[str, str]:
        user = None
        if len(user_id.encode("utf-8", "surrogatepass")) <= MAX_USER_ID:
            user = await self.hs.backend.get_user(profile_name(user_id))
        if user is None:
            raise MatrixError(404, "M_NOT_FOUND", "Profile not found")
        return profile_body(user)

    async def get(self, user_id: str) -> None:
        self.write_json(await self.fetch_profile(user_id))


class ProfileFieldHandler(ProfileHandler):
    """One field of the profile, as clients read it with GET /profile/{userId}/{field}."""

    async def get(self, user_id: str, field: str) -> None:  # type: ignore[override]
        body = await self.fetch_profile(user_id)
        if field not in body:
            raise MatrixError(404, "M_NOT_FOUND", f"Profile has no {field}")
        self.write_json({field: body[field]})


ROUTES = [
    (r"/_matrix/client/v3/profile/([^/]+)", ProfileHandler),
    (r"/_matrix/client/v3/profile/([^/]+)/(displayname|avatar_url)", ProfileFieldHandler),
]
