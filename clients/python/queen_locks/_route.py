"""The route transport: one lock operation per POST /api/v1/locks call."""

import http.client
import json
import os
import socket
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request

from ._errors import QueenLocksError, RouteError, Unavailable

ROUTE_PATH = "/api/v1/locks"
DEFAULT_TOKEN_FILE = "/var/run/secrets/queen-locks/token"

# Answers a proxy or the route gives when the call may or may not have been
# applied: the same call sent again with the same owner converges.
_ANSWERLESS = {502, 503, 504}

# The longest wait one call may carry (SPEC section 6: waitSeconds 0 to 60).
MAX_WAIT_SECONDS = 60

# How long an ordinary call may take before it counts as unanswered.
CALL_TIMEOUT = 30.0


def route_url(url):
    """The route's full address: a bare server URL gets /api/v1/locks."""
    if not url:
        raise ValueError("no route URL: pass url= or set QUEEN_LOCKS_URL (for example http://localhost:6632)")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"route URL {url!r}: must be http:// or https:// with a host")
    if parts.path in ("", "/"):
        parts = parts._replace(path=ROUTE_PATH)
    return urllib.parse.urlunsplit(parts)


class _TokenFile:
    """A bearer token on disk, re-read when the file changes (the kubelet
    rotates projected tokens by swapping a symlink)."""

    def __init__(self, path, required):
        self._path = path
        self._required = required
        self._mu = threading.Lock()
        self._seen = None
        self._token = None

    def read(self):
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            if self._required:
                raise QueenLocksError(f"token file {self._path}: does not exist") from None
            return None
        except OSError as e:
            raise QueenLocksError(f"token file {self._path}: {e}") from e
        seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._mu:
            if seen != self._seen:
                try:
                    with open(self._path, encoding="utf-8") as f:
                        self._token = f.read().strip()
                except OSError as e:
                    raise QueenLocksError(f"token file {self._path}: {e}") from e
                self._seen = seen
            return self._token or None


class Route:
    """Calls the route. Safe for concurrent use."""

    def __init__(self, url, namespace=None, token_file=None, ca_file=None):
        self.url = route_url(url)
        self.namespace = namespace or None
        required = token_file is not None
        self._token = _TokenFile(token_file if required else DEFAULT_TOKEN_FILE, required)
        self._ssl = None
        if ca_file is not None:
            if not os.path.isfile(ca_file):
                raise ValueError(f"CA file {ca_file}: does not exist")
            self._ssl = ssl.create_default_context(cafile=ca_file)
        # Until the route refuses waitSeconds, assume it takes it; once it has,
        # stop sending it and poll instead.
        self._takes_wait = True

    @property
    def takes_wait(self):
        return self._takes_wait

    def call(self, op, timeout=CALL_TIMEOUT):
        """Sends one operation and answers its result (a dict). Raises
        Unavailable when there was no answer, RouteError for any other answer
        than 200."""
        body = {"operations": [op]}
        if self.namespace:
            body["namespace"] = self.namespace
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        token = self._token.read()
        if token:
            headers["Authorization"] = "Bearer " + token
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=max(timeout, 0.05), context=self._ssl) as resp:
                raw = resp.read(4 << 20)
        except urllib.error.HTTPError as e:
            raw = e.read(4 << 20)
            e.close()
            raise self._refusal(e.code, raw) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLCertVerificationError):
                # Asking again will not help: the route is not the one we trust.
                raise QueenLocksError(f"{op['op']} {op['name']!r}: {self.url}: {e.reason.verify_message or e.reason}: "
                                      "the route's certificate is not trusted (pass ca_file)") from e
            raise Unavailable(f"{op['op']} {op['name']!r}: no answer from {self.url}: {_why(e)}") from e
        except (http.client.HTTPException, ConnectionError, socket.timeout, OSError) as e:
            raise Unavailable(f"{op['op']} {op['name']!r}: no answer from {self.url}: {_why(e)}") from e
        try:
            results = json.loads(raw)["results"]
        except (ValueError, KeyError, TypeError):
            raise QueenLocksError(f"the route answered something that is not JSON results: {raw[:200]!r}") from None
        if not isinstance(results, list) or len(results) != 1 or not isinstance(results[0], dict):
            raise QueenLocksError(f"the route answered {len(results)} results to one operation")
        return results[0]

    def _refusal(self, code, raw):
        message, field, index = raw.decode("utf-8", "replace").strip(), None, None
        try:
            err = json.loads(raw)["error"]
            message, field, index = err.get("message", message), err.get("field"), err.get("index")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        if code in _ANSWERLESS:
            return Unavailable(f"the route answered {code}: {message}", code=code)
        return RouteError(code, message, field=field, index=index)

    def acquire(self, name, owner, ttl_seconds, limit, wait_seconds=0):
        op = {"op": "acquire", "name": name, "ttlSeconds": ttl_seconds, "owner": owner, "limit": limit}
        if wait_seconds > 0 and self._takes_wait:
            op["waitSeconds"] = wait_seconds
            try:
                return self.call(op, timeout=CALL_TIMEOUT + wait_seconds), wait_seconds
            except RouteError as e:
                # A route from before waitSeconds refuses the field whole
                # (400, nothing applied): remember it and ask without.
                if e.code != 400 or e.field != "waitSeconds":
                    raise
                self._takes_wait = False
                del op["waitSeconds"]
        return self.call(op), 0

    def renew(self, name, slot, token, owner, ttl_seconds, timeout):
        return self.call({"op": "renew", "name": name, "slot": slot, "token": token,
                          "owner": owner, "ttlSeconds": ttl_seconds}, timeout=timeout)

    def release(self, name, slot, token, owner, timeout=CALL_TIMEOUT):
        return self.call({"op": "release", "name": name, "slot": slot, "token": token, "owner": owner},
                         timeout=timeout)

    def get(self, name):
        return self.call({"op": "get", "name": name})

    def check(self, name, slot, expect):
        return self.call({"op": "check", "name": name, "slot": slot, "expect": expect})


def _why(e):
    if isinstance(e, urllib.error.URLError) and e.reason is not None:
        return str(e.reason)
    return str(e) or type(e).__name__
