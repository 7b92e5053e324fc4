// The HTTP transport to the route: its URL, the bearer token file read again
// when it changes, the CA, one operation per call, and what an answer means.

import { request as httpRequest } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { readFile, stat } from 'node:fs/promises'
import { readFileSync } from 'node:fs'

import { QueenLocksError, RouteError, UnavailableError } from './errors.js'

export const ROUTE_PATH = '/api/v1/locks'
export const DEFAULT_TOKEN_FILE = '/var/run/secrets/queen-locks/token'

/** The longest wait one acquire call may carry (waitSeconds 0 to 60). */
export const MAX_WAIT_SECONDS = 60

// How long one call may go without an answer (an acquire that waits at the
// route gets its wait on top); a handle's own calls use it too.
export const CALL_TIMEOUT_MS = 30_000
// Answers a proxy or the route gives when the call may or may not have been
// applied: the same call sent again with the same owner converges.
const ANSWERLESS = new Set([502, 503, 504])

/** The route's full address: a bare server URL gets /api/v1/locks. */
export function routeURL (url) {
  if (!url) throw new TypeError('no route URL: pass { url } or set QUEEN_LOCKS_URL (for example http://localhost:6632)')
  let u
  try {
    u = new URL(url)
  } catch {
    throw new TypeError(`route URL ${JSON.stringify(url)}: not a URL`)
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || !u.host) {
    throw new TypeError(`route URL ${JSON.stringify(url)}: must be http:// or https:// with a host`)
  }
  if (u.pathname === '' || u.pathname === '/') u.pathname = ROUTE_PATH
  return u.toString()
}

/** A bearer token on disk, read again when the file changes (the kubelet rotates projected tokens). */
class TokenFile {
  #path
  #required
  #seen = ''
  #token = null

  constructor (path, required) {
    this.#path = path
    this.#required = required
  }

  async read () {
    let st
    try {
      st = await stat(this.#path)
    } catch (e) {
      if (e.code === 'ENOENT' && !this.#required) return null
      throw new QueenLocksError(`token file ${this.#path}: ${e.message}`, { cause: e })
    }
    const seen = `${st.dev}:${st.ino}:${st.mtimeMs}:${st.size}`
    if (seen !== this.#seen) {
      try {
        this.#token = (await readFile(this.#path, 'utf8')).trim() || null
      } catch (e) {
        throw new QueenLocksError(`token file ${this.#path}: ${e.message}`, { cause: e })
      }
      this.#seen = seen
    }
    return this.#token
  }
}

/** Calls the route: one operation per call. */
export class Route {
  #token
  #ca
  #request
  // Until the route refuses waitSeconds, assume it takes it; once it has,
  // stop sending it and poll instead.
  takesWait = true

  constructor ({ url, namespace, tokenFile, caFile }) {
    this.url = routeURL(url)
    this.namespace = namespace || undefined
    this.#token = new TokenFile(tokenFile ?? DEFAULT_TOKEN_FILE, tokenFile != null)
    if (caFile != null) {
      try {
        this.#ca = readFileSync(caFile)
      } catch (e) {
        throw new TypeError(`CA file ${caFile}: ${e.code === 'ENOENT' ? 'does not exist' : e.message}`)
      }
    }
    this.#request = this.url.startsWith('https:') ? httpsRequest : httpRequest
  }

  async call (op, timeoutMs = CALL_TIMEOUT_MS) {
    const body = JSON.stringify({ ...(this.namespace && { namespace: this.namespace }), operations: [op] })
    const headers = { 'content-type': 'application/json', accept: 'application/json', 'content-length': Buffer.byteLength(body) }
    const token = await this.#token.read()
    if (token) headers.authorization = `Bearer ${token}`
    const what = `${op.op} ${JSON.stringify(op.name)}`
    const { status, raw } = await new Promise((resolve, reject) => {
      const req = this.#request(this.url, { method: 'POST', headers, ca: this.#ca, agent: false }, (res) => {
        const chunks = []
        let size = 0
        res.on('data', (c) => {
          size += c.length
          if (size > 4 << 20) req.destroy(new Error('answer over 4 MiB'))
          else chunks.push(c)
        })
        res.on('end', () => resolve({ status: res.statusCode, raw: Buffer.concat(chunks).toString('utf8') }))
        res.on('error', (e) => reject(e))
      })
      const timer = setTimeout(() => req.destroy(new Error(`no answer within ${Math.round(timeoutMs)} ms`)), Math.max(timeoutMs, 50))
      timer.unref()
      req.on('close', () => clearTimeout(timer))
      req.on('error', (e) => reject(e))
      req.end(body)
    }).catch((e) => {
      if (untrusted(e)) {
        // Asking again will not help: the route is not the one we trust.
        throw new QueenLocksError(`${what}: ${this.url}: ${e.message}: the route's certificate is not trusted (pass caFile)`, { cause: e })
      }
      throw new UnavailableError(`${what}: no answer from ${this.url}: ${e.message}`, { cause: e })
    })
    if (status !== 200) throw refusal(status, raw)
    let results
    try {
      results = JSON.parse(raw).results
    } catch {
      throw new QueenLocksError(`the route answered something that is not JSON results: ${raw.slice(0, 200)}`)
    }
    if (!Array.isArray(results) || results.length !== 1) throw new QueenLocksError(`the route answered ${results?.length} results to one operation`)
    return results[0]
  }

  // Answers [result, how long the route was asked to wait].
  async acquire (name, owner, ttlSeconds, limit, waitSeconds = 0) {
    const op = { op: 'acquire', name, ttlSeconds, owner, limit }
    if (waitSeconds > 0 && this.takesWait) {
      try {
        return [await this.call({ ...op, waitSeconds }, CALL_TIMEOUT_MS + waitSeconds * 1000), waitSeconds]
      } catch (e) {
        // A route from before waitSeconds refuses the field whole (400,
        // nothing applied): remember it and ask without.
        if (!(e instanceof RouteError) || e.code !== 400 || e.field !== 'waitSeconds') throw e
        this.takesWait = false
      }
    }
    return [await this.call(op), 0]
  }

  renew (name, slot, token, owner, ttlSeconds, timeoutMs) {
    return this.call({ op: 'renew', name, slot, token, owner, ttlSeconds }, timeoutMs)
  }

  release (name, slot, token, owner, timeoutMs) {
    return this.call({ op: 'release', name, slot, token, owner }, timeoutMs)
  }

  get (name) { return this.call({ op: 'get', name }) }

  check (name, slot, expect) { return this.call({ op: 'check', name, slot, expect }) }
}

// A TLS error of the route's certificate (OpenSSL's verify codes, Node's altname check).
function untrusted (e) {
  return typeof e?.code === 'string' && (/CERT|ISSUER|SIGNATURE/.test(e.code) || e.code === 'ERR_TLS_CERT_ALTNAME_INVALID')
}

function refusal (status, raw) {
  let message = raw.trim()
  let field, index
  try {
    const e = JSON.parse(raw).error
    if (e && typeof e === 'object') ({ message = message, field, index } = e)
  } catch {}
  if (ANSWERLESS.has(status)) return new UnavailableError(`the route answered ${status}: ${message}`, { code: status })
  return new RouteError(status, message, { field, index })
}
