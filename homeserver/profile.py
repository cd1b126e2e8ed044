"""The public profile: the specification's rules 1-3."""

from __future__ import annotations

from backends.base import User


def profile_name(user_id: str) -> str:
    """Rule 1: drop the first character, keep everything before the first ':'."""
    return user_id[1:].partition(":")[0]


def profile_body(user: User) -> dict[str, str]:
    """Rule 3: display name followed directly by ident (or ident alone); absent keys omitted."""
    body = {"displayname": (user.display_name or "") + user.ident}
    if user.avatar_url:
        body["avatar_url"] = user.avatar_url
    return body
