"""What Synapse asks its authentication service (`[delegation]`): the OpenID metadata and
token introspection; and the OAuth discovery paths clients try, answered "not here"."""

from __future__ import annotations

from homeserver.delegation.introspection import inactive, introspect
from homeserver.errors import M_MISSING_TOKEN, M_UNKNOWN_TOKEN, MatrixError, invalid_param, missing_param, unrecognized
from homeserver.handlers.base import BaseHandler
from homeserver.handlers.body import MAX_FORM_FIELDS, BodyHandler, FormError
from homeserver.oauth.metadata import server_metadata


class OpenIdConfigurationHandler(BaseHandler):
    """GET /.well-known/openid-configuration: what Synapse needs (issuer, account page), the whole
    OAuth metadata with `[oauth]` on; 404 with neither delegation nor OAuth."""

    def get(self) -> None:
        base = self.hs.config.get("server", "base_url").rstrip("/")
        if self.hs.oauth is not None:
            self.write_json(server_metadata(base, introspection=self.hs.delegation is not None))
            return
        if self.hs.delegation is None:
            raise unrecognized()
        self.write_json(
            {
                "issuer": base + "/",
                "account_management_uri": base + "/account/",
                "introspection_endpoint": base + "/oauth2/introspect",
            }
        )


class AuthorizationServerHandler(BaseHandler):
    """GET /.well-known/oauth-authorization-server (RFC 8414's own path, which strict OAuth
    clients such as oauth4webapi read): the metadata with `[oauth]` on, else 404."""

    def get(self) -> None:
        if self.hs.oauth is None:
            raise unrecognized()
        base = self.hs.config.get("server", "base_url")
        self.write_json(server_metadata(base, introspection=self.hs.delegation is not None))


class IntrospectHandler(BodyHandler):
    """POST /oauth2/introspect (RFC 7662, form `token=...`), for Synapse with the shared secret."""

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


class AuthMetadataHandler(BaseHandler):
    """GET /_matrix/client/v1/auth_metadata (and MSC2965's): the OAuth 2.0 server metadata with
    `[oauth]` on; else 404 M_UNRECOGNIZED, so clients (Element X, Element Web) log in with
    m.login.password."""

    def initialize(self, unstable: bool = False) -> None:
        super().initialize()
        self.unstable = unstable

    def get(self) -> None:
        if self.hs.oauth is None:
            raise unrecognized()
        base = self.hs.config.get("server", "base_url")
        self.write_json(server_metadata(base, introspection=False, unstable=self.unstable))


ROUTES = [
    (r"/\.well-known/openid-configuration", OpenIdConfigurationHandler),
    (r"/\.well-known/oauth-authorization-server", AuthorizationServerHandler),
    (r"/oauth2/introspect", IntrospectHandler),
    (r"/_matrix/client/v1/auth_metadata", AuthMetadataHandler),
    (r"/_matrix/client/unstable/org\.matrix\.msc2965/auth_metadata", AuthMetadataHandler, {"unstable": True}),
]
