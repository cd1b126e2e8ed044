"""Reading a Synapse that is to move here: its `homeserver.yaml` (config.py) and the tables of
its database that hold users, devices and tokens (database.py, rows.py), SQLite or PostgreSQL.

Read only, never written. Like every store adapter, nothing here imports `homeserver`.
"""
