"""The handle against a real route (see _support for how to point it at one)."""

import datetime
import os
import threading
import time
import unittest

from _support import (
    NAMESPACE,
    TLS_DIR,
    URL,
    Proxy,
    client,
    delete_permit,
    live,
    unique,
    wait_for,
    with_kubectl,
    with_tls,
    write_configmap,
    write_configmap_with,
)

import queen_locks


@live
class AcquireRelease(unittest.TestCase):
    def test_a_held_lock_is_refused_to_others_until_released(self):
        c = client()
        name = unique("job")
        a, b = c.lock(name, 30), c.lock(name, 30)
        self.assertTrue(a.acquire())
        self.assertTrue(a.held)
        self.assertEqual(a.slot, 0)
        [holder] = c.holders(name)
        self.assertEqual((holder["owner"], holder["token"]), (a.owner, a.token))

        self.assertFalse(b.acquire())
        self.assertEqual(b.reason, "held")
        self.assertEqual([h["owner"] for h in b.holders], [a.owner])

        a.release()
        self.assertFalse(a.held)
        self.assertFalse(a.lost.is_set(), "a release is not a loss")
        self.assertEqual(c.holders(name), [])
        self.assertTrue(b.acquire())
        self.assertGreater(b.token, a.token, "a later holder's token is higher")
        g = b.guard()
        self.assertEqual((g["op"], g["key"], g["expect"], g["required"]), ("check", f"{name}#0", b.token, True))
        self.assertTrue(b.check())
        b.release()

    def test_acquire_again_while_held_is_a_no_op(self):
        h = client().lock(unique("twice"), 30)
        self.assertTrue(h.acquire())
        token = h.token
        self.assertTrue(h.acquire())
        self.assertEqual(h.token, token)
        h.release()

    def test_exactly_one_of_many_concurrent_acquirers_wins(self):
        c, name, n = client(), unique("race"), 8
        handles = [c.lock(name, 30) for _ in range(n)]
        start = threading.Barrier(n)
        won = [None] * n

        def race(i):
            start.wait()
            won[i] = handles[i].acquire()

        threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(won.count(True), 1, f"winners: {won}")
        winner = handles[won.index(True)]
        [holder] = c.holders(name)
        self.assertEqual((holder["owner"], holder["token"]), (winner.owner, winner.token))
        for h in handles:
            if h is not winner:
                self.assertIn(h.reason, ("held", "contended"))
        winner.release()


@live
class Semaphore(unittest.TestCase):
    def test_n_holders_take_distinct_slots_and_no_more(self):
        c, name = client(), unique("pool")
        held = [c.semaphore(name, 3, 30) for _ in range(3)]
        for h in held:
            self.assertTrue(h.acquire())
        self.assertEqual(sorted(h.slot for h in held), [0, 1, 2])
        fourth = c.semaphore(name, 3, 30)
        self.assertFalse(fourth.acquire())
        self.assertEqual((fourth.reason, len(fourth.holders)), ("held", 3))
        for h in held:
            h.release()

    def test_concurrent_holders_never_exceed_n(self):
        c, name, n = client(), unique("never-over"), 3
        mu = threading.Lock()
        inside, most, slots_in_use, errors = [0], [0], set(), []

        def work(_):
            with mu:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)  # hold it a moment, so holders overlap
            with mu:
                inside[0] -= 1

        def worker():
            try:
                for _ in range(3):
                    h = c.semaphore(name, n, 30)
                    with h.run(wait=60):
                        with mu:
                            if h.slot in slots_in_use:
                                errors.append(f"slot {h.slot} given twice")
                            slots_in_use.add(h.slot)
                        work(h)
                        with mu:
                            slots_in_use.discard(h.slot)
            except Exception as e:  # reported below, not lost in a thread
                errors.append(repr(e))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertLessEqual(most[0], n)
        self.assertGreaterEqual(most[0], 2, "holders never overlapped: the test proved nothing")
        self.assertEqual(c.holders(name), [])


