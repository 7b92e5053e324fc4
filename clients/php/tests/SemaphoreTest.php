<?php

declare(strict_types=1);

namespace QueenLocks\Tests;

use PHPUnit\Framework\TestCase;
use QueenLocks\Testing\Process;
use QueenLocks\Testing\Support;

final class SemaphoreTest extends TestCase
{
    protected function setUp(): void
    {
        Support::live($this);
    }

    public function testNHoldersTakeDistinctSlotsAndNoMore(): void
    {
        $c = Support::client();
        $name = Support::unique('pool');
        $held = [$c->semaphore($name, 3, 30), $c->semaphore($name, 3, 30), $c->semaphore($name, 3, 30)];
        foreach ($held as $h) {
            $this->assertTrue($h->acquire());
        }
        $slots = array_map(fn ($h) => $h->slot(), $held);
        sort($slots);
        $this->assertSame([0, 1, 2], $slots);
        $fourth = $c->semaphore($name, 3, 30);
        $this->assertFalse($fourth->acquire());
        $this->assertSame(['held', 3], [$fourth->reason(), count($fourth->holders())]);
        foreach ($held as $h) {
            $h->release();
        }
        $this->assertSame([], $c->holders($name));
    }

    public function testConcurrentProcessesNeverHoldMoreThanN(): void
    {
        $name = Support::unique('never-over');
        $counter = tempnam(sys_get_temp_dir(), 'queen-locks-php-');
        try {
            $workers = [];
            for ($i = 0; $i < 6; $i++) {
                $workers[] = Process::php('worker.php', [$name, '3', '3', $counter], ['QUEEN_LOCKS_URL' => Support::url()]);
            }
            foreach ($workers as $w) {
                $this->assertSame(0, $w->wait(), $w->stderr());
            }
            $state = json_decode((string) file_get_contents($counter), true);
            $this->assertSame(0, $state['inside']);
            $this->assertSame([], $state['slots']);
            $this->assertLessThanOrEqual(3, $state['most'], 'more than 3 held the semaphore at once');
            $this->assertGreaterThanOrEqual(2, $state['most'], 'holders never overlapped: the test proved nothing');
            $this->assertSame([], Support::client()->holders($name));
        } finally {
            unlink($counter);
        }
    }
}
