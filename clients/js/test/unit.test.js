// Pure tests of one function each: no route needed.

import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import net from 'node:net'
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises'
import { hostname, tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, it } from 'node:test'

import { QueenLocksError, RouteError, UnavailableError, mintOwner, parseDuration, queenLocks, routeURL } from '../index.js'

describe('bad input fails before any call', () => {
  let server
  let calls = 0
  let c
  before(async () => {
    // A listener that counts connections: none may be made.
    server = net.createServer((s) => { calls++; s.destroy() })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    c = queenLocks({ url: `http://127.0.0.1:${server.address().port}` })
  })
  after(() => {
    server.close()
    assert.equal(calls, 0, 'a call was made')
  })

  it('names', () => {
    const cases = {
      '': /must not be empty/,
      'a#b': /'#'/,
      'tab\there': /control character \(U\+0009/,
      'del\x7f': /control character \(U\+007F/,
      ['x'.repeat(257)]: /at most 256 bytes, got 257/,
      ['é'.repeat(129)]: /at most 256 bytes, got 258/,
      '\ud800': /valid UTF-8/
    }
    for (const [name, says] of Object.entries(cases)) assert.throws(() => c.lock(name, { ttl: '30s' }), says)
    assert.equal(c.lock('é'.repeat(128), { ttl: '30s' }).name, 'é'.repeat(128))
    assert.throws(() => c.lock(42, { ttl: '30s' }), TypeError)
  })

  it('ttl', () => {
    for (const ttl of [0, 999, '999ms', '0s', -1000, NaN, Infinity, '31536001s']) {
      assert.throws(() => c.lock('x', { ttl }), /ttl/, `ttl ${ttl}`)
    }
    for (const ttl of ['30', '30 s', '1d', null, true]) assert.throws(() => c.lock('x', { ttl }), TypeError, `ttl ${ttl}`)
    assert.throws(() => c.lock('x'), /ttl is required/)
    assert.equal(c.lock('x', { ttl: '2m' }).ttl, 120_000)
    assert.equal(c.lock('x', { ttl: 1000 }).ttl, 1000)
  })

  it('semaphore size', () => {
    for (const n of [0, -1, 1025]) assert.throws(() => c.semaphore('x', n, { ttl: '30s' }), /from 1 to 1024/)
    for (const n of [1.5, '3', undefined]) assert.throws(() => c.semaphore('x', n, { ttl: '30s' }), TypeError)
    assert.equal(c.semaphore('x', 1024, { ttl: '30s' }).limit, 1024)
  })

  it('wait and run', async () => {
    const h = c.lock('x', { ttl: '30s' })
    await assert.rejects(h.acquire({ wait: -1 }), RangeError)
    await assert.rejects(h.acquire({ wait: '10 seconds' }), TypeError)
    await assert.rejects(h.run('not a function'), TypeError)
  })

  it('CA file', () => {
    assert.throws(() => queenLocks({ url: 'https://127.0.0.1:1', caFile: '/nonexistent/ca.crt' }), /CA file \/nonexistent\/ca.crt: does not exist/)
  })

  it('owner', () => {
    for (const owner of ['', 'o'.repeat(257), 7]) assert.throws(() => c.lock('x', { ttl: '30s', owner }), /owner/)
  })
})

describe('durations', () => {
  it('parse', () => {
    assert.equal(parseDuration('500ms'), 500)
    assert.equal(parseDuration('30s'), 30_000)
    assert.equal(parseDuration('2m'), 120_000)
    assert.equal(parseDuration('1h'), 3_600_000)
    assert.equal(parseDuration('1m30s'), 90_000)
    assert.equal(parseDuration('1.5s'), 1500)
    assert.equal(parseDuration(250), 250)
  })
})

describe('owners', () => {
  it('are host:pid:random and differ', () => {
    const a = mintOwner()
    const [host, pid, rand] = a.split(':')
    assert.deepEqual([host, pid, rand.length], [hostname(), String(process.pid), 8])
    assert.notEqual(a, mintOwner())
    const c = queenLocks({ url: 'http://127.0.0.1:1' })
    assert.notEqual(c.lock('x', { ttl: '30s' }).owner, c.lock('x', { ttl: '30s' }).owner)
  })
})

describe('urls', () => {
  it('a bare server gets the route path', () => {
    assert.equal(routeURL('http://localhost:6632'), 'http://localhost:6632/api/v1/locks')
    assert.equal(routeURL('https://q.ns.svc:6632/'), 'https://q.ns.svc:6632/api/v1/locks')
    assert.equal(routeURL('http://h:1/api/v1/locks'), 'http://h:1/api/v1/locks')
    for (const bad of ['', 'localhost:6632', 'ftp://h/x', 'http://']) assert.throws(() => routeURL(bad), TypeError, bad)
  })

  it('default to the environment', () => {
    const old = process.env.QUEEN_LOCKS_URL
    try {
      process.env.QUEEN_LOCKS_URL = 'http://127.0.0.1:6632'
      assert.equal(queenLocks().url, 'http://127.0.0.1:6632/api/v1/locks')
      delete process.env.QUEEN_LOCKS_URL
      assert.throws(() => queenLocks(), /QUEEN_LOCKS_URL/)
    } finally {
      if (old !== undefined) process.env.QUEEN_LOCKS_URL = old
    }
  })
})

// A stub route: answers as a route from before waitSeconds (400 naming the
// field), and records what it was sent.
async function stubRoute (t) {
  const seen = []
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (d) => { body += d })
    req.on('end', () => {
      const op = JSON.parse(body).operations[0]
      seen.push({ op, authorization: req.headers.authorization })
      const [code, answer] = 'waitSeconds' in op
        ? [400, { error: { code: 400, index: 0, field: 'waitSeconds', message: 'operations[0].waitSeconds: unknown field for acquire' } }]
        : [200, { results: [{ index: 0, op: op.op, name: op.name, acquired: false, reason: 'held', holders: [] }] }]
      res.writeHead(code, { 'content-type': 'application/json' }).end(JSON.stringify(answer))
    })
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => server.close())
  return { url: `http://127.0.0.1:${server.address().port}`, seen }
}

