"""A minimal OIDC provider for the tests: the client-credentials grant at ``/token`` (HTTP Basic
or form credentials, as librdkafka and Kafka's Java client send them) issuing RS256 JWTs, and
their public key at ``/jwks`` for the broker's validator. On 127.0.0.1, in a thread of the
test process; it counts the tokens it issued per client."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class OidcProvider:
    """``with OidcProvider({"client-id": "secret"}, audience="kafka") as provider:``"""

    def __init__(self, clients: dict[str, str], audience: str = "kafka") -> None:
        self.clients = dict(clients)
        self.audience = audience
        self.issued: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks"

    def __enter__(self) -> OidcProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def token(self, client: str, scope: str = "") -> str:
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": "test-key"}
        claims = {"sub": client, "iss": self.url, "aud": self.audience, "iat": now,
                  "exp": now + 3600, "scope": scope}  # fmt: skip
        signed = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self._key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_b64(signature)}"

    def jwks(self) -> dict[str, Any]:
        numbers = self._key.public_key().public_numbers()

        def unsigned(n: int) -> str:
            return _b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))

        key = {"kty": "RSA", "kid": "test-key", "use": "sig", "alg": "RS256",
               "n": unsigned(numbers.n), "e": unsigned(numbers.e)}  # fmt: skip
        return {"keys": [key]}

    def _credentials(self, headers: Any, form: dict[str, list[str]]) -> tuple[str, str]:
        basic = headers.get("Authorization", "")
        if basic.startswith("Basic "):
            user, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
            return urllib.parse.unquote_plus(user), urllib.parse.unquote_plus(secret)
        return form.get("client_id", [""])[0], form.get("client_secret", [""])[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/jwks":
                    self._reply(200, provider.jwks())
                else:
                    self._reply(404, {"error": "not_found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                client, secret = provider._credentials(self.headers, form)
                if self.path.rstrip("/") == "/moved":  # a redirect, to see it is not followed
                    provider.refused["redirected"] += 1
                    self.send_response(302)
                    self.send_header("Location", f"{provider.url}/token")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path.rstrip("/") != "/token":
                    self._reply(404, {"error": "not_found"})
                elif form.get("grant_type", [""])[0] != "client_credentials":
                    self._reply(400, {"error": "unsupported_grant_type"})
                elif provider.clients.get(client) != secret or not secret:
                    provider.refused[client] += 1
                    self._reply(401, {"error": "invalid_client"})
                else:
                    provider.issued[client] += 1
                    scope = form.get("scope", [""])[0]
                    self._reply(200, {"access_token": provider.token(client, scope),
                                      "token_type": "Bearer", "expires_in": 3600})  # fmt: skip

        return Handler
