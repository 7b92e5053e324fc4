<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Testing\Process;
use QueenLocks\Testing\Proxy;
use QueenLocks\Testing\Support;
use QueenLocks\Unavailable;

/** Acquire and release against the real route. */
final class AcquireTest extends TestCase
{
    protected function setUp(): void
    {
        Support::live($this);
    }

    public function testAHeldLockIsRefusedToOthersUntilReleased(): void
    {
        $c = Support::client();
        $name = Support::unique('job');
        [$a, $b] = [$c->lock($name, 30), $c->lock($name, 30)];
        $this->assertTrue($a->acquire());
        $this->assertTrue($a->held());
        $this->assertSame(0, $a->slot());
        $this->assertGreaterThan(0, $a->token());
        [$holder] = $c->holders($name);
        $this->assertSame([$a->owner(), $a->token()], [$holder['owner'], $holder['token']]);

        $this->assertFalse($b->acquire());
        $this->assertSame('held', $b->reason());
        $this->assertSame([$a->owner()], array_column($b->holders(), 'owner'));
        $this->assertNull($b->token());

        $a->release();
        $this->assertFalse($a->held());
        $this->assertNull($a->lostReason(), 'a release is not a loss');
        $this->assertSame([], $c->holders($name));
        $this->assertTrue($b->acquire());
        $this->assertGreaterThan($a->token(), $b->token(), "a later holder's token is higher");
        $g = $b->guard();
        $this->assertSame(['check', "{$name}#0", $b->token(), true], [$g['op'], $g['key'], $g['expect'], $g['required']]);
        $this->assertNotNull($b->expiresAt());
        $this->assertTrue($b->check());
        $b->release();
    }

    public function testAcquireAgainWhileHeldIsANoOp(): void
    {
        $h = Support::client()->lock(Support::unique('twice'), 30);
        $this->assertTrue($h->acquire());
        $token = $h->token();
        $this->assertTrue($h->acquire());
        $this->assertSame($token, $h->token());
        $h->release();
    }

    public function testExactlyOneOfManyConcurrentProcessesWins(): void
    {
        $c = Support::client();
        $name = Support::unique('race');
        $env = ['QUEEN_LOCKS_URL' => Support::url()];
        $racers = [];
        for ($i = 0; $i < 8; $i++) {
            $racers[] = Process::php('holder.php', ['race', $name], $env);
        }
        // Every racer has started PHP and made its handle: start them at once.
        foreach ($racers as $p) {
            $this->assertSame('ready', $p->readLine());
        }
        foreach ($racers as $p) {
            $p->write('go');
        }
        $seen = array_map(fn (Process $p) => $p->readJson(), $racers);
        $winners = array_values(array_filter($seen, fn (array $s) => $s['acquired']));
        $this->assertCount(1, $winners, 'winners: ' . json_encode($seen));
        [$holder] = $c->holders($name);
        $this->assertSame([$winners[0]['owner'], $winners[0]['token']], [$holder['owner'], $holder['token']]);
        $pids = [];
        foreach ($seen as $s) {
            $pids[] = explode(':', $s['owner'])[1];
            if (!$s['acquired']) {
                $this->assertContains($s['reason'], ['held', 'contended']);
            }
        }
        $this->assertCount(8, array_unique($pids), 'each process mints an owner with its own pid');
        foreach ($racers as $p) {
            $this->assertSame(0, $p->finish(), $p->stderr());
        }
        $this->assertSame([], $c->holders($name), 'the winner released when told to');
    }

    public function testALostAnswerIsRetriedWithTheSameOwner(): void
    {
        $c = Support::client();
        $name = Support::unique('retried');
        $proxy = new Proxy(Support::url());
        $h = Support::client($proxy->url)->lock($name, 3);
        $proxy->drop(1); // the acquire lands, its answer does not come back
        $this->assertTrue($h->acquire(10));
        $this->assertGreaterThanOrEqual(2, $proxy->calls());
        [$holder] = $c->holders($name);
        $this->assertSame([$h->owner(), $h->token()], [$holder['owner'], $holder['token']]);

        // A renew whose answer is lost: the next sends the same (now stale)
        // token, and the route carries it through to the current one.
        $tokens = [$h->token()];
        $proxy->drop(1);
        $calls = $proxy->calls();
        Support::waitFor('two renews after a lost answer', function () use ($h, &$tokens, $proxy, $calls) {
            $this->assertTrue($h->keepAlive(), "lost: {$h->lostReason()}");
            if (end($tokens) !== $h->token()) {
                $tokens[] = $h->token();
            }
            return count($tokens) >= 3;
        });
        $this->assertGreaterThanOrEqual($calls + 3, $proxy->calls(), 'a renew was dropped, then two got through');
        [$holder] = $c->holders($name);
        $this->assertSame([$h->owner(), $h->token()], [$holder['owner'], $holder['token']]);
        $h->release();
        $proxy->stop();
    }

    public function testReleaseAfterAnUnansweredAcquireFreesWhatItTook(): void
    {
        $c = Support::client();
        $name = Support::unique('unsure');
        $proxy = new Proxy(Support::url());
        $h = Support::client($proxy->url)->lock($name, 30);
        $proxy->drop(1);
        try {
            $h->acquire();
            $this->fail('an acquire without an answer and without a wait must throw');
        } catch (Unavailable $e) {
            $this->assertStringContainsString('no answer', $e->getMessage());
        }
        [$holder] = $c->holders($name);
        $this->assertSame($h->owner(), $holder['owner']);
        $this->assertFalse($h->held());
        $h->release();
        $this->assertSame([], $c->holders($name), 'the permit the lost answer told of is still held');
        $proxy->stop();
    }
}
