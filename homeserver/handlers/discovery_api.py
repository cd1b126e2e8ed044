"""Discovery: both well-known documents, the support page and the versions list."""

from __future__ import annotations

from homeserver.handlers.base import BaseHandler


class WellKnownClientHandler(BaseHandler):
    def get(self) -> None:
        self.finish(self.hs.documents.well_known_client)


class WellKnownSupportHandler(BaseHandler):
    def get(self) -> None:
        self.finish(self.hs.documents.well_known_support)


class VersionsHandler(BaseHandler):
    def get(self) -> None:
        self.finish(self.hs.documents.versions)


class SupportPageHandler(BaseHandler):
    """A small human page listing the support contacts (the well-known's support_page)."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.hs.documents.support_page)


ROUTES = [
    (r"/\.well-known/matrix/client", WellKnownClientHandler),
    (r"/\.well-known/matrix/support", WellKnownSupportHandler),
    (r"/support\.html", SupportPageHandler),
    (r"/_matrix/client/versions", VersionsHandler),
]
