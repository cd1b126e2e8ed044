"""The server as processes: bind the listeners (listen), run one server or N forked workers
(server, workers), and let requests in flight (homeserver.inflight) finish on a graceful stop.

Nothing below imports this package: it runs the parts homeserver.context builds.
"""
