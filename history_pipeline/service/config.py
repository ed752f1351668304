"""The server's configuration: where, which tenants, what limits, TLS. Read from a TOML file.

    root = "data"                   # the storage root every tenant's database lives under
    host = "127.0.0.1"
    port = 8815
    workers = 4                     # worker processes answering queries (server-wide)
    batch_rows = 65536              # rows per streamed Arrow record batch
    row_cache_mib = 256             # decoded row groups kept for point lookups (0: none)
    tls_cert = "server.pem"         # both or neither: PEM certificate chain and private key
    tls_key = "server.key"

    [limits]                        # every tenant's, unless its own section overrides them
    max_result_rows = 5000000
    max_result_bytes = 536870912
    query_timeout_s = 60
    max_concurrent_queries = 4

    [tenants.tenant_a]
    database = "tenant_a"           # default: the tenant's name
    token_sha256 = "<64 hex digits>"  # `history-pipeline serve --hash-token` prints it
    max_concurrent_queries = 2      # optional: any [limits] key
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from history_pipeline.service.auth import Tenant, TenantDirectory
from history_pipeline.service.limits import Limits
from history_pipeline.supertable.row_cache import ROW_CACHE_BYTES

_LIMIT_KEYS = {f.name for f in fields(Limits)}


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs to start."""

    root: str
    tenants: tuple[Tenant, ...]
    host: str = "127.0.0.1"
    port: int = 8815
    limits: Limits = field(default_factory=Limits)
    workers: int = 4
    batch_rows: int = 65_536
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    #: MiB of decoded row groups the server keeps for point lookups (``supertable.row_cache``)
    row_cache_mib: int = ROW_CACHE_BYTES // 2**20

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key (PEM), or neither")
        if not self.tenants:
            raise ValueError("the server has no tenants: add a [tenants.<name>] section with a token_sha256")
        TenantDirectory.of(self.tenants)  # refuses shared tokens now rather than at the first request
        for tenant in self.tenants:
            self.limits_of(tenant)  # refuses unknown limit names

    @property
    def scheme(self) -> str:
        """``grpc+tls`` when TLS is configured, else ``grpc``."""
        return "grpc+tls" if self.tls_cert is not None else "grpc"

    def limits_of(self, tenant: Tenant) -> Limits:
        """The limits that apply to one tenant."""
        return self.limits.with_overrides(tenant.limits)

    def with_overrides(self, **changes: Any) -> ServerConfig:
        """This configuration with some fields replaced (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class ConfigKey:
    """One key of the configuration file, as ``serve --help`` lists it."""

    key: str
    default: str
    meaning: str


#: every key the configuration file accepts: config_from_mapping reads these and ``serve --help``
#: lists them, so the two cannot drift apart
CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("root", '"data"', "the storage root every tenant's database lives under"),
    ConfigKey("host", f'"{ServerConfig.host}"', "the address to listen on"),
    ConfigKey("port", f"{ServerConfig.port}", "the port to listen on (0: any free port)"),
    ConfigKey("workers", f"{ServerConfig.workers}", "worker processes answering queries (server-wide)"),
    ConfigKey("batch_rows", f"{ServerConfig.batch_rows}", "rows per streamed Arrow record batch"),
    ConfigKey("row_cache_mib", f"{ServerConfig.row_cache_mib}",
              "MiB of decoded row groups kept for point lookups, all tenants together (0: none)"),
    ConfigKey("tls_cert", "none", "PEM certificate chain (with tls_key; relative to the file)"),
    ConfigKey("tls_key", "none", "PEM private key (with tls_cert)"),
    ConfigKey("limits", "", "[limits] table: every tenant's limits, unless its own section overrides them"),
    ConfigKey("limits.max_result_rows", f"{Limits.max_result_rows}", "most rows one answer may have"),
    ConfigKey("limits.max_result_bytes", f"{Limits.max_result_bytes}", "most bytes one answer may have"),
    ConfigKey("limits.query_timeout_s", f"{Limits.query_timeout_s:g}", "seconds a query may run"),
    ConfigKey("limits.max_concurrent_queries", f"{Limits.max_concurrent_queries}",
              "queries one tenant may run at once"),
    ConfigKey("tenants", "", "[tenants.<name>] tables, one per tenant (at least one)"),
    ConfigKey("tenants.<name>.database", "<name>", "the tenant's database under root"),
    ConfigKey("tenants.<name>.token_sha256", "required",
              "SHA-256 of the tenant's token (`serve --hash-token` prints it)"),
    ConfigKey("tenants.<name>.<limit>", "[limits]'s", "any limits key, for this tenant only"),
)

_TOP_KEYS = frozenset(k.key for k in CONFIG_KEYS if "." not in k.key)
_TENANT_KEYS = frozenset(
    k.key.rsplit(".", 1)[1] for k in CONFIG_KEYS if k.key.startswith("tenants.<name>.") and "<limit>" not in k.key
)


def config_help() -> str:
    """The configuration file's keys, defaults and meanings, one aligned line each."""
    width = max(len(k.key) for k in CONFIG_KEYS)
    dwidth = max(len(k.default) for k in CONFIG_KEYS)
    lines = ["configuration file (TOML) keys:"]
    lines += [f"  {k.key:<{width}}  {k.default:<{dwidth}}  {k.meaning}" for k in CONFIG_KEYS]
    return "\n".join(lines)



