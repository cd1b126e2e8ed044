"""matrix-nio's legacy login calls against a server, with a login token a browser sign-in
brought back (MSC3824): `login_info()` (the flow types), `login(token=...)` once, then again.
Run by the matrix-nio virtualenv's Python (tests/support/nio_e2e.py); prints one JSON line.
Usage: python token_login.py <base url> <login token>
"""

from __future__ import annotations

import asyncio
import json
import sys

from nio import AsyncClient, LoginInfoResponse, LoginResponse


async def main(base: str, token: str) -> dict[str, object]:
    out: dict[str, object] = {}
    client = AsyncClient(base, "")
    again = AsyncClient(base, "")
    try:
        info = await client.login_info()
        out["flows"] = info.flows if isinstance(info, LoginInfoResponse) else repr(info)
        answer = await client.login(token=token, device_name="nio through the browser")
        if isinstance(answer, LoginResponse):
            out["login"] = {"user_id": answer.user_id, "device_id": answer.device_id}
            me = await client.whoami()
            out["whoami"] = [getattr(me, "user_id", None), getattr(me, "device_id", None)]
            devices = await client.devices()
            out["devices"] = [[d.id, d.display_name] for d in getattr(devices, "devices", [])]
        else:
            out["login"] = repr(answer)
        second = await again.login(token=token)
        out["again"] = [getattr(second, "status_code", None), getattr(second, "message", None)]
    finally:
        await client.close()
        await again.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
