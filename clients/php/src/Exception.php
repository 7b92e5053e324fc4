<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * The base of every error this handle throws: catch it to catch them all.
 */
class Exception extends \RuntimeException
{
}
