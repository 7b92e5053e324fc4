// What a caller hands in: lock names, owners, durations, and their limits.

import { hostname } from 'node:os'
import { randomBytes } from 'node:crypto'

export const MAX_NAME_BYTES = 256
export const MAX_OWNER_BYTES = 256
export const MAX_TTL_SECONDS = 31536000
export const MAX_LIMIT = 1024

/** An owner unique to this process and call: host:pid:random. */
export function mintOwner () {
  return `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`
}

/** Throws when name is not a valid lock name (1 to 256 bytes of UTF-8, no control character, no '#'). */
export function validateName (name) {
  if (typeof name !== 'string') throw new TypeError(`lock name must be a string, got ${typeof name}`)
  if (name === '') throw new RangeError('lock name: must not be empty')
  if (!name.isWellFormed()) throw new RangeError(`lock name ${JSON.stringify(name)}: must be valid UTF-8 (a lone surrogate)`)
  const size = Buffer.byteLength(name, 'utf8')
  if (size > MAX_NAME_BYTES) throw new RangeError(`lock name: must be at most ${MAX_NAME_BYTES} bytes, got ${size}`)
  const hash = name.indexOf('#')
  if (hash >= 0) throw new RangeError(`lock name ${JSON.stringify(name)}: must not contain '#' (character ${hash})`)
  const control = name.search(/[\u0000-\u001f\u007f-\u009f]/)
  if (control >= 0) {
    const code = name.charCodeAt(control).toString(16).toUpperCase().padStart(4, '0')
    throw new RangeError(`lock name ${JSON.stringify(name)}: must not contain a control character (U+${code} at character ${control})`)
  }
}

const UNITS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }

/**
 * A duration in milliseconds: a number of milliseconds, or a string such as
 * '500ms', '30s', '2m', '1h' or '1m30s'.
 */
export function parseDuration (value, what = 'duration') {
  let ms
  if (typeof value === 'number') {
    ms = value
  } else if (typeof value === 'string' && /^(\d+(\.\d+)?(ms|s|m|h))+$/.test(value)) {
    ms = 0
    for (const [, n, , unit] of value.matchAll(/(\d+(\.\d+)?)(ms|s|m|h)/g)) ms += Number(n) * UNITS[unit]
  } else {
    throw new TypeError(`${what} must be milliseconds (a number) or a string like '30s', '2m' or '500ms', got ${JSON.stringify(value)}`)
  }
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`${what} must be a finite duration of 0 or more, got ${JSON.stringify(value)}`)
  return ms
}