describe('waitSeconds', () => {
  it('a route that refuses it is polled instead, and remembered', async (t) => {
    const { url, seen } = await stubRoute(t)
    const h = queenLocks({ url }).lock('x', { ttl: '30s' })
    assert.equal(await h.acquire({ wait: '1.5s' }), false)
    assert.equal(h.reason, 'held')
    const asked = seen.map((s) => 'waitSeconds' in s.op)
    assert.equal(asked[0], true, 'the first call asks the route to wait')
    assert.ok(asked.slice(1).every((a) => !a), `then it polls: ${asked}`)
    assert.ok(asked.length >= 3, `polled ${asked.length - 1} times in 1.5 s`)
  })

  it('the token file is read again when it changes', async (t) => {
    const { url, seen } = await stubRoute(t)
    const dir = await mkdtemp(join(tmpdir(), 'queen-locks-'))
    t.after(() => rm(dir, { recursive: true }))
    const tokenFile = join(dir, 'token')
    await writeFile(tokenFile, 'first\n')
    const h = queenLocks({ url, tokenFile }).lock('x', { ttl: '30s' })
    await h.acquire()
    // The kubelet swaps in a new file: another inode, perhaps the same size.
    await writeFile(join(dir, 'new'), 'other\n')
    await rename(join(dir, 'new'), tokenFile)
    await h.acquire()
    assert.deepEqual(seen.map((s) => s.authorization), ['Bearer first', 'Bearer other'])
    await rm(tokenFile)
    await assert.rejects(h.acquire(), (e) => e instanceof QueenLocksError && e.message.includes(tokenFile))
  })
})

describe('refusals', () => {
  it('answer-less ones are UnavailableError, others RouteError', async (t) => {
    const server = createServer((req, res) => {
      const code = Number(req.url.split('/')[1])
      res.writeHead(code).end(JSON.stringify({ error: { code, message: 'no', index: 0, field: 'ttlSeconds' } }))
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    t.after(() => server.close())
    const at = (code) => queenLocks({ url: `http://127.0.0.1:${server.address().port}/${code}` }).lock('x', { ttl: '30s' })
    await assert.rejects(at(503).acquire(), UnavailableError)
    await assert.rejects(at(400).acquire(), (e) => e instanceof RouteError && e.code === 400 && e.field === 'ttlSeconds' && e.index === 0)
    await assert.rejects(at(401).acquire(), (e) => e instanceof RouteError && e.code === 401)
  })
})
