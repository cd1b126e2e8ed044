"""The framework's floor: a bare Tornado handler serving the same /versions bytes."""

from __future__ import annotations

import argparse
import asyncio
import sys

import tornado.web

# The exact bytes the homeserver answers on /_matrix/client/versions.
VERSIONS = b'{"versions":["v1.12"]}'


class VersionsHandler(tornado.web.RequestHandler):
    def compute_etag(self) -> None:
        # The homeserver skips ETags too; hashing the body would lower the floor.
        return None

    def get(self) -> None:
        self.write(VERSIONS)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # Tornado's defaults otherwise: its access log stays off (no logging is configured).
    app = tornado.web.Application([(r"/_matrix/client/versions", VersionsHandler)])
    app.listen(args.port, "127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    # --uvloop: the same floor on uvloop, for context (the targets use plain asyncio).
    if "--uvloop" in sys.argv:
        import uvloop

        sys.argv.remove("--uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())
