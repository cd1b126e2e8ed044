"""Token introspection (RFC 7662) for Synapse (`[delegation]`): the protocol of Element's
Matrix Authentication Service, with the secret shared with Synapse."""

from __future__ import annotations

from homeserver.delegation.introspection import inactive, introspect
from homeserver.errors import M_MISSING_TOKEN, M_UNKNOWN_TOKEN, MatrixError, invalid_param, missing_param, unrecognized
from homeserver.handlers.body import MAX_FORM_FIELDS, BodyHandler, FormError
from homeserver.oauth.metadata import INTROSPECTION_PATH


class IntrospectHandler(BodyHandler):
    """POST /oauth2/introspect (form `token=...`), for Synapse with the shared secret."""

    async def post(self) -> None:
        delegation = self.hs.delegation
        if delegation is None:
            raise unrecognized()
        authorization = self.request.headers.get("Authorization")
        if not delegation.secret_matches(authorization):
            errcode = M_UNKNOWN_TOKEN if authorization else M_MISSING_TOKEN
            message = "Introspection needs the secret shared with Synapse"
            raise MatrixError(401, errcode, message, headers={"WWW-Authenticate": "Bearer"})
        try:
            form = self.form()
        except FormError as exc:
            if exc.undecodable:
                self.write_json(inactive())  # no token of ours is anything but ASCII
                return
            raise invalid_param("body", f"a form of at most {MAX_FORM_FIELDS} fields") from None
        tokens = form.get("token")
        if not tokens or not tokens[0]:
            raise missing_param("token")
        if len(tokens) > 1:
            raise invalid_param("token", "given once")
        hint = form.get("token_type_hint", [""])[0]
        if hint == "refresh_token":
            self.write_json(inactive())  # a refresh token is never an access token
            return
        self.write_json(await introspect(self.hs.auth, tokens[0], delegation.admins))


ROUTES = [
    (INTROSPECTION_PATH, IntrospectHandler),
]
