"""One spelling of the security settings (the Java client's) for both Kafka clients: what
librdkafka gets, what Spark's Java client gets, what is refused at start-up and what may be
shown (kafka/security.py). Pure logic: the secured broker's tests run them end to end."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from streamplatform import StreamsConfig
from streamplatform.config import ConfigError
from streamplatform.kafka.clients import connection_settings, librdkafka_settings
from streamplatform.kafka.security import HIDDEN, jaas_options, librdkafka_security, redacted

SCRAM = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
         'username="app" password="s3cr\\"et";')  # fmt: skip


def test_scram_over_tls_with_a_pem_trust_store():
    java = {"bootstrap.servers": "b:9093", "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": SCRAM,
            "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/ca.pem"}  # fmt: skip
    assert librdkafka_settings(java) == {
        "bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "app", "sasl.password": 's3cr"et',
        "ssl.ca.location": "/etc/ca.pem",
    }  # fmt: skip
    # Spark's Kafka source and sink are the Java client: the settings as given.
    assert connection_settings(java) == java


def test_plain_and_the_host_name_check_off():
    got = librdkafka_security({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                            "username=alice password=pw;",
        "ssl.endpoint.identification.algorithm": "",
    })  # fmt: skip
    assert got["sasl.username"] == "alice" and got["sasl.password"] == "pw"
    assert got["ssl.endpoint.identification.algorithm"] == "none"


def test_oauthbearer_unsecured_tokens_and_oidc_client_credentials():
    unsecured = librdkafka_security({
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                            'required unsecuredLoginStringClaim_sub="svc";',
    })  # fmt: skip
    assert unsecured["enable.sasl.oauthbearer.unsecure.jwt"] is True
    assert unsecured["sasl.oauthbearer.config"] == "principal=svc"
    oidc = librdkafka_security({
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                            'required clientId="job" clientSecret="cs" scope="kafka";',
    })  # fmt: skip
    assert oidc == {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.client.id": "job", "sasl.oauthbearer.client.secret": "cs",
                    "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
                    "sasl.oauthbearer.scope": "kafka"}  # fmt: skip


def test_key_stores_for_mutual_tls():
    pem = librdkafka_security({"security.protocol": "SSL", "ssl.keystore.type": "PEM",
                               "ssl.keystore.location": "/k/client.pem",
                               "ssl.key.password": "kp"})  # fmt: skip
    assert pem == {"security.protocol": "SSL", "ssl.certificate.location": "/k/client.pem",
                   "ssl.key.location": "/k/client.pem", "ssl.key.password": "kp"}  # fmt: skip
    p12 = librdkafka_security({"ssl.keystore.type": "PKCS12",
                               "ssl.keystore.location": "/k/client.p12",
                               "ssl.keystore.password": "sp"})  # fmt: skip
    assert p12 == {"ssl.keystore.location": "/k/client.p12", "ssl.keystore.password": "sp"}
    inline = librdkafka_security({"ssl.keystore.type": "PEM", "ssl.keystore.key": "KEY",
                                  "ssl.keystore.certificate.chain": "CHAIN"})  # fmt: skip
    assert inline == {"ssl.key.pem": "KEY", "ssl.certificate.pem": "CHAIN"}


def test_a_pkcs12_trust_store_becomes_a_pem_file_librdkafka_reads(tmp_path, monkeypatch):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path / "data"))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
          .public_key(key.public_key()).serial_number(1).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))  # fmt: skip
    store = tmp_path / "trust.p12"
    store.write_bytes(pkcs12.serialize_key_and_certificates(
        b"trust", None, None, [ca], serialization.BestAvailableEncryption(b"tp")))  # fmt: skip
    got = librdkafka_security({"ssl.truststore.type": "PKCS12",
                               "ssl.truststore.location": str(store),
                               "ssl.truststore.password": "tp"})  # fmt: skip
    pem = Path(got["ssl.ca.location"])
    assert pem.is_relative_to(tmp_path / "data")
    assert pem.read_bytes() == ca.public_bytes(serialization.Encoding.PEM)
    with pytest.raises(ConfigError, match="ssl.truststore.location"):
        librdkafka_security({"ssl.truststore.type": "PKCS12", "ssl.truststore.location": str(store),
                             "ssl.truststore.password": "wrong"})  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "message"),
    [({"sasl.username": "u"}, "sasl.username: librdkafka's name.*sasl.jaas.config"),
     ({"ssl.ca.location": "/ca"}, "ssl.ca.location: librdkafka's name.*ssl.truststore.type=PEM"),
     ({"ssl.truststore.location": "/t.jks"}, "ssl.truststore.type: JKS"),
     ({"security.protocol": "TLS"}, "security.protocol: 'TLS'"),
     ({"ssl.cipher.suites": "x"}, "ssl.cipher.suites: not a security setting"),
     ({"sasl.mechanism": "GSSAPI", "sasl.jaas.config":
       "com.sun.security.auth.module.Krb5LoginModule required;"}, "Krb5LoginModule")],
)  # fmt: skip
def test_what_one_client_would_misread_stops_start_up_naming_the_setting(setting, message):
    with pytest.raises(ConfigError, match=message):
        StreamsConfig({"application.id": "a", "bootstrap.servers": "b:9092"} | setting)


def test_secrets_are_hidden_from_what_may_be_shown():
    shown = redacted({"sasl.jaas.config": SCRAM, "ssl.keystore.password": "p",
                      "ssl.key.password": "k", "security.protocol": "SASL_SSL"})  # fmt: skip
    assert shown == {"sasl.jaas.config": HIDDEN, "ssl.keystore.password": HIDDEN,
                     "ssl.key.password": HIDDEN, "security.protocol": "SASL_SSL"}  # fmt: skip


def test_jaas_options():
    assert jaas_options(SCRAM) == (
        "org.apache.kafka.common.security.scram.ScramLoginModule",
        {"username": "app", "password": 's3cr"et'},
    )
    with pytest.raises(ConfigError, match="sasl.jaas.config"):
        jaas_options("username=app")


def test_why_unreachable_asks_the_token_endpoint_and_never_names_the_secret():
    """librdkafka reports refused OIDC client credentials only as a transport failure: the
    reason added to "cannot reach Kafka" comes from asking the endpoint once."""
    from oidc_provider import OidcProvider

    from streamplatform.kafka.security import why_unreachable

    module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"

    def settings(url: str, secret: str) -> dict[str, str]:
        return {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
                "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.endpoint.url": url,
                "sasl.jaas.config": f'{module} required clientId="job" clientSecret="{secret}" '
                                    'scope="kafka";'}  # fmt: skip

    with OidcProvider({"job": "right-secret"}) as provider:
        wrong = why_unreachable(settings(provider.token_url, "wrong-secret"))
        assert wrong == (f" (the token endpoint {provider.token_url} refused clientId=job: HTTP "
                         "401; check the client id and secret in sasl.jaas.config)")  # fmt: skip
        assert why_unreachable(settings(provider.token_url, "right-secret")) == ""
        assert provider.issued["job"] == 1 and provider.refused["job"] == 1
        assert "HTTP 404" in why_unreachable(settings(f"{provider.url}/nowhere", "right-secret"))
        # A redirect is reported, not followed: urllib would send the credentials on with it.
        moved = why_unreachable(settings(f"{provider.url}/moved", "right-secret"))
        assert f"redirects to {provider.url}/token" in moved
        assert provider.issued["job"] == 1  # the target was not asked
    closed = why_unreachable(settings(provider.token_url, "right-secret"))  # server shut down
    assert closed.startswith(f" (the token endpoint {provider.token_url} cannot be reached")
    assert why_unreachable({"bootstrap.servers": "x", "sasl.mechanism": "SCRAM-SHA-512"}) == ""
