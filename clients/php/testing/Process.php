<?php

declare(strict_types=1);

namespace QueenLocks\Testing;

/**
 * A child process the tests talk to by lines: its stdin and stdout are
 * pipes, its stderr is kept for the failure message.
 */
final class Process
{
    /** @var resource */
    private $proc;
    /** @var array<int, resource> */
    private array $pipes;
    private string $buffer = '';
    private ?int $exit = null;

    /**
     * @param list<string>               $argv
     * @param array<string, string>|null $env  added to this process's environment
     */
    public function __construct(private readonly array $argv, ?array $env = null)
    {
        $spec = [0 => ['pipe', 'r'], 1 => ['pipe', 'w'], 2 => ['pipe', 'w']];
        $proc = proc_open($argv, $spec, $pipes, null, $env === null ? null : array_merge(getenv(), $env));
        if ($proc === false) {
            throw new \RuntimeException('cannot start ' . implode(' ', $argv));
        }
        $this->proc = $proc;
        $this->pipes = $pipes;
        stream_set_blocking($this->pipes[1], false);
        stream_set_blocking($this->pipes[2], false);
    }

    /** A PHP script of testing/ run by this PHP binary. */
    public static function php(string $script, array $args = [], ?array $env = null): self
    {
        return new self([PHP_BINARY, __DIR__ . '/' . $script, ...$args], $env);
    }

    public function pid(): int
    {
        return proc_get_status($this->proc)['pid'];
    }

    public function write(string $line): void
    {
        fwrite($this->pipes[0], $line . "\n");
        fflush($this->pipes[0]);
    }

    /** The next line of its stdout, without the newline; fails after $timeout seconds or at its end. */
    public function readLine(float $timeout = 60.0): string
    {
        $end = microtime(true) + $timeout;
        while (($at = strpos($this->buffer, "\n")) === false) {
            $left = $end - microtime(true);
            if ($left <= 0) {
                throw new \RuntimeException(sprintf('%s: no line within %.0fs; stderr: %s', $this->name(), $timeout, $this->stderr()));
            }
            $r = [$this->pipes[1]];
            $w = $e = null;
            if (@stream_select($r, $w, $e, (int) $left, (int) (fmod($left, 1) * 1e6)) > 0) {
                $chunk = fread($this->pipes[1], 65536);
                if ($chunk === '' || $chunk === false) {
                    if (feof($this->pipes[1])) {
                        throw new \RuntimeException(sprintf('%s ended without a line; stderr: %s', $this->name(), $this->stderr()));
                    }
                    continue;
                }
                $this->buffer .= $chunk;
            }
        }
        $line = substr($this->buffer, 0, $at);
        $this->buffer = substr($this->buffer, $at + 1);
        return $line;
    }

    /** The next line, decoded as a JSON object. */
    public function readJson(float $timeout = 60.0): array
    {
        $line = $this->readLine($timeout);
        $v = json_decode($line, true);
        if (!is_array($v)) {
            throw new \RuntimeException("{$this->name()}: not JSON: {$line}; stderr: {$this->stderr()}");
        }
        return $v;
    }

    /** Closes its stdin (the holders release then) and waits for its exit code. */
    public function finish(): int
    {
        if (is_resource($this->pipes[0])) {
            fclose($this->pipes[0]);
        }
        return $this->wait();
    }

    public function wait(): int
    {
        if ($this->exit !== null) {
            return $this->exit;
        }
        // proc_close waits; stdout and stderr are drained first so that a
        // chatty child cannot block on a full pipe.
        stream_set_blocking($this->pipes[1], true);
        $this->buffer .= stream_get_contents($this->pipes[1]);
        $this->stderrText .= stream_get_contents($this->pipes[2]);
        foreach ($this->pipes as $p) {
            if (is_resource($p)) {
                fclose($p);
            }
        }
        return $this->exit = proc_close($this->proc);
    }

    /** Ends it at once (SIGKILL) and reaps it. */
    public function kill(): void
    {
        if ($this->exit === null) {
            proc_terminate($this->proc, 9);
            $this->wait();
        }
    }

    private string $stderrText = '';

    public function stderr(): string
    {
        if (is_resource($this->pipes[2] ?? null)) {
            $this->stderrText .= (string) stream_get_contents($this->pipes[2]);
        }
        return $this->stderrText;
    }

    private function name(): string
    {
        return implode(' ', array_map('basename', array_slice($this->argv, 0, 3)));
    }

    public function __destruct()
    {
        $this->kill();
    }
}
