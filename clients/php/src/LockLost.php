<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * The server says the permit is no longer ours: it expired, was deleted by
 * hand, or was taken over. Thrown by release(); keepAlive() and check()
 * answer false instead.
 */
final class LockLost extends Exception
{
    public function __construct(private readonly string $lock, private readonly string $reason)
    {
        parent::__construct("lock '{$lock}' was lost ({$reason})");
    }

    public function lock(): string
    {
        return $this->lock;
    }

    /** The route's reason, usually "lost". */
    public function reason(): string
    {
        return $this->reason;
    }
}
