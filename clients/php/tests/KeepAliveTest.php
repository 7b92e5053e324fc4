<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Testing\Support;

/** The checkpoint: keepAlive() renews once a third of the lifetime has passed, and only then. */
final class KeepAliveTest extends TestCase
{
    public function testKeepAliveHoldsALockForSeveralLifetimesWithTheTokenChanging(): void
    {
        Support::live($this);
        $c = Support::client();
        $name = Support::unique('long-job');
        $ttl = 2;
        $h = $c->lock($name, $ttl);
        $start = Support::now();
        $this->assertTrue($h->acquire());
        $tokens = [$h->token()];
        // Work for three lifetimes, at the checkpoint every 20 ms.
        while (Support::now() - $start < 3 * $ttl) {
            $this->assertTrue($h->keepAlive(), "lost after {$this->since($start)}: {$h->lostReason()}");
            if ($h->token() !== end($tokens)) {
                $tokens[] = $h->token();
            }
            usleep(20_000);
        }
        $this->assertTrue($h->held());
        $this->assertNull($h->lostReason());
        $sorted = array_unique($tokens);
        sort($sorted);
        $this->assertSame($tokens, $sorted, 'every renew answers a new, higher token');
        // A renew every third of the lifetime, counted from when the last
        // was sent: about 9 in three lifetimes; asking for 6 leaves room for
        // a slow call on a loaded machine.
        $this->assertGreaterThanOrEqual(7, count($tokens), 'renews: ' . json_encode($tokens));
        [$holder] = $c->holders($name);
        $this->assertSame([$h->owner(), $h->token()], [$holder['owner'], $holder['token']]);
        $this->assertSame("{$name}#0", $h->guard()['key']);
        $this->assertSame($h->token(), $h->guard()['expect'], 'the guard follows the token');
        $h->release();
        $this->assertSame([], $c->holders($name));
    }

    /**
     * Calling keepAlive() in a tight loop for less than a third of the
     * lifetime writes nothing, counted by the API server's own metrics of
     * PUT on queenlocks (a renew is one update) and by the token;
     * just past the third, exactly one renew.
     */
    public function testTheCheckpointDoesNotRenewBeforeAThirdOfTheLifetime(): void
    {
        Support::withKubectl($this);
        $ttl = 12; // a third: 4 s
        $h = Support::client()->lock(Support::unique('checkpoint'), $ttl);
        $updates = Support::permitUpdates();
        $before = Support::now();
        $this->assertTrue($h->acquire());
        $acquired = Support::now();
        $token = $h->token();

        // A tight loop until 3 s after the acquire was sent.
        [$calls, $alive] = [0, true];
        while (Support::now() < $before + 3) {
            $alive = $h->keepAlive() && $alive;
            $calls++;
        }
        $this->assertTrue($alive);
        $this->assertGreaterThan(1000, $calls, 'the loop was not tight');
        $this->assertSame($token, $h->token(), 'keepAlive renewed before a third of the lifetime');
        $this->assertSame($updates, Support::permitUpdates(), 'a renew reached the API server before a third of the lifetime');

        // The first checkpoint past the third renews, once.
        while ($h->token() === $token) {
            $this->assertTrue($h->keepAlive());
            $this->assertLessThan($acquired + $ttl, Support::now(), 'no renew within the lifetime');
            usleep(1000);
        }
        $renewedAt = Support::now();
        $this->assertGreaterThanOrEqual($before + $ttl / 3, $renewedAt, 'renewed before a third of the lifetime');
        $this->assertGreaterThan($token, $h->token());
        // More checkpoints, well within the next third: no second renew.
        $renewed = $h->token();
        [$calls, $alive] = [0, true];
        while (Support::now() < $renewedAt + 1) {
            $alive = $h->keepAlive() && $alive;
            $calls++;
        }
        $this->assertTrue($alive);
        $this->assertGreaterThan(1000, $calls, 'the loop was not tight');
        $this->assertSame($renewed, $h->token(), 'a second renew within a third of the lifetime');
        // The metric counts a request once it has been served: wait for it,
        // then make sure there was one and no more.
        Support::waitFor('the renew in the metrics', fn () => Support::permitUpdates() > $updates);
        $this->assertSame($updates + 1, Support::permitUpdates(), 'exactly one renew past the third');
        $h->release();
    }

    private function since(float $start): string
    {
        return sprintf('%.2fs', Support::now() - $start);
    }
}
