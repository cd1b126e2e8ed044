"""The listening sockets, bound first: a taken port or a bad host is one line at start-up."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from tornado.netutil import bind_sockets

from homeserver.config import Config
from homeserver.errors import ConfigError


@dataclass
class Listeners:
    """The public sockets (shared by every worker) and each worker's own metrics sockets."""

    main: list[socket.socket]
    metrics: dict[int, list[socket.socket]] = field(default_factory=dict)

    def close(self) -> None:
        for sock in [*self.main, *(s for group in self.metrics.values() for s in group)]:
            sock.close()


def bind(port: int, host: str, section: str) -> list[socket.socket]:
    """Bind and listen on host:port; ConfigError naming `<section>.host` or `.port` otherwise."""
    where = f"{host}:{port}"
    if not 0 <= port <= 65535:  # getaddrinfo() would quietly take 65536 as 0: any free port
        raise ConfigError(f"{section}.port: {port} is not a port number (0 to 65535)")
    try:
        return bind_sockets(port, host)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{section}.host: cannot resolve {host!r} ({reason})") from None
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"{section}.host: {host!r} is not an address of this machine") from None
        if exc.errno == errno.EADDRINUSE:
            reason = "the address is already in use (is another server running?)"
        elif exc.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
        else:
            reason = exc.strerror or str(exc)
        raise ConfigError(f"{section}.port: cannot listen on {where}: {reason}") from None


def bind_listeners(config: Config) -> Listeners:
    """Bind the public port and, when `[metrics] port` is set, one metrics port per worker.

    Done before the store loads, before any log line and before any fork, so every
    listening problem stops start-up in the parent with one line, whatever the
    number of processes.
    """
    server = config.section("server")
    listeners = Listeners(bind(server["port"], server["host"], "server"))
    port = config.get("metrics", "port")
    if config.get("metrics", "enabled") and port:
        try:
            main = {s.getsockname()[1] for s in listeners.main}
            for worker in range(server["processes"]):
                if port + worker in main:
                    raise ConfigError(
                        f"metrics.port: {port + worker} is the main listener's port (server.port)"
                        + (f" for worker {worker}" if worker else "")
                        + "; choose another port, or 0 to serve /metrics on the main listener"
                    )
                listeners.metrics[worker] = bind(port + worker, config.get("metrics", "host"), "metrics")
        except ConfigError:
            listeners.close()
            raise
    return listeners
