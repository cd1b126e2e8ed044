"""Discovery: both well-known documents, the support page and the versions list."""

from __future__ import annotations

import html

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
        support = self.hs.config.section("support")
        email = html.escape(support["email_address"])
        mxid = html.escape(support["matrix_id"])
        role = html.escape(support["role"])
        server = html.escape(self.hs.server_name)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Support for {server}</title></head><body>"
            f"<h1>Support for {server}</h1><ul>"
            f"<li>Role: {role}</li>"
            f"<li>E-mail: <a href=\"mailto:{email}\">{email}</a></li>"
            f"<li>Matrix: <a href=\"https://matrix.to/#/{mxid}\">{mxid}</a></li>"
            "</ul></body></html>\n"
        )


ROUTES = [
    (r"/\.well-known/matrix/client", WellKnownClientHandler),
    (r"/\.well-known/matrix/support", WellKnownSupportHandler),
    (r"/support\.html", SupportPageHandler),
    (r"/_matrix/client/versions", VersionsHandler),
]
