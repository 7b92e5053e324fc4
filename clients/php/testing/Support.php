<?php

declare(strict_types=1);

namespace QueenLocks\Testing;

use PHPUnit\Framework\TestCase;
use QueenLocks\Client;

/**
 * What the tests share: where the route is, kubectl, the API server's
 * metrics, and waiting for a condition.
 *
 * The route tests need a route. `go test ./clients/ -run TestPHPHandle`
 * starts a control plane and sets the variables below; by hand, against
 * `make dev`, from the repository's root:
 *
 *     QUEEN_LOCKS_TEST_URL=http://localhost:6632 QUEEN_LOCKS_TEST_NAMESPACE=default \
 *     QUEEN_LOCKS_TEST_KUBECONFIG=.dev/kubeconfig QUEEN_LOCKS_TEST_KUBECTL=bin/kubectl \
 *     phpunit -c clients/php/phpunit.xml
 */
final class Support
{
    public static function url(): string
    {
        return (string) getenv('QUEEN_LOCKS_TEST_URL');
    }

    public static function namespace(): ?string
    {
        return getenv('QUEEN_LOCKS_TEST_NAMESPACE') ?: null;
    }

    public static function tlsDir(): string
    {
        return (string) getenv('QUEEN_LOCKS_TEST_TLS_DIR');
    }

    /** Skips $test unless a route is given (the Go harness fails on any skip). */
    public static function live(TestCase $test): void
    {
        if (self::url() === '') {
            $test->markTestSkipped('QUEEN_LOCKS_TEST_URL is not set: these tests need a running route '
                . '(go test ./clients/ sets it; by hand: make dev, then QUEEN_LOCKS_TEST_URL=http://localhost:6632)');
        }
    }

    /** Skips $test unless kubectl and a kubeconfig are given too. */
    public static function withKubectl(TestCase $test): void
    {
        self::live($test);
        if (!getenv('QUEEN_LOCKS_TEST_KUBECONFIG') || !getenv('QUEEN_LOCKS_TEST_KUBECTL')) {
            $test->markTestSkipped('QUEEN_LOCKS_TEST_KUBECONFIG and QUEEN_LOCKS_TEST_KUBECTL are not set: this test '
                . 'deletes a permit, writes a ConfigMap or reads the API server\'s metrics with kubectl '
                . '(go test ./clients/ sets them; under make dev: .dev/kubeconfig and bin/kubectl)');
        }
    }

    /** Skips $test unless a CA and a certificate for 127.0.0.1 are given. */
    public static function withTls(TestCase $test): void
    {
        self::live($test);
        if (self::tlsDir() === '') {
            $test->markTestSkipped('QUEEN_LOCKS_TEST_TLS_DIR is not set: this test needs a CA (ca.crt) and a '
                . 'certificate for 127.0.0.1 (tls.crt, tls.key) for an https proxy (go test ./clients/ makes them)');
        }
    }

    public static function client(?string $url = null, ?string $caFile = null): Client
    {
        return new Client(url: $url ?? self::url(), namespace: self::namespace(), caFile: $caFile);
    }

    /** A lock name no other run has used, so runs against make dev do not meet. */
    public static function unique(string $prefix): string
    {
        return $prefix . '-' . bin2hex(random_bytes(3));
    }

    /**
     * Runs kubectl with the admin's kubeconfig, in the test namespace unless
     * $namespaced is false.
     *
     * @param list<string> $args
     * @return array{0: int, 1: string, 2: string} exit code, stdout, stderr
     */
    public static function kubectl(array $args, string $stdin = '', bool $namespaced = true): array
    {
        $argv = [(string) getenv('QUEEN_LOCKS_TEST_KUBECTL'), '--kubeconfig', (string) getenv('QUEEN_LOCKS_TEST_KUBECONFIG')];
        if ($namespaced && self::namespace() !== null) {
            array_push($argv, '-n', self::namespace());
        }
        $proc = proc_open([...$argv, ...$args], [0 => ['pipe', 'r'], 1 => ['pipe', 'w'], 2 => ['pipe', 'w']], $pipes);
        fwrite($pipes[0], $stdin);
        fclose($pipes[0]);
        // Read both pipes together: the metrics are far bigger than a pipe's buffer.
        [$out, $err] = ['', ''];
        $open = [1 => $pipes[1], 2 => $pipes[2]];
        while ($open) {
            $r = array_values($open);
            $w = $e = null;
            stream_select($r, $w, $e, 60);
            foreach ($open as $i => $p) {
                if (in_array($p, $r, true)) {
                    $chunk = fread($p, 65536);
                    if ($chunk === '' || $chunk === false) {
                        if (feof($p)) {
                            fclose($p);
                            unset($open[$i]);
                        }
                        continue;
                    }
                    $i === 1 ? $out .= $chunk : $err .= $chunk;
                }
            }
        }
        return [proc_close($proc), $out, $err];
    }

    /** Deletes the permit of a simply named lock, as an operator would. */
    public static function deletePermit(string $lock, int $slot = 0): void
    {
        [$code, , $err] = self::kubectl(['delete', 'queenlock', "{$lock}.{$slot}", '--wait=false']);
        if ($code !== 0) {
            throw new \RuntimeException("kubectl delete: {$err}");
        }
    }

    /**
     * Writes a guarded ConfigMap carrying the guard annotation, as every
     * write to one must.
     *
     * @return array{0: int, 1: string, 2: string}
     */
    public static function writeConfigMap(string $name, string $guard, string $value, bool $create = false): array
    {
        $cm = [
            'apiVersion' => 'v1',
            'kind' => 'ConfigMap',
            'metadata' => [
                'name' => $name,
                'labels' => ['locks.queen.dev/guarded' => 'true'],
                'annotations' => ['locks.queen.dev/guard' => $guard],
            ],
            'data' => ['report' => $value],
        ];
        return self::kubectl([$create ? 'create' : 'replace', '-f', '-'], json_encode($cm, JSON_THROW_ON_ERROR));
    }

    /**
     * How many PUT requests on queenlocks the API server has served, by
     * its own metrics: the route renews with one update, stamped by the
     * manager.
     */
    public static function permitUpdates(): int
    {
        [$code, $out, $err] = self::kubectl(['get', '--raw', '/metrics'], '', false);
        if ($code !== 0) {
            throw new \RuntimeException("kubectl get --raw /metrics: {$err}");
        }
        $n = 0;
        foreach (explode("\n", $out) as $line) {
            if (str_starts_with($line, 'apiserver_request_total{')
                && str_contains($line, 'resource="queenlocks"') && str_contains($line, 'verb="PUT"')) {
                $n += (int) substr($line, strrpos($line, ' ') + 1);
            }
        }
        return $n;
    }

    /** Waits until $cond() is true, asking every 20 ms; fails after $timeout seconds. */
    public static function waitFor(string $what, callable $cond, float $timeout = 30.0): void
    {
        $end = hrtime(true) + (int) ($timeout * 1e9);
        while (!$cond()) {
            if (hrtime(true) > $end) {
                throw new \RuntimeException("waiting for {$what}: gave up after {$timeout}s");
            }
            usleep(20_000);
        }
    }

    /** Seconds on the monotonic clock, for measuring. */
    public static function now(): float
    {
        return hrtime(true) / 1e9;
    }
}