@live
class Renew(unittest.TestCase):
    def test_background_renew_keeps_a_lock_for_several_lifetimes(self):
        c, name = client(), unique("long-job")
        # A 2 s lifetime: six renewals outlive it twice over, with room for
        # a slow call on a loaded machine.
        h = c.lock(name, 2)
        tokens, six = [], threading.Event()

        @h.on_renew
        def renewed(token):
            tokens.append(token)
            if len(tokens) >= 6:
                six.set()

        self.assertTrue(h.acquire())
        first = h.token
        # Six renewals a third of a second apart outlive the lifetime twice over.
        self.assertTrue(six.wait(30), f"renewals: {tokens}")
        self.assertTrue(h.held)
        self.assertFalse(h.lost.is_set())
        self.assertEqual(tokens, sorted(set(tokens)), "every renew answers a new, higher token")
        self.assertGreater(tokens[0], first)
        [holder] = c.holders(name)
        self.assertEqual(holder["owner"], h.owner)
        h.release()
        self.assertEqual(c.holders(name), [])

    def test_a_lost_answer_is_retried_with_the_same_owner(self):
        c, name = client(), unique("retried")
        proxy = Proxy(URL)
        h = client(proxy.url).lock(name, 3)
        proxy.drop = 1  # the acquire lands, its answer does not come back
        self.assertTrue(h.acquire(wait=10))
        self.assertGreaterEqual(proxy.calls, 2)
        [holder] = c.holders(name)
        self.assertEqual((holder["owner"], holder["token"]), (h.owner, h.token))

        # A renew whose answer is lost: the next one sends the same (now
        # stale) token and the route carries it through.
        renewals = []
        h.on_renew(renewals.append)
        proxy.drop = 1
        wait_for("two renewals after a lost answer", lambda: len(renewals) >= 2)
        self.assertTrue(h.held)
        [holder] = c.holders(name)
        self.assertEqual((holder["owner"], holder["token"]), (h.owner, h.token))
        h.release()

    def test_release_after_an_unanswered_acquire_frees_what_it_took(self):
        c, name = client(), unique("unsure")
        proxy = Proxy(URL)
        h = client(proxy.url).lock(name, 30)
        proxy.drop = 1  # the acquire lands, its answer does not come back
        with self.assertRaises(queen_locks.Unavailable):
            h.acquire()
        [holder] = c.holders(name)
        self.assertEqual(holder["owner"], h.owner)
        self.assertFalse(h.held)
        h.release()
        self.assertEqual(c.holders(name), [], "the permit the lost answer told of is still held")


@live
class Loss(unittest.TestCase):
    @with_kubectl
    def test_deleting_the_permit_by_hand_loses_it_with_reason_renew(self):
        name, ttl = unique("deleted"), 3
        h = client().lock(name, ttl)
        reasons = []
        lost = threading.Event()
        h.on_lost(lambda r: (reasons.append(r), lost.set()))
        self.assertTrue(h.acquire())
        event = h.lost
        delete_permit(name)
        deleted = time.monotonic()  # kubectl's own start-up is not the handle's
        self.assertTrue(lost.wait(30), "the loss was never reported")
        took = time.monotonic() - deleted
        self.assertEqual(reasons, [queen_locks.LOST_RENEW])
        # The next renew, at most a third of the lifetime away, learns it
        # (with slack for a renew call on a busy machine).
        self.assertLess(took, ttl / 3 + 2, f"learnt after {took:.2f}s")
        self.assertTrue(event.is_set())
        self.assertFalse(h.held)
        self.assertEqual(h.reason, "renew")
        h.release()  # nothing held: a no-op

    def test_a_route_that_stops_answering_is_given_up_on_the_local_clock(self):
        c, name, ttl = client(), unique("cut-off"), 2
        # Requests reach the route 0.3 s after they are sent, so the server's
        # lifetime starts later than the one the handle counts.
        proxy = Proxy(URL, delay=0.3)
        h = client(proxy.url).lock(name, ttl)
        renewed, lost = threading.Event(), threading.Event()
        lost_at = []
        h.on_renew(lambda _: renewed.set())
        h.on_lost(lambda r: (lost_at.append((r, datetime.datetime.now(datetime.timezone.utc))), lost.set()))
        acquired_at = datetime.datetime.now(datetime.timezone.utc)
        self.assertTrue(h.acquire())
        self.assertTrue(renewed.wait(30), "no renew got through")
        proxy.cut()
        server_expiry = h.expires_at  # of the last renew that got through
        self.assertTrue(lost.wait(30), "the handle never gave up")
        [(reason, at)] = lost_at
        self.assertEqual(reason, queen_locks.LOST_EXPIRED)
        self.assertLess(at, server_expiry, "the handle must give up before the server does")
        self.assertGreaterEqual(at, acquired_at + datetime.timedelta(seconds=ttl),
                                "renewals got through: it cannot have expired within one lifetime")
        self.assertFalse(h.held)
        self.assertTrue(h.lost.is_set())
        [holder] = c.holders(name) or [None]
        if holder is not None:
            self.assertEqual(holder["owner"], h.owner, "nobody else may have it before the server's expiry")


