"""Handles: one holder's lock or semaphore permit, renewed in the background
until it is released or lost."""

import datetime
import logging
import math
import os
import random
import re
import secrets
import socket
import threading
import time
import unicodedata

from ._errors import LockLost, NotAcquired, QueenLocksError, RouteError, Unavailable
from ._route import CALL_TIMEOUT, MAX_WAIT_SECONDS, Route

log = logging.getLogger("queen_locks")

# Why a handle lost its lock, as on_lost reports it.
LOST_RENEW = "renew"  # the server answered that the permit is no longer ours
LOST_GUARD = "guard"  # a check of the handle's token failed
LOST_EXPIRED = "expired"  # the lifetime passed on this machine's clock without a renew getting through

# The label that opts a Kubernetes object in to fencing, and the annotation
# every write to it carries (docs/fencing.md).
GUARDED_LABEL = "locks.queen.dev/guarded"
GUARD_ANNOTATION = "locks.queen.dev/guard"

MAX_NAME_BYTES = 256
MAX_OWNER_BYTES = 256
MAX_TTL_SECONDS = 31536000
MAX_LIMIT = 1024

# Polling between tries when the route cannot wait for us: 100 ms doubling to 1 s.
_POLL_FIRST, _POLL_MAX = 0.1, 1.0
# A release that gets no answer is retried for at most this long.
_RELEASE_RETRY = 10.0
# How often acquire asks again when a permit the route says is already ours
# is lost before it could be renewed.
_ALREADY_TRIES = 3


