"""`migrate-synapse check`: what would block or surprise a move of a running Synapse here.

`check()` reads Synapse's config and database (backends/synapse) and this server's config
and user store, writes nothing anywhere, and returns findings: one line each, `error: ...`
(the move cannot go ahead: the CLI exits 1) or `warning: ...`, then one summary line.

What MAS's `syn2mas check` tests (crates/syn2mas/src/synapse_reader/checks.rs), and
what becomes of each here:

- GuestsEnabled (allow_guest_access): error here too; GuestsInDatabase: warning (not moved).
- ServerNameMismatch (matrix.homeserver): error against `[server] server_name`.
- MissingPasswordScheme / PasswordSchemeNotBcrypt / PasswordSchemeWrongPepper: MAS must be
  configured to verify Synapse's hashes; here Synapse's scheme is built in
  (homeserver/synapse_passwords.py), so the only thing to say is that a pepper is set and
  must be kept (a warning), and which hashes cost more than ours.
- ExternalAuthSystem (CAS, SAML2, JWT; password_config.localdb_enabled false with a
  "non-standard password provider plugin") and UpstreamOidcProvider: warnings, each with
  the users linked to it, as single sign-on is not carried; matrix-synapse-ldap3 is named
  on its own, being the case this move exists for.
- SynapseMissingOAuthProvider (links to a provider the config lacks) and
  ExistingOAuthDelegated (links from an earlier MAS): warnings; links are not carried.
- MasMissingOAuthProvider: does not apply (this server has no upstream providers).
- DisableRegistrationAfterMigration: warning. ShouldPortRegistrationCaptcha: part of it.
- DisableUserConsentAfterMigration / ShouldPortUserConsentAsTerms, ThreepidChangesEnabled
  and LoginViaExistingSessionEnabled (errors for MAS): one warning naming every setting
  Synapse refuses to start with under delegation, lifetimes included.
- NonEmailThreepidsInDatabase: warning (phone numbers are not carried).

Beyond syn2mas: the database must be readable (error); password login off or local
passwords off (the hashes would start working here); the user store against Synapse's
users (an LDAP directory that lacks some, a file/Redis store that already has some, users
matching only by case, users without a hash); tokens not carried (expired, impersonation,
no device, users not moved) with counts; users deactivated at Synapse who are still in
the store (under delegation Synapse does not check deactivation for a token, so this server
alone keeps them out); application-service users; unapproved users;
Synapse admins this server would not make admins (the store has them unmarked, and
`[delegation] admins` lacks them); `[delegation]` off; a SQLite Synapse
that seems to be running.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.base import StoreDataError, StoreUnavailable, UserBackend
from backends.synapse.config import SynapseConfig, SynapseConfigError, load_synapse_config
from backends.synapse.database import SynapseDatabase, SynapseReadError, wal_pending
from homeserver.config import Config
from homeserver.migration import findings
from homeserver.migration.survey import Survey, Surveyor
from homeserver.users import Users


@dataclass(frozen=True)
class Finding:
    level: str  # "error" or "warning"
    text: str

    def __str__(self) -> str:
        return f"{self.level}: {self.text}"


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)
    synapse: SynapseConfig | None = None
    survey: Survey | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        """No error: the CLI exits 0."""
        return not self.errors

    def lines(self) -> list[str]:
        """The errors, the warnings, then the summary line."""
        return [str(f) for f in self.errors + self.warnings] + [self.summary()]

    def summary(self) -> str:
        errors, warnings = len(self.errors), len(self.warnings)
        text = f"summary: {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
        if self.survey is None:
            return text + "; Synapse's database was not read"
        return text + "; " + findings.totals(self.survey)


async def check(
    synapse_config: str | Sequence[str], config: Config, backend: UserBackend, *, now_ms: int | None = None
) -> CheckReport:
    """Check a move of the Synapse whose config is at `synapse_config` (a file, a folder, or
    several) to this server (`config`, and its started user `backend`). Reads only."""
    report = CheckReport()

    def add(level: str, text: str) -> None:
        report.findings.append(Finding(level, text))

    try:
        synapse = report.synapse = load_synapse_config(synapse_config)
    except SynapseConfigError as exc:
        add("error", f"Synapse's config cannot be read: {exc}")
        return report
    for level, text in findings.from_config(synapse, config):
        add(level, text)
    if synapse.database is None:
        add("error", f"Synapse's database cannot be read: {synapse.database_problem}")
        return report
    if synapse.database.engine == "sqlite3" and wal_pending(synapse.database.sqlite_path):
        add("warning", f"Synapse seems to be running ({synapse.database.sqlite_path}-wal holds writes not yet in "
                       "the database): stop it before `migrate-synapse run`")
    directory = config.get("backend", "type") == "ldap"
    surveyor = Surveyor(Users(backend), directory=directory, now_ms=now_ms or int(time.time() * 1000),
                        admins=frozenset(config.get("delegation", "admins")))
    try:
        with SynapseDatabase.open(synapse.database) as database:
            report.survey = await surveyor.run(database, synapse.server_name)
    except SynapseReadError as exc:
        add("error", f"Synapse's database cannot be read: {exc}")
        return report
    except (StoreUnavailable, StoreDataError) as exc:
        add("error", f"this server's user store cannot be read: {exc}")
        return report
    for level, text in findings.from_survey(report.survey, synapse, config, directory=directory):
        add(level, text)
    return report
