<?php

/*
 * A semaphore holder for the "never over N" test: ROUNDS times, it takes
 * one of N permits of NAME (waiting for one), and while it holds it counts
 * itself in COUNTER, a JSON file shared by all workers under flock:
 * {"inside": holders now, "most": the most ever, "slots": slots in use}.
 * A slot already in use is an error (exit 1). Not a test itself.
 *
 *     worker.php NAME N ROUNDS COUNTER
 */

declare(strict_types=1);

require __DIR__ . '/../autoload.php';

use QueenLocks\Client;
use QueenLocks\Handle;

[, $name, $n, $rounds, $counter] = $argv + [null, '', 0, 0, ''];
$client = new Client(namespace: getenv('QUEEN_LOCKS_TEST_NAMESPACE') ?: null);

/** Changes the shared count under an exclusive lock of the file. */
$update = static function (callable $fn) use ($counter): void {
    $f = fopen($counter, 'c+');
    flock($f, LOCK_EX);
    $state = json_decode((string) stream_get_contents($f), true) ?: ['inside' => 0, 'most' => 0, 'slots' => []];
    $state = $fn($state);
    ftruncate($f, 0);
    rewind($f);
    fwrite($f, json_encode($state, JSON_THROW_ON_ERROR));
    fflush($f);
    flock($f, LOCK_UN);
    fclose($f);
};

for ($i = 0; $i < (int) $rounds; $i++) {
    $sem = $client->semaphore($name, (int) $n, 30);
    $ran = $sem->run(static function (Handle $h) use ($update): void {
        $update(static function (array $s) use ($h): array {
            if (in_array($h->slot(), $s['slots'], true)) {
                fwrite(STDERR, "worker.php: slot {$h->slot()} given twice\n");
                exit(1);
            }
            $s['slots'][] = $h->slot();
            $s['inside']++;
            $s['most'] = max($s['most'], $s['inside']);
            return $s;
        });
        // Hold it a moment, so that holders overlap.
        usleep(50_000);
        if (!$h->keepAlive()) {
            fwrite(STDERR, "worker.php: lost slot {$h->slot()}: {$h->lostReason()}\n");
            exit(1);
        }
        $update(static function (array $s) use ($h): array {
            $s['slots'] = array_values(array_diff($s['slots'], [$h->slot()]));
            $s['inside']--;
            return $s;
        });
    }, 60);
    if (!$ran) {
        fwrite(STDERR, "worker.php: no permit of {$name} within 60 s: {$sem->reason()}\n");
        exit(1);
    }
}
