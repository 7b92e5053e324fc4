<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * A bearer token on disk, read again whenever the file changes: the kubelet
 * rotates a projected token by swapping a symlink, so a long-lived process
 * must not keep the first one it read.
 *
 * @internal
 */
final class TokenFile
{
    public const DEFAULT_PATH = '/var/run/secrets/queen-locks/token';

    private ?string $seen = null;
    private ?string $token = null;

    /**
     * @param bool $required whether a missing file is an error (a path the
     *                       caller named) or means "no token" (the default
     *                       path, absent outside a pod and under make dev)
     */
    public function __construct(private readonly string $path, private readonly bool $required)
    {
    }

    public function read(): ?string
    {
        // PHP caches stat results per request; a rotation must be seen.
        clearstatcache(true, $this->path);
        $st = @stat($this->path);
        if ($st === false) {
            if (!$this->required && !file_exists($this->path)) {
                return null;
            }
            throw new Exception("token file {$this->path}: does not exist or cannot be read");
        }
        $seen = "{$st['dev']}:{$st['ino']}:{$st['mtime']}:{$st['size']}";
        if ($seen !== $this->seen) {
            $raw = @file_get_contents($this->path);
            if ($raw === false) {
                throw new Exception("token file {$this->path}: cannot be read");
            }
            $this->token = trim($raw);
            $this->seen = $seen;
        }
        return $this->token === '' ? null : $this->token;
    }
}
