"""The server as processes: bind the listeners (listen), run one server or N forked workers
(server, workers), and let requests in flight finish on a graceful stop (drain).

Nothing is imported here: the service's parts (homeserver.context) use `drain` without
loading the rest.
"""
