"""Pure tests of one function each: no route needed."""

import datetime
import http.server
import json
import os
import socket
import tempfile
import threading
import unittest

import _support  # noqa: F401  (puts the package on the path)

import queen_locks
from queen_locks import _handle, _route


class BadInputFailsBeforeAnyCall(unittest.TestCase):
    def setUp(self):
        # A listener that counts connections: none may be made.
        self.ln = socket.create_server(("127.0.0.1", 0))
        self.ln.settimeout(0.01)
        self.client = queen_locks.Client(f"http://127.0.0.1:{self.ln.getsockname()[1]}")

    def tearDown(self):
        try:
            self.ln.accept()
            self.fail("a call was made")
        except socket.timeout:
            pass
        finally:
            self.ln.close()

    def test_names(self):
        cases = {
            "": "must not be empty",
            "a#b": "'#'",
            "tab\there": "control character (U+0009",
            "del\x7f": "control character (U+007F",
            "x" * 257: "at most 256 bytes, got 257",
            "é" * 129: "at most 256 bytes, got 258",
            "\ud800": "valid UTF-8",
        }
        for name, says in cases.items():
            with self.subTest(name=name[:20]):
                with self.assertRaises(ValueError) as e:
                    self.client.lock(name, 30)
                self.assertIn(says, str(e.exception))
        self.assertEqual(self.client.lock("é" * 128, 30).name, "é" * 128)
        with self.assertRaises(TypeError):
            self.client.lock(b"bytes", 30)

    def test_ttl(self):
        for ttl in (0, 0.999, -1, datetime.timedelta(milliseconds=500), float("nan"), float("inf"), 31536001):
            with self.subTest(ttl=ttl), self.assertRaises(ValueError) as e:
                self.client.lock("x", ttl)
            self.assertIn("ttl", str(e.exception))
        for ttl in ("30s", None, True):
            with self.subTest(ttl=ttl), self.assertRaises(TypeError):
                self.client.lock("x", ttl)
        self.assertEqual(self.client.lock("x", datetime.timedelta(minutes=2)).ttl, 120)
        self.assertEqual(self.client.lock("x", 1).ttl, 1)

    def test_semaphore_size(self):
        for n in (0, -1, 1025):
            with self.subTest(n=n), self.assertRaises(ValueError) as e:
                self.client.semaphore("x", n, 30)
            self.assertIn("from 1 to 1024", str(e.exception))
        for n in (1.5, "3", True):
            with self.subTest(n=n), self.assertRaises(TypeError):
                self.client.semaphore("x", n, 30)
        self.assertEqual(self.client.semaphore("x", 1024, 30).limit, 1024)

    def test_wait(self):
        h = self.client.lock("x", 30)
        for wait in (-1, float("nan")):
            with self.subTest(wait=wait), self.assertRaises(ValueError):
                h.acquire(wait=wait)
        with self.assertRaises(TypeError):
            h.acquire(wait="10s")
        with self.assertRaises(TypeError):
            h.run("not callable")

    def test_ca_file(self):
        with self.assertRaises(ValueError) as e:
            queen_locks.Client("https://127.0.0.1:1", ca_file="/nonexistent/ca.crt")
        self.assertIn("CA file /nonexistent/ca.crt: does not exist", str(e.exception))

    def test_owner(self):
        for owner in ("", "o" * 257, 7):
            with self.subTest(owner=owner), self.assertRaises(ValueError):
                self.client.lock("x", 30, owner=owner)


class Owners(unittest.TestCase):
    def test_owners_are_host_pid_random_and_differ(self):
        a, b = queen_locks.mint_owner(), queen_locks.mint_owner()
        host, pid, rand = a.split(":")
        self.assertEqual((host, pid), (socket.gethostname(), str(os.getpid())))
        self.assertEqual(len(rand), 8)
        self.assertNotEqual(a, b)
        c = queen_locks.Client("http://127.0.0.1:1")
        self.assertNotEqual(c.lock("x", 30).owner, c.lock("x", 30).owner)


class URLs(unittest.TestCase):
    def test_a_bare_server_gets_the_route_path(self):
        self.assertEqual(_route.route_url("http://localhost:6632"), "http://localhost:6632/api/v1/locks")
        self.assertEqual(_route.route_url("https://q.ns.svc:6632/"), "https://q.ns.svc:6632/api/v1/locks")
        self.assertEqual(_route.route_url("http://h:1/api/v1/locks"), "http://h:1/api/v1/locks")
        for bad in ("", "localhost:6632", "ftp://h/x", "http://"):
            with self.subTest(url=bad), self.assertRaises(ValueError):
                _route.route_url(bad)

    def test_the_url_defaults_to_the_environment(self):
        old = os.environ.get("QUEEN_LOCKS_URL")
        try:
            os.environ["QUEEN_LOCKS_URL"] = "http://127.0.0.1:6632"
            self.assertEqual(queen_locks.Client().url, "http://127.0.0.1:6632/api/v1/locks")
            del os.environ["QUEEN_LOCKS_URL"]
            with self.assertRaises(ValueError) as e:
                queen_locks.Client()
            self.assertIn("QUEEN_LOCKS_URL", str(e.exception))
        finally:
            if old is not None:
                os.environ["QUEEN_LOCKS_URL"] = old


