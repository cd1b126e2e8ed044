"""Filters on a user's own entry, evaluated on the entry the lookup fetched: `[backend.ldap]
locked_filter` (locked accounts), `admin_filter` (administrators) and `mfa_required_filter`
(who must have a second factor).

The lock (and the other two) comes with the user lookup every authenticated request already makes: the search
asks for the attributes the filter names, and the filter is evaluated here, on those
values, so no second search (and no second round trip) is made. The defaults fit the
directories people run:

- Active Directory: a disabled account, `userAccountControl` with bit 2 (ACCOUNTDISABLE) set,
  `(userAccountControl:1.2.840.113556.1.4.803:=2)`; with `locked_out_is_locked`, also an
  account locked out by failed logons, `(lockoutTime>=1)`;
- otherwise: OpenLDAP's ppolicy lock `(pwdAccountLockedTime=*)` and 389-DS / FreeIPA's
  `(nsAccountLock=TRUE)`.

Matching follows the directories' usual rules closely enough for these attributes:
integers compare as numbers, other values without regard to case or surrounding spaces,
distinguished names (a group in `memberOf`) also without regard to the spaces around `,`
and `=`;
`>=`/`<=` compare numbers, else text (generalized times compare right as text);
presence, substrings, `!`, `&`, `|`; the bitwise matching rules of Active Directory
(1.2.840.113556.1.4.803 AND, .804 OR; OpenLDAP calls them integerBitAndMatch and
integerBitOrMatch). Anything else is refused at start-up, naming the filter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ldap3.core.exceptions import LDAPInvalidDnError, LDAPInvalidFilterError
from ldap3.operation.search import (
    AND,
    MATCH_APPROX,
    MATCH_EQUAL,
    MATCH_EXTENSIBLE,
    MATCH_GREATER_OR_EQUAL,
    MATCH_LESS_OR_EQUAL,
    MATCH_PRESENT,
    MATCH_SUBSTRING,
    NOT,
    OR,
    ROOT,
    FilterNode,
    parse_filter,
)
from ldap3.utils.dn import parse_dn

from backends.base import ConfigError

AD_DISABLED = "(userAccountControl:1.2.840.113556.1.4.803:=2)"
AD_LOCKED_OUT = "(lockoutTime>=1)"
OPENLDAP_AND_389 = "(|(pwdAccountLockedTime=*)(nsAccountLock=TRUE))"

BIT_AND = {"1.2.840.113556.1.4.803", "integerbitandmatch"}
BIT_OR = {"1.2.840.113556.1.4.804", "integerbitormatch"}
_ESCAPE = re.compile(rb"\\([0-9a-fA-F]{2})")
_INTEGER = re.compile(r"[+-]?[0-9]+")

Values = dict[str, list[bytes]]  # attribute name (lower case) -> raw values


def default_filter(active_directory: bool, locked_out_is_locked: bool) -> str:
    if active_directory:
        return f"(|{AD_DISABLED}{AD_LOCKED_OUT})" if locked_out_is_locked else AD_DISABLED
    return OPENLDAP_AND_389


def _unescape(value: bytes) -> str:
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), value).decode("utf-8", "replace")


def _normal(value: str) -> str:
    return " ".join(value.split()).casefold()


# Text in which a DN's parse may change more than spaces and case (escapes, quotes, the old
# `;` separator, a value in hex): compared by its parse alone.
_DN_SPECIAL = frozenset('\\";#')


def _loose(value: str) -> str:
    """A DN's text without any space, case-folded: two DNs without `_DN_SPECIAL` whose loose
    texts differ are different DNs (their parses differ in more than spaces and case)."""
    return "".join(value.split()).casefold()


def _normal_dn(value: str) -> str | None:
    """A distinguished name as its RDNs compare (types and values case-folded, spaces around
    separators dropped); None for text that is no DN."""
    try:
        parts = parse_dn(value, escape=False, strip=True)
    except (LDAPInvalidDnError, ValueError, TypeError, IndexError):
        return None
    return "".join(f"{kind.strip().casefold()}={_normal(text)}{sep}" for kind, text, sep in parts)


def _integer(value: str) -> int | None:
    value = value.strip()
    return int(value) if _INTEGER.fullmatch(value) else None


def _texts(values: Values, attribute: str) -> list[str]:
    return [bytes(v).decode("utf-8", "replace") for v in values.get(attribute, [])]


@dataclass
class _Node:
    kind: int
    attribute: str = ""
    value: str = ""
    rule: str = ""
    initial: str = ""
    any: list[str] = field(default_factory=list)
    final: str = ""
    children: list[_Node] = field(default_factory=list)
    # An equality test's value that is a DN (a group in memberOf): its parse, and its loose
    # text (None when it holds _DN_SPECIAL), made once, not at each lookup.
    dn: str | None = None
    loose: str | None = None

    def matches(self, values: Values) -> bool:
        if self.kind == AND:
            return all(child.matches(values) for child in self.children)
        if self.kind == OR:
            return any(child.matches(values) for child in self.children)
        if self.kind == NOT:
            return not self.children[0].matches(values)
        texts = _texts(values, self.attribute)
        if self.kind == MATCH_PRESENT:
            return bool(texts)
        return any(self._value_matches(text) for text in texts)

    def _value_matches(self, text: str) -> bool:
        if self.kind in (MATCH_EQUAL, MATCH_APPROX):
            a, b = _integer(text), _integer(self.value)
            if a is not None and b is not None:
                return a == b
            if _normal(text) == _normal(self.value):
                return True
            if self.dn is not None and "=" in text:
                # Every lookup compares each of a person's groups: a DN that differs in more than
                # spaces and case is told apart without parsing it (~10 us each).
                if self.loose is not None and _DN_SPECIAL.isdisjoint(text) and _loose(text) != self.loose:
                    return False
                return _normal_dn(text) == self.dn
            return False
        if self.kind in (MATCH_GREATER_OR_EQUAL, MATCH_LESS_OR_EQUAL):
            a, b = _integer(text), _integer(self.value)
            if a is not None and b is not None:
                return a >= b if self.kind == MATCH_GREATER_OR_EQUAL else a <= b
            x, y = _normal(text), _normal(self.value)
            return x >= y if self.kind == MATCH_GREATER_OR_EQUAL else x <= y
        if self.kind == MATCH_SUBSTRING:
            rest = _normal(text)
            if not rest.startswith(self.initial):
                return False
            rest = rest[len(self.initial):]
            for part in self.any:
                at = rest.find(part)
                if at < 0:
                    return False
                rest = rest[at + len(part):]
            return rest.endswith(self.final)
        # MATCH_EXTENSIBLE with a bitwise rule (checked when built)
        a, b = _integer(text), _integer(self.value)
        if a is None or b is None:
            return False
        return (a & b) == b if self.rule in BIT_AND else (a & b) != 0


class LockFilter:
    """A parsed entry filter (`locked_filter`, `admin_filter`, `mfa_required_filter`): which
    attributes it needs (asked for by name, so operational ones such as memberOf come too),
    and whether an entry matches."""

    def __init__(self, text: str, key: str = "backend.ldap.locked_filter") -> None:
        text = text.strip()
        if text and not text.startswith("("):
            text = f"({text})"
        self.text = text
        self.attributes: list[str] = []
        try:
            tree = parse_filter(text, None, auto_escape=False, auto_encode=False, validator=None, check_names=False)
        except LDAPInvalidFilterError as exc:
            raise ConfigError(f"{key}: {text!r} is not a valid LDAP filter ({exc})") from None
        self.root = self._build(tree, key)

    def _build(self, node: FilterNode, key: str) -> _Node:
        if node.tag == ROOT:
            if len(node.elements) != 1:
                raise ConfigError(f"{key}: {self.text!r} must be one filter")
            return self._build(node.elements[0], key)
        if node.tag in (AND, OR, NOT):
            return _Node(node.tag, children=[self._build(child, key) for child in node.elements])
        assertion = node.assertion or {}
        attribute = str(assertion.get("attr") or "")
        if not attribute:
            raise ConfigError(f"{key}: {self.text!r}: every test must name an attribute")
        if attribute.lower() not in self.attributes:
            self.attributes.append(attribute.lower())
        built = _Node(node.tag, attribute=attribute.lower())
        if node.tag == MATCH_SUBSTRING:
            built.initial = _normal(_unescape(assertion.get("initial") or b""))
            built.any = [_normal(_unescape(part)) for part in assertion.get("any") or []]
            built.final = _normal(_unescape(assertion.get("final") or b""))
        elif node.tag != MATCH_PRESENT:
            built.value = _unescape(assertion.get("value") or b"")
            if node.tag in (MATCH_EQUAL, MATCH_APPROX) and "=" in built.value:
                built.dn = _normal_dn(built.value)
                built.loose = _loose(built.value) if _DN_SPECIAL.isdisjoint(built.value) else None
        if node.tag == MATCH_EXTENSIBLE:
            rule = str(assertion.get("matchingRule") or "").lower()
            if rule not in BIT_AND | BIT_OR or assertion.get("dnAttributes"):
                raise ConfigError(
                    f"{key}: {self.text!r}: only the bitwise matching rules 1.2.840.113556.1.4.803 and .804 "
                    "are understood in an extensible match"
                )
            built.rule = rule
        return built

    def matches(self, values: Values) -> bool:
        """Whether an entry with these raw values (attribute names in lower case) matches."""
        return self.root.matches(values)
