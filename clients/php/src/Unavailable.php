<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * The route gave no answer (connection refused or cut, timeout, 502, 503,
 * 504). The call may or may not have been applied; sending it again with
 * the same owner converges, and a handle keeps its owner, so calling the
 * same method again is safe.
 */
final class Unavailable extends Exception
{
}