class TokenFile(unittest.TestCase):
    def test_the_token_is_read_again_when_the_file_changes(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "token")
            with open(path, "w") as f:
                f.write("first\n")
            t = _route._TokenFile(path, required=True)
            self.assertEqual(t.read(), "first")
            # The kubelet swaps in a new file: another inode, perhaps the same size.
            new = os.path.join(d, "token.new")
            with open(new, "w") as f:
                f.write("other\n")
            os.replace(new, path)
            self.assertEqual(t.read(), "other")

    def test_a_named_file_must_exist_the_default_need_not(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "missing")
            self.assertIsNone(_route._TokenFile(path, required=False).read())
            with self.assertRaises(queen_locks.QueenLocksError) as e:
                _route._TokenFile(path, required=True).read()
            self.assertIn(path, str(e.exception))


class WaitSeconds(unittest.TestCase):
    def plan(self, ttl, left, takes_wait=True):
        h = queen_locks.Client("http://127.0.0.1:1").lock("x", ttl)
        h._route._takes_wait = takes_wait
        return h._wait_seconds(left)

    def test_one_call_waits_whole_seconds_up_to_60_and_a_third_of_the_lifetime(self):
        self.assertEqual(self.plan(300, 600), 60)  # longer waits take several calls
        self.assertEqual(self.plan(300, 42.9), 42)
        self.assertEqual(self.plan(30, 600), 10)  # the answer still leaves two thirds of the lifetime
        self.assertEqual(self.plan(2, 600), 0)  # too short a lifetime: poll
        self.assertEqual(self.plan(300, 0.5), 0)  # under a second left: poll
        self.assertEqual(self.plan(300, 600, takes_wait=False), 0)


class _Stub(http.server.BaseHTTPRequestHandler):
    """Answers as a route from before waitSeconds: 400 naming the field."""

    seen = []

    def do_POST(self):
        op = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["operations"][0]
        type(self).seen.append(op)
        if "waitSeconds" in op:
            code, body = 400, {"error": {"code": 400, "index": 0, "field": "waitSeconds",
                                         "message": "operations[0].waitSeconds: unknown field for acquire"}}
        else:
            code, body = 200, {"results": [{"index": 0, "op": "acquire", "name": op["name"], "acquired": False,
                                            "reason": "held", "holders": []}]}
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


class WaitSecondsFallback(unittest.TestCase):
    def test_a_route_that_refuses_wait_seconds_is_polled_instead(self):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        _Stub.seen = []
        r = _route.Route(f"http://127.0.0.1:{srv.server_address[1]}")
        answer, waited = r.acquire("x", "me", 30, 1, wait_seconds=5)
        self.assertEqual((answer["reason"], waited, r.takes_wait), ("held", 0, False))
        self.assertEqual([("waitSeconds" in op) for op in _Stub.seen], [True, False])
        # Remembered: the next call does not ask again.
        r.acquire("x", "me", 30, 1, wait_seconds=5)
        self.assertEqual(len(_Stub.seen), 3)
        self.assertNotIn("waitSeconds", _Stub.seen[2])

    def test_other_refusals_are_errors(self):
        r = _route.Route("http://127.0.0.1:1")
        err = r._refusal(400, b'{"error":{"code":400,"message":"operations[0].ttlSeconds: bad","index":0,"field":"ttlSeconds"}}')
        self.assertIsInstance(err, queen_locks.RouteError)
        self.assertEqual((err.code, err.field, err.index), (400, "ttlSeconds", 0))
        self.assertIsInstance(r._refusal(503, b'{"error":{"code":503,"message":"webhook"}}'), queen_locks.Unavailable)
        self.assertIsInstance(r._refusal(502, b"bad gateway"), queen_locks.Unavailable)


class Times(unittest.TestCase):
    def test_route_times_parse(self):
        t = _handle._parse_time("2026-12-02T10:00:30.123456Z")
        self.assertEqual(t, datetime.datetime(2026, 12, 2, 10, 0, 30, 123456, tzinfo=datetime.timezone.utc))
        self.assertEqual(_handle._parse_time("2026-12-02T10:00:30Z").microsecond, 0)
        self.assertIsNone(_handle._parse_time("yesterday"))


if __name__ == "__main__":
    unittest.main()
