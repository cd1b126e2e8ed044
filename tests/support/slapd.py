"""A private OpenLDAP slapd for the LDAP backend tests: temp dir, free loopback port, TLS."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator

import bcrypt
import pytest

from tests.support.helpers import TEST_ROUNDS, ci, hex_hash

SUFFIX = "dc=example,dc=org"
PEOPLE = f"ou=people,{SUFFIX}"
READER_DN = f"cn=reader,{SUFFIX}"
READER_PASSWORD = "reader-secret"
SCHEMA_DIR = os.environ.get("SLAPD_SCHEMA_DIR", "/etc/ldap/schema")
MODULE_DIR = os.environ.get("SLAPD_MODULE_DIR", "/usr/lib/ldap")


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/local/sbin/{name}") if os.access(p, os.X_OK)), None
    )


def crypt_bcrypt(password: str) -> str:
    """The `{CRYPT}$2b$...` form OpenLDAP keeps (and verifies with crypt(3))."""
    return "{CRYPT}" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(TEST_ROUNDS)).decode()


def ssha(password: str) -> str:
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certificates(directory: str) -> dict[str, str]:
    """A throw-away CA and a server certificate for DNS:localhost (EC keys: fast)."""
    paths = {name: os.path.join(directory, f"{name}.pem") for name in ("ca", "ca-key", "cert", "key")}
    ext = os.path.join(directory, "ext.cnf")
    with open(ext, "w") as fh:
        fh.write("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", paths["ca-key"], "-out", paths["ca"],
            "-days", "2", "-subj", "/CN=homeserver test CA")
    csr = os.path.join(directory, "server.csr")
    openssl("req", "-new", *ec, "-keyout", paths["key"], "-out", csr, "-subj", "/CN=localhost")
    openssl("x509", "-req", "-in", csr, "-CA", paths["ca"], "-CAkey", paths["ca-key"],
            "-CAcreateserial", "-days", "2", "-out", paths["cert"], "-extfile", ext)
    return paths


# Active Directory's logon-name and account-state attributes (their real OIDs) and an
# auxiliary class to carry them, so AD-shaped entries live in a real OpenLDAP: the backend
# searches and reads the very attribute names an AD domain controller has. Likewise
# 389-DS / FreeIPA's nsAccountLock (its real OID; the class is made up).
AD_SCHEMA = """dn: cn=adtest,cn=schema,cn=config
objectClass: olcSchemaConfig
cn: adtest
olcAttributeTypes: ( 1.2.840.113556.1.4.221 NAME 'sAMAccountName' EQUALITY caseIgnoreMatch SUBSTR caseIgnoreSubstringsMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.656 NAME 'userPrincipalName' EQUALITY caseIgnoreMatch SUBSTR caseIgnoreSubstringsMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.8 NAME 'userAccountControl' EQUALITY integerMatch ORDERING integerOrderingMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.27 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.662 NAME 'lockoutTime' EQUALITY integerMatch ORDERING integerOrderingMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.27 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.96 NAME 'pwdLastSet' EQUALITY integerMatch ORDERING integerOrderingMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.27 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.2 NAME 'objectGUID' EQUALITY octetStringMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.40 SINGLE-VALUE )
olcAttributeTypes: ( 2.16.840.1.113730.3.1.610 NAME 'nsAccountLock' EQUALITY caseIgnoreMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
olcObjectClasses: ( 1.2.840.113556.1.5.9 NAME 'adUser' SUP top AUXILIARY MAY ( sAMAccountName $ userPrincipalName $ userAccountControl $ lockoutTime $ pwdLastSet $ objectGUID ) )
olcObjectClasses: ( 2.16.840.1.113730.3.2.999 NAME 'nsLockable' SUP top AUXILIARY MAY nsAccountLock )

"""


PPOLICY_OVERLAY = f"""
dn: olcOverlay=ppolicy,olcDatabase={{1}}mdb,cn=config
objectClass: olcOverlayConfig
objectClass: olcPPolicyConfig
olcOverlay: ppolicy
olcPPolicyDefault: cn=default-policy,{SUFFIX}
"""


# The memberof overlay keeps each member's memberOf (an operational attribute) in step with
# groupOfNames entries changed online (slapadd runs no overlays: add groups to a running slapd).
MEMBEROF_OVERLAY = """
dn: olcOverlay=memberof,olcDatabase={1}mdb,cn=config
objectClass: olcOverlayConfig
objectClass: olcMemberOf
olcOverlay: memberof
olcMemberOfRefInt: TRUE
olcMemberOfGroupOC: groupOfNames
olcMemberOfMemberAD: member
olcMemberOfMemberOfAD: memberOf
"""


def ppolicy_available() -> bool:
    return os.path.exists(os.path.join(MODULE_DIR, "ppolicy.la")) or os.path.exists(
        os.path.join(MODULE_DIR, "ppolicy.so")
    )


def _config_ldif(
    directory: str, tls: dict[str, str] | None, ppolicy: bool = False, *, memberof: bool = False, size_limit: str = ""
) -> str:
    """cn=config for a private slapd; `size_limit` becomes the database's olcSizeLimit (it
    binds the reader, not the root DN), e.g. "500" or "size.soft=500 size.prtotal=unlimited"."""
    tls_lines = ""
    if tls:
        tls_lines = (
            f"olcTLSCACertificateFile: {tls['ca']}\n"
            f"olcTLSCertificateFile: {tls['cert']}\n"
            f"olcTLSCertificateKeyFile: {tls['key']}\n"
        )
    schemas = "".join(
        f"include: file://{SCHEMA_DIR}/{name}.ldif\n\n" for name in ("core", "cosine", "inetorgperson")
    ) + AD_SCHEMA
    modules = "".join(f"olcModuleLoad: {name}\n" for name, wanted in (("ppolicy", ppolicy), ("memberof", memberof))
                      if wanted)
    return f"""dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: {directory}/slapd.pid
{tls_lines}
dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: {MODULE_DIR}
olcModuleLoad: back_mdb
{modules}

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

