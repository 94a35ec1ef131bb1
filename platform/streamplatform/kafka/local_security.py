"""What a secured local broker needs (local_broker.py, ``security=``): a certificate authority,
the broker's certificate and a client's (for mutual TLS), a SCRAM user with a random password,
the broker's listener settings and the clients' settings, in the Java client's names
(kafka/security.py translates them for librdkafka).

Everything is generated once into the broker's ``security/`` folder and kept (PEM files: the
CA, ``broker.pem`` and ``client.pem`` holding a key and its certificate; ``user.json``), so
a restarted broker and its clients keep agreeing. The keys are for a local broker on
127.0.0.1 only: unencrypted, readable by their owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("sasl_ssl", "sasl_plaintext", "ssl")
MECHANISM = "SCRAM-SHA-512"
USER = "streamplatform"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


@dataclass(frozen=True)
class LocalSecurity:
    """The generated material of one broker's ``security/`` folder."""

    directory: Path
    user: str
    password: str

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def broker_pem(self) -> Path:
        return self.directory / "broker.pem"

    @property
    def client_pem(self) -> Path:
        return self.directory / "client.pem"


def prepare(directory: Path) -> LocalSecurity:
    """The security material in ``directory``, generated at the first call."""
    user_file = directory / "user.json"
    if user_file.exists():
        user = json.loads(user_file.read_text())
        return LocalSecurity(directory, user["user"], user["password"])
    directory.mkdir(parents=True, exist_ok=True)
    _generate(directory)
    password = secrets.token_urlsafe(18)
    write_private(user_file, json.dumps({"user": USER, "password": password}).encode())
    return LocalSecurity(directory, USER, password)


def client_settings(security: LocalSecurity, mode: str, mechanism: str = MECHANISM) -> dict:
    """The Java-named client settings for a broker secured with ``mode``; ``mechanism``:
    SCRAM-SHA-512, SCRAM-SHA-256 or OAUTHBEARER (Kafka's unsecured tokens, for tests)."""
    settings: dict[str, Any] = {"security.protocol": mode.upper()}
    if mode.startswith("sasl"):
        settings["sasl.mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            jaas = f'{OAUTH} required unsecuredLoginStringClaim_sub="{security.user}";'
        else:
            jaas = f'{SCRAM} required username="{security.user}" password="{security.password}";'
        settings["sasl.jaas.config"] = jaas
    if mode.endswith("ssl"):
        settings |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(security.ca)}
    if mode == "ssl":  # mutual TLS: the client's certificate is its identity
        settings |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(security.client_pem)}
    return settings


def broker_properties(security: LocalSecurity, mode: str, listener: str) -> dict[str, str]:
    """The broker's settings for its client listener ``listener`` (lower case) under ``mode``."""
    prefix = f"listener.name.{listener}"
    properties: dict[str, str] = {}
    if mode.startswith("sasl"):
        properties |= {
            f"{prefix}.sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,OAUTHBEARER",
            f"{prefix}.scram-sha-512.sasl.jaas.config": f"{SCRAM} required;",
            f"{prefix}.scram-sha-256.sasl.jaas.config": f"{SCRAM} required;",
            f"{prefix}.oauthbearer.sasl.jaas.config":
                f'{OAUTH} required unsecuredLoginStringClaim_sub="broker";',
        }  # fmt: skip
    if mode.endswith("ssl"):
        properties |= {
            f"{prefix}.ssl.keystore.type": "PEM",
            f"{prefix}.ssl.keystore.location": str(security.broker_pem),
            f"{prefix}.ssl.truststore.type": "PEM",
            f"{prefix}.ssl.truststore.location": str(security.ca),
            f"{prefix}.ssl.client.auth": "required" if mode == "ssl" else "none",
        }
    return properties


def _generate(directory: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def certificate(subject: str, key: Any, issuer: x509.Name, signer: Any, extensions: list):
        builder = (
            x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
        )  # fmt: skip
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    def pem(key: Any, cert: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ) + cert.public_bytes(serialization.Encoding.PEM)  # fmt: skip

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate("streamplatform local CA", ca_key, name("streamplatform local CA"), ca_key,
                     [(x509.BasicConstraints(ca=True, path_length=0), True)])  # fmt: skip
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who, usage in (("broker", ExtendedKeyUsageOID.SERVER_AUTH),
                       ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):  # fmt: skip
        key = ec.generate_private_key(ec.SECP256R1())
        alternative = x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ])  # fmt: skip
        cert = certificate(
            f"streamplatform-{who}", key, ca.subject, ca_key,
            [(alternative, False), (x509.ExtendedKeyUsage([usage]), False),
             (x509.BasicConstraints(ca=False, path_length=None), True)],
        )  # fmt: skip
        write_private(directory / f"{who}.pem", pem(key, cert))


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