def _read_pem(base: Path, value: Any, key: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be the path of a PEM file, got {value!r}")
    path = Path(value) if Path(value).is_absolute() else base / value
    return path.read_bytes()


def config_from_mapping(data: Mapping[str, Any], base: Path = Path(".")) -> ServerConfig:
    """A ServerConfig from parsed TOML (relative PEM paths are resolved against ``base``)."""
    known = _TOP_KEYS
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown server settings {sorted(unknown)}; known: {sorted(known)}")
    tenants = []
    sections = data.get("tenants") or {}
    if not isinstance(sections, Mapping):  # ([[tenants]], a list, failed with an AttributeError)
        raise ValueError("tenants are tables [tenants.<name>] with a token_sha256, not a list")
    for name, section in sections.items():
        if not isinstance(section, Mapping):
            raise ValueError(f"tenant {name!r} must be a table [tenants.{name}] with a token_sha256, not {section!r}")
        if "token_sha256" not in section:
            raise ValueError(f"tenant {name!r} has no token_sha256")
        for key in ("token_sha256", "database"):
            if not isinstance(section.get(key, ""), str):
                raise ValueError(f"tenant {name!r}: {key} must be a string, got {section[key]!r}")
        extra = set(section) - _TENANT_KEYS - _LIMIT_KEYS
        if extra:
            raise ValueError(f"tenant {name!r}: unknown settings {sorted(extra)}")
        tenants.append(
            Tenant(
                name=name,
                database=section.get("database", name),
                token_sha256=section["token_sha256"],
                limits={k: v for k, v in section.items() if k in _LIMIT_KEYS},
            )
        )
    return ServerConfig(
        root=str(data.get("root", "data")),
        tenants=tuple(tenants),
        host=data.get("host", ServerConfig.host),
        port=_integer(data, "port", ServerConfig.port),
        limits=Limits().with_overrides(data.get("limits") or {}),
        workers=_integer(data, "workers", ServerConfig.workers, least=1),
        batch_rows=_integer(data, "batch_rows", ServerConfig.batch_rows, least=1),
        row_cache_mib=_integer(data, "row_cache_mib", ServerConfig.row_cache_mib),
        tls_cert=_read_pem(base, data.get("tls_cert"), "tls_cert"),
        tls_key=_read_pem(base, data.get("tls_key"), "tls_key"),
    )


def _integer(data: Mapping[str, Any], key: str, default: int, least: int = 0) -> int:
    value = data.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be an integer, got {value!r}") from None
    if number < least:
        raise ValueError(f"{key} must be at least {least}, got {value!r}")
    return number


def load_config(path: str | Path) -> ServerConfig:
    """Read a server configuration file (TOML)."""
    path = Path(path)
    with path.open("rb") as f:
        return config_from_mapping(tomllib.load(f), path.parent)
