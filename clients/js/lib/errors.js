// The errors the route and a handle raise.

/** Base of every error the route or a handle raises. */
export class QueenLocksError extends Error {
  get name () { return this.constructor.name }
}

/** The route refused the call (an answer other than 200): nothing of it was applied. */
export class RouteError extends QueenLocksError {
  constructor (code, message, { field, index } = {}) {
    super(`the route answered ${code}: ${message}`)
    this.code = code
    this.field = field
    this.index = index
  }
}

/**
 * The route did not answer (connection error, timeout, 503). The call may or
 * may not have been applied: the same call again, with the same owner,
 * converges. Handles keep their owner, so simply try again.
 */
export class UnavailableError extends QueenLocksError {
  constructor (message, { code, cause } = {}) {
    super(message, { cause })
    this.code = code
  }
}

/** The lock was lost (reason renew, guard or expired), or a release found it no longer ours (lost). */
export class LockLostError extends QueenLocksError {
  constructor (lock, reason) {
    super(`lock ${JSON.stringify(lock)} was lost (${reason})`)
    this.lock = lock
    this.reason = reason
  }
}

/** The reason of a handle's signal after release. */
export class LockReleasedError extends QueenLocksError {
  constructor (lock) {
    super(`lock ${JSON.stringify(lock)} was released`)
    this.lock = lock
  }
}
