<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Handle;
use QueenLocks\Testing\Support;

/** guardMetadata() fences a ConfigMap write until the lock is taken over. */
final class GuardMetadataTest extends TestCase
{
    /**
     * Writes a ConfigMap whose labels and annotations are $metadata's.
     *
     * @param array{labels: array<string, string>, annotations: array<string, string>} $metadata
     * @return array{0: int, 1: string, 2: string}
     */
    private static function write(string $name, array $metadata, string $value, bool $create = false): array
    {
        $cm = [
            'apiVersion' => 'v1',
            'kind' => 'ConfigMap',
            'metadata' => ['name' => $name] + $metadata,
            'data' => ['report' => $value],
        ];
        return Support::kubectl([$create ? 'create' : 'replace', '-f', '-'], json_encode($cm, JSON_THROW_ON_ERROR));
    }

    public function testGuardMetadataFencesAWriteUntilTheLockIsTakenOver(): void
    {
        Support::withKubectl($this);
        $c = Support::client();
        $name = Support::unique('fenced');
        $cm = Support::unique('report');
        $h = $c->lock($name, 60);
        $this->assertNull($h->guardMetadata(), 'a guard before any acquire');
        $this->assertTrue($h->acquire());
        $this->assertSame([
            'labels' => [Handle::GUARDED_LABEL => 'true'],
            'annotations' => [Handle::GUARD_ANNOTATION => "{$name}#0={$h->token()}"],
        ], $h->guardMetadata());
        [$code, , $err] = self::write($cm, $h->guardMetadata(), 'first', true);
        $this->assertSame(0, $code, $err);
        [$code, , $err] = self::write($cm, $h->guardMetadata(), 'second');
        $this->assertSame(0, $code, $err);

        // Taken over: the permit deleted by hand and acquired by another.
        Support::deletePermit($name);
        $b = $c->lock($name, 60);
        Support::waitFor('the other holder to acquire', fn () => $b->acquire());
        [$code, , $err] = self::write($cm, $h->guardMetadata(), 'stale');
        $this->assertNotSame(0, $code, "a replaced holder's write was admitted");
        $this->assertStringContainsString('kv_precondition', $err);
        $this->assertStringContainsString($name, $err);
        $this->assertFalse($h->check());
        $this->assertSame(Handle::LOST_GUARD, $h->lostReason());
        $this->assertNull($h->guardMetadata(), 'a guard after the loss');
        $b->release();
    }
}
