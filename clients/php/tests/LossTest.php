<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Handle;
use QueenLocks\Testing\Proxy;
use QueenLocks\Testing\Support;

/** How a holder learns at its checkpoint that the lock is gone. */
final class LossTest extends TestCase
{
    public function testDeletingThePermitByHandIsLearntAtTheNextRenewWithReasonRenew(): void
    {
        Support::withKubectl($this);
        $name = Support::unique('deleted');
        $ttl = 6; // kubectl's own start-up must not outlast the lifetime
        $h = Support::client()->lock($name, $ttl);
        $before = Support::now();
        $this->assertTrue($h->acquire());
        Support::deletePermit($name);
        $deleted = Support::now();

        // Until a third of the lifetime has passed, the checkpoint asks
        // nobody, so it cannot know; the first one past the third renews,
        // and the server says the permit is not ours.
        while ($h->keepAlive()) {
            $this->assertLessThan($deleted + $ttl, Support::now(), 'the loss was never learnt');
            usleep(10_000);
        }
        $learnt = Support::now();
        $this->assertSame(Handle::LOST_RENEW, $h->lostReason());
        $this->assertGreaterThanOrEqual($before + $ttl / 3, $learnt, 'a renew went out before a third of the lifetime');
        // The first renew, a third of the lifetime after the acquire was sent,
        // learns it (with slack for a call on a busy machine).
        $this->assertLessThan(max($before + $ttl / 3, $deleted) + 2, $learnt,
            sprintf('learnt %.2fs after the delete', $learnt - $deleted));
        $this->assertFalse($h->held());
        $this->assertFalse($h->keepAlive(), 'a lost lock stays lost');
        $this->assertSame(Handle::LOST_RENEW, $h->lostReason());
        $h->release(); // nothing held: a no-op
    }

    public function testARouteThatStopsAnsweringIsGivenUpOnTheLocalClock(): void
    {
        Support::live($this);
        $c = Support::client();
        $name = Support::unique('cut-off');
        $ttl = 2;
        // Requests reach the route 0.3 s after they are sent, so the
        // server's lifetime starts later than the one the handle counts.
        $proxy = new Proxy(Support::url(), 0.3);
        $h = Support::client($proxy->url)->lock($name, $ttl);
        $acquiredAt = new \DateTimeImmutable();
        $this->assertTrue($h->acquire());
        $first = $h->token();
        while ($h->token() === $first) {
            $this->assertTrue($h->keepAlive(), "lost: {$h->lostReason()}");
            usleep(10_000);
        }
        $proxy->stop();
        $serverExpiry = $h->expiresAt(); // of the last renew that got through

        while ($h->keepAlive()) {
            usleep(10_000);
        }
        $lostAt = new \DateTimeImmutable();
        $this->assertSame(Handle::LOST_EXPIRED, $h->lostReason());
        $this->assertLessThan($serverExpiry, $lostAt, 'the handle must give up before the server does');
        $this->assertGreaterThanOrEqual($acquiredAt->modify("+{$ttl} seconds"), $lostAt,
            'a renew got through: it cannot have expired within one lifetime');
        $this->assertFalse($h->held());
        $holders = $c->holders($name);
        if ($holders !== []) {
            $this->assertSame($h->owner(), $holders[0]['owner'], "nobody else may have it before the server's expiry");
        }
        $h->release(); // lost: a no-op, and no call to a route that is gone
        $this->assertSame(Handle::LOST_EXPIRED, $h->lostReason());
    }
}
