"""The OAuth 2.0 server metadata (RFC 8414) at every path clients and Synapse read it, as
serialised once (homeserver.documents); with `[oauth]` off, "not here" (404 M_UNRECOGNIZED),
so clients log in with m.login.password."""

from __future__ import annotations

from homeserver.errors import unrecognized
from homeserver.handlers.base import BaseHandler


class OpenIdConfigurationHandler(BaseHandler):
    """GET /.well-known/openid-configuration: the whole OAuth metadata with `[oauth]` on (with the
    introspection endpoint under delegation); under delegation alone what Synapse needs
    (issuer, account page, introspection); 404 with neither."""

    def get(self) -> None:
        document = self.hs.documents.openid_configuration
        if document is None:
            raise unrecognized()
        self.finish(document)


class AuthorizationServerHandler(BaseHandler):
    """GET /.well-known/oauth-authorization-server (RFC 8414's own path, which strict OAuth
    clients such as oauth4webapi read): the metadata with `[oauth]` on, else 404."""

    def get(self) -> None:
        document = self.hs.documents.server_metadata
        if document is None:
            raise unrecognized()
        self.finish(document)


class AuthMetadataHandler(BaseHandler):
    """GET /_matrix/client/v1/auth_metadata (and MSC2965's, with the unstable account action
    names): the OAuth 2.0 server metadata with `[oauth]` on; else 404 M_UNRECOGNIZED, so
    clients (Element X, Element Web) log in with m.login.password."""

    def initialize(self, unstable: bool = False) -> None:
        super().initialize()
        self.unstable = unstable

    def get(self) -> None:
        documents = self.hs.documents
        document = documents.auth_metadata_unstable if self.unstable else documents.auth_metadata
        if document is None:
            raise unrecognized()
        self.finish(document)


ROUTES = [
    (r"/\.well-known/openid-configuration", OpenIdConfigurationHandler),
    (r"/\.well-known/oauth-authorization-server", AuthorizationServerHandler),
    (r"/_matrix/client/v1/auth_metadata", AuthMetadataHandler),
    (r"/_matrix/client/unstable/org\.matrix\.msc2965/auth_metadata", AuthMetadataHandler, {"unstable": True}),
]
