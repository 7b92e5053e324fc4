<?php

/*
 * A holder process, for the tests here and for the cross-language test
 * (clients/php_test.go). Not a test itself. One JSON line out per result.
 *
 *     holder.php hold NAME        acquire (ttl 30 s), print {"acquired", "owner",
 *                                 "token", "reason", "holders"}, hold it (calling
 *                                 keepAlive) until stdin closes, then release
 *     holder.php try NAME         acquire once, print the same, release if acquired
 *     holder.php race NAME        print "ready", wait for a line on stdin (the
 *                                 start), then as hold
 *     holder.php run NAME WAIT    print "start", run a job under the lock with a
 *                                 wait of WAIT seconds; the job prints {"held",
 *                                 "token", "lostReason"} and throws; then print
 *                                 {"ran", "error"}
 *
 * The route is $QUEEN_LOCKS_URL, the namespace $QUEEN_LOCKS_TEST_NAMESPACE.
 */

declare(strict_types=1);

require __DIR__ . '/../autoload.php';

use QueenLocks\Client;
use QueenLocks\Handle;

[, $mode, $name] = $argv + [null, '', ''];
if (!in_array($mode, ['hold', 'try', 'race', 'run'], true) || $name === '') {
    fwrite(STDERR, "usage: holder.php hold|try|race NAME, or holder.php run NAME WAIT\n");
    exit(2);
}

$out = static function (array $v): void {
    echo json_encode($v, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR), "\n";
};
$lock = (new Client(namespace: getenv('QUEEN_LOCKS_TEST_NAMESPACE') ?: null))->lock($name, 30);

if ($mode === 'run') {
    echo "start\n";
    $ran = null;
    try {
        $ran = $lock->run(static function (Handle $h) use ($out): void {
            $out(['held' => $h->held(), 'token' => $h->token(), 'lostReason' => $h->lostReason()]);
            throw new RuntimeException("the job's own error");
        }, (float) ($argv[3] ?? 0));
        $out(['ran' => $ran, 'error' => null]);
    } catch (RuntimeException $e) {
        $out(['ran' => $ran, 'error' => $e->getMessage()]);
    }
    exit(0);
}

if ($mode === 'race') {
    echo "ready\n";
    fgets(STDIN);
}
$acquired = $lock->acquire();
$out(['acquired' => $acquired, 'owner' => $lock->owner(), 'token' => $lock->token(),
    'reason' => $lock->reason(), 'holders' => $lock->holders()]);
if ($acquired && $mode !== 'try') {
    // Hold until stdin closes, at the checkpoint a few times a second.
    while (true) {
        $r = [STDIN];
        $w = $e = null;
        if (stream_select($r, $w, $e, 0, 200_000) > 0 && (fgets(STDIN) === false && feof(STDIN))) {
            break;
        }
        if (!$lock->keepAlive()) {
            fwrite(STDERR, "holder.php: lost {$name}: {$lock->lostReason()}\n");
            exit(1);
        }
    }
}
if ($acquired) {
    $lock->release();
}
