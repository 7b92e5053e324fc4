// The handle against a real route (see ../testing/support.js for how to
// point it at one).

import assert from 'node:assert/strict'
import { describe, it } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'

import { join } from 'node:path'

import { LOST_EXPIRED, LOST_GUARD, LOST_RENEW, LockLostError, LockReleasedError, QueenLocksError, UnavailableError, queenLocks } from '../index.js'
import { NAMESPACE, Proxy, TLS_DIR, URL_, client, deletePermit, live, testTLS, unique, waitFor, withKubectl, withTLS, writeConfigMap } from '../testing/support.js'

// A promise and the function that resolves it, for callbacks.
function later () {
  let resolve
  const promise = new Promise((r) => { resolve = r })
  return { promise, resolve }
}

// Rejects when p takes longer than ms: the thing awaited never happened.
function within (ms, p, what) {
  let timer
  const timeout = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms) })
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer))
}

describe('acquire and release', { skip: live }, () => {
  it('refuses a held lock to others until it is released', async () => {
    const c = client()
    const name = unique('job')
    const a = c.lock(name, { ttl: '30s' })
    const b = c.lock(name, { ttl: '30s' })
    assert.equal(await a.acquire(), true)
    assert.equal(a.held, true)
    assert.equal(a.slot, 0)
    const [holder] = await c.holders(name)
    assert.deepEqual([holder.owner, holder.token], [a.owner, a.token])

    assert.equal(await b.acquire(), false)
    assert.equal(b.reason, 'held')
    assert.deepEqual(b.holders.map((h) => h.owner), [a.owner])

    const signal = a.signal
    await a.release()
    assert.equal(a.held, false)
    assert.ok(signal.reason instanceof LockReleasedError, 'the signal ends at release')
    assert.deepEqual(await c.holders(name), [])
    assert.equal(await b.acquire(), true)
    assert.ok(b.token > a.token, "a later holder's token is higher")
    const g = b.guard()
    assert.deepEqual([g.op, g.key, g.expect, g.required], ['check', `${name}#0`, b.token, true])
    assert.equal(await b.check(), true)
    await b.release()
  })

  it('lets exactly one of many concurrent acquirers win', async () => {
    const c = client()
    const name = unique('race')
    const handles = Array.from({ length: 8 }, () => c.lock(name, { ttl: '30s' }))
    const won = await Promise.all(handles.map((h) => h.acquire()))
    assert.equal(won.filter(Boolean).length, 1, `winners: ${won}`)
    const winner = handles[won.indexOf(true)]
    const [holder] = await c.holders(name)
    assert.deepEqual([holder.owner, holder.token], [winner.owner, winner.token])
    for (const h of handles) if (h !== winner) assert.ok(['held', 'contended'].includes(h.reason), h.reason)
    await winner.release()
  })
})

describe('semaphores', { skip: live }, () => {
  it('gives n holders distinct slots and no more', async () => {
    const c = client()
    const name = unique('pool')
    const held = Array.from({ length: 3 }, () => c.semaphore(name, 3, { ttl: '30s' }))
    for (const h of held) assert.equal(await h.acquire(), true)
    assert.deepEqual(held.map((h) => h.slot).sort(), [0, 1, 2])
    const fourth = c.semaphore(name, 3, { ttl: '30s' })
    assert.equal(await fourth.acquire(), false)
    assert.deepEqual([fourth.reason, fourth.holders.length], ['held', 3])
    for (const h of held) await h.release()
  })

  it('never has more than n concurrent holders', async () => {
    const c = client()
    const name = unique('never-over')
    const n = 3
    let inside = 0
    let most = 0
    const slots = new Set()
    const worker = async () => {
      for (let i = 0; i < 3; i++) {
        const h = c.semaphore(name, n, { ttl: '30s' })
        const { acquired, value } = await h.run(async () => {
          assert.ok(!slots.has(h.slot), `slot ${h.slot} given twice`)
          slots.add(h.slot)
          most = Math.max(most, ++inside)
          await sleep(50) // hold it a moment, so holders overlap
          inside--
          slots.delete(h.slot)
          return i
        }, { wait: '60s' })
        assert.deepEqual([acquired, value], [true, i], 'run answers fn\'s value once it ran')
      }
    }
    await Promise.all(Array.from({ length: 8 }, worker))
    assert.ok(most <= n, `${most} holders at once`)
    assert.ok(most >= 2, 'holders never overlapped: the test proved nothing')
    assert.deepEqual(await c.holders(name), [])
  })
})

