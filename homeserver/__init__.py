"""A small Matrix-compatible homeserver: discovery, login and profiles over a read-only user store."""

__version__ = "0.1.0"
