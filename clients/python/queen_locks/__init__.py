"""Locks and semaphores with fencing tokens, over the queen-locks route.

    from queen_locks import Client

    client = Client()  # $QUEEN_LOCKS_URL, the projected token at $QUEEN_LOCKS_TOKEN_FILE
    lock = client.lock("daily-report", ttl=30)
    with lock.run(wait=10):  # raises NotAcquired when held elsewhere for 10 s
        write_report(fence=lock.token)  # watch lock.lost; read the token when you use it

Standard library only; Python 3.9 or later.
"""

from ._errors import LockLost, NotAcquired, QueenLocksError, RouteError, Unavailable
from ._handle import (
    GUARD_ANNOTATION,
    GUARDED_LABEL,
    LOST_EXPIRED,
    LOST_GUARD,
    LOST_RENEW,
    MAX_LIMIT,
    MAX_NAME_BYTES,
    MAX_TTL_SECONDS,
    Client,
    Handle,
    mint_owner,
    validate_name,
)
from ._route import DEFAULT_TOKEN_FILE, MAX_WAIT_SECONDS, ROUTE_PATH

__all__ = [
    "Client",
    "Handle",
    "QueenLocksError",
    "RouteError",
    "Unavailable",
    "LockLost",
    "NotAcquired",
    "LOST_RENEW",
    "LOST_GUARD",
    "LOST_EXPIRED",
    "GUARDED_LABEL",
    "GUARD_ANNOTATION",
    "MAX_LIMIT",
    "MAX_NAME_BYTES",
    "MAX_TTL_SECONDS",
    "MAX_WAIT_SECONDS",
    "DEFAULT_TOKEN_FILE",
    "ROUTE_PATH",
    "mint_owner",
    "validate_name",
]
