<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Client;
use QueenLocks\Exception;
use QueenLocks\RouteError;
use QueenLocks\Testing\Process;
use QueenLocks\Unavailable;

/** What goes over the wire, against a stand-in for the route: needs no control plane. */
final class TransportTest extends TestCase
{
    private const GET = '{"results":[{"index":0,"op":"get","name":"job","holders":[]}]}';

    private string $dir;

    protected function setUp(): void
    {
        $this->dir = sys_get_temp_dir() . '/queen-locks-php-' . bin2hex(random_bytes(4));
        mkdir($this->dir);
    }

    protected function tearDown(): void
    {
        array_map('unlink', glob("{$this->dir}/*") ?: []);
        rmdir($this->dir);
    }

    public function testTheTokenIsSentAndReadAgainWhenTheFileChanges(): void
    {
        $route = Process::php('fakeroute.php', ['200', self::GET]);
        $url = $route->readLine();
        file_put_contents("{$this->dir}/token", "first-token\n");
        $c = new Client(url: $url, namespace: 'team-a', tokenFile: "{$this->dir}/token");

        $this->assertSame([], $c->holders('job'));
        $seen = $route->readJson();
        $this->assertSame('Bearer first-token', $seen['authorization']);
        $this->assertSame(['operations' => [['op' => 'get', 'name' => 'job']], 'namespace' => 'team-a'], $seen['body']);

        // The kubelet swaps the file for a new one.
        file_put_contents("{$this->dir}/token.new", 'second-token');
        rename("{$this->dir}/token.new", "{$this->dir}/token");
        $c->holders('job');
        $this->assertSame('Bearer second-token', $route->readJson()['authorization']);
        $this->assertSame(0, $route->finish());
    }

    public function testTheTokenFileComesFromTheEnvironment(): void
    {
        $route = Process::php('fakeroute.php', ['200', self::GET]);
        $url = $route->readLine();
        file_put_contents("{$this->dir}/token", 'from-env');
        putenv("QUEEN_LOCKS_TOKEN_FILE={$this->dir}/token");
        try {
            (new Client(url: $url))->holders('job');
        } finally {
            putenv('QUEEN_LOCKS_TOKEN_FILE');
        }
        $seen = $route->readJson();
        $this->assertSame('Bearer from-env', $seen['authorization']);
        $this->assertArrayNotHasKey('namespace', $seen['body'], 'no namespace: the route takes the token\'s');
        $route->finish();
    }

    public function testAnAcquireSendsTheContractsFields(): void
    {
        $route = Process::php('fakeroute.php', ['200',
            '{"results":[{"index":0,"op":"acquire","name":"pool","acquired":false,"reason":"held","holders":[{"slot":0,"owner":"x","token":7}]}]}']);
        $url = $route->readLine();
        $h = (new Client(url: $url))->semaphore('pool', 3, 2.5);
        $this->assertFalse($h->acquire());
        $this->assertSame(['held', 'x'], [$h->reason(), $h->holders()[0]['owner']]);
        $this->assertSame(['operations' => [['op' => 'acquire', 'name' => 'pool', 'ttlSeconds' => 3,
            'owner' => $h->owner(), 'limit' => 3]]], $route->readJson()['body'], 'a fraction of a second is rounded up for the server');
        $route->finish();
    }

    public function testARefusalNamesTheFieldAndA503IsUnavailable(): void
    {
        $route = Process::php('fakeroute.php', ['400', '{"error":{"code":400,"message":"operations[0].name: bad","index":0,"field":"name"}}']);
        try {
            (new Client(url: $route->readLine()))->holders('job');
            $this->fail('a 400 was taken for an answer');
        } catch (RouteError $e) {
            $this->assertSame([400, 'name', 0], [$e->status(), $e->field(), $e->index()]);
            $this->assertStringContainsString('operations[0].name: bad', $e->getMessage());
        }
        $route->finish();

        $route = Process::php('fakeroute.php', ['503', '{"error":{"code":503,"message":"the API server did not answer"}}']);
        try {
            (new Client(url: $route->readLine()))->holders('job');
            $this->fail('a 503 was taken for an answer');
        } catch (Unavailable $e) {
            $this->assertStringContainsString('503', $e->getMessage());
        }
        $route->finish();

        $route = Process::php('fakeroute.php', ['200', 'not json']);
        $this->expectException(Exception::class);
        $this->expectExceptionMessage('not json');
        try {
            (new Client(url: $route->readLine()))->holders('job');
        } finally {
            $route->finish();
        }
    }
}
