<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Client;
use QueenLocks\Exception;
use QueenLocks\Handle;
use QueenLocks\InvalidArgument;
use QueenLocks\Lease;

/**
 * Bad input is refused before any request, naming what is wrong. These
 * need no route: the client points at a listener of our own that must
 * never see a connection.
 */
final class InputTest extends TestCase
{
    /** @var resource */
    private $listener;
    private Client $client;

    protected function setUp(): void
    {
        $this->listener = stream_socket_server('tcp://127.0.0.1:0');
        $this->client = new Client(url: 'http://' . stream_socket_get_name($this->listener, false), tokenFile: null);
    }

    protected function tearDown(): void
    {
        // Nothing may have reached the "route".
        $r = [$this->listener];
        $w = $e = null;
        $this->assertSame(0, stream_select($r, $w, $e, 0), 'a request was sent for bad input');
        fclose($this->listener);
    }

    /** @return iterable<string, array{0: callable(Client): mixed, 1: string, 2: string}> */
    public static function badInput(): iterable
    {
        yield 'empty name' => [fn (Client $c) => $c->lock('', 30), 'name', 'must not be empty'];
        yield 'name with #' => [fn (Client $c) => $c->lock('a#b', 30), 'name', "'#'"];
        yield 'name with a control character' => [fn (Client $c) => $c->lock("a\tb", 30), 'name', 'control character'];
        yield 'name with a C1 control' => [fn (Client $c) => $c->lock("a\u{85}b", 30), 'name', 'control character'];
        yield 'name of bad UTF-8' => [fn (Client $c) => $c->lock("a\xffb", 30), 'name', 'UTF-8'];
        yield 'name over 256 bytes' => [fn (Client $c) => $c->lock(str_repeat('é', 129), 30), 'name', 'at most 256 bytes'];
        yield 'ttl 0' => [fn (Client $c) => $c->lock('job', 0), 'ttl', 'from 1'];
        yield 'ttl under a second' => [fn (Client $c) => $c->lock('job', 0.5), 'ttl', 'from 1'];
        yield 'negative ttl' => [fn (Client $c) => $c->semaphore('job', 2, -3), 'ttl', 'from 1'];
        yield 'ttl over a year' => [fn (Client $c) => $c->lock('job', 31536001), 'ttl', '31536000'];
        yield 'ttl not finite' => [fn (Client $c) => $c->lock('job', INF), 'ttl', 'from 1'];
        yield 'semaphore of 0' => [fn (Client $c) => $c->semaphore('pool', 0, 30), 'n', 'from 1 to 1024'];
        yield 'semaphore over 1024' => [fn (Client $c) => $c->semaphore('pool', 1025, 30), 'n', 'from 1 to 1024'];
        yield 'empty owner' => [fn (Client $c) => $c->lock('job', 30, ''), 'owner', '1 to 256 bytes'];
        yield 'negative wait' => [fn (Client $c) => $c->lock('job', 30)->acquire(-1), 'wait', '0 or more'];
        yield 'negative wait for run' => [fn (Client $c) => $c->lock('job', 30)->run(fn () => null, -0.5), 'wait', '0 or more'];
        yield 'holders of an empty name' => [fn (Client $c) => $c->holders(''), 'name', 'must not be empty'];
    }

    /** @dataProvider badInput */
    public function testBadInputIsRefusedBeforeAnyRequest(callable $call, string $field, string $says): void
    {
        try {
            $call($this->client);
            $this->fail("no error for a bad {$field}");
        } catch (InvalidArgument $e) {
            $this->assertSame($field, $e->field());
            $this->assertStringStartsWith("{$field}: ", $e->getMessage());
            $this->assertStringContainsString($says, $e->getMessage());
            $this->assertInstanceOf(Exception::class, $e, 'every error is a QueenLocks\Exception');
        }
    }

    public function testTheClientNeedsARouteUrlItCanUse(): void
    {
        foreach (['' => 'QUEEN_LOCKS_URL', 'ftp://host' => 'http:// or https://', 'http://' => 'with a host'] as $url => $says) {
            try {
                new Client(url: $url);
                $this->fail("no error for url '{$url}'");
            } catch (InvalidArgument $e) {
                $this->assertSame('url', $e->field());
                $this->assertStringContainsString($says, $e->getMessage());
            }
        }
        $this->expectExceptionObject(new InvalidArgument('caFile', 'no-such-ca.crt does not exist'));
        new Client(url: 'https://127.0.0.1:6632', caFile: 'no-such-ca.crt');
    }

    public function testTheUrlDefaultsToTheEnvironmentAndABareServerGetsThePath(): void
    {
        $this->assertSame('http://127.0.0.1:9/api/v1/locks', (new Client(url: 'http://127.0.0.1:9'))->url());
        $this->assertSame('http://127.0.0.1:9/api/v1/locks', (new Client(url: 'http://127.0.0.1:9/'))->url());
        $this->assertSame('http://127.0.0.1:9/x/api/v1/locks', (new Client(url: 'http://127.0.0.1:9/x/api/v1/locks'))->url());
        $before = getenv('QUEEN_LOCKS_URL');
        putenv('QUEEN_LOCKS_URL=http://127.0.0.1:7');
        try {
            $this->assertSame('http://127.0.0.1:7/api/v1/locks', (new Client())->url());
        } finally {
            putenv($before === false ? 'QUEEN_LOCKS_URL' : "QUEEN_LOCKS_URL={$before}");
        }
    }

    public function testAFreshHandleHoldsNothingAndSendsNothing(): void
    {
        $h = $this->client->semaphore('pool', 4, 30);
        $this->assertSame(['pool', 4], [$h->name(), $h->limit()]);
        $this->assertMatchesRegularExpression('/^[^:]+:' . getmypid() . ':[0-9a-f]{8}$/', $h->owner(), 'owner is host:pid:random');
        $this->assertNotSame($h->owner(), $this->client->lock('pool', 30)->owner(), 'each handle mints its own owner');
        $this->assertSame('me', $this->client->lock('pool', 30, 'me')->owner());
        $this->assertFalse($h->held());
        $this->assertFalse($h->keepAlive(), 'nothing held: nothing to keep alive');
        $this->assertFalse($h->check());
        $this->assertNull($h->token());
        $this->assertNull($h->slot());
        $this->assertNull($h->guard());
        $this->assertNull($h->lostReason());
        $h->release(); // nothing held: a no-op
        $this->assertSame(['renew', 'guard', 'expired'], [Handle::LOST_RENEW, Handle::LOST_GUARD, Handle::LOST_EXPIRED]);
    }

    public function testAMissingTokenFileThatWasNamedIsAnError(): void
    {
        $h = (new Client(url: 'http://' . stream_socket_get_name($this->listener, false), tokenFile: 'no-such-token'))->lock('job', 30);
        $this->expectException(Exception::class);
        $this->expectExceptionMessage('token file no-such-token');
        $h->acquire();
    }

    public function testTheRoutesTimesAreRead(): void
    {
        $t = Lease::time('2026-12-02T10:00:50.123456Z');
        $this->assertNotNull($t);
        $this->assertSame('2026-12-02 10:00:50.123456 +00:00', $t->format('Y-m-d H:i:s.u P'));
        $this->assertSame('10:00:50.100000', Lease::time('2026-12-02T10:00:50.1Z')?->format('H:i:s.u'));
        $this->assertNull(Lease::time('yesterday'));
    }
}
