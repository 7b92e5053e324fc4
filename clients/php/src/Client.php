<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * Makes handles over the route.
 *
 *     $client = new QueenLocks\Client();   // $QUEEN_LOCKS_URL, the projected token
 *     $lock = $client->lock('daily-report', 30);
 *
 * url defaults to $QUEEN_LOCKS_URL (a bare http://host:port gets
 * /api/v1/locks); tokenFile to $QUEEN_LOCKS_TOKEN_FILE, else the projected
 * token at /var/run/secrets/queen-locks/token when that file exists (read
 * again when it changes); namespace, when null, is left to the route (the
 * token's ServiceAccount namespace); caFile verifies an https route.
 */
final class Client
{
    private readonly Route $route;

    public function __construct(
        ?string $url = null,
        ?string $namespace = null,
        ?string $tokenFile = null,
        ?string $caFile = null,
    ) {
        $url ??= self::env('QUEEN_LOCKS_URL') ?? '';
        $tokenFile ??= self::env('QUEEN_LOCKS_TOKEN_FILE');
        if ($tokenFile === '') {
            throw new InvalidArgument('tokenFile', 'must not be empty (null: the environment or the default path)');
        }
        $token = $tokenFile !== null
            ? new TokenFile($tokenFile, true)
            : new TokenFile(TokenFile::DEFAULT_PATH, false);
        $this->route = new Route($url, $namespace === '' ? null : $namespace, $token, $caFile);
    }

    /** The route's full URL. */
    public function url(): string
    {
        return $this->route->url;
    }

    /** A handle on the lock $name: one holder at a time, for $ttl seconds between renews. */
    public function lock(string $name, int|float $ttl, ?string $owner = null): Handle
    {
        return new Handle($this->route, $name, 1, $ttl, $owner);
    }

    /** A handle on one of $n permits of $name. Every holder of one name should use the same $n. */
    public function semaphore(string $name, int $n, int|float $ttl, ?string $owner = null): Handle
    {
        return new Handle($this->route, $name, $n, $ttl, $owner);
    }

    /**
     * Who holds $name now, as the route's holders: slot, owner, token,
     * since, renewedAt, expiresAt.
     *
     * @return list<array<string, mixed>>
     */
    public function holders(string $name): array
    {
        return $this->route->get(Limits::name($name))['holders'] ?? [];
    }

    /** An owner unique to this process and call: host:pid:random. */
    public static function mintOwner(): string
    {
        return sprintf('%s:%d:%s', gethostname() ?: 'localhost', getmypid(), bin2hex(random_bytes(4)));
    }

    private static function env(string $name): ?string
    {
        $v = getenv($name);
        return $v === false || $v === '' ? null : $v;
    }
}
