<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * The route refused the call with an answer other than 200 (a 4xx: bad
 * input it caught, no or bad credentials, no right in the namespace).
 * Nothing of the call was applied.
 */
final class RouteError extends Exception
{
    public function __construct(
        private readonly int $status,
        private readonly string $detail,
        private readonly ?string $field = null,
        private readonly ?int $index = null,
    ) {
        parent::__construct("the route answered {$status}: {$detail}", $status);
    }

    /** The HTTP status. */
    public function status(): int
    {
        return $this->status;
    }

    /** The route's own message. */
    public function detail(): string
    {
        return $this->detail;
    }

    /** The field of the operation the route named, when it did. */
    public function field(): ?string
    {
        return $this->field;
    }

    /** The index of the operation the route named, when it did. */
    public function index(): ?int
    {
        return $this->index;
    }
}
