<?php

/*
 * A loopback TCP proxy in front of the route, for the tests (see Proxy.php).
 *
 *     php proxy.php TARGET_URL [DELAY_SECONDS [CERT KEY]]
 *
 * Prints its own URL (https when given a certificate and key), then obeys
 * commands on stdin, one a line, answering one line each:
 *     drop N   the next N calls lose their answer: the request reaches the
 *              route, the client sees the connection close
 *     calls    how many calls (connections) it has accepted
 * It ends when stdin closes: the route then stops answering. DELAY holds
 * back each piece of a request before passing it on, so the server admits
 * a write later than the client sent it.
 */

declare(strict_types=1);

[$target, $delay] = [$argv[1] ?? '', (float) ($argv[2] ?? 0)];
$t = parse_url($target);
if (!isset($t['host'], $t['port'])) {
    fwrite(STDERR, "usage: proxy.php http://HOST:PORT[/PATH] [DELAY [CERT KEY]]\n");
    exit(2);
}
$tls = isset($argv[3], $argv[4]);
$ctx = stream_context_create($tls ? ['ssl' => ['local_cert' => $argv[3], 'local_pk' => $argv[4]]] : []);
$ln = stream_socket_server(($tls ? 'tls' : 'tcp') . '://127.0.0.1:0', $errno, $errstr, STREAM_SERVER_BIND | STREAM_SERVER_LISTEN, $ctx);
if ($ln === false) {
    fwrite(STDERR, "proxy: listen: {$errstr}\n");
    exit(1);
}
$port = (int) substr(strrchr(stream_socket_get_name($ln, false), ':'), 1);
echo ($tls ? 'https' : 'http') . "://127.0.0.1:{$port}" . ($t['path'] ?? '') . "\n";

$calls = 0;
$drop = 0;
// One pair per call: the client's connection, the route's, whether its
// answer is dropped, and request pieces held back until their time.
$pairs = [];

// Writes all of $data, also to a non-blocking stream that takes it in parts.
$send = static function ($sock, string $data): void {
    while ($data !== '') {
        $n = @fwrite($sock, $data);
        if ($n === false) {
            return;
        }
        $data = substr($data, $n);
        if ($data !== '') {
            usleep(1000);
        }
    }
};

$close = static function (int $id) use (&$pairs): void {
    foreach (['c', 's'] as $k) {
        if (is_resource($pairs[$id][$k])) {
            @stream_socket_shutdown($pairs[$id][$k], STREAM_SHUT_RDWR);
            fclose($pairs[$id][$k]);
        }
    }
    unset($pairs[$id]);
};

while (true) {
    $now = microtime(true);
    // Pass on the held-back pieces whose time has come.
    $next = null;
    foreach ($pairs as $id => &$p) {
        while ($p['held'] && $p['held'][0][0] <= $now) {
            [, $data] = array_shift($p['held']);
            $send($p['s'], $data);
        }
        if ($p['held']) {
            $next = min($next ?? PHP_FLOAT_MAX, $p['held'][0][0]);
        }
    }
    unset($p);

    $read = [$ln, STDIN];
    foreach ($pairs as $p) {
        $read[] = $p['c'];
        $read[] = $p['s'];
    }
    $w = $e = null;
    $wait = $next === null ? null : max(0.0, $next - microtime(true));
    if (@stream_select($read, $w, $e, $wait === null ? null : (int) $wait, $wait === null ? 0 : (int) (fmod($wait, 1) * 1e6)) === false) {
        continue;
    }
    foreach ($read as $r) {
        if ($r === STDIN) {
            $line = fgets(STDIN);
            if ($line === false) {
                exit(0); // stdin closed: stop, the route stops answering
            }
            $cmd = explode(' ', trim($line));
            if ($cmd[0] === 'drop') {
                $drop = (int) ($cmd[1] ?? 1);
                echo "ok\n";
            } elseif ($cmd[0] === 'calls') {
                echo "{$calls}\n";
            } else {
                echo "unknown command\n";
            }
            continue;
        }
        if ($r === $ln) {
            // With TLS the handshake happens here; a client that does not
            // trust us gives up on it, and accept fails.
            $c = @stream_socket_accept($ln, 5);
            if ($c === false) {
                continue;
            }
            $s = @stream_socket_client("tcp://{$t['host']}:{$t['port']}", $errno, $errstr, 5);
            if ($s === false) {
                fclose($c);
                continue;
            }
            $calls++;
            stream_set_blocking($c, false);
            $pairs[] = ['c' => $c, 's' => $s, 'drop' => $drop > 0, 'held' => []];
            $drop = max(0, $drop - 1);
            continue;
        }
        foreach ($pairs as $id => &$p) {
            if ($r === $p['c']) {
                // Read all there is: a TLS stream may hold decrypted data
                // that select cannot see.
                $data = '';
                while (($chunk = fread($p['c'], 65536)) !== false && $chunk !== '') {
                    $data .= $chunk;
                }
                if ($data === '' && feof($p['c'])) {
                    $close($id);
                } elseif ($delay > 0) {
                    $p['held'][] = [microtime(true) + $delay, $data];
                } elseif ($data !== '') {
                    $send($p['s'], $data);
                }
                break;
            }
            if ($r === $p['s']) {
                $data = fread($p['s'], 65536);
                if ($data === '' || $data === false || $p['drop']) {
                    // The route's side ended, or this answer is to be lost.
                    $close($id);
                } else {
                    $send($p['c'], $data);
                }
                break;
            }
        }
        unset($p);
    }
}
