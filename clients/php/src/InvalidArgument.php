<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * Bad input to the handle's API (an empty name, a ttl under 1 s, ...),
 * refused before any request is sent. field() names what was wrong.
 */
final class InvalidArgument extends Exception
{
    public function __construct(private readonly string $field, string $message)
    {
        parent::__construct("{$field}: {$message}");
    }

    /** The argument or option at fault: name, ttl, n, wait, owner, url, caFile, ... */
    public function field(): string
    {
        return $this->field;
    }
}
