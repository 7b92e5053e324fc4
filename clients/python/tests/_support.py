"""What the tests share: where the route is, kubectl, and a loopback proxy
that a test can slow down, cut, or make lose answers.

The live tests need a route. `go test ./clients/` starts a control plane
and sets the variables below; by hand, against `make dev`:

    QUEEN_LOCKS_TEST_URL=http://localhost:6632 QUEEN_LOCKS_TEST_NAMESPACE=default \
    QUEEN_LOCKS_TEST_KUBECONFIG=.dev/kubeconfig QUEEN_LOCKS_TEST_KUBECTL=bin/kubectl \
    python3 -m unittest discover -s clients/python/tests -v
"""

import json
import os
import secrets
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

# Importable from a checkout without installing.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import queen_locks  # noqa: E402

URL = os.environ.get("QUEEN_LOCKS_TEST_URL", "")
NAMESPACE = os.environ.get("QUEEN_LOCKS_TEST_NAMESPACE", "")
KUBECONFIG = os.environ.get("QUEEN_LOCKS_TEST_KUBECONFIG", "")
KUBECTL = os.environ.get("QUEEN_LOCKS_TEST_KUBECTL", "")
TLS_DIR = os.environ.get("QUEEN_LOCKS_TEST_TLS_DIR", "")

live = unittest.skipUnless(
    URL,
    "QUEEN_LOCKS_TEST_URL is not set: these tests need a running route "
    "(go test ./clients/ sets it; by hand: make dev, then QUEEN_LOCKS_TEST_URL=http://localhost:6632)",
)

with_kubectl = unittest.skipUnless(
    URL and KUBECONFIG and KUBECTL,
    "QUEEN_LOCKS_TEST_KUBECONFIG and QUEEN_LOCKS_TEST_KUBECTL are not set: this test deletes a permit "
    "or writes a ConfigMap by hand (go test ./clients/ sets them; under make dev: .dev/kubeconfig and bin/kubectl)",
)

with_tls = unittest.skipUnless(
    URL and TLS_DIR,
    "QUEEN_LOCKS_TEST_TLS_DIR is not set: this test needs a CA (ca.crt) and a certificate for 127.0.0.1 "
    "(tls.crt, tls.key) for an https proxy in front of the route (go test ./clients/ makes them)",
)


def client(url=None):
    return queen_locks.Client(url or URL, namespace=NAMESPACE or None)


def unique(prefix):
    """A lock name no other run has used, so runs against make dev do not meet."""
    return f"{prefix}-{secrets.token_hex(3)}"


def kubectl(*args, stdin=None):
    """Runs kubectl in the test namespace; answers the CompletedProcess."""
    ns = ["-n", NAMESPACE] if NAMESPACE else []
    return subprocess.run([KUBECTL, "--kubeconfig", KUBECONFIG, *ns, *args],
                          input=stdin, capture_output=True, text=True, timeout=60)


def delete_permit(lock, slot=0):
    """Deletes the permit of a simply named lock, as an operator would."""
    r = kubectl("delete", "queenlock", f"{lock}.{slot}", "--wait=false")
    if r.returncode != 0:
        raise AssertionError(f"kubectl delete: {r.stderr}")


def write_configmap(name, guard, value, create=False):
    """Writes a guarded ConfigMap with the guard annotation, as every write
    to one must carry."""
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {"locks.queen.dev/guarded": "true"},
            "annotations": {"locks.queen.dev/guard": guard},
        },
        "data": {"report": value},
    }
    return kubectl("create" if create else "replace", "-f", "-", stdin=json.dumps(cm))


def write_configmap_with(name, metadata, value, create=False):
    """Writes a ConfigMap whose labels and annotations are metadata's, as a
    handle's guard_metadata() answers them."""
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, **metadata},
        "data": {"report": value},
    }
    return kubectl("create" if create else "replace", "-f", "-", stdin=json.dumps(cm))


def wait_for(what, cond, timeout=30.0):
    """Waits until cond() is true, checking every 20 ms."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"waiting for {what}: gave up after {timeout}s")
        time.sleep(0.02)


class Proxy:
    """A loopback TCP proxy in front of the route.

    delay holds back each piece of a request before passing it on (so the
    server admits a write later than the client sent it); drop, when > 0,
    is how many of the next calls lose their answer: the request reaches the
    route, the client sees the connection close. cut() stops it for good:
    the route stops answering. With tls=(cert file, key file) it serves
    https.
    """

    def __init__(self, target, delay=0.0, tls=None):
        parts = urllib.parse.urlsplit(target)
        self._target = (parts.hostname, parts.port)
        self._ln = socket.create_server(("127.0.0.1", 0))
        self._tls = None
        if tls:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(*tls)
            parts = parts._replace(scheme="https")
        self.url = urllib.parse.urlunsplit(parts._replace(netloc=f"127.0.0.1:{self._ln.getsockname()[1]}"))
        self.delay = delay
        self.drop = 0
        self.calls = 0
        self._mu = threading.Lock()
        self._socks = set()
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self):
        with self._mu:
            self._cut = True
            socks, self._socks = self._socks, set()
        self._ln.close()
        for s in socks:
            _close(s)

    def _accept(self):
        while True:
            try:
                c, _ = self._ln.accept()
            except OSError:
                return
            with self._mu:
                if self._cut:
                    _close(c)
                    continue
                self.calls += 1
                drop = self.drop > 0
                if drop:
                    self.drop -= 1
            threading.Thread(target=self._serve, args=(c, drop), daemon=True).start()

    def _serve(self, c, drop):
        s = None
        try:
            if self._tls:
                c = self._tls.wrap_socket(c, server_side=True)
            s = socket.create_connection(self._target)
            with self._mu:
                self._socks.update((c, s))
            # One thread moves both directions: a TLS socket must not be
            # read and written from two threads at once.
            while True:
                ready = [c] if getattr(c, "pending", lambda: 0)() else select.select([c, s], [], [])[0]
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    if src is c:
                        if self.delay:
                            time.sleep(self.delay)
                        s.sendall(data)
                    elif drop:
                        return  # a dropped answer: the client sees the connection close
                    else:
                        c.sendall(data)
        except (OSError, ValueError):
            pass  # a refused handshake, or a cut
        finally:
            _close(c)
            if s is not None:
                _close(s)


def _close(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