{schemas}dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {SUFFIX}
olcRootDN: cn=admin,{SUFFIX}
olcRootPW: adminpw
olcDbDirectory: {directory}/db
olcDbIndex: uid eq
{f"olcSizeLimit: {size_limit}" + chr(10) if size_limit else ""}olcAccess: {{0}}to attrs=userPassword by dn.exact="{READER_DN}" read by anonymous auth by * none
olcAccess: {{1}}to * by * read
{PPOLICY_OVERLAY if ppolicy else ""}{MEMBEROF_OVERLAY if memberof else ""}"""


def person(uid: str, ou: str = "people", more_uids: tuple[str, ...] = (), **attrs: str | list[str]) -> str:
    """One inetOrgPerson entry as LDIF (cn and sn default to the uid)."""
    attrs.setdefault("cn", uid)
    attrs.setdefault("sn", uid)
    classes = attrs.pop("objectClass", [])
    lines = [f"dn: uid={uid},ou={ou},{SUFFIX}", "objectClass: inetOrgPerson"]
    lines += [f"objectClass: {name}" for name in ([classes] if isinstance(classes, str) else classes)]
    lines += [f"uid: {value}" for value in (uid, *more_uids)]
    for key, value in attrs.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{key}: {item}")
    return "\n".join(lines) + "\n"


def base_ldif() -> str:
    return f"""dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
dc: example
o: Example

dn: {PEOPLE}
objectClass: organizationalUnit
ou: people

dn: ou=staff,{SUFFIX}
objectClass: organizationalUnit
ou: staff