@live
class Run(unittest.TestCase):
    def test_run_waits_for_the_holder_and_gives_up_when_the_wait_ends(self):
        c, name = client(), unique("turn")
        holder = c.lock(name, 30)
        self.assertTrue(holder.acquire())

        ran = []
        self.assertFalse(c.lock(name, 30).run(ran.append, wait=0.3))
        self.assertEqual(ran, [])
        with self.assertRaises(queen_locks.NotAcquired) as e:
            with c.lock(name, 30).run(wait=0.3):
                ran.append("body")
        self.assertEqual((ran, e.exception.reason), ([], "held"))

        proxy = Proxy(URL)
        waiter = client(proxy.url).lock(name, 30)
        result = {}

        def wait_and_run():
            def job(h):
                ran.append((h.held, h.lost.is_set(), h.token))
                raise RuntimeError("the job's own error")

            try:
                result["acquired"] = waiter.run(job, wait=20)
            except RuntimeError as e:
                result["error"] = str(e)

        t = threading.Thread(target=wait_and_run)
        t.start()
        wait_for("the waiter to ask", lambda: proxy.calls >= 1)
        holder.release()
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertEqual(result, {"error": "the job's own error"})
        [(held, lost, token)] = ran
        self.assertTrue(held)
        self.assertFalse(lost)
        self.assertGreater(token, holder.token)
        self.assertFalse(waiter.held)
        self.assertEqual(c.holders(name), [], "run releases even when the job fails")

    def test_run_as_a_context_manager_releases_after(self):
        c, name = client(), unique("ctx")
        with c.lock(name, 30).run(wait=5) as lock:
            self.assertTrue(lock.held)
            [holder] = c.holders(name)
            self.assertEqual(holder["owner"], lock.owner)
        self.assertFalse(lock.held)
        self.assertEqual(c.holders(name), [])
        with c.lock(name, 30) as again:
            self.assertTrue(again.held)
        self.assertEqual(c.holders(name), [])


@live
@with_kubectl
class Guard(unittest.TestCase):
    def test_the_guard_is_accepted_by_a_guarded_write_and_refused_after_loss(self):
        name = unique("fenced")
        cm = unique("report")
        h = client().lock(name, 60)  # renews every 20 s: the token holds still while we write
        reasons = []
        h.on_lost(reasons.append)
        self.assertTrue(h.acquire())
        g = h.guard()
        guard = f"{g['key']}={g['expect']}"
        self.assertEqual(guard, f"{name}#0={h.token}")
        r = write_configmap(cm, guard, "first", create=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = write_configmap(cm, guard, "second")
        self.assertEqual(r.returncode, 0, r.stderr)

        delete_permit(name)
        self.assertFalse(h.check())
        self.assertEqual(reasons, [queen_locks.LOST_GUARD])
        self.assertTrue(h.lost.is_set())

        r = write_configmap(cm, guard, "stale")
        self.assertNotEqual(r.returncode, 0, "a write under a lost lock's token was admitted")
        self.assertIn("kv_precondition", r.stderr)
        self.assertIn(name, r.stderr)


@live
@with_kubectl
class GuardMetadata(unittest.TestCase):
    def test_a_write_under_guard_metadata_is_admitted_until_the_lock_is_taken_over(self):
        c = client()
        name, cm = unique("fenced"), unique("report")
        h = c.lock(name, 60)
        reasons = []
        h.on_lost(reasons.append)
        self.assertIsNone(h.guard_metadata(), "a guard before any acquire")
        self.assertTrue(h.acquire())
        meta = h.guard_metadata()
        self.assertEqual(meta, {
            "labels": {queen_locks.GUARDED_LABEL: "true"},
            "annotations": {queen_locks.GUARD_ANNOTATION: f"{name}#0={h.token}"},
        })
        r = write_configmap_with(cm, h.guard_metadata(), "first", create=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = write_configmap_with(cm, h.guard_metadata(), "second")
        self.assertEqual(r.returncode, 0, r.stderr)

        # Taken over: the permit deleted by hand and acquired by another.
        delete_permit(name)
        b = c.lock(name, 60)
        wait_for("the other holder to acquire", b.acquire)
        self.addCleanup(b.release)
        r = write_configmap_with(cm, h.guard_metadata(), "stale")
        self.assertNotEqual(r.returncode, 0, "a replaced holder's write was admitted")
        self.assertIn("kv_precondition", r.stderr)
        self.assertIn(name, r.stderr)
        self.assertFalse(h.check())
        self.assertEqual(reasons, [queen_locks.LOST_GUARD])
        self.assertIsNone(h.guard_metadata(), "a guard after the loss")


@live
@with_tls
class TLS(unittest.TestCase):
    def test_an_https_route_is_verified_with_the_ca_file(self):
        cert = (os.path.join(TLS_DIR, "tls.crt"), os.path.join(TLS_DIR, "tls.key"))
        proxy = Proxy(URL, tls=cert)
        self.assertTrue(proxy.url.startswith("https://"))
        name = unique("tls")
        h = queen_locks.Client(proxy.url, namespace=NAMESPACE or None,
                               ca_file=os.path.join(TLS_DIR, "ca.crt")).lock(name, 30)
        self.assertTrue(h.acquire())
        self.assertEqual(client().holders(name)[0]["owner"], h.owner)
        h.release()

        # Without the CA the route is not trusted: a clear error, at once,
        # not an unanswered call to retry.
        stranger = queen_locks.Client(proxy.url, namespace=NAMESPACE or None).lock(name, 30)
        with self.assertRaises(queen_locks.QueenLocksError) as e:
            stranger.acquire(wait=30)
        self.assertNotIsInstance(e.exception, queen_locks.Unavailable)
        self.assertIn("certificate", str(e.exception))
        self.assertEqual(client().holders(name), [])


if __name__ == "__main__":
    unittest.main()
