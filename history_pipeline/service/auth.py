"""Bearer tokens per tenant: how they are stored (hashed) and checked. Pure functions.

Tokens are long random secrets (``new_token``), so a single SHA-256 is the right hash: it cannot
be reversed, and unlike a password hash it costs nothing per request. The server keeps only the
digests; a request's ``authorization: Bearer <token>`` header is hashed and looked up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from history_pipeline.service.errors import AuthenticationError

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Tenant:
    """A tenant of the service: the database it may read and its token's digest."""

    name: str
    database: str
    token_sha256: str
    #: per-tenant overrides of the server's limits (field name -> value)
    limits: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not _DIGEST_RE.match(self.token_sha256):
            raise ValueError(
                f"tenant {self.name!r}: token_sha256 must be 64 lowercase hex digits "
                "(the output of `history-pipeline serve --hash-token`)"
            )


@dataclass(frozen=True)
class TenantDirectory:
    """Every tenant, found by its token's digest."""

    by_digest: Mapping[str, Tenant]

    @staticmethod
    def of(tenants: Iterable[Tenant]) -> TenantDirectory:
        """A directory of tenants; two tenants may not share a token."""
        by_digest: dict[str, Tenant] = {}
        for tenant in tenants:
            if tenant.token_sha256 in by_digest:
                raise ValueError(
                    f"tenants {by_digest[tenant.token_sha256].name!r} and {tenant.name!r} share a token; "
                    "give each tenant its own"
                )
            by_digest[tenant.token_sha256] = tenant
        return TenantDirectory(MappingProxyType(by_digest))

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant an ``authorization`` header value names (AuthenticationError otherwise)."""
        if not authorization:
            raise AuthenticationError(
                "no bearer token: send the header 'authorization: Bearer <token>' (connect(url, token))"
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("the authorization header must be 'Bearer <token>'")
        digest = token_digest(token.strip())
        for known, tenant in self.by_digest.items():
            # constant-time comparison, so timing tells nothing about stored digests
            if hmac.compare_digest(known, digest):
                return tenant
        raise AuthenticationError("unknown bearer token: ask the service operator for this tenant's token")
