<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Handle;
use QueenLocks\Testing\Support;

/** Fencing a Kubernetes object with the guard of an answer. */
final class GuardTest extends TestCase
{
    public function testTheGuardIsAcceptedByAGuardedWriteAndRefusedAfterLoss(): void
    {
        Support::withKubectl($this);
        $name = Support::unique('fenced');
        $cm = Support::unique('report');
        // No checkpoint runs here, so the token holds still while we write.
        $h = Support::client()->lock($name, 60);
        $this->assertTrue($h->acquire());
        $g = $h->guard();
        $guard = "{$g['key']}={$g['expect']}";
        $this->assertSame("{$name}#0={$h->token()}", $guard);
        [$code, , $err] = Support::writeConfigMap($cm, $guard, 'first', true);
        $this->assertSame(0, $code, $err);
        [$code, , $err] = Support::writeConfigMap($cm, $guard, 'second');
        $this->assertSame(0, $code, $err);

        Support::deletePermit($name);
        $this->assertFalse($h->check());
        $this->assertSame(Handle::LOST_GUARD, $h->lostReason());
        $this->assertFalse($h->held());
        $this->assertFalse($h->keepAlive());

        [$code, , $err] = Support::writeConfigMap($cm, $guard, 'stale');
        $this->assertNotSame(0, $code, "a write under a lost lock's token was admitted");
        $this->assertStringContainsString('kv_precondition', $err);
        $this->assertStringContainsString($name, $err);
        [$code, $out] = Support::kubectl(['get', 'configmap', $cm, '-o', 'jsonpath={.data.report}']);
        $this->assertSame([0, 'second'], [$code, $out], 'the stale write changed the ConfigMap');
    }
}
