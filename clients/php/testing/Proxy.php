<?php

declare(strict_types=1);

namespace QueenLocks\Testing;

/**
 * A loopback proxy in front of the route (testing/proxy.php, a process of
 * its own, since the test's own process blocks in the handle's calls): it
 * can hold requests back, lose answers, and stop.
 */
final class Proxy
{
    public readonly string $url;
    private Process $proc;

    /** @param array{0: string, 1: string}|null $tls the certificate and key to serve https with */
    public function __construct(string $target, float $delay = 0.0, ?array $tls = null)
    {
        $this->proc = Process::php('proxy.php', [$target, (string) $delay, ...($tls ?? [])]);
        $this->url = $this->proc->readLine(30);
    }

    /** The next $n calls lose their answer after reaching the route. */
    public function drop(int $n): void
    {
        $this->proc->write("drop {$n}");
        $this->proc->readLine(30);
    }

    /** How many calls it has accepted. */
    public function calls(): int
    {
        $this->proc->write('calls');
        return (int) $this->proc->readLine(30);
    }

    /** Stops it: from now on the route does not answer at this URL. */
    public function stop(): void
    {
        $this->proc->finish();
    }
}