def mint_owner():
    """An owner unique to this process and call: host:pid:random."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def validate_name(name):
    """Raises ValueError or TypeError when name is not a valid lock name
    (1 to 256 bytes of UTF-8, no control character, no '#')."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, got {type(name).__name__}")
    if name == "":
        raise ValueError("lock name: must not be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"lock name {name!r}: must be valid UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(f"lock name: must be at most {MAX_NAME_BYTES} bytes, got {size}")
    for i, c in enumerate(name):
        if c == "#":
            raise ValueError(f"lock name {name!r}: must not contain '#' (character {i})")
        if unicodedata.category(c) == "Cc":
            raise ValueError(f"lock name {name!r}: must not contain a control character (U+{ord(c):04X} at character {i})")


def seconds(value, what, minimum=0.0, maximum=None):
    """value (seconds as a number, or a timedelta) as float seconds."""
    if isinstance(value, datetime.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        s = float(value)
    else:
        raise TypeError(f"{what} must be seconds (a number) or a timedelta, got {type(value).__name__}")
    if not math.isfinite(s) or s < minimum or (maximum is not None and s > maximum):
        bound = f"from {minimum:.10g}s" + (f" to {maximum:.10g}s" if maximum is not None else "")
        raise ValueError(f"{what} must be {bound}, got {value!r}")
    return s


def _parse_time(s):
    """An RFC 3339 time of the route (microseconds, Z) as an aware datetime."""
    if not s:
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", s)
    if not m:
        return None
    frac = (m.group(2) or "").ljust(6, "0")[:6]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.datetime.fromisoformat(f"{m.group(1)}.{frac}{zone}")


def _jitter(poll, left):
    # Jitter spreads waiters out, so they do not all ask at once.
    return min(poll / 2 + random.uniform(0, poll), left)


class Client:
    """Makes handles over the route.

    url defaults to $QUEEN_LOCKS_URL (a bare http://host:port gets
    /api/v1/locks); token_file to $QUEEN_LOCKS_TOKEN_FILE, else the projected
    token at /var/run/secrets/queen-locks/token when it exists (re-read when
    it changes); namespace, when None, is left to the route (the token's
    ServiceAccount namespace); ca_file verifies an https route.
    """

    def __init__(self, url=None, namespace=None, token_file=None, ca_file=None):
        if url is None:
            url = os.environ.get("QUEEN_LOCKS_URL")
        if token_file is None:
            token_file = os.environ.get("QUEEN_LOCKS_TOKEN_FILE") or None
        self._route = Route(url, namespace=namespace, token_file=token_file, ca_file=ca_file)

    @property
    def url(self):
        return self._route.url

    @property
    def namespace(self):
        return self._route.namespace

    def lock(self, name, ttl, owner=None):
        """A handle on the lock name: one holder at a time, for ttl (seconds
        or a timedelta), renewed in the background while held."""
        return self.semaphore(name, 1, ttl, owner=owner)

    def semaphore(self, name, n, ttl, owner=None):
        """A handle on one of n permits of name."""
        return Handle(self._route, name, n, ttl, owner)

    def holders(self, name):
        """Who holds name now: the route's holders, as dicts."""
        validate_name(name)
        return self._route.get(name).get("holders") or []


class _Lease:
    """One acquisition: what the server last answered about our permit."""

    def __init__(self, slot, token, deadline, answer):
        self.slot = slot
        self.token = token
        self.deadline = deadline  # time.monotonic() when we must assume it is over
        self.expires_at = _parse_time(answer.get("expiresAt"))
        self.guard = answer.get("guard")
        self.held = True
        self.renew_seq = 0  # renews sent so far
        self.renewing = None  # while a renew is in flight: an Event set when it has answered
        self.stop = threading.Event()  # set to end the renew and watch threads
        self.renewer = None


class Handle:
    """One holder's view of a lock or a semaphore permit.

    Its properties, check(), on_lost() and on_renew() are safe to use from
    any thread; acquire() and release() are meant for the holder's own.
    """

    def __init__(self, route, name, limit, ttl, owner=None):
        validate_name(name)
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise TypeError(f"semaphore size n must be an int, got {type(limit).__name__}")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"semaphore size n must be from 1 to {MAX_LIMIT}, got {limit}")
        self._ttl = seconds(ttl, "ttl", minimum=1, maximum=MAX_TTL_SECONDS)
        if owner is not None:
            if not isinstance(owner, str) or not owner or len(owner.encode("utf-8", "replace")) > MAX_OWNER_BYTES:
                raise ValueError(f"owner must be a str of 1 to {MAX_OWNER_BYTES} bytes, got {owner!r}")
        self._route = route
        self._name = name
        self._limit = limit
        self._owner = owner or mint_owner()
        # The server counts whole seconds; our own deadline uses the exact
        # ttl, which is never later.
        self._ttl_seconds = math.ceil(self._ttl)
        self._op = threading.Lock()  # one acquire or release at a time
        self._mu = threading.Lock()  # the fields below
        self._cond = threading.Condition(self._mu)
        self._lease = None
        # An acquire or release got no answer: the route may hold a permit of ours.
        self._unsure = False
        self._reason = None
        self._holders = []
        self._lost = threading.Event()
        self._on_lost = []
        self._on_renew = []

    def __repr__(self):
        return f"<queen_locks.Handle {self._name!r} limit={self._limit} owner={self._owner!r} held={self.held}>"

    # What the handle is.

    @property
    def name(self):
        return self._name

    @property
    def limit(self):
        return self._limit

    @property
    def ttl(self):
        """The lifetime, in seconds."""
        return self._ttl

    @property
    def owner(self):
        return self._owner

    # What it holds. Read token when you use it: every renew changes it.

    @property
    def held(self):
        with self._mu:
            return self._lease is not None and self._lease.held

    @property
    def token(self):
        """The current fencing token (None before the first acquire)."""
        with self._mu:
            return self._lease.token if self._lease else None

    @property
    def slot(self):
        """The permit's slot: always 0 for a lock (None before the first acquire)."""
        with self._mu:
            return self._lease.slot if self._lease else None

    @property
    def expires_at(self):
        """When the server will count the permit expired, by its clock, as
        of the last answer (an aware datetime)."""
        with self._mu:
            return self._lease.expires_at if self._lease else None

    @property
    def reason(self):
        """Why the last acquire failed (held, contended) or why the lock was
        lost (renew, guard, expired)."""
        with self._mu:
            return self._reason

    @property
    def holders(self):
        """Who held the lock when the last acquire answered held."""
        with self._mu:
            return list(self._holders)

    @property
    def lost(self):
        """A threading.Event set when the held lock is lost (not when it is
        released). A new acquire after a loss makes a new one."""
        with self._mu:
            return self._lost

    def guard(self):
        """The guard object of the last acquire or renew answer: the check
        that fences a write with the current token. None before the first
        acquire."""
        with self._mu:
            return dict(self._lease.guard) if self._lease and self._lease.guard else None

    def guard_metadata(self):
        """The label and annotation that fence a Kubernetes write with the
        current token, as metadata to merge into the object's:

            {"labels": {"locks.queen.dev/guarded": "true"},
             "annotations": {"locks.queen.dev/guard": "<lock>#<slot>=<token>"}}

        Call it for each write, right before sending: every renew changes the
        token. None while nothing is held. A write refused with
        kv_precondition after this answered means the lock may be lost: the
        next check() (or renew) tells."""
        with self._mu:
            lease = self._lease
            if lease is None or not lease.held:
                return None
            return {
                "labels": {GUARDED_LABEL: "true"},
                "annotations": {GUARD_ANNOTATION: f"{self._name}#{lease.slot}={lease.token}"},
            }

    def on_lost(self, callback):
        """Calls callback(reason) whenever a held lock is lost; reason is
        renew, guard or expired. It runs on the handle's thread: keep it short."""
        with self._mu:
            self._on_lost.append(callback)
        return callback

    def on_renew(self, callback):
        """Calls callback(token) after each renew that got through."""
        with self._mu:
            self._on_renew.append(callback)
        return callback

    # Acquire and release.

    def acquire(self, wait=None):
        """Takes the lock, waiting up to wait (seconds or a timedelta; None
        or 0: one try). Answers False when somebody else held it for the
        whole wait (reason and holders say more).

        A call that got no answer is retried within the wait with the same
        owner, so one that did land comes back as already ours; without a
        wait it raises Unavailable, and calling acquire again is safe.
        """
        wait = 0.0 if wait is None else seconds(wait, "wait")
        with self._op:
            if self.held:
                return True
            give_up = time.monotonic() + wait
            poll = _POLL_FIRST
            while True:
                left = give_up - time.monotonic()
                try:
                    won, waited = self._try(self._wait_seconds(left))
                    if won:
                        return True
                    failure = None
                except Unavailable as e:
                    won, waited, failure = False, 0, e
                left = give_up - time.monotonic()
                if left <= 0:
                    if failure is not None:
                        raise failure
                    return False
                if waited:
                    # The route waited for us and a slot did not free (or was
                    # taken first): ask again at once.
                    poll = _POLL_FIRST
                    continue
                time.sleep(_jitter(poll, left))
                poll = min(poll * 2, _POLL_MAX)

    def _wait_seconds(self, left):
        """How long one acquire call may wait at the route: whole seconds, at
        most 60, and at most a third of the lifetime, so the lifetime we
        count from when the call was sent still has two thirds left when
        the answer comes; 0 means poll."""
        if not self._route.takes_wait:
            return 0
        return max(0, min(MAX_WAIT_SECONDS, int(left), int(self._ttl // 3)))

    def _try(self, wait_seconds):
        """One acquire call. Answers (won, the call waited at the route)."""
        for _ in range(_ALREADY_TRIES):
            sent = time.monotonic()
            try:
                r, asked = self._route.acquire(self._name, self._owner, self._ttl_seconds, self._limit, wait_seconds)
            except Unavailable:
                self._set_unsure()
                raise
            took = time.monotonic() - sent
            if not r.get("acquired"):
                # The route answers already, not held, to an owner that
                # holds a permit: this one holds none.
                with self._mu:
                    self._reason = r.get("reason")
                    self._holders = r.get("holders") or []
                    self._unsure = False
                return False, asked > 0 and took >= asked
            if not r.get("already"):
                self._start(int(r.get("slot", 0)), int(r["token"]), sent, r)
                return True, False
            # The permit was already ours: an earlier acquire whose answer
            # was lost, or a release that did not get through. Its lifetime
            # was counted from a write we may never have seen, and expiresAt
            # is a reading of the server's wall clock, which cannot be
            # compared with ours. So renew it at once and count from when
            # that renew was sent, on our monotonic clock.
            slot, token = int(r.get("slot", 0)), int(r["token"])
            sent = time.monotonic()
            try:
                rn = self._route.renew(self._name, slot, token, self._owner, self._ttl_seconds, timeout=CALL_TIMEOUT)
            except Unavailable:
                self._set_unsure()
                raise
            if rn.get("renewed"):
                self._start(slot, int(rn["token"]), sent, rn)
                return True, False
            # It expired or was deleted between the two answers: ask again.
        raise QueenLocksError(f"acquiring {self._name!r}: a permit the route said was ours was lost "
                              f"{_ALREADY_TRIES} times before it could be renewed")

    def _set_unsure(self):
        with self._mu:
            self._unsure = True

    def _start(self, slot, token, sent, answer):
        """Records a won permit, its deadline counted from sent, and starts
        renewing it."""
        lease = _Lease(slot, token, sent + self._ttl, answer)
        with self._mu:
            if self._lost.is_set():
                self._lost = threading.Event()
            self._lease, self._reason, self._holders, self._unsure = lease, None, [], False
        lease.renewer = threading.Thread(target=self._renew, args=(lease,), daemon=True,
                                         name=f"queen-locks-renew {self._name}")
        watch = threading.Thread(target=self._watch, args=(lease,), daemon=True,
                                 name=f"queen-locks-watch {self._name}")
        lease.renewer.start()
        watch.start()

    def release(self):
        """Stops renewing and releases the permit. A no-op when nothing is
        held. Raises LockLost when the server says it was no longer ours,
        Unavailable when the route did not answer for a while (the permit
        then ends with its lifetime)."""
        with self._op:
            with self._mu:
                lease, unsure = self._lease, self._unsure
                holding = lease is not None and lease.held
                if holding:
                    lease.stop.set()
                    self._cond.notify_all()
            if not holding:
                if unsure:
                    self._release_unsure()
                return
            if lease.renewer is not threading.current_thread():
                lease.renewer.join()  # an in-flight renew has landed or failed; its token is recorded
            with self._mu:
                if not lease.held:  # lost while we waited
                    return
                lease.held = False
                slot, token = lease.slot, lease.token
                give_up = min(lease.deadline, time.monotonic() + _RELEASE_RETRY)
            poll, unanswered = _POLL_FIRST, False
            while True:
                try:
                    r = self._route.release(self._name, slot, token, self._owner,
                                            timeout=max(0.1, min(CALL_TIMEOUT, give_up - time.monotonic())))
                    break
                except Unavailable:
                    left = give_up - time.monotonic()
                    if left <= 0:
                        self._set_unsure()
                        raise
                    unanswered = True
                    time.sleep(_jitter(poll, left))
                    poll = min(poll * 2, _POLL_MAX)
            # After a release whose answer was lost, "lost" may mean that one landed.
            if not r.get("released") and not unanswered:
                raise LockLost(self._name, r.get("reason") or "lost")

    def _release_unsure(self):
        """Releases the permits of our owner that an unanswered call may have
        left: we never learnt their slot and token, so ask the route."""
        for h in self._route.get(self._name).get("holders") or []:
            if h.get("owner") == self._owner:
                # Not ours any more is as good as released here.
                self._route.release(self._name, h["slot"], h["token"], self._owner)
        with self._mu:
            self._unsure = False

    def check(self):
        """Asks the server whether the handle's token is still the permit's.
        When it is not, the lock counts as lost with reason guard. False when
        nothing is held."""
        while True:
            with self._mu:
                lease = self._lease
                if lease is None or not lease.held:
                    return False
                token, seq, inflight = lease.token, lease.renew_seq, lease.renewing
            if self._route.check(self._name, lease.slot, token).get("ok"):
                return True
            # Only a check of the token the lease still has counts. A renew
            # that overlapped the check may have moved the permit to a new
            # token before we recorded it: wait for its answer and check the
            # token it leaves.
            with self._mu:
                if not lease.held or self._lease is not lease:
                    return False  # released or lost meanwhile
                overlapped = inflight is not None or lease.renew_seq != seq or lease.token != token
                inflight = lease.renewing
            if not overlapped:
                self._lose(lease, LOST_GUARD, token=token)
                return False
            if inflight is not None:
                inflight.wait()

    # Running something under the lock.

    def run(self, fn=None, wait=None):
        """Acquires (waiting up to wait), calls fn(handle), and releases
        after, whatever fn did. Answers False, without calling fn, when the
        lock could not be had in time. fn should watch handle.lost and fence
        what it commits with handle.token.

        Without fn it is a context manager that raises NotAcquired instead:

            with lock.run(wait=10):
                ...
        """
        if fn is None:
            return _Running(self, wait)
        if not callable(fn):
            raise TypeError(f"run: fn must be callable, got {type(fn).__name__}")
        if not self._acquire_or_clean_up(wait):
            return False
        try:
            fn(self)
        except BaseException:
            # fn's exception is the one to see, whatever the release meets.
            self._release_after_run(quiet=True)
            raise
        self._release_after_run()
        return True

    def _acquire_or_clean_up(self, wait):
        """acquire(wait) for run: when it gives up on a route that did not
        answer, release whatever an unanswered acquire may have taken."""
        try:
            return self.acquire(wait)
        except Unavailable:
            try:
                self.release()
            except QueenLocksError as e:
                log.warning("releasing %r after the route did not answer: %s", self._name, e)
            raise

    def __enter__(self):
        return _Running(self, None).__enter__()

    def __exit__(self, *exc):
        return _Running.exit(self, exc[0] is not None)

    def _release_after_run(self, quiet=False):
        try:
            self.release()
        except LockLost:
            pass  # the work has ended; on_lost already told whoever listens
        except Unavailable:
            if not quiet:
                raise
            log.warning("releasing %r: the route did not answer; the permit ends with its lifetime", self._name)

    # The background: renew every third of the lifetime; give up on our clock.

    def _renew(self, lease):
        interval = self._ttl / 3
        retry = max(self._ttl / 10, 0.1)
        with self._mu:
            # Renew while two thirds of the lifetime we count are left.
            next_at = lease.deadline - 2 * interval
        while True:
            with self._mu:
                deadline = lease.deadline
            if lease.stop.wait(max(0.0, min(next_at, deadline) - time.monotonic())):
                return
            if time.monotonic() >= deadline:
                return  # the watch thread counts it lost
            with self._mu:
                lease.renew_seq += 1
                lease.renewing = answered = threading.Event()
            try:
                outcome = self._renew_once(lease, deadline)
            finally:
                with self._mu:
                    lease.renewing = None
                answered.set()
            if outcome is None:
                return
            # After a renew that got through, when two thirds of the new
            # lifetime are left; after one that did not, soon, until the deadline.
            next_at = outcome - 2 * interval if outcome else time.monotonic() + retry

    def _renew_once(self, lease, deadline):
        """Sends one renew with the token of the last answer and records its
        answer. Answers the new deadline, False when it got no answer, None
        when the loop should end."""
        sent = time.monotonic()
        try:
            r = self._route.renew(self._name, lease.slot, lease.token, self._owner, self._ttl_seconds,
                                  timeout=max(0.05, deadline - sent))
        except (Unavailable, RouteError) as e:
            # No answer, or one we cannot act on (a token being rotated,
            # say): keep trying, with the same token, until the deadline.
            log.debug("renewing %r: %s", self._name, e)
            return False
        if not r.get("renewed"):
            self._lose(lease, LOST_RENEW)
            return None
        if time.monotonic() >= deadline:
            # It landed, but we learnt it only after our deadline: by then we
            # had to assume the lease over, and we keep to that.
            self._lose(lease, LOST_EXPIRED)
            return None
        token = int(r["token"])
        with self._mu:
            if not lease.held:
                return None
            if token >= lease.token:
                lease.token = token
                lease.guard = r.get("guard") or lease.guard
                lease.expires_at = _parse_time(r.get("expiresAt")) or lease.expires_at
            lease.deadline = max(lease.deadline, sent + self._ttl)
            new_deadline = lease.deadline
            self._cond.notify_all()
            callbacks = list(self._on_renew)
        for cb in callbacks:
            try:
                cb(token)
            except Exception:
                log.exception("queen_locks on_renew callback of %r", self._name)
        if lease.stop.is_set():
            return None  # release is waiting for us: the token is recorded
        return new_deadline

    def _watch(self, lease):
        with self._cond:
            while lease.held and not lease.stop.is_set():
                left = lease.deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if not lease.held or lease.stop.is_set():
                return
        self._lose(lease, LOST_EXPIRED)

    def _lose(self, lease, reason, token=None):
        """Marks lease lost, once, and tells whoever listens; with a token,
        only while the lease still has that token."""
        with self._mu:
            if not lease.held or (token is not None and lease.token != token):
                return
            lease.held = False
            lease.stop.set()
            self._cond.notify_all()
            self._reason = reason
            event = self._lost
            callbacks = list(self._on_lost)
        event.set()
        for cb in callbacks:
            try:
                cb(reason)
            except Exception:
                log.exception("queen_locks on_lost callback of %r", self._name)


class _Running:
    """The context manager of Handle.run() without fn."""

    def __init__(self, handle, wait):
        self._handle = handle
        self._wait = wait

    def __enter__(self):
        h = self._handle
        if not h._acquire_or_clean_up(self._wait):
            raise NotAcquired(h.name, h.reason, h.holders)
        return h

    def __exit__(self, exc_type, exc, tb):
        return _Running.exit(self._handle, exc_type is not None)

    @staticmethod
    def exit(handle, failing):
        # When the body failed, its exception is the one to see.
        handle._release_after_run(quiet=failing)
        return False
