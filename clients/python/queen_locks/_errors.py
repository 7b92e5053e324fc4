"""The exceptions of queen_locks. Bad arguments raise ValueError or
TypeError before any call is made."""


class QueenLocksError(Exception):
    """Base of every error the route or a handle raises."""


class RouteError(QueenLocksError):
    """The route refused the call (an answer other than 200): nothing of it
    was applied. ``field`` and ``index`` name what was wrong when the route
    says."""

    def __init__(self, code, message, field=None, index=None):
        super().__init__(f"the route answered {code}: {message}")
        self.code = code
        self.message = message
        self.field = field
        self.index = index


class Unavailable(QueenLocksError):
    """The route did not answer (connection error, timeout, 503). The call
    may or may not have been applied: the same call again, with the same
    owner, converges. Handles keep their owner, so simply try again."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class LockLost(QueenLocksError):
    """The server says the permit is no longer ours (it expired, was deleted
    by hand, or was taken over)."""

    def __init__(self, name, reason):
        super().__init__(f"lock {name!r} was lost ({reason})")
        self.name = name
        self.reason = reason


class NotAcquired(QueenLocksError):
    """Raised when entering ``with handle`` or ``with handle.run(...)`` and
    the lock could not be had in time. ``reason`` is ``held`` or
    ``contended``; ``holders`` lists who held it."""

    def __init__(self, name, reason, holders):
        who = ", ".join(f"{h.get('owner')} (slot {h.get('slot')})" for h in holders) or "nobody listed"
        super().__init__(f"lock {name!r} not acquired: {reason}; held by {who}")
        self.name = name
        self.reason = reason
        self.holders = holders
