<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * One acquisition: what the server last answered about our permit, and the
 * times, on this process's monotonic clock (hrtime, nanoseconds), that
 * keepAlive() goes by.
 *
 * @internal
 */
final class Lease
{
    public ?\DateTimeImmutable $expiresAt;
    /** @var array<string, mixed>|null */
    public ?array $guard;

    /**
     * @param int                  $deadline    when we must assume it is over: the send time of
     *                                          the last successful acquire or renew, plus the ttl
     * @param int                  $nextRenewAt when keepAlive() next renews
     * @param array<string, mixed> $answer      the answer that won or renewed it
     */
    public function __construct(
        public readonly int $slot,
        public int $token,
        public int $deadline,
        public int $nextRenewAt,
        array $answer,
    ) {
        $this->expiresAt = self::time($answer['expiresAt'] ?? null);
        $this->guard = is_array($answer['guard'] ?? null) ? $answer['guard'] : null;
    }

    /** An RFC 3339 time of the route (microseconds, Z). */
    public static function time(mixed $s): ?\DateTimeImmutable
    {
        if (!is_string($s) || $s === '') {
            return null;
        }
        if (preg_match('/^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/', $s, $m) !== 1) {
            return null;
        }
        $frac = substr(str_pad($m[2], 6, '0'), 0, 6);
        $zone = $m[3] === 'Z' ? '+00:00' : $m[3];
        $t = \DateTimeImmutable::createFromFormat('Y-m-d\TH:i:s.uP', "{$m[1]}.{$frac}{$zone}");
        return $t === false ? null : $t;
    }
}
