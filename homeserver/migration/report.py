"""The words of `migrate-synapse run`: what a run carried (or, dry, would carry), one line each,
then the summary. No line holds a secret (no token, hash or pepper)."""

from __future__ import annotations

from homeserver.config import Config
from homeserver.migration.importer import ImportCounts


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else (plural or word + 's')}"


def count_lines(counts: ImportCounts, config: Config, *, dry_run: bool, seconds: float) -> list[str]:
    kind = config.get("backend", "type")
    store = "the LDAP directory" if kind == "ldap" else f"the {kind} user store"
    verb = "would be" if dry_run else ""
    where = [f"{counts.added:,} added to {store}"] if kind != "ldap" else []
    if counts.kept:
        where.append(f"{counts.kept:,} already there, keeping their records")
    if counts.directory:
        where.append(f"{counts.directory:,} found in the directory")
    lines = [f"users: {_n(counts.moved, 'user')} {verb + ' ' if verb else ''}moved"
             + (f" ({', '.join(where)})" if where else "") + f" of {counts.users:,} read"]
    if counts.deactivated:
        lines.append(f"deactivated at Synapse: {_n(counts.deactivated, 'user')} {verb or 'recorded'} "
                     f"{'recorded ' if verb else ''}here, refused at login (M_USER_DEACTIVATED)")
    if counts.not_moved.count:
        lines.append(f"not moved: {_n(counts.not_moved.count, 'user')} ({counts.not_moved})")
    lines.append(f"devices: {_n(counts.devices, 'device')} of the users moved, "
                 f"{counts.device_only:,} newly kept without a live token")
    carried = "would be carried" if dry_run else "carried"
    lines.append(f"access tokens: {counts.access:,} {carried} as sessions")
    lines.append(f"refresh tokens: {counts.refresh:,} {carried}"
                 + (f" ({counts.dropped_refresh:,} older ones on devices with a newer one left)"
                    if counts.dropped_refresh else ""))
    lines.append(f"carried by an earlier run already: {_n(counts.already, 'token or device', 'tokens or devices')}")
    if counts.emails_taken.count:
        lines.append(f"warning: {_n(counts.emails_taken.count, 'e-mail address', 'e-mail addresses')} held by "
                     f"another user here {'are' if counts.emails_taken.count != 1 else 'is'} left out of the new "
                     f"records: {counts.emails_taken}")
    if counts.locked_elsewhere.count:
        fix = "[backend.ldap] locked_filter" if kind == "ldap" else "run.py lock NAME"
        lines.append(f"warning: {_n(counts.locked_elsewhere.count, 'user')} locked at Synapse "
                     f"{'are' if counts.locked_elsewhere.count != 1 else 'is'} not locked in {store} "
                     f"({counts.locked_elsewhere}): lock them there ({fix})")
    if counts.admins_elsewhere.count:
        lines.append(f"warning: {_n(counts.admins_elsewhere.count, 'Synapse admin')} "
                     f"({counts.admins_elsewhere}) {'are' if counts.admins_elsewhere.count != 1 else 'is'} no admin "
                     "here: add them to [delegation] admins (or the store's admin mark) to keep them admins at Synapse")
    took = f"{seconds:.1f} s"
    lines.append(f"summary: dry run, nothing written ({took})" if dry_run else f"summary: done in {took}")
    return lines