dn: {READER_DN}
objectClass: organizationalRole
objectClass: simpleSecurityObject
cn: reader
userPassword: {ssha(READER_PASSWORD)}
"""


class Slapd:
    """One private slapd: config and data built offline, then `slapd -d 0` in the foreground."""

    def __init__(
        self, ldif: str, *, tls: bool = True, ppolicy: bool = False, memberof: bool = False, size_limit: str = ""
    ) -> None:
        self.slapd, self.slapadd = _tool("slapd"), _tool("slapadd")
        self.ldapwhoami = _tool("ldapwhoami")
        self.directory = tempfile.mkdtemp(prefix="homeserver-slapd-")
        self.tls = make_certificates(self.directory) if tls else None
        self.ldif = ldif
        self.ppolicy = ppolicy
        self.memberof = memberof
        self.size_limit = size_limit
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._build()

    @property
    def uri(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    @property
    def host_uri(self) -> str:
        """The URI by host name, which TLS certificate checks need."""
        return f"ldap://localhost:{self.port}"

    def _build(self) -> None:
        os.makedirs(os.path.join(self.directory, "slapd.d"))
        os.makedirs(os.path.join(self.directory, "db"))
        config = os.path.join(self.directory, "config.ldif")
        data = os.path.join(self.directory, "data.ldif")
        with open(config, "w") as fh:
            fh.write(_config_ldif(self.directory, self.tls, self.ppolicy, memberof=self.memberof,
                                  size_limit=self.size_limit))
        with open(data, "w") as fh:
            fh.write(self.ldif)
        for number, path in (("0", config), ("1", data)):
            done = subprocess.run(
                [self.slapadd, "-q", "-n", number, "-F", os.path.join(self.directory, "slapd.d"), "-l", path],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                raise RuntimeError(f"slapadd -n{number} failed: {done.stderr}")

    def start(self, port: int | None = None) -> None:
        """Start on `port` (a restart) or on a new free port, retrying a lost port race."""
        for _ in range(3 if port is None else 1):
            self.port = port or free_port()
            log = open(os.path.join(self.directory, "slapd.log"), "ab")
            sock = urllib.parse.quote(os.path.join(self.directory, "ldapi"), safe="")
            self.process = subprocess.Popen(
                [self.slapd, "-F", os.path.join(self.directory, "slapd.d"),
                 "-h", f"{self.uri} ldapi://{sock}", "-d", "0"],
                stdout=log,
                stderr=log,
            )
            log.close()
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(f"slapd did not start: {self.log()[-2000:]}")

    def _wait_ready(self, limit: float = 10.0) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            if self.ldapwhoami:
                ready = subprocess.run(
                    [self.ldapwhoami, "-x", "-H", self.uri], capture_output=True
                ).returncode == 0
            else:
                with socket.socket() as s:
                    ready = s.connect_ex(("127.0.0.1", self.port)) == 0
            if ready:
                return True
            time.sleep(0.02)
        return False

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections, but nothing answers (a hang)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self._wait_stopped(True)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self._wait_stopped(False)

    def _wait_stopped(self, stopped: bool, limit: float = 5.0) -> None:
        """Wait until every slapd thread has (or none has) stopped: signals land asynchronously,
        and on a busy machine a thread can still answer a request just after kill()."""
        assert self.process is not None
        task_dir = f"/proc/{self.process.pid}/task"
        if not os.path.isdir(task_dir):
            return  # no procfs: rely on the signal alone
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            states = []
            for task in os.listdir(task_dir):
                try:
                    with open(f"{task_dir}/{task}/stat") as fh:
                        states.append(fh.read().rpartition(")")[2].split()[0])
                except OSError:
                    continue  # the thread just ended
            if (stopped and all(state == "T" for state in states)) or (not stopped and "T" not in states):
                return
            time.sleep(0.005)
        raise RuntimeError(f"slapd did not {'stop' if stopped else 'continue'} within {limit} s")

    def stop(self) -> None:
        """SIGTERM and wait (a stopped slapd is continued first so it can exit)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the abrupt end of a crashed directory."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def entry_uuid(self, dn: str) -> str:
        """Read an entry's entryUUID with ldapsearch, independently of the code under test."""
        done = subprocess.run(
            [_tool("ldapsearch"), "-x", "-LLL", "-H", self.uri, "-b", dn, "-s", "base", "entryUUID"],
            capture_output=True, text=True, check=True,
        )
        return next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("entryUUID: "))

    def log(self) -> str:
        try:
            with open(os.path.join(self.directory, "slapd.log"), errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def require_slapd() -> None:
    """Skip when slapd is not installed; fail instead on CI, where it must be."""
    missing = [name for name in ("slapd", "slapadd", "ldapsearch", "openssl") if _tool(name) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (run scripts/install-test-services.sh)"
        if ci():
            pytest.fail(reason)
        pytest.skip(reason)


def running_slapd(ldif: str) -> Iterator[Slapd]:
    """Start a slapd with `ldif` loaded; stop it and remove its files afterwards."""
    require_slapd()
    server = Slapd(ldif)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


# The test directory. Passwords are the uid followed by "-pw" unless said otherwise.
def directory_ldif() -> str:
    """Entries covering the attribute mapping, odd passwords and ambiguous names."""
    return "\n".join([
        base_ldif(),
        person("alice", cn="Alice Liddell", displayName="Alice", employeeNumber="A-1",
               labeledURI="mxc://localhost/alice Alice's avatar", userPassword=crypt_bcrypt("wonderland")),
        # No displayName: cn (multi-valued) is the fallback; $2a$ hash.
        person("bob", cn=["Bob Builder", "Robert"], mail="bob@example.org",
               userPassword=crypt_bcrypt("builder").replace("$2b$", "$2a$")),
        # Lower-case {crypt} with $2y$, two labeledURIs, a mail address.
        person("carol", displayName="Carol", mail="carol@example.org", title="Dr",
               labeledURI=["mxc://localhost/carol1", "mxc://localhost/carol2 second"],
               userPassword=crypt_bcrypt("carol-pw").replace("{CRYPT}$2b$", "{crypt}$2y$")),
        # A salted SHA-1 the directory can check (bind mode) but the hash mode cannot.
        person("dave", displayName="Dave", userPassword=ssha("dave-pw")),
        # The bcrypt hash kept as hex text in another attribute.
        person("erin", displayName="Erin", description=hex_hash("erin-pw"), userPassword=ssha("erin-pw")),
        # Excluded by the test filter "(!(employeeType=disabled))".
        person("mallory", employeeType="disabled", userPassword=crypt_bcrypt("mallory-pw")),
        # The same uid twice: ambiguous, so nobody.
        person("twin", userPassword=crypt_bcrypt("twin-pw")),
        person("twin", ou="staff", userPassword=crypt_bcrypt("twin-pw")),
        # Filter metacharacters inside a stored name.
        person("star*", displayName="Star", userPassword=crypt_bcrypt("star-pw")),
        # Two uid values.
        person("frank", more_uids=("franky",), displayName="Frank", userPassword=crypt_bcrypt("frank-pw")),
        # Login by address: a mixed-case mail, and one address held by two entries.
        person("grace", displayName="Grace", mail="Grace.Hopper@Example.ORG", userPassword=crypt_bcrypt("grace-pw")),
        person("dup1", mail="shared@example.org", userPassword=crypt_bcrypt("dup-pw")),
        person("dup2", mail="shared@example.org", userPassword=crypt_bcrypt("dup-pw")),
        # Active Directory shaped: CORP\\hwin or hwin@corp.example.com; the Matrix name is its uid.
        person("hwin", objectClass="adUser", sAMAccountName="HWin", userPrincipalName="hwin@corp.example.com",
               mail="Hal.Win@example.org", displayName="Hal Win", userPassword=crypt_bcrypt("hwin-pw")),
        # Only under ou=staff: found when both bases are searched.
        person("ivan", ou="staff", mail="ivan@example.org", userPassword=crypt_bcrypt("ivan-pw")),
        # A mixed-case uid, for lowercase_user_ids.
        person("Judy", displayName="Judy", userPassword=crypt_bcrypt("judy-pw")),
    ])


@pytest.fixture(scope="session")
def slapd() -> Iterator[Slapd]:
    """The shared, read-only test directory (tests that break a server start their own)."""
    yield from running_slapd(directory_ldif())
