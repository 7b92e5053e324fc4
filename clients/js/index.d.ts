// Types of queen-locks for Node (index.js).

/** A duration: milliseconds as a number, or a string such as '500ms', '30s', '2m', '1h', '1m30s'. */
export type Duration = number | string

/** Why a held lock was lost. */
export type LostReason = 'renew' | 'guard' | 'expired'

export const ROUTE_PATH: '/api/v1/locks'
export const DEFAULT_TOKEN_FILE: string
export const LOST_RENEW: 'renew'
export const LOST_GUARD: 'guard'
/** The label that opts an object in to fencing. */
export const GUARDED_LABEL: 'locks.queen.dev/guarded'
/** The annotation each write to a guarded object carries. */
export const GUARD_ANNOTATION: 'locks.queen.dev/guard'
/** What guardMetadata answers: metadata to merge into a Kubernetes object's. */
export interface GuardMetadata {
  labels: { 'locks.queen.dev/guarded': 'true' }
  /** "<lock>#<slot>=<token>" with the current token. */
  annotations: { 'locks.queen.dev/guard': string }
}
export const LOST_EXPIRED: 'expired'
export const MAX_NAME_BYTES: 256
export const MAX_OWNER_BYTES: 256
export const MAX_TTL_SECONDS: 31536000
export const MAX_LIMIT: 1024
export const MAX_WAIT_SECONDS: 60

export interface ClientOptions {
  /** The route, e.g. http://queen-locks.queen-locks.svc:6632 (default $QUEEN_LOCKS_URL). */
  url?: string
  /** Namespace of the locks; unset: the namespace of the token's ServiceAccount. */
  namespace?: string
  /** The projected token (default $QUEEN_LOCKS_TOKEN_FILE, else /var/run/secrets/queen-locks/token when it exists). */
  tokenFile?: string
  /** A CA bundle (PEM) that verifies an https route. */
  caFile?: string
}

export interface HandleOptions {
  /** The lifetime: from 1s to 31536000s. Renewed every third of it while held. */
  ttl: Duration
  /** The holder's owner; default host:pid:random, minted per handle. */
  owner?: string
}

export interface WaitOptions {
  /** How long to wait for the lock; none: one try. */
  wait?: Duration
}

/** What run resolves to: whether fn ran, and what it resolved to if so. */
export type RunResult<T> = { acquired: true, value: T } | { acquired: false, value: undefined }

/** One held permit, as the route lists holders. */
export interface Holder {
  slot: number
  owner: string
  token: number
  since: string
  renewedAt: string
  expiresAt: string
}

/** The check that fences a write with the current token. */
export interface Guard {
  op: 'check'
  ns: string
  namespace: string
  /** "<lock>#<slot>": the annotation locks.queen.dev/guard is `${key}=${expect}`. */
  key: string
  expect: number
  required: boolean
}

export class QueenLocksError extends Error {}

/** The route refused the call (an answer other than 200): nothing of it was applied. */
export class RouteError extends QueenLocksError {
  code: number
  field?: string
  index?: number
}

/** The route did not answer (connection error, timeout, 503); trying again with the same handle converges. */
export class UnavailableError extends QueenLocksError {
  code?: number
}

/** The lock was lost, or a release found it no longer ours. */
export class LockLostError extends QueenLocksError {
  lock: string
  reason: LostReason | 'lost'
}

/** The reason of a handle's signal after release. */
export class LockReleasedError extends QueenLocksError {
  lock: string
}

export function queenLocks (options?: ClientOptions): Client

export class Client {
  constructor (options?: ClientOptions)
  /** The route's full address. */
  readonly url: string
  readonly namespace: string | undefined
  /** A lock: one holder at a time. Throws on a bad name or ttl before any call. */
  lock (name: string, options: HandleOptions): Handle
  /** One of n permits (1 to 1024) of name. */
  semaphore (name: string, n: number, options: HandleOptions): Handle
  /** Who holds name now. */
  holders (name: string): Promise<Holder[]>
}

export class Handle {
  readonly name: string
  readonly limit: number
  /** The lifetime, in milliseconds. */
  readonly ttl: number
  readonly owner: string
  readonly held: boolean
  /** The current fencing token; read it when you use it, every renew changes it. */
  readonly token: number | undefined
  readonly slot: number | undefined
  /** When the server counts the permit expired, by its clock, as of the last answer. */
  readonly expiresAt: Date | undefined
  /** Why the last acquire failed (held, contended) or why the lock was lost. */
  readonly reason: string | null
  /** Who held the lock when the last acquire answered held. */
  readonly holders: Holder[]
  /** Aborted when the lock is lost (LockLostError) or released (LockReleasedError). */
  readonly signal: AbortSignal

  /** Takes the lock, waiting up to wait; false when it was held elsewhere the whole time. */
  acquire (options?: WaitOptions): Promise<boolean>
  /** Stops renewing and releases; a no-op when nothing is held. */
  release (): Promise<void>
  /**
   * Acquires, runs fn with a signal aborted on loss, releases after.
   * acquired is false when the lock could not be had in time (fn did not
   * run); value is what fn resolved to.
   */
  run<T> (fn: (signal: AbortSignal) => T | Promise<T>, options?: WaitOptions): Promise<RunResult<T>>
  /** The guard object of the last acquire or renew answer. */
  guard (): Guard | undefined
  /** The label and annotation that fence a write with the current token; undefined while nothing is held. */
  guardMetadata (): GuardMetadata | undefined
  /** Whether the token is still the permit's; a failed check is a loss with reason guard. */
  check (): Promise<boolean>
  onLost (fn: (reason: LostReason) => void): this
  onRenew (fn: (token: number) => void): this
}

export function mintOwner (): string
export function validateName (name: string): void
export function parseDuration (value: Duration, what?: string): number
export function routeURL (url: string): string