describe('renew', { skip: live }, () => {
  it('keeps a lock for several lifetimes, with a new token each time', async () => {
    const c = client()
    const name = unique('long-job')
    // A 2 s lifetime: six renewals outlive it twice over, with room for a
    // slow call on a loaded machine.
    const h = c.lock(name, { ttl: '2s' })
    const tokens = []
    const six = later()
    h.onRenew((t) => { tokens.push(t); if (tokens.length >= 6) six.resolve() })
    assert.equal(await h.acquire(), true)
    const first = h.token
    await within(30_000, six.promise, 'six renewals')
    assert.equal(h.held, true)
    assert.equal(h.signal.aborted, false)
    assert.deepEqual(tokens, [...new Set(tokens)].sort((x, y) => x - y), 'every renew answers a new, higher token')
    assert.ok(tokens[0] > first)
    const [holder] = await c.holders(name)
    assert.equal(holder.owner, h.owner)
    await h.release()
    assert.deepEqual(await c.holders(name), [])
  })

  it('retries a call whose answer was lost, with the same owner', async (t) => {
    const c = client()
    const name = unique('retried')
    const proxy = await Proxy.start(t, URL_)
    const h = client(proxy.url).lock(name, { ttl: '3s' })
    proxy.drop = 1 // the acquire lands, its answer does not come back
    assert.equal(await h.acquire({ wait: '10s' }), true)
    assert.ok(proxy.calls >= 2)
    let [holder] = await c.holders(name)
    assert.deepEqual([holder.owner, holder.token], [h.owner, h.token])

    // A renew whose answer is lost: the next one sends the same (now stale)
    // token and the route carries it through.
    let renewals = 0
    h.onRenew(() => renewals++)
    proxy.drop = 1
    await waitFor('two renewals after a lost answer', () => renewals >= 2)
    assert.equal(h.held, true);
    [holder] = await c.holders(name)
    assert.deepEqual([holder.owner, holder.token], [h.owner, h.token])
    await h.release()
  })
})

describe('unanswered calls', { skip: live }, () => {
  it('release frees what an unanswered acquire took', async (t) => {
    const c = client()
    const name = unique('unsure')
    const proxy = await Proxy.start(t, URL_)
    const h = client(proxy.url).lock(name, { ttl: '30s' })
    proxy.drop = 1 // the acquire lands, its answer does not come back
    await assert.rejects(h.acquire(), UnavailableError)
    const [holder] = await c.holders(name)
    assert.equal(holder.owner, h.owner)
    assert.equal(h.held, false)
    await h.release()
    assert.deepEqual(await c.holders(name), [], 'the permit the lost answer told of is still held')
  })
})

describe('loss', { skip: live }, () => {
  it('reports a permit deleted by hand with reason renew', { skip: withKubectl }, async () => {
    const name = unique('deleted')
    const ttl = 3000
    const h = client().lock(name, { ttl })
    const lost = later()
    h.onLost(lost.resolve)
    assert.equal(await h.acquire(), true)
    const signal = h.signal
    await deletePermit(name)
    const deleted = performance.now() // kubectl's own start-up is not the handle's
    const reason = await within(30_000, lost.promise, 'the loss')
    const took = performance.now() - deleted
    assert.equal(reason, LOST_RENEW)
    // The next renew, at most a third of the lifetime away, learns it (with
    // slack for a renew call on a busy machine).
    assert.ok(took < ttl / 3 + 2000, `learnt after ${took} ms`)
    assert.ok(signal.aborted && signal.reason instanceof LockLostError && signal.reason.reason === 'renew')
    assert.equal(h.held, false)
    assert.equal(h.reason, 'renew')
    await h.release() // nothing held: a no-op
  })

  it('gives up on a route that stops answering, on the local clock', async (t) => {
    const c = client()
    const name = unique('cut-off')
    const ttl = 2000
    // Requests reach the route 300 ms after they are sent, so the server's
    // lifetime starts later than the one the handle counts.
    const proxy = await Proxy.start(t, URL_, { delay: 300 })
    const h = client(proxy.url).lock(name, { ttl })
    const renewed = later()
    const lost = later()
    h.onRenew(renewed.resolve)
    h.onLost((reason) => lost.resolve({ reason, at: Date.now() }))
    const acquiredAt = Date.now()
    assert.equal(await h.acquire(), true)
    await within(30_000, renewed.promise, 'a renew')
    proxy.cut()
    const serverExpiry = h.expiresAt // of the last renew that got through
    const { reason, at } = await within(30_000, lost.promise, 'giving up')
    assert.equal(reason, LOST_EXPIRED)
    assert.ok(at < serverExpiry.getTime(), `lost at ${new Date(at).toISOString()}, the server's expiry ${serverExpiry.toISOString()}: the handle must give up first`)
    assert.ok(at >= acquiredAt + ttl, 'renewals got through: it cannot have expired within one lifetime')
    assert.equal(h.held, false)
    assert.equal(h.signal.aborted, true)
    const holders = await c.holders(name)
    for (const holder of holders) assert.equal(holder.owner, h.owner, "nobody else may have it before the server's expiry")
  })
})

