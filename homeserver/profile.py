"""The public profile: the specification's rules 1-3."""

from __future__ import annotations

from backends.base import User
from homeserver.errors import M_NOT_FOUND, MatrixError
from homeserver.names import MAX_USER_ID_BYTES
from homeserver.users import Users


def profile_name(user_id: str) -> str:
    """Rule 1: drop the first character, keep everything before the first ':'."""
    return user_id[1:].partition(":")[0]


def profile_body(user: User) -> dict[str, str]:
    """Rule 3: display name followed directly by ident (or ident alone); absent keys omitted."""
    body = {"displayname": (user.display_name or "") + user.ident}
    if user.avatar_url:
        body["avatar_url"] = user.avatar_url
    return body


async def get_profile(users: Users, user_id: str) -> dict[str, str]:
    """Rules 1-3: the profile of the user the ID names, or 404 M_NOT_FOUND."""
    user = None
    # A user ID over 255 bytes names nobody, whatever its first part: skip the store.
    if len(user_id.encode("utf-8", "surrogatepass")) <= MAX_USER_ID_BYTES:
        user = await users.get(profile_name(user_id))  # rule 2
    if user is None:
        raise MatrixError(404, M_NOT_FOUND, "Profile not found")
    return profile_body(user)


async def get_profile_field(users: Users, user_id: str, field: str) -> dict[str, str]:
    """One field of the profile, as clients read it with GET /profile/{userId}/{field}."""
    body = await get_profile(users, user_id)
    if field not in body:
        raise MatrixError(404, M_NOT_FOUND, f"Profile has no {field}")
    return {field: body[field]}
