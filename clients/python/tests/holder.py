"""A holder for the cross-language test (clients/clients_test.go), which
checks that every handle sees the others' locks. Not a test itself.

    holder.py hold NAME   acquire, print {"acquired", "owner", "token"}, hold
                          (renewing) until stdin closes, then release
    holder.py try NAME    acquire once, print {"acquired", "owner", "reason",
                          "holders"}, release if acquired

The route is $QUEEN_LOCKS_URL, the namespace $QUEEN_LOCKS_TEST_NAMESPACE.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import queen_locks  # noqa: E402


def main(mode, name):
    lock = queen_locks.Client(namespace=os.environ.get("QUEEN_LOCKS_TEST_NAMESPACE") or None).lock(name, 30)
    acquired = lock.acquire()
    print(json.dumps({"acquired": acquired, "owner": lock.owner, "token": lock.token,
                      "reason": lock.reason, "holders": lock.holders}), flush=True)
    if acquired and mode == "hold":
        sys.stdin.read()
    if acquired:
        lock.release()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("hold", "try"):
        sys.exit("usage: holder.py hold|try NAME")
    main(sys.argv[1], sys.argv[2])
