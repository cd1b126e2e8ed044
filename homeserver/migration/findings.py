"""The words of `migrate-synapse check`: each finding from Synapse's config, this server's
config and the survey of Synapse's database (homeserver/migration/check.py says which
of syn2mas's checks each one stands for). Each is (level, text); no text holds a secret."""

from __future__ import annotations

from backends.synapse.config import LDAP3_MODULES, SynapseConfig
from backends.synapse.rows import TokenFate
from homeserver.config import Config
from homeserver.errors import ConfigError
from homeserver.migration.survey import Survey
from homeserver.synapse_passwords import load_pepper

Found = list[tuple[str, str]]


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word if count == 1 else (plural or word + 's')}"


def _verb(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def from_config(synapse: SynapseConfig, config: Config) -> Found:
    found: Found = []
    ours = config.get("server", "server_name")
    directory = config.get("backend", "type") == "ldap"
    if synapse.allow_guest_access:
        found.append(("error", "guest access is on in Synapse (allow_guest_access): guests cannot move here; "
                               "turn it off and restart Synapse first"))
    if synapse.server_name != ours:
        found.append(("error", f"Synapse's server_name is {synapse.server_name!r} but this server's [server] "
                               f"server_name is {ours!r}: every user ID would change; set server_name = "
                               f"{synapse.server_name!r} here"))
    if synapse.delegated:
        found.append(("warning", "Synapse already hands its logins to an authentication service "
                                 "(matrix_authentication_service): sessions made there are not in Synapse's "
                                 "database and are not carried"))
    if not config.get("delegation", "enabled"):
        found.append(("warning", "[delegation] is off in this server's config: moved sessions keep clients signed "
                                 "in only once Synapse asks this server about its tokens ([delegation] enabled)"))
    sso = [f"OpenID Connect ({', '.join(p.idp_id for p in synapse.oidc_providers)})"] if synapse.oidc_providers else []
    sso += [name for name, on in (("SAML", synapse.saml2), ("CAS", synapse.cas), ("JWT", synapse.jwt)) if on]
    for kind in sso:
        found.append(("warning", f"{kind} login is configured in Synapse: single sign-on is not carried; its users "
                                 "log in here with a password in this server's user store, and Synapse refuses "
                                 "to start with it under delegation (remove it at the switch)"))
    if synapse.enable_registration:
        extra = [k for k, on in (("a captcha", synapse.registration_captcha),
                                 ("registration tokens", synapse.registration_requires_token)) if on]
        found.append(("warning", "registration is open in Synapse (enable_registration)"
                                 + (f", with {' and '.join(extra)}" if extra else "")
                                 + ": Synapse refuses it under delegation; after the switch accounts are made in "
                                 "this server's user store (add-user, or the directory)"))
    if synapse.pepper and not directory:
        missing = "" if _our_pepper(config) == synapse.pepper else (
            "; this server's [auth] synapse_pepper (or synapse_pepper_file) does not hold it yet: until it does, "
            "no moved password works")
        found.append(("warning", "Synapse's passwords carry a pepper (password_config.pepper): the moved password "
                                 "hashes are checked with it, so it moves here too and must stay secret and unchanged"
                                 + missing))
    if synapse.ldap3 and not directory:
        found.append(("warning", "matrix-synapse-ldap3 is configured in Synapse, but this server's user store is "
                                 f"{config.get('backend', 'type')!r}: directory users can log in here only with "
                                 '[backend] type = "ldap" (or a password in this store)'))
    others = [m for m in synapse.password_providers if m not in LDAP3_MODULES]
    if others:
        found.append(("warning", f"Synapse checks passwords through {', '.join(others)} (password_providers): "
                                 "passwords only they know are not carried"))
    refused = [key for key, on in (
        ("user_consent", synapse.user_consent),
        ("login_via_existing_session", synapse.login_via_existing_session),
        ("enable_3pid_changes", synapse.enable_3pid_changes is True),
    ) if on] + list(synapse.lifetimes)
    if refused:
        found.append(("warning", f"Synapse's config sets {', '.join(refused)}, which it refuses to start with under "
                                 "delegation: remove them at the switch"))
    return found


def _our_pepper(config: Config) -> str:
    """This server's `[auth] synapse_pepper` (or its file's); "" when it cannot be read."""
    try:
        return load_pepper(config)
    except ConfigError:
        return ""


def from_survey(survey: Survey, synapse: SynapseConfig, config: Config, *, directory: bool) -> Found:
    found: Found = []
    store = f"this server's {config.get('backend', 'type')} user store"
    if survey.case_only.count:
        fix = ("[backend.ldap] lowercase_user_ids = true" if directory else "the records renamed")
        found.append(("warning", f"{_plural(survey.case_only.count, 'Synapse user')} "
                                 f"{_verb(survey.case_only.count, 'matches', 'match')} {store} only by case "
                                 f"({survey.case_only}): they would log in here as other Matrix users and are not "
                                 f"moved; {fix} would match them"))
    if survey.returning.count:
        found.append(("warning", f"{_plural(survey.returning.count, 'user')} deactivated at Synapse "
                                 f"{_verb(survey.returning.count, 'is', 'are')} in {store} ({survey.returning}): "
                                 "Synapse does not check deactivation for a token it introspects, so only this "
                                 "server keeps them out; the move records them deactivated here, or remove them "
                                 "from the store"))
    if directory:
        if survey.missing.count:
            found.append(("warning", f"{_plural(survey.missing.count, 'Synapse user')} "
                                     f"{_verb(survey.missing.count, 'is', 'are')} not in the LDAP directory "
                                     f"({survey.missing}): they cannot log in here and their sessions are not carried"))
        if survey.directory_hashes:
            found.append(("warning", f"{_plural(survey.directory_hashes, 'user')} in the directory also "
                                     f"{_verb(survey.directory_hashes, 'has', 'have')} a "
                                     "Synapse password hash: with an LDAP store they log in with their directory "
                                     "password; Synapse's hashes are not imported"))
    else:
        if survey.ours.count:
            found.append(("warning", f"{_plural(survey.ours.count, 'Synapse user')} "
                                     f"{_verb(survey.ours.count, 'is', 'are')} already in {store} and "
                                     f"{_verb(survey.ours.count, 'keeps', 'keep')} "
                                     f"its record, password included: {survey.ours}"))
        if survey.no_hash.count:
            found.append(("warning", f"{_plural(survey.no_hash.count, 'Synapse user')} "
                                     f"{_verb(survey.no_hash.count, 'has', 'have')} no password hash (made by "
                                     f"single sign-on or a module: {survey.no_hash}): they are not moved and their "
                                     "sessions are not carried until add-user gives them a password here"))
        if survey.bad_hash.count:
            found.append(("warning", f"{_plural(survey.bad_hash.count, 'Synapse user')} "
                                     f"{_verb(survey.bad_hash.count, 'has', 'have')} a password hash that is not "
                                     f"bcrypt ({survey.bad_hash}): they are not moved and their sessions are not "
                                     "carried until add-user gives them a password here"))
        found += _passwords(survey, synapse, config)
        if survey.several_emails:
            found.append(("warning", f"{_plural(survey.several_emails, 'user')} "
                                     f"{_verb(survey.several_emails, 'has', 'have')} several e-mail addresses at "
                                     "Synapse: the record here keeps one (the first added)"))
    found += _tokens(survey)
    found += _leftovers(survey, synapse)
    if survey.unmarked_admins.count:
        mark = "admin_filter" if directory else '"admin": true in the record'
        found.append(("warning", f"{_plural(survey.unmarked_admins.count, 'Synapse admin')} "
                                 f"({survey.unmarked_admins}) {_verb(survey.unmarked_admins.count, 'is', 'are')} "
                                 f"in {store} without its admin mark ({mark}) and not in [delegation] admins: "
                                 "they are Synapse admins no more after the switch"))
    return found


def _passwords(survey: Survey, synapse: SynapseConfig, config: Config) -> Found:
    found: Found = []
    hashes = _plural(survey.hashes, "password hash", "password hashes")
    if not survey.hashes:
        return found
    if synapse.password_enabled is not True:
        setting = "only_for_reauth" if synapse.password_enabled == "only_for_reauth" else "false"
        found.append(("warning", f"Synapse's password login is off (password_config.enabled: {setting}): its {hashes} "
                                 "would start letting their users log in here"))
    elif not synapse.password_localdb:
        found.append(("warning", "Synapse checks passwords only through its modules (password_config.localdb_enabled: "
                                 f"false): its {hashes} are not in use there and would start working here"))
    rounds = config.get("auth", "bcrypt_rounds")
    dearer = sum(count for cost, count in survey.hash_costs.items() if cost > rounds)
    if dearer:
        found.append(("warning", f"{_plural(dearer, 'moved password hash', 'moved password hashes')} "
                                 f"{_verb(dearer, 'costs', 'cost')} more than "
                                 f"this server's [auth] bcrypt_rounds ({rounds}; theirs up to "
                                 f"{max(survey.hash_costs)}): their logins take longer until their password is "
                                 "set again"))
    return found


def _tokens(survey: Survey) -> Found:
    found: Found = []
    for kind, counts, left, extra in (
        ("access token", survey.access, survey.access_left, [("impersonation", "of admins acting as users")]),
        ("refresh token", survey.refresh, survey.refresh_left, [("spent", "already used")]),
    ):
        parts = [(counts[TokenFate.EXPIRED], "expired")]
        parts += [(counts[TokenFate(name)], words) for name, words in extra]
        parts += [(counts[TokenFate.NO_DEVICE], "without a device"), (left, "of users not moved")]
        total = sum(count for count, _ in parts)
        if total:
            listed = ", ".join(f"{count} {words}" for count, words in parts if count)
            found.append(("warning", f"{_plural(total, kind)} will not be carried: {listed}"))
    return found


def _leftovers(survey: Survey, synapse: SynapseConfig) -> Found:
    found: Found = []
    if survey.by_digest:
        count = survey.by_digest
        found.append(("warning", f"{_plural(count, 'live access token')} {_verb(count, 'does', 'do')} not name "
                                 f"{_verb(count, 'its', 'their')} user (an older Synapse's macaroons): carried, each "
                                 "found by its digest (one lookup more at its first request after each of Synapse's "
                                 "two-minute caches)"))
    if survey.appservices:
        services = ", ".join(f"{name}: {count}" for name, count in sorted(survey.appservices.items()))
        found.append(("warning", f"{_plural(sum(survey.appservices.values()), 'user')} "
                                 f"{_verb(sum(survey.appservices.values()), 'belongs', 'belong')} to application "
                                 f"services ({services}): Synapse keeps authenticating them with the services' "
                                 "tokens; they are not moved"))
    if survey.guests:
        found.append(("warning", f"{_plural(survey.guests, 'guest account')} in Synapse's database: not moved, "
                                 "their tokens stop working"))
    if survey.unapproved.count:
        found.append(("warning", f"{_plural(survey.unapproved.count, 'user')} still "
                                 f"{_verb(survey.unapproved.count, 'waits', 'wait')} for an admin's approval "
                                 f"at Synapse ({survey.unapproved}): not moved"))
    if survey.phone_numbers:
        found.append(("warning", f"{_plural(survey.phone_numbers, 'phone number')} (user_threepids, not e-mail) "
                                 f"{_verb(survey.phone_numbers, 'is', 'are')} not carried"))
    configured = {p.idp_id for p in synapse.oidc_providers}
    links = {name: count for name, count in survey.external_ids.items() if name != "oauth-delegated"}
    if links:
        listed = ", ".join(f"{name}: {count}" + ("" if name in configured or not name.startswith("oidc")
                                                 else " (no longer configured)") for name, count in links.items())
        found.append(("warning", f"{_plural(sum(links.values()), 'single sign-on link')} ({listed}) "
                                 f"{_verb(sum(links.values()), 'is', 'are')} not carried: "
                                 "those users log in here with a password or the directory"))
    if survey.external_ids.get("oauth-delegated"):
        found.append(("warning", f"{_plural(survey.external_ids['oauth-delegated'], 'user')} "
                                 f"{_verb(survey.external_ids['oauth-delegated'], 'carries', 'carry')} links of an "
                                 "earlier Matrix Authentication Service (auth_provider oauth-delegated): not carried"))
    if survey.orphans:
        found.append(("warning", f"{_plural(survey.orphans, 'row')} of devices, tokens, addresses or profiles "
                                 f"{_verb(survey.orphans, 'belongs', 'belong')} to user IDs Synapse's users table "
                                 "lacks: ignored"))
    return found


def totals(survey: Survey) -> str:
    states = [f"{survey.admins.count} admin{'s' * (survey.admins.count != 1)}"] if survey.admins.count else []
    states += [f"{count} {word}" for count, word in ((survey.locked, "locked"), (survey.deactivated, "deactivated"))
               if count]
    live_access = survey.access[TokenFate.LIVE]
    live_refresh = survey.refresh[TokenFate.LIVE] + survey.refresh[TokenFate.SUPERSEDED]
    return (f"{_plural(survey.users, 'user')}" + (f" ({', '.join(states)})" if states else "")
            + f", {_plural(survey.devices, 'device')}, {_plural(sum(survey.access.values()), 'access token')} "
            f"({live_access} live), {_plural(sum(survey.refresh.values()), 'refresh token')} ({live_refresh} live)")
