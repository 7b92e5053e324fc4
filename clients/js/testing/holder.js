// A holder for the cross-language test (clients/clients_test.go), which
// checks that every handle sees the others' locks. Not a test itself.
//
//   node holder.js hold NAME   acquire, print {"acquired", "owner", "token"},
//                              hold (renewing) until stdin closes, then release
//   node holder.js try NAME    acquire once, print {"acquired", "owner",
//                              "reason", "holders"}, release if acquired
//
// The route is $QUEEN_LOCKS_URL, the namespace $QUEEN_LOCKS_TEST_NAMESPACE.

import { queenLocks } from '../index.js'

const [mode, name] = process.argv.slice(2)
if (!['hold', 'try'].includes(mode) || !name) {
  console.error('usage: node holder.js hold|try NAME')
  process.exit(2)
}
const lock = queenLocks({ namespace: process.env.QUEEN_LOCKS_TEST_NAMESPACE || undefined }).lock(name, { ttl: '30s' })
const acquired = await lock.acquire()
console.log(JSON.stringify({ acquired, owner: lock.owner, token: lock.token, reason: lock.reason, holders: lock.holders }))
if (acquired && mode === 'hold') {
  // The renew timers are unref'd: stdin is what keeps this process alive.
  process.stdin.resume()
  await new Promise((resolve) => process.stdin.on('end', resolve))
}
if (acquired) await lock.release()
