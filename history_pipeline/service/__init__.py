"""The HistoryService over the network (Arrow Flight): a server for many tenants and a thin client.

``server.py`` answers, ``client.py`` asks, ``protocol.py`` holds the messages and their Arrow
forms; ``auth.py``, ``limits.py`` and ``config.py`` are pure pieces the server is made of;
``workers.py`` runs queries in processes that can be killed when they exceed their time.
"""

from history_pipeline.service.client import HistoryClient, connect
from history_pipeline.service.errors import (
    AuthenticationError,
    ConcurrencyLimitError,
    InvalidRequestError,
    LimitExceededError,
    QueryTimeoutError,
    ResultTooLargeError,
    ServiceError,
    ServiceUnavailableError,
)

__all__ = [
    "AuthenticationError",
    "ConcurrencyLimitError",
    "HistoryClient",
    "InvalidRequestError",
    "LimitExceededError",
    "QueryTimeoutError",
    "ResultTooLargeError",
    "ServiceError",
    "ServiceUnavailableError",
    "connect",
]
