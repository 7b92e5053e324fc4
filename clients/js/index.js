// queen-locks for Node: locks and semaphores with fencing tokens, over the
// queen-locks route. No dependencies; Node 20 or later.
//
//   import { queenLocks } from 'queen-locks'
//   const ql = queenLocks()                      // $QUEEN_LOCKS_URL, the projected token
//   const lock = ql.lock('daily-report', { ttl: '30s' })
//   const { acquired } = await lock.run(async (signal) => { // aborted when the lock is lost
//     await writeReport({ fence: lock.token, signal })
//   }, { wait: '10s' })                          // acquired false: nothing ran
//
// This file only gathers the public names; the code is in lib/: errors.js
// (the errors), input.js (names, owners, durations and their limits),
// route.js (the HTTP transport), handle.js (a lock or semaphore handle) and
// client.js (queenLocks and Client).

export { QueenLocksError, RouteError, UnavailableError, LockLostError, LockReleasedError } from './lib/errors.js'
export { MAX_NAME_BYTES, MAX_OWNER_BYTES, MAX_TTL_SECONDS, MAX_LIMIT, mintOwner, validateName, parseDuration } from './lib/input.js'
export { ROUTE_PATH, DEFAULT_TOKEN_FILE, MAX_WAIT_SECONDS, routeURL } from './lib/route.js'
export { LOST_RENEW, LOST_GUARD, LOST_EXPIRED, Handle } from './lib/handle.js'
export { GUARDED_LABEL, GUARD_ANNOTATION } from './lib/handle.js'
export { queenLocks, Client } from './lib/client.js'
