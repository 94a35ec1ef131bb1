"""KafkaResource: where the brokers are and how to authenticate, for every Kafka client.

Locally nothing needs configuring: with ``bootstrap_servers`` empty, the resource finds the
broker that ``streamplatform broker start`` (or ``make ui``) runs under ``.data/broker``. On a
real cluster set ``KAFKA_BOOTSTRAP_SERVERS`` and, as needed, ``KAFKA_SECURITY_PROTOCOL``,
``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD`` and
``KAFKA_SSL_CA_LOCATION`` (see :func:`kafka_from_env`).
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg
from pydantic import Field

from streamplatform.kafka import end_offsets
from streamplatform.kafka.local_broker import default_data_dir, running_broker

# Resource field -> (environment variable, Kafka setting).
_FROM_ENV = {
    "bootstrap_servers": ("KAFKA_BOOTSTRAP_SERVERS", "bootstrap.servers"),
    "security_protocol": ("KAFKA_SECURITY_PROTOCOL", "security.protocol"),
    "sasl_mechanism": ("KAFKA_SASL_MECHANISM", "sasl.mechanism"),
    "sasl_username": ("KAFKA_SASL_USERNAME", "sasl.username"),
    "sasl_password": ("KAFKA_SASL_PASSWORD", "sasl.password"),
    "ssl_ca_location": ("KAFKA_SSL_CA_LOCATION", "ssl.ca.location"),
}


class KafkaResource(dg.ConfigurableResource):
    """Kafka connection settings, in Kafka's own names once :meth:`settings` is called."""

    bootstrap_servers: str = Field(
        default="",
        description="host:port,... Empty: the local broker of `streamplatform broker start`.",
    )
    security_protocol: str | None = Field(default=None, description="security.protocol")
    sasl_mechanism: str | None = Field(default=None, description="sasl.mechanism")
    sasl_username: str | None = Field(default=None, description="sasl.username")
    sasl_password: str | None = Field(default=None, description="sasl.password")
    ssl_ca_location: str | None = Field(default=None, description="ssl.ca.location")
    extra: dict[str, str] = Field(
        default_factory=dict, description="More client settings (ssl.*, sasl.*, client.id)."
    )

    def settings(self) -> dict[str, Any]:
        """Connection settings for StreamsConfig and the confluent-kafka helpers."""
        servers = self.bootstrap_servers or _local_broker()
        settings: dict[str, Any] = {"bootstrap.servers": servers}
        for name, (_, setting) in _FROM_ENV.items():
            value = getattr(self, name)
            if name != "bootstrap_servers" and value:
                settings[setting] = value
        return settings | dict(self.extra)

    def end_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` of ``topic``."""
        return end_offsets(self.settings(), topic)


def _local_broker() -> str:
    state = running_broker()
    if state is None:
        raise ConnectionError(
            "No Kafka broker configured and none running locally: set KAFKA_BOOTSTRAP_SERVERS, "
            f"or start one with `.venv/bin/streamplatform broker start` (data in "
            f"{default_data_dir()}), or run `make ui`."
        )
    return state.bootstrap_servers


def kafka_from_env() -> KafkaResource:
    """The resource with every field whose environment variable is set read from it (as a
    Dagster EnvVar, so the UI shows where it comes from and never shows the password)."""
    given = {name: dg.EnvVar(env) for name, (env, _) in _FROM_ENV.items() if os.environ.get(env)}
    return KafkaResource(**given)
