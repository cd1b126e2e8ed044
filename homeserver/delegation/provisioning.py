"""What Synapse is told of a user (`provision_user`): the profile as the profile rules make it
(display name then ident, the avatar), the e-mail addresses and the lock; and the digest of
it the session store keeps (DelegationState), by which a login and the directory sweep alike
tell an unchanged user, who costs no call to Synapse."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from backends.base import User, canonical_email
from homeserver.profile import profile_body

# Synapse's bounds on profile fields (synapse.handlers.profile): longer ones are refused.
MAX_DISPLAY_NAME = 256
MAX_AVATAR_URL = 1000


def profile_for_synapse(user: User) -> tuple[str | None, str | None, list[str]]:
    """Display name (the profile rule: display name then ident), avatar URL and e-mail
    addresses as Synapse is given them; a value Synapse would refuse is left out."""
    body = profile_body(user)
    display = body["displayname"][:MAX_DISPLAY_NAME] or None
    avatar = body.get("avatar_url")
    if avatar is not None and len(avatar) > MAX_AVATAR_URL:
        avatar = None
    email = canonical_email(user.email) if user.email else None
    return display, avatar, [email] if email else []


def profile_digest(user: User) -> str:
    """The digest of what `provision_user` tells Synapse of the user: the profile and the lock."""
    told = [*profile_for_synapse(user), user.locked]
    return hashlib.sha256(json.dumps(told).encode("utf-8", "surrogatepass")).hexdigest()


def only_the_lock_changed(told: str | None, user: User) -> bool:
    """Whether what Synapse was last told (`told`, a digest) differs from the user only in the lock."""
    return told == profile_digest(dataclasses.replace(user, locked=not user.locked))


def profile_matches(found: dict[str, object], user: User) -> bool:
    """Whether Synapse's profile of the user (`query_user`) is the one the store gives.

    Synapse keeps a display name stripped of outer white space, and none for "".
    """
    display, avatar, _ = profile_for_synapse(user)
    theirs_display = found.get("display_name") or None
    theirs_avatar = found.get("avatar_url") or None
    return theirs_display == ((display or "").strip() or None) and theirs_avatar == (avatar or None)
