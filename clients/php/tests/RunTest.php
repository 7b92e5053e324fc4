<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Handle;
use QueenLocks\Testing\Process;
use QueenLocks\Testing\Proxy;
use QueenLocks\Testing\Support;

final class RunTest extends TestCase
{
    protected function setUp(): void
    {
        Support::live($this);
    }

    public function testRunWaitsForTheHolderAndGivesUpWhenTheWaitEnds(): void
    {
        $c = Support::client();
        $name = Support::unique('turn');
        $holder = $c->lock($name, 30);
        $this->assertTrue($holder->acquire());

        $ran = [];
        $this->assertFalse($c->lock($name, 30)->run(function () use (&$ran) {
            $ran[] = 'job';
        }, 0.3));
        $this->assertSame([], $ran, 'the job ran without the lock');

        // Another process waits for it through a proxy that counts its calls;
        // its job fails, and run releases all the same.
        $proxy = new Proxy(Support::url());
        $waiter = Process::php('holder.php', ['run', $name, '20'], ['QUEEN_LOCKS_URL' => $proxy->url]);
        $this->assertSame('start', $waiter->readLine());
        Support::waitFor('the waiter to ask', fn () => $proxy->calls() >= 1);
        $holder->release();
        $job = $waiter->readJson();
        $this->assertTrue($job['held']);
        $this->assertNull($job['lostReason']);
        $this->assertGreaterThan($holder->token(), $job['token']);
        $this->assertSame(['ran' => null, 'error' => "the job's own error"], $waiter->readJson());
        $this->assertSame(0, $waiter->wait(), $waiter->stderr());
        $this->assertSame([], $c->holders($name), 'run releases even when the job fails');
        $proxy->stop();
    }

    public function testRunGivesTheJobTheHandleAndReleasesAfter(): void
    {
        $c = Support::client();
        $name = Support::unique('job');
        $seen = null;
        $this->assertTrue($c->lock($name, 30)->run(function (Handle $h) use ($c, $name, &$seen) {
            $this->assertTrue($h->keepAlive());
            [$holder] = $c->holders($name);
            $seen = [$holder['owner'], $holder['token']];
            $this->assertSame([$h->owner(), $h->token()], $seen);
        }, 5));
        $this->assertNotNull($seen, 'the job never ran');
        $this->assertSame([], $c->holders($name));
    }
}
