"""One spelling of Kafka's security settings for both of the platform's Kafka clients.

The platform follows Kafka Streams' settings, so security is configured with the Java client's
names (``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config``,
``ssl.truststore.*``, ``ssl.keystore.*``, ``ssl.key.password``,
``ssl.endpoint.identification.algorithm``, ``sasl.oauthbearer.token.endpoint.url``). Spark's
Kafka source and sink are the Java client: they get those settings as they are (``kafka.``
prefixed). librdkafka — the tasks, the planner, the tools, the DLQ replay — spells them
differently and refuses the Java names, so ``librdkafka_security`` translates them:

- ``sasl.jaas.config`` of the PLAIN and SCRAM login modules -> ``sasl.username`` and
  ``sasl.password``; of the OAUTHBEARER module with ``unsecuredLoginStringClaim_sub`` (Kafka's
  unsecured tokens, for tests) -> librdkafka's unsecured JWT for that principal; with
  ``clientId`` and ``clientSecret`` (OIDC client credentials, the token endpoint in
  ``sasl.oauthbearer.token.endpoint.url``) -> librdkafka's OIDC method;
- a PEM trust store (``ssl.truststore.type=PEM``: a file, or the certificates themselves in
  ``ssl.truststore.certificates``) -> ``ssl.ca.location`` / ``ssl.ca.pem``; a PKCS12 one -> its
  certificates written once to a PEM file beside the platform's data (librdkafka reads no
  PKCS12 trust store); a JKS one is refused with a message naming the setting;
- a PKCS12 key store -> librdkafka's own ``ssl.keystore.location`` and password; a PEM one (a
  file holding the key and its chain, or ``ssl.keystore.key`` and
  ``ssl.keystore.certificate.chain``) -> ``ssl.certificate.*`` and ``ssl.key.*``;
- ``ssl.endpoint.identification.algorithm`` "" (no host name check) -> "none".

librdkafka's own spellings (``sasl.username``, ``ssl.ca.location``...) are refused, naming the
Java setting to use: one dict then means the same to both clients. Secrets never leave this
module in clear: ``redacted`` is what logs, reprs and metadata may show.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamplatform.config import ConfigError

# The Java client's security settings the platform takes (and passes to Spark unchanged).
JAVA_SECURITY_KEYS = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.jaas.config",
    "sasl.oauthbearer.token.endpoint.url", "sasl.login.callback.handler.class",
    "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type",
    "ssl.truststore.certificates", "ssl.keystore.location", "ssl.keystore.password",
    "ssl.keystore.type", "ssl.keystore.key", "ssl.keystore.certificate.chain",
    "ssl.key.password", "ssl.endpoint.identification.algorithm",
})  # fmt: skip
# librdkafka's names a user might bring from a confluent-kafka project: the Java one to use.
_LIBRDKAFKA_ONLY = {
    "sasl.username": "sasl.jaas.config (username=...)",
    "sasl.password": "sasl.jaas.config (password=...)",
    "sasl.mechanisms": "sasl.mechanism",
    "ssl.ca.location": "ssl.truststore.location with ssl.truststore.type=PEM",
    "ssl.ca.pem": "ssl.truststore.certificates with ssl.truststore.type=PEM",
    "ssl.certificate.location": "ssl.keystore.location with ssl.keystore.type=PEM",
    "ssl.key.location": "ssl.keystore.location with ssl.keystore.type=PEM",
    "ssl.certificate.pem": "ssl.keystore.certificate.chain",
    "ssl.key.pem": "ssl.keystore.key",
    "sasl.oauthbearer.method": "sasl.jaas.config (OAuthBearerLoginModule)",
    "sasl.oauthbearer.client.id": "sasl.jaas.config (clientId=...)",
    "sasl.oauthbearer.client.secret": "sasl.jaas.config (clientSecret=...)",
    "sasl.oauthbearer.config": "sasl.jaas.config (unsecuredLoginStringClaim_sub=...)",
}
SECRET_KEYS = frozenset({
    "sasl.jaas.config", "ssl.truststore.password", "ssl.keystore.password",
    "ssl.key.password", "ssl.keystore.key",
    "sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.pem",  # librdkafka's, translated
})  # fmt: skip
HIDDEN = "[hidden]"
_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)"
                   r"(?P<options>.*?);?\s*$", re.DOTALL)  # fmt: skip
_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+))')
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def is_security_key(key: str) -> bool:
    return key in JAVA_SECURITY_KEYS or key.startswith(("sasl.", "ssl."))


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every secret replaced by ``[hidden]``: what may be shown."""
    return {key: HIDDEN if key in SECRET_KEYS else value for key, value in settings.items()}


