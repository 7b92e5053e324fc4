// What the tests share: where the route is, kubectl, and a loopback proxy
// that a test can slow down, cut, or make lose answers. (Kept out of test/,
// where node --test would run it as a test file.)
//
// The route tests need a route. `go test ./clients/` starts a control plane
// and sets the variables below; by hand, against `make dev`:
//
//   QUEEN_LOCKS_TEST_URL=http://localhost:6632 QUEEN_LOCKS_TEST_NAMESPACE=default \
//   QUEEN_LOCKS_TEST_KUBECONFIG=.dev/kubeconfig QUEEN_LOCKS_TEST_KUBECTL=bin/kubectl \
//   node --test clients/js/test/

import { execFile } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import net from 'node:net'
import { join } from 'node:path'
import { readFileSync } from 'node:fs'
import tls from 'node:tls'
import { setTimeout as sleep } from 'node:timers/promises'

import { queenLocks } from '../index.js'

export const URL_ = process.env.QUEEN_LOCKS_TEST_URL ?? ''
export const NAMESPACE = process.env.QUEEN_LOCKS_TEST_NAMESPACE ?? ''
const KUBECONFIG = process.env.QUEEN_LOCKS_TEST_KUBECONFIG ?? ''
const KUBECTL = process.env.QUEEN_LOCKS_TEST_KUBECTL ?? ''
export const TLS_DIR = process.env.QUEEN_LOCKS_TEST_TLS_DIR ?? ''

/** false when the route tests can run, else why they are skipped. */
export const live = URL_
  ? false
  : 'QUEEN_LOCKS_TEST_URL is not set: these tests need a running route ' +
    '(go test ./clients/ sets it; by hand: make dev, then QUEEN_LOCKS_TEST_URL=http://localhost:6632)'

/** false when kubectl can be used, else why the test is skipped. */
export const withKubectl = live || (KUBECONFIG && KUBECTL
  ? false
  : 'QUEEN_LOCKS_TEST_KUBECONFIG and QUEEN_LOCKS_TEST_KUBECTL are not set: this test deletes a permit ' +
    'or writes a ConfigMap by hand (go test ./clients/ sets them; under make dev: .dev/kubeconfig and bin/kubectl)')

/** false when a CA and a certificate for 127.0.0.1 are given, else why the test is skipped. */
export const withTLS = live || (TLS_DIR
  ? false
  : 'QUEEN_LOCKS_TEST_TLS_DIR is not set: this test needs a CA (ca.crt) and a certificate for 127.0.0.1 ' +
    '(tls.crt, tls.key) for an https proxy in front of the route (go test ./clients/ makes them)')

/** The test certificate and key, for Proxy.start's tls. */
export function testTLS () {
  return { cert: readFileSync(join(TLS_DIR, 'tls.crt')), key: readFileSync(join(TLS_DIR, 'tls.key')) }
}

export function client (url = URL_) {
  return queenLocks({ url, namespace: NAMESPACE || undefined })
}

/** A lock name no other run has used, so runs against make dev do not meet. */
export function unique (prefix) {
  return `${prefix}-${randomBytes(3).toString('hex')}`
}

/** Runs kubectl in the test namespace; resolves { code, stdout, stderr }. */
export function kubectl (args, stdin) {
  const ns = NAMESPACE ? ['-n', NAMESPACE] : []
  return new Promise((resolve) => {
    const child = execFile(KUBECTL, ['--kubeconfig', KUBECONFIG, ...ns, ...args], { timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr })
    })
    child.stdin.end(stdin ?? '')
  })
}

/** Deletes the permit of a simply named lock, as an operator would. */
export async function deletePermit (lock, slot = 0) {
  const r = await kubectl(['delete', 'queenlock', `${lock}.${slot}`, '--wait=false'])
  if (r.code !== 0) throw new Error(`kubectl delete: ${r.stderr}`)
}

/** Writes a guarded ConfigMap with the guard annotation, as every write to one must carry. */
export function writeConfigMap (name, guard, value, { create = false } = {}) {
  const cm = {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: {
      name,
      labels: { 'locks.queen.dev/guarded': 'true' },
      annotations: { 'locks.queen.dev/guard': guard }
    },
    data: { report: value }
  }
  return kubectl([create ? 'create' : 'replace', '-f', '-'], JSON.stringify(cm))
}

/** Waits until cond() is true, checking every 20 ms. */
export async function waitFor (what, cond, timeoutMs = 30_000) {
  const end = Date.now() + timeoutMs
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`waiting for ${what}: gave up after ${timeoutMs} ms`)
    await sleep(20)
  }
}

/**
 * A loopback TCP proxy in front of the route. delay holds back each piece of
 * a request before passing it on (so the server admits a write later than
 * the client sent it); drop, when > 0, is how many of the next calls lose
 * their answer: the request reaches the route, the client sees the
 * connection close. cut() stops it for good: the route stops answering.
 */
export class Proxy {
  delay = 0
  drop = 0
  calls = 0
  #server
  #sockets = new Set()

  /** Starts a proxy to target, https with tls ({ cert, key }); it is cut when test t ends. */
  static async start (t, target, { delay = 0, tls: creds } = {}) {
    const p = new Proxy()
    p.delay = delay
    const to = new URL(target)
    const [host, port] = [to.hostname, Number(to.port)]
    const serve = (c) => p.#connect(c, host, port)
    p.#server = creds ? tls.createServer(creds, serve) : net.createServer(serve)
    if (creds) to.protocol = 'https:'
    await new Promise((resolve) => p.#server.listen(0, '127.0.0.1', resolve))
    t.after(() => p.cut())
    to.host = `127.0.0.1:${p.#server.address().port}`
    p.url = to.toString()
    return p
  }

  #connect (c, host, port) {
    this.calls++
    const drop = this.drop > 0
    if (drop) this.drop--
    const s = net.connect(port, host)
    for (const sock of [c, s]) {
      this.#sockets.add(sock)
      sock.on('error', () => { c.destroy(); s.destroy() })
      sock.on('close', () => this.#sockets.delete(sock))
    }
    c.on('close', () => s.destroy())
    // The request, each piece held back by delay; its end passed on after them.
    let pending = Promise.resolve()
    c.on('data', (data) => {
      pending = pending.then(() => this.delay && delay(this.delay)).then(() => { s.write(data) })
    })
    c.on('end', () => { pending = pending.then(() => s.end()) })
    if (drop) {
      // A dropped answer: the request got there, the client sees the connection close.
      s.once('data', () => { c.destroy(); s.destroy() })
    } else {
      s.pipe(c)
    }
  }

  cut () {
    this.#server.close()
    for (const sock of this.#sockets) sock.destroy()
  }
}

const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
