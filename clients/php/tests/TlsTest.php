<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Client;
use QueenLocks\Exception;
use QueenLocks\Testing\Proxy;
use QueenLocks\Testing\Support;
use QueenLocks\Unavailable;

final class TlsTest extends TestCase
{
    public function testAnHttpsRouteIsVerifiedWithTheCaFile(): void
    {
        Support::withTls($this);
        $dir = Support::tlsDir();
        $proxy = new Proxy(Support::url(), 0.0, ["{$dir}/tls.crt", "{$dir}/tls.key"]);
        $this->assertStringStartsWith('https://', $proxy->url);
        $name = Support::unique('tls');
        $h = Support::client($proxy->url, "{$dir}/ca.crt")->lock($name, 30);
        $this->assertTrue($h->acquire());
        $this->assertSame($h->owner(), Support::client()->holders($name)[0]['owner']);
        $h->release();

        // Without the CA the route is not trusted: a clear error at once,
        // not an unanswered call to retry for the whole wait.
        $stranger = (new Client(url: $proxy->url, namespace: Support::namespace()))->lock($name, 30);
        $start = Support::now();
        try {
            $stranger->acquire(30);
            $this->fail('an untrusted route was used');
        } catch (Exception $e) {
            $this->assertNotInstanceOf(Unavailable::class, $e);
            $this->assertStringContainsString('certificate', $e->getMessage());
        }
        $this->assertLessThan($start + 10, Support::now(), 'it retried an untrusted route');
        $this->assertSame([], Support::client()->holders($name));
        $proxy->stop();
    }
}
