"""Errors of the network service, and how any HistoryError crosses the wire and back.

The server sends a refused or failed request as a Flight error whose ``extra_info`` is a small
JSON object naming the ``HistoryError`` subclass and its message; the client raises that very
class again, so remote callers catch the same errors as local ones.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from history_pipeline import errors as core_errors
from history_pipeline.errors import HistoryError


class ServiceError(HistoryError):
    """The history service failed to answer (a server-side fault, not a problem with the query)."""


class AuthenticationError(ServiceError):
    """The request carries no bearer token, or one this server does not know."""


class InvalidRequestError(ServiceError):
    """A request message is malformed (unknown operation, missing or mistyped field)."""


class LimitExceededError(ServiceError):
    """A request was refused or stopped by one of the server's limits."""


class ResultTooLargeError(LimitExceededError):
    """The answer is larger than the server's result-size limit (rows or bytes)."""


class QueryTimeoutError(LimitExceededError):
    """The query ran longer than the server's time limit and was cancelled."""


class ConcurrencyLimitError(LimitExceededError):
    """The tenant already runs as many queries as the server allows at once."""


class ServiceUnavailableError(ServiceError):
    """The server cannot be reached, or is shutting down."""


def _known_errors() -> dict[str, type[HistoryError]]:
    found: dict[str, type[HistoryError]] = {}
    for namespace in (vars(core_errors), globals()):
        for name, value in namespace.items():
            if isinstance(value, type) and issubclass(value, HistoryError):
                found[name] = value
    return found


def error_payload(exc: BaseException) -> bytes:
    """The wire form of an error: the HistoryError class name and its message."""
    name = type(exc).__name__ if isinstance(exc, HistoryError) else ServiceError.__name__
    message = str(exc) if isinstance(exc, HistoryError) else f"internal error ({type(exc).__name__}): {exc}"
    return json.dumps({"error": name, "message": message}).encode()


def error_from_payload(payload: bytes | None, fallback: type[HistoryError], message: str) -> HistoryError:
    """The HistoryError a payload names (``fallback`` with ``message`` when it names none we know)."""
    name, text = None, message
    if payload:
        try:
            body = json.loads(payload)
            name, text = body.get("error"), body.get("message", message)
        except (ValueError, AttributeError):
            pass
    cls = _known_errors().get(name or "", fallback)
    # several HistoryError subclasses take structured constructor arguments; the message is
    # already complete, so build the instance around it alone
    error = cls.__new__(cls)
    Exception.__init__(error, text)
    return error


#: an absolute file path of two or more parts (a bug's message may quote one: where the server's
#: files or libraries live is nothing a client needs to know)
_PATH_RE = re.compile(r"(?<![\w:/.])/(?:[\w.@+~-]+/)+[\w.@+~*-]*")


def redact(message: str, roots: Iterable[str], any_path: bool = False) -> str:
    """``message`` with every storage root in ``roots`` written ``<root>`` (and, with ``any_path``,
    every other absolute path ``<path>``), so that no error shows where the server keeps its files."""
    for root in roots:
        for form in {root.rstrip("/"), os.path.realpath(root).rstrip("/")} if "://" not in root else {root}:
            if len(form) > 1:
                message = message.replace(form, "<root>")
    return _PATH_RE.sub("<path>", message) if any_path else message
