"""OAUTHBEARER with OIDC client credentials, end to end: a token endpoint (oidc_provider.py)
issues RS256 JWTs for the job's client id and secret, the broker validates them against the
provider's JWKS (Kafka's OAuthBearerValidatorCallbackHandler), and the job's settings — in the
Java client's names, ``clientId``/``clientSecret`` in ``sasl.jaas.config`` — reach librdkafka's
``oidc`` method (the direct path) and Spark's Java client with Kafka's login callback handler
(the cached path). Each run gives the test driver's answer; a wrong secret is refused by the
token endpoint and the job's start says the broker could not be reached, naming no secret."""

from __future__ import annotations

import logging
import uuid

import pytest
from oidc_provider import OidcProvider
from runtime.support import (
    dedup_topology,
    expected_with_the_test_driver,
    job_config,
    make_input,
    read_topic,
)

from streamplatform.kafka import LocalBroker, TopicSpec, create_topics
from streamplatform.runtime.microbatch import StreamingJob

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a broker and a token endpoint of its own

CLIENT, SECRET = "orders-job", "oidc-client-secret-7f3a"
OAUTH = "org.apache.kafka.common.security.oauthbearer"


def oidc_settings(base: dict, token_url: str, secret: str = SECRET) -> dict:
    """``base`` (bootstrap and TLS) with OIDC client credentials, as a team writes them for
    Kafka Streams."""
    return base | {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": token_url,
        "sasl.login.callback.handler.class": f"{OAUTH}.OAuthBearerLoginCallbackHandler",
        "sasl.jaas.config": f'{OAUTH}.OAuthBearerLoginModule required clientId="{CLIENT}" '
        f'clientSecret="{secret}" scope="kafka";',
    }


@pytest.fixture(scope="module")
def oidc(tmp_path_factory):
    with OidcProvider({CLIENT: SECRET}, audience="kafka") as provider:
        validator = {
            "listener.name.client.oauthbearer.sasl.jaas.config":
                f"{OAUTH}.OAuthBearerLoginModule required;",
            "listener.name.client.oauthbearer.sasl.server.callback.handler.class":
                f"{OAUTH}.OAuthBearerValidatorCallbackHandler",
            "sasl.oauthbearer.jwks.endpoint.url": provider.jwks_url,
            "sasl.oauthbearer.expected.audience": "kafka",
        }  # fmt: skip
        allowed = {"org.apache.kafka.sasl.oauthbearer.allowed.urls": provider.jwks_url}
        directory = tmp_path_factory.mktemp("oidc") / "broker"
        with LocalBroker(directory, security="sasl_ssl", properties=validator,
                         system_properties=allowed) as broker:  # fmt: skip
            tls = {k: v for k, v in broker.client_settings().items() if not k.startswith("sasl.")}
            yield provider, broker, oidc_settings(tls, provider.token_url)


@pytest.mark.parametrize("path", ["direct-driver", "cached"])
def test_a_job_authenticates_with_oidc_client_credentials(spark, oidc, tmp_path, path, caplog):
    provider, broker, settings = oidc
    admin = broker.admin_settings
    source, out = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(admin, [TopicSpec(source, 3), TopicSpec(out, 1), TopicSpec(f"{source}-dlq", 1)])
    sent = make_input(admin, source)
    overrides = {"platform.max.records.per.batch": 100_000}
    if path == "cached":  # Spark's Kafka source: Kafka's Java login callback handler
        overrides["platform.sink.driver.max.records"] = 0
    config = job_config(settings, tmp_path, f"oidc-{uuid.uuid4().hex[:6]}", source,
                        **overrides) | settings  # fmt: skip
    issued = provider.issued[CLIENT]
    caplog.set_level(logging.DEBUG, logger="streamplatform")
    job = StreamingJob(dedup_topology(source, out), config, spark=spark)
    try:
        results = job.run_until_caught_up()
    finally:
        job.close()
    assert {r.path for r in results} == {path}
    got = sorted((r.key, r.value) for r in read_topic(settings, out))
    assert got == expected_with_the_test_driver(source, sent)
    assert provider.issued[CLIENT] > issued  # the clients fetched tokens from the endpoint
    assert SECRET not in caplog.text and SECRET not in repr(job.config)


def test_a_wrong_client_secret_is_refused_at_the_token_endpoint(spark, oidc, tmp_path):
    provider, broker, settings = oidc
    wrong = oidc_settings(settings, provider.token_url, secret="not-the-secret")
    source = f"in-{uuid.uuid4().hex[:8]}"
    create_topics(broker.admin_settings, [TopicSpec(source, 1), TopicSpec(f"{source}-dlq", 1)])
    refused = provider.refused[CLIENT]
    config = job_config(wrong, tmp_path, f"oidc-{uuid.uuid4().hex[:6]}", source) | wrong
    with pytest.raises(ConnectionError) as failed:
        StreamingJob(dedup_topology(source, "out"), config, spark=spark)
    assert provider.refused[CLIENT] > refused
    message = str(failed.value)
    assert "cannot reach Kafka" in message
    assert f"the token endpoint {provider.token_url} refused clientId={CLIENT}: HTTP 401" in message
    assert "not-the-secret" not in message