def check(settings: Mapping[str, Any]) -> None:
    """Refuse what one of the clients would misread, naming the setting: librdkafka's own
    spellings, Java settings the platform does not know, an unknown protocol."""
    for key in settings:
        if key in _LIBRDKAFKA_ONLY:
            raise ConfigError(
                f"{key}: librdkafka's name; security settings take the Java client's names "
                f"here (Kafka Streams'): use {_LIBRDKAFKA_ONLY[key]}"
            )
        if key.startswith(("sasl.", "ssl.")) and key not in JAVA_SECURITY_KEYS:
            raise ConfigError(f"{key}: not a security setting the platform knows; it takes "
                              f"{', '.join(sorted(JAVA_SECURITY_KEYS))}")  # fmt: skip
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in _PROTOCOLS:
        raise ConfigError(f"security.protocol: {settings['security.protocol']!r} is not one of "
                          f"{', '.join(_PROTOCOLS)}")  # fmt: skip


def jaas_options(jaas: str) -> tuple[str, dict[str, str]]:
    """``sasl.jaas.config`` as its login module's class and options."""
    found = _JAAS.match(jaas)
    if found is None:
        raise ConfigError("sasl.jaas.config: expected '<LoginModule class> required "
                          "key=\"value\" ...;'")  # fmt: skip
    options = {
        name: quoted.replace('\\"', '"') if quoted or bare is None or bare == "" else bare
        for name, quoted, bare in _OPTION.findall(found["options"])
    }
    return found["module"], options


