<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * The contract's limits on what a call may carry, checked here so that bad
 * input is refused before any request, with the field it is about.
 *
 * @internal
 */
final class Limits
{
    public const MAX_NAME_BYTES = 256;
    public const MAX_OWNER_BYTES = 256;
    public const MAX_TTL_SECONDS = 31536000;
    public const MAX_LIMIT = 1024;
    /** The longest one acquire call may wait at the route. */
    public const MAX_WAIT_SECONDS = 60;

    /** A lock name: 1 to 256 bytes of UTF-8, no control character, no '#'. */
    public static function name(string $name): string
    {
        if ($name === '') {
            throw new InvalidArgument('name', 'a lock name must not be empty');
        }
        if (strlen($name) > self::MAX_NAME_BYTES) {
            throw new InvalidArgument('name', sprintf('must be at most %d bytes, got %d', self::MAX_NAME_BYTES, strlen($name)));
        }
        // preg with /u refuses a subject that is not valid UTF-8.
        if (preg_match('//u', $name) !== 1) {
            throw new InvalidArgument('name', 'must be valid UTF-8');
        }
        $at = strpos($name, '#');
        if ($at !== false) {
            throw new InvalidArgument('name', sprintf("'%s' must not contain '#' (byte %d)", $name, $at));
        }
        // Unicode's control characters (category Cc): C0, DEL and C1.
        if (preg_match('/[\x{0}-\x{1F}\x{7F}-\x{9F}]/u', $name, $m, PREG_OFFSET_CAPTURE) === 1) {
            throw new InvalidArgument('name', sprintf('must not contain a control character (byte %d)', $m[0][1]));
        }
        return $name;
    }

    /** An owner: 1 to 256 bytes. */
    public static function owner(string $owner): string
    {
        if ($owner === '' || strlen($owner) > self::MAX_OWNER_BYTES) {
            throw new InvalidArgument('owner', sprintf('must be 1 to %d bytes, got %d', self::MAX_OWNER_BYTES, strlen($owner)));
        }
        return $owner;
    }

    /** A lifetime in seconds: from 1 to a year. A fraction is kept for our own clock. */
    public static function ttl(int|float $ttl): float
    {
        $s = (float) $ttl;
        if (!is_finite($s) || $s < 1 || $s > self::MAX_TTL_SECONDS) {
            throw new InvalidArgument('ttl', sprintf('must be from 1 to %d seconds, got %s', self::MAX_TTL_SECONDS, var_export($ttl, true)));
        }
        return $s;
    }

    /** The size of a semaphore: 1 to 1024. */
    public static function limit(int $n): int
    {
        if ($n < 1 || $n > self::MAX_LIMIT) {
            throw new InvalidArgument('n', sprintf('a semaphore has from 1 to %d permits, got %d', self::MAX_LIMIT, $n));
        }
        return $n;
    }

    /** A wait in seconds: null or 0 is one try. */
    public static function wait(?float $wait): float
    {
        if ($wait === null) {
            return 0.0;
        }
        if (!is_finite($wait) || $wait < 0) {
            throw new InvalidArgument('wait', sprintf('must be 0 or more seconds, got %s', var_export($wait, true)));
        }
        return $wait;
    }
}
