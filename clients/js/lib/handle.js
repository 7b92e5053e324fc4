// One holder's handle on a lock or a semaphore permit: acquire, release, the
// renew loop, run, and the signal and callbacks of a lost lock.

import { setTimeout as sleep } from 'node:timers/promises'

import { LockLostError, LockReleasedError, QueenLocksError, UnavailableError } from './errors.js'
import { MAX_LIMIT, MAX_OWNER_BYTES, MAX_TTL_SECONDS, mintOwner, parseDuration, validateName } from './input.js'
import { CALL_TIMEOUT_MS, MAX_WAIT_SECONDS } from './route.js'

/** Why a handle lost its lock, as onLost reports it. */
export const LOST_RENEW = 'renew' // the server answered that the permit is no longer ours
export const LOST_GUARD = 'guard' // a check of the handle's token failed
export const LOST_EXPIRED = 'expired' // the lifetime passed on this machine's clock without a renew getting through

// The label that opts a Kubernetes object in to fencing, and the annotation
// every write to it carries (docs/fencing.md).
export const GUARDED_LABEL = 'locks.queen.dev/guarded'
export const GUARD_ANNOTATION = 'locks.queen.dev/guard'

const POLL_FIRST_MS = 100
const POLL_MAX_MS = 1000
const RELEASE_RETRY_MS = 10_000
// How often acquire asks again when a permit the route says is already ours
// is lost before it could be renewed.
const ALREADY_TRIES = 3

const now = () => performance.now() // monotonic, in milliseconds

// Jitter spreads waiters out, so they do not all ask at once.
const jitter = (poll, left) => Math.min(poll / 2 + Math.random() * poll, left)

const notAcquired = AbortSignal.abort(new QueenLocksError('not acquired'))

/**
 * One holder's view of a lock or a semaphore permit. acquire, release and
 * run are queued one after another on a handle.
 */
export class Handle {
  #route
  #name
  #limit
  #ttlMs
  #ttlSeconds
  #owner
  #lease = null
  // An acquire or release got no answer: the route may hold a permit of ours.
  #unsure = false
  #reason = null
  #holders = []
  #onLost = []
  #onRenew = []
  #queue = Promise.resolve()

  constructor (route, name, limit, ttl, owner) {
    validateName(name)
    if (!Number.isInteger(limit)) throw new TypeError(`semaphore size n must be an integer, got ${JSON.stringify(limit)}`)
    if (limit < 1 || limit > MAX_LIMIT) throw new RangeError(`semaphore size n must be from 1 to ${MAX_LIMIT}, got ${limit}`)
    if (ttl === undefined) throw new TypeError("ttl is required, for example { ttl: '30s' }")
    const ms = parseDuration(ttl, 'ttl')
    if (ms < 1000 || ms > MAX_TTL_SECONDS * 1000) throw new RangeError(`ttl must be from 1s to ${MAX_TTL_SECONDS}s, got ${JSON.stringify(ttl)}`)
    if (owner !== undefined && (typeof owner !== 'string' || owner === '' || Buffer.byteLength(owner) > MAX_OWNER_BYTES)) {
      throw new RangeError(`owner must be a string of 1 to ${MAX_OWNER_BYTES} bytes, got ${JSON.stringify(owner)}`)
    }
    this.#route = route
    this.#name = name
    this.#limit = limit
    this.#ttlMs = ms
    // The server counts whole seconds; our own deadline uses the exact ttl,
    // which is never later.
    this.#ttlSeconds = Math.ceil(ms / 1000)
    this.#owner = owner ?? mintOwner()
  }