def librdkafka_security(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The security part of ``settings`` (Java names) in librdkafka's names."""
    check(settings)
    out: dict[str, Any] = {}
    protocol = settings.get("security.protocol")
    if protocol is not None:
        out["security.protocol"] = str(protocol).upper()
    mechanism = settings.get("sasl.mechanism")
    if mechanism is not None:
        out["sasl.mechanism"] = mechanism
    jaas = settings.get("sasl.jaas.config")
    if jaas:
        out |= _sasl(str(jaas), str(mechanism or "GSSAPI"), settings)
    out |= _truststore(settings) | _keystore(settings)
    algorithm = settings.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        out["ssl.endpoint.identification.algorithm"] = str(algorithm).lower() or "none"
    return out


def _sasl(jaas: str, mechanism: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    module, options = jaas_options(jaas)
    name = module.rsplit(".", 1)[-1]
    if name in ("PlainLoginModule", "ScramLoginModule"):
        if "username" not in options or "password" not in options:
            raise ConfigError(f"sasl.jaas.config: {name} needs username=\"...\" and "
                              "password=\"...\"")  # fmt: skip
        return {"sasl.username": options["username"], "sasl.password": options["password"]}
    if name == "OAuthBearerLoginModule":
        if "unsecuredLoginStringClaim_sub" in options:  # Kafka's unsecured tokens (tests)
            return {"enable.sasl.oauthbearer.unsecure.jwt": True,
                    "sasl.oauthbearer.config":
                        f"principal={options['unsecuredLoginStringClaim_sub']}"}  # fmt: skip
        endpoint = settings.get("sasl.oauthbearer.token.endpoint.url")
        if not endpoint or "clientId" not in options or "clientSecret" not in options:
            raise ConfigError("sasl.jaas.config: OAuthBearerLoginModule needs clientId and "
                              "clientSecret, and sasl.oauthbearer.token.endpoint.url (OIDC), "
                              "or unsecuredLoginStringClaim_sub (unsecured tokens)")  # fmt: skip
        oidc = {
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": options["clientId"],
            "sasl.oauthbearer.client.secret": options["clientSecret"],
            "sasl.oauthbearer.token.endpoint.url": endpoint,
        }
        if options.get("scope"):
            oidc["sasl.oauthbearer.scope"] = options["scope"]
        return oidc
    raise ConfigError(f"sasl.jaas.config: login module {module} is not supported (PLAIN, SCRAM "
                      f"and OAUTHBEARER are; sasl.mechanism is {mechanism})")  # fmt: skip


def _store_type(settings: Mapping[str, Any], which: str) -> str:
    return str(settings.get(f"ssl.{which}.type", "JKS")).upper()


def _truststore(settings: Mapping[str, Any]) -> dict[str, Any]:
    certificates = settings.get("ssl.truststore.certificates")
    if certificates:
        return {"ssl.ca.pem": certificates}
    location = settings.get("ssl.truststore.location")
    if not location:
        return {}
    kind = _store_type(settings, "truststore")
    if kind == "PEM":
        return {"ssl.ca.location": str(location)}
    if kind == "PKCS12":
        path = Path(location)
        password = settings.get("ssl.truststore.password")
        version = path.stat().st_mtime_ns  # a changed store is converted again
        return {"ssl.ca.location": str(_pkcs12_as_pem(path, version, password))}
    raise ConfigError(
        f"ssl.truststore.type: {kind} trust stores cannot be read by librdkafka (the tasks' "
        "client); give a PEM file (ssl.truststore.type=PEM) or PKCS12"
    )


def _keystore(settings: Mapping[str, Any]) -> dict[str, Any]:
    key, chain = settings.get("ssl.keystore.key"), settings.get("ssl.keystore.certificate.chain")
    out: dict[str, Any] = {}
    if key or chain:
        out = {"ssl.key.pem": key, "ssl.certificate.pem": chain}
    elif settings.get("ssl.keystore.location"):
        location, kind = str(settings["ssl.keystore.location"]), _store_type(settings, "keystore")
        if kind == "PEM":  # one file: the key and its certificate chain
            out = {"ssl.certificate.location": location, "ssl.key.location": location}
        elif kind == "PKCS12":
            out = {"ssl.keystore.location": location}
            if settings.get("ssl.keystore.password") is not None:
                out["ssl.keystore.password"] = settings["ssl.keystore.password"]
        else:
            raise ConfigError(
                f"ssl.keystore.type: {kind} key stores cannot be read by librdkafka (the "
                "tasks' client); give PKCS12 or PEM"
            )
    if out and settings.get("ssl.key.password") is not None and "ssl.keystore.location" not in out:
        out["ssl.key.password"] = settings["ssl.key.password"]
    return out


@functools.lru_cache(maxsize=16)
def _pkcs12_as_pem(path: Path, version: int, password: Any) -> Path:
    """A PKCS12 trust store's certificates as a PEM file, written once per store's content
    under the platform's data folder (public certificates only: no secret is written).
    Cached per store version and password: every Kafka client of a process is created
    through here, and the store is read once, not per client."""
    from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

    from streamplatform.home import data_dir

    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    target = data_dir() / "truststores" / f"{path.stem}-{digest}.pem"
    try:  # a wrong password fails here, not in Spark's Java client later
        store = pkcs12.load_pkcs12(data, None if password is None else str(password).encode())
    except ValueError as error:
        raise ConfigError(f"ssl.truststore.location: {path} is not a PKCS12 store this "
                          f"password opens ({error})") from error  # fmt: skip
    certificates = [c.certificate for c in store.additional_certs]
    if store.cert is not None:
        certificates.append(store.cert.certificate)
    if not certificates:
        raise ConfigError(f"ssl.truststore.location: {path} holds no certificate")
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".tmp")
    partial.write_bytes(b"".join(c.public_bytes(Encoding.PEM) for c in certificates))
    partial.replace(target)
    return target


def why_unreachable(settings: Mapping[str, Any], timeout_s: float = 5.0) -> str:
    """A reason to add to "cannot reach Kafka" when the settings can tell one, else "".

    librdkafka reports a token endpoint that refuses the client credentials (OIDC) only as a
    broker transport failure, with no log line: ask the endpoint once, the way librdkafka and
    Kafka's Java client do (HTTP Basic, the client-credentials grant), and say what it
    answered. Never names the secret."""
    import base64
    import urllib.error
    import urllib.parse
    import urllib.request

    endpoint = settings.get("sasl.oauthbearer.token.endpoint.url")
    if str(settings.get("sasl.mechanism", "")).upper() != "OAUTHBEARER" or not endpoint:
        return ""
    try:
        _, options = jaas_options(str(settings.get("sasl.jaas.config", "")))
    except ConfigError:
        return ""
    client, secret = options.get("clientId", ""), options.get("clientSecret", "")
    basic = f"{urllib.parse.quote_plus(client)}:{urllib.parse.quote_plus(secret)}"
    form = {"grant_type": "client_credentials"} | (
        {"scope": options["scope"]} if options.get("scope") else {}
    )
    request = urllib.request.Request(
        str(endpoint), data=urllib.parse.urlencode(form).encode(), method="POST",
        headers={"Authorization": "Basic " + base64.b64encode(basic.encode()).decode(),
                 "Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip

    class _NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # urllib would send the credentials on to wherever it points

    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(request, timeout=timeout_s):
            return ""  # a token was issued: the reason lies elsewhere
    except urllib.error.HTTPError as error:
        if 300 <= error.code < 400:
            where = error.headers.get("Location", "elsewhere")
            return f" (the token endpoint {endpoint} redirects to {where}: give that URL)"
        return (f" (the token endpoint {endpoint} refused clientId={client}: HTTP "
                f"{error.code}; check the client id and secret in sasl.jaas.config)")  # fmt: skip
    except (OSError, ValueError) as error:
        return f" (the token endpoint {endpoint} cannot be reached: {error})"
