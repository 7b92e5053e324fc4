// A client of the route, and the handles it makes.

import { Route } from './route.js'
import { Handle } from './handle.js'
import { validateName } from './input.js'

/**
 * A client of the route.
 *
 * url defaults to $QUEEN_LOCKS_URL (a bare http://host:port gets
 * /api/v1/locks); tokenFile to $QUEEN_LOCKS_TOKEN_FILE, else the projected
 * token at /var/run/secrets/queen-locks/token when it exists (read again when
 * it changes); namespace, when unset, is left to the route (the token's
 * ServiceAccount namespace); caFile verifies an https route.
 */
export function queenLocks ({ url, namespace, tokenFile, caFile } = {}) {
  return new Client({ url, namespace, tokenFile, caFile })
}

export class Client {
  #route

  constructor ({ url, namespace, tokenFile, caFile } = {}) {
    this.#route = new Route({
      url: url ?? process.env.QUEEN_LOCKS_URL,
      namespace,
      tokenFile: tokenFile ?? (process.env.QUEEN_LOCKS_TOKEN_FILE || undefined),
      caFile
    })
  }

  get url () { return this.#route.url }
  get namespace () { return this.#route.namespace }

  /** A handle on the lock name: one holder at a time, for ttl, renewed in the background while held. */
  lock (name, { ttl, owner } = {}) {
    return new Handle(this.#route, name, 1, ttl, owner)
  }

  /** A handle on one of n permits of name. */
  semaphore (name, n, { ttl, owner } = {}) {
    return new Handle(this.#route, name, n, ttl, owner)
  }

  /** Who holds name now, as the route lists holders. */
  async holders (name) {
    validateName(name)
    return (await this.#route.get(name)).holders ?? []
  }
}
