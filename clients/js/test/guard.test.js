// guardMetadata against a real route and API server: the label and
// annotation it answers fence a ConfigMap write (see ../testing/support.js
// for how to point it at one).

import assert from 'node:assert/strict'
import { describe, it } from 'node:test'

import { GUARD_ANNOTATION, GUARDED_LABEL, LOST_GUARD } from '../index.js'
import { client, deletePermit, kubectl, live, unique, waitFor, withKubectl } from '../testing/support.js'

/** Writes a ConfigMap whose labels and annotations are metadata's, as guardMetadata answers them. */
function writeConfigMapWith (name, metadata, value, { create = false } = {}) {
  const cm = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, ...metadata }, data: { report: value } }
  return kubectl([create ? 'create' : 'replace', '-f', '-'], JSON.stringify(cm))
}

describe('guardMetadata', { skip: live || withKubectl }, () => {
  it('fences a write until the lock is taken over', async (t) => {
    const c = client()
    const name = unique('fenced')
    const cm = unique('report')
    const h = c.lock(name, { ttl: '60s' }) // renews every 20 s: the token holds still while we write
    const reasons = []
    h.onLost((r) => reasons.push(r))
    assert.equal(h.guardMetadata(), undefined, 'a guard before any acquire')
    assert.equal(await h.acquire(), true)
    assert.deepEqual(h.guardMetadata(), {
      labels: { [GUARDED_LABEL]: 'true' },
      annotations: { [GUARD_ANNOTATION]: `${name}#0=${h.token}` }
    })
    let r = await writeConfigMapWith(cm, h.guardMetadata(), 'first', { create: true })
    assert.equal(r.code, 0, r.stderr)
    r = await writeConfigMapWith(cm, h.guardMetadata(), 'second')
    assert.equal(r.code, 0, r.stderr)

    // Taken over: the permit deleted by hand and acquired by another.
    await deletePermit(name)
    const b = c.lock(name, { ttl: '60s' })
    await waitFor('the other holder to acquire', () => b.acquire())
    t.after(() => b.release())
    r = await writeConfigMapWith(cm, h.guardMetadata(), 'stale')
    assert.notEqual(r.code, 0, "a replaced holder's write was admitted")
    assert.match(r.stderr, /kv_precondition/)
    assert.ok(r.stderr.includes(name), r.stderr)
    assert.equal(await h.check(), false)
    assert.deepEqual(reasons, [LOST_GUARD])
    assert.equal(h.guardMetadata(), undefined, 'a guard after the loss')
  })
})