describe('run', { skip: live }, () => {
  it('waits for the holder, and gives up when the wait ends', async (t) => {
    const c = client()
    const name = unique('turn')
    const holder = c.lock(name, { ttl: '30s' })
    assert.equal(await holder.acquire(), true)

    let ran = false
    assert.deepEqual(await c.lock(name, { ttl: '30s' }).run(() => { ran = true }, { wait: 300 }), { acquired: false, value: undefined })
    assert.equal(ran, false)

    const proxy = await Proxy.start(t, URL_)
    const waiter = client(proxy.url).lock(name, { ttl: '30s' })
    let seen
    const running = waiter.run(async (signal) => {
      seen = { held: waiter.held, aborted: signal.aborted, token: waiter.token }
      throw new Error("the job's own error")
    }, { wait: '20s' })
    await waitFor('the waiter to ask', () => proxy.calls >= 1)
    await holder.release()
    await assert.rejects(within(30_000, running, 'the waiter'), /the job's own error/)
    assert.deepEqual([seen.held, seen.aborted], [true, false])
    assert.ok(seen.token > holder.token)
    assert.equal(waiter.held, false)
    assert.deepEqual(await c.holders(name), [], 'run releases even when the job fails')
  })

  it('hands the job a signal that is aborted when the lock is lost', { skip: withKubectl }, async () => {
    const name = unique('aborted')
    const h = client().lock(name, { ttl: '60s' })
    const { acquired } = await h.run(async (signal) => {
      await deletePermit(name)
      assert.equal(await h.check(), false)
      assert.ok(signal.aborted && signal.reason.reason === LOST_GUARD)
    })
    assert.equal(acquired, true)
  })
})

describe('guard', { skip: live || withKubectl }, () => {
  it('is accepted by a guarded write, and refused after loss', async () => {
    const name = unique('fenced')
    const cm = unique('report')
    const h = client().lock(name, { ttl: '60s' }) // renews every 20 s: the token holds still while we write
    const reasons = []
    h.onLost((r) => reasons.push(r))
    assert.equal(await h.acquire(), true)
    const g = h.guard()
    const guard = `${g.key}=${g.expect}`
    assert.equal(guard, `${name}#0=${h.token}`)
    let r = await writeConfigMap(cm, guard, 'first', { create: true })
    assert.equal(r.code, 0, r.stderr)
    r = await writeConfigMap(cm, guard, 'second')
    assert.equal(r.code, 0, r.stderr)

    await deletePermit(name)
    assert.equal(await h.check(), false)
    assert.deepEqual(reasons, [LOST_GUARD])
    assert.equal(h.signal.aborted, true)

    r = await writeConfigMap(cm, guard, 'stale')
    assert.notEqual(r.code, 0, "a write under a lost lock's token was admitted")
    assert.match(r.stderr, /kv_precondition/)
    assert.ok(r.stderr.includes(name), r.stderr)
  })
})

describe('tls', { skip: withTLS }, () => {
  it('verifies an https route with the CA file', async (t) => {
    const proxy = await Proxy.start(t, URL_, { tls: testTLS() })
    assert.match(proxy.url, /^https:/)
    const name = unique('tls')
    const h = queenLocks({ url: proxy.url, namespace: NAMESPACE || undefined, caFile: join(TLS_DIR, 'ca.crt') }).lock(name, { ttl: '30s' })
    assert.equal(await h.acquire(), true)
    assert.equal((await client().holders(name))[0].owner, h.owner)
    await h.release()

    // Without the CA the route is not trusted: a clear error, at once, not
    // an unanswered call to retry.
    const stranger = queenLocks({ url: proxy.url, namespace: NAMESPACE || undefined }).lock(name, { ttl: '30s' })
    await assert.rejects(stranger.acquire({ wait: '30s' }), (e) =>
      e instanceof QueenLocksError && !(e instanceof UnavailableError) && /certificate/.test(e.message))
    assert.deepEqual(await client().holders(name), [])
  })
})