  get name () { return this.#name }
  get limit () { return this.#limit }
  /** The lifetime, in milliseconds. */
  get ttl () { return this.#ttlMs }
  get owner () { return this.#owner }
  get held () { return this.#lease?.held ?? false }
  /** The current fencing token (undefined before the first acquire). Read it when you use it: every renew changes it. */
  get token () { return this.#lease?.token }
  /** The permit's slot: always 0 for a lock. */
  get slot () { return this.#lease?.slot }
  /** When the server counts the permit expired, by its clock, as of the last answer. */
  get expiresAt () { return this.#lease?.expiresAt }
  /** Why the last acquire failed (held, contended) or why the lock was lost (renew, guard, expired). */
  get reason () { return this.#reason }
  /** Who held the lock when the last acquire answered held. */
  get holders () { return [...this.#holders] }
  /**
   * Aborted when the lock is lost (reason: a LockLostError) or released (a
   * LockReleasedError). Before the first acquire it is already aborted; each
   * acquire makes a new one.
   */
  get signal () { return this.#lease?.controller.signal ?? notAcquired }

  /** The guard object of the last acquire or renew answer: the check that fences a write with the current token. */
  guard () {
    const g = this.#lease?.guard
    return g ? { ...g } : undefined
  }

  /**
   * The label and annotation that fence a Kubernetes write with the current
   * token, as metadata to merge into the object's:
   * { labels: { 'locks.queen.dev/guarded': 'true' },
   *   annotations: { 'locks.queen.dev/guard': '<lock>#<slot>=<token>' } }.
   * Call it for each write, right before sending (not before an await that
   * may span a renew): every renew changes the token. Undefined while
   * nothing is held.
   */
  guardMetadata () {
    const lease = this.#lease
    if (!lease?.held) return undefined
    return {
      labels: { [GUARDED_LABEL]: 'true' },
      annotations: { [GUARD_ANNOTATION]: `${this.#name}#${lease.slot}=${lease.token}` }
    }
  }

  /** Calls fn(reason) whenever a held lock is lost; reason is renew, guard or expired. */
  onLost (fn) {
    this.#onLost.push(fn)
    return this
  }

  /** Calls fn(token) after each renew that got through. */
  onRenew (fn) {
    this.#onRenew.push(fn)
    return this
  }

  #queued (fn) {
    const p = this.#queue.then(fn)
    this.#queue = p.catch(() => {})
    return p
  }

  /**
   * Takes the lock, waiting up to wait ('10s', or milliseconds; none: one
   * try). Resolves false when somebody else held it for the whole wait
   * (reason and holders say more). A call that got no answer is retried
   * within the wait with the same owner; without a wait it rejects with
   * UnavailableError, and calling acquire again is safe.
   */
  acquire ({ wait } = {}) {
    let waitMs
    try {
      waitMs = wait == null ? 0 : parseDuration(wait, 'wait')
    } catch (e) {
      return Promise.reject(e)
    }
    return this.#queued(async () => {
      if (this.held) return true
      const giveUp = now() + waitMs
      let poll = POLL_FIRST_MS
      for (;;) {
        let failure = null
        let waited = false
        try {
          const [won, w] = await this.#try(this.#waitSeconds(giveUp - now()))
          if (won) return true
          waited = w
        } catch (e) {
          if (!(e instanceof UnavailableError)) throw e
          failure = e
        }
        const left = giveUp - now()
        if (left <= 0) {
          if (failure) throw failure
          return false
        }
        if (waited) {
          // The route waited for us and a slot did not free (or was taken
          // first): ask again at once.
          poll = POLL_FIRST_MS
          continue
        }
        await sleep(jitter(poll, left))
        poll = Math.min(poll * 2, POLL_MAX_MS)
      }
    })
  }

  // How long one acquire call may wait at the route: whole seconds, at most
  // 60, and at most a third of the lifetime, so the lifetime we count from
  // when the call was sent still has two thirds left when the answer comes;
  // 0 means poll.
  #waitSeconds (leftMs) {
    if (!this.#route.takesWait) return 0
    return Math.max(0, Math.min(MAX_WAIT_SECONDS, Math.floor(leftMs / 1000), Math.floor(this.#ttlMs / 3000)))
  }

  // One acquire call. Answers [won, the route waited the whole time asked].
  async #try (waitSeconds) {
    for (let i = 0; i < ALREADY_TRIES; i++) {
      let sent = now()
      const [r, asked] = await this.#route.acquire(this.#name, this.#owner, this.#ttlSeconds, this.#limit, waitSeconds)
        .catch((e) => { this.#unsure ||= e instanceof UnavailableError; throw e })
      if (!r.acquired) {
        // The route answers already, not held, to an owner that holds a
        // permit: this one holds none.
        this.#reason = r.reason ?? null
        this.#holders = r.holders ?? []
        this.#unsure = false
        return [false, asked > 0 && now() - sent >= asked * 1000]
      }
      if (!r.already) {
        this.#start(r.slot ?? 0, r.token, sent, r)
        return [true, false]
      }
      // The permit was already ours: an earlier acquire whose answer was
      // lost, or a release that did not get through. Its lifetime was
      // counted from a write we may never have seen, and expiresAt is a
      // reading of the server's wall clock, which cannot be compared with
      // ours. So renew it at once and count from when that renew was sent,
      // on our monotonic clock.
      sent = now()
      const rn = await this.#route.renew(this.#name, r.slot ?? 0, r.token, this.#owner, this.#ttlSeconds, CALL_TIMEOUT_MS)
        .catch((e) => { this.#unsure ||= e instanceof UnavailableError; throw e })
      if (rn.renewed) {
        this.#start(r.slot ?? 0, rn.token, sent, rn)
        return [true, false]
      }
      // It expired or was deleted between the two answers: ask again.
    }
    throw new QueenLocksError(`acquiring ${JSON.stringify(this.#name)}: a permit the route said was ours was lost ${ALREADY_TRIES} times before it could be renewed`)
  }

  // Records a won permit, its deadline counted from sent, and starts renewing it.
  #start (slot, token, sent, answer) {
    this.#lease = {
      slot,
      token,
      deadline: sent + this.#ttlMs,
      expiresAt: answer.expiresAt ? new Date(answer.expiresAt) : undefined,
      guard: answer.guard,
      held: true,
      stopped: false,
      controller: new AbortController(),
      renewTimer: null,
      watchTimer: null,
      inflight: null,
      renewSeq: 0, // renews sent so far
      renewing: null // while a renew is in flight: a promise settled when it has answered
    }
    this.#reason = null
    this.#holders = []
    this.#unsure = false
    this.#schedule(this.#lease)
  }

  // Renew while two thirds of the lifetime we count are left; give up at the
  // deadline. Both timers are unref'd: holding a lock does not keep the
  // process alive.
  #schedule (lease, renewInMs) {
    clearTimeout(lease.renewTimer)
    clearTimeout(lease.watchTimer)
    const renewAt = renewInMs ?? lease.deadline - (2 * this.#ttlMs) / 3 - now()
    lease.renewTimer = setTimeout(() => { lease.inflight = this.#renew(lease) }, Math.max(0, renewAt)).unref()
    lease.watchTimer = setTimeout(() => this.#watch(lease), Math.max(0, lease.deadline - now())).unref()
  }

  #watch (lease) {
    if (!lease.held || lease.stopped) return
    const left = lease.deadline - now()
    if (left > 0) lease.watchTimer = setTimeout(() => this.#watch(lease), left).unref()
    else this.#lose(lease, LOST_EXPIRED)
  }

  #renew (lease) {
    if (!lease.held || lease.stopped) return
    lease.renewSeq++
    const p = this.#renewOnce(lease).finally(() => { if (lease.renewing === p) lease.renewing = null })
    lease.renewing = p
    return p
  }

  // Sends one renew with the token of the last answer and records its answer.
  async #renewOnce (lease) {
    const deadline = lease.deadline
    const sent = now()
    let r
    try {
      r = await this.#route.renew(this.#name, lease.slot, lease.token, this.#owner, this.#ttlSeconds, deadline - sent)
    } catch {
      // No answer, or one we cannot act on (a token being rotated, say):
      // keep trying, with the same token, until the deadline.
      if (lease.held && !lease.stopped) {
        clearTimeout(lease.renewTimer)
        lease.renewTimer = setTimeout(() => { lease.inflight = this.#renew(lease) }, Math.max(this.#ttlMs / 10, 100)).unref()
      }
      return
    }
    if (!lease.held) return
    if (!r.renewed) {
      this.#lose(lease, LOST_RENEW)
      return
    }
    if (now() >= deadline) {
      // It landed, but we learnt it only after our deadline: by then we had
      // to assume the lease over, and we keep to that.
      this.#lose(lease, LOST_EXPIRED)
      return
    }
    if (r.token >= lease.token) {
      lease.token = r.token
      lease.guard = r.guard ?? lease.guard
      if (r.expiresAt) lease.expiresAt = new Date(r.expiresAt)
    }
    lease.deadline = Math.max(lease.deadline, sent + this.#ttlMs)
    if (!lease.stopped) this.#schedule(lease)
    for (const fn of this.#onRenew) {
      try {
        fn(r.token)
      } catch (e) {
        process.emitWarning(`queen-locks onRenew callback of ${JSON.stringify(this.#name)} threw: ${e?.stack ?? e}`)
      }
    }
  }

  #lose (lease, reason) {
    if (!lease.held) return
    lease.held = false
    lease.stopped = true
    clearTimeout(lease.renewTimer)
    clearTimeout(lease.watchTimer)
    this.#reason = reason
    lease.controller.abort(new LockLostError(this.#name, reason))
    for (const fn of this.#onLost) {
      try {
        fn(reason)
      } catch (e) {
        process.emitWarning(`queen-locks onLost callback of ${JSON.stringify(this.#name)} threw: ${e?.stack ?? e}`)
      }
    }
  }

  /**
   * Stops renewing and releases the permit; a no-op when nothing is held.
   * Rejects with LockLostError when the server says it was no longer ours,
   * UnavailableError when the route did not answer for a while (the permit
   * then ends with its lifetime).
   */
  release () {
    return this.#queued(async () => {
      const lease = this.#lease
      if (!lease?.held) {
        if (this.#unsure) await this.#releaseUnsure()
        return
      }
      lease.stopped = true
      clearTimeout(lease.renewTimer)
      clearTimeout(lease.watchTimer)
      await lease.inflight // an in-flight renew has landed or failed; its token is recorded
      if (!lease.held) return // lost while we waited
      lease.held = false
      lease.controller.abort(new LockReleasedError(this.#name))
      const giveUp = Math.min(lease.deadline, now() + RELEASE_RETRY_MS)
      let poll = POLL_FIRST_MS
      let unanswered = false
      let r
      for (;;) {
        try {
          r = await this.#route.release(this.#name, lease.slot, lease.token, this.#owner, Math.max(100, Math.min(CALL_TIMEOUT_MS, giveUp - now())))
          break
        } catch (e) {
          const left = giveUp - now()
          if (e instanceof UnavailableError && left <= 0) this.#unsure = true
          if (!(e instanceof UnavailableError) || left <= 0) throw e
          unanswered = true
          await sleep(jitter(poll, left))
          poll = Math.min(poll * 2, POLL_MAX_MS)
        }
      }
      // After a release whose answer was lost, "lost" may mean that one landed.
      if (!r.released && !unanswered) throw new LockLostError(this.#name, r.reason ?? 'lost')
    })
  }

  // Releases the permits of our owner that an unanswered call may have left:
  // we never learnt their slot and token, so ask the route.
  async #releaseUnsure () {
    const { holders = [] } = await this.#route.get(this.#name)
    for (const h of holders) {
      // Not ours any more is as good as released here.
      if (h.owner === this.#owner) await this.#route.release(this.#name, h.slot, h.token, this.#owner)
    }
    this.#unsure = false
  }

  /**
   * Asks the server whether the handle's token is still the permit's. When
   * it is not, the lock counts as lost with reason guard. Resolves false
   * when nothing is held.
   */
  async check () {
    for (;;) {
      const lease = this.#lease
      if (!lease?.held) return false
      const { token, renewSeq } = lease
      let renewing = lease.renewing
      const { ok } = await this.#route.check(this.#name, lease.slot, token)
      if (ok) return true
      // Only a check of the token the lease still has counts. A renew that
      // overlapped the check may have moved the permit to a new token before
      // we recorded it: wait for its answer and check the token it leaves.
      if (!lease.held || this.#lease !== lease) return false // released or lost meanwhile
      const overlapped = renewing !== null || lease.renewSeq !== renewSeq || lease.token !== token
      renewing = lease.renewing
      if (!overlapped) {
        this.#lose(lease, LOST_GUARD)
        return false
      }
      if (renewing) await renewing
    }
  }

  /**
   * Acquires (waiting up to wait), runs fn(signal) with a signal aborted when
   * the lock is lost, and releases after, whatever fn did. Resolves
   * { acquired: false }, without running fn, when the lock could not be had
   * in time; { acquired: true, value } after fn resolved to value; rejects
   * with fn's error after releasing.
   */
  async run (fn, { wait } = {}) {
    if (typeof fn !== 'function') throw new TypeError(`run: fn must be a function, got ${typeof fn}`)
    let acquired
    try {
      acquired = await this.acquire({ wait })
    } catch (e) {
      // Given up on a route that did not answer: release whatever an
      // unanswered acquire may have taken.
      if (e instanceof UnavailableError) await this.release().catch(() => {})
      throw e
    }
    if (!acquired) return { acquired: false, value: undefined }
    let failed = true
    let value
    try {
      value = await fn(this.signal)
      failed = false
    } finally {
      try {
        await this.release()
      } catch (e) {
        // A lost lock was already reported; when fn failed, its error is the one to see.
        if (!(e instanceof LockLostError) && !failed) throw e
      }
    }
    return { acquired: true, value }
  }
}
