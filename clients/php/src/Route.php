<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * The transport: one operation per POST /api/v1/locks call, over curl.
 *
 * Every call opens a connection of its own. A lock client calls a few
 * times per lifetime, so reuse saves little, while a pooled connection
 * that went stale would make curl send the call again on its own, behind
 * the handle's back.
 *
 * @internal
 */
final class Route
{
    public const PATH = '/api/v1/locks';
    /** How long an ordinary call may take before it counts as unanswered. */
    public const CALL_TIMEOUT = 30.0;

    /** Answers that mean "maybe applied, maybe not": a proxy's or the route's. */
    private const ANSWERLESS = [502, 503, 504];

    public readonly string $url;
    private bool $takesWait = true;

    public function __construct(
        string $url,
        public readonly ?string $namespace,
        private readonly TokenFile $token,
        private readonly ?string $caFile,
    ) {
        $this->url = self::routeUrl($url);
        if ($caFile !== null && !is_file($caFile)) {
            throw new InvalidArgument('caFile', "{$caFile} does not exist");
        }
    }

    /** The route's full address: a bare server URL gets /api/v1/locks. */
    public static function routeUrl(string $url): string
    {
        if ($url === '') {
            throw new InvalidArgument('url', 'no route URL: pass url: or set QUEEN_LOCKS_URL (for example http://localhost:6632)');
        }
        $parts = parse_url($url);
        if ($parts === false || !in_array($parts['scheme'] ?? '', ['http', 'https'], true) || ($parts['host'] ?? '') === '') {
            throw new InvalidArgument('url', "'{$url}' must be http:// or https:// with a host");
        }
        $path = $parts['path'] ?? '';
        if ($path === '' || $path === '/') {
            return rtrim($url, '/') . self::PATH;
        }
        return $url;
    }

    /** Whether the route takes waitSeconds (until it refuses the field once). */
    public function takesWait(): bool
    {
        return $this->takesWait;
    }

    /**
     * Sends one operation and answers its result.
     *
     * @param array<string, mixed> $op
     * @return array<string, mixed>
     * @throws Unavailable when there was no answer
     * @throws RouteError  for any other answer than 200
     */
    public function call(array $op, float $timeout = self::CALL_TIMEOUT): array
    {
        $body = ['operations' => [$op]];
        if ($this->namespace !== null && $this->namespace !== '') {
            $body['namespace'] = $this->namespace;
        }
        $headers = ['Content-Type: application/json', 'Accept: application/json', 'Expect:'];
        $token = $this->token->read();
        if ($token !== null) {
            $headers[] = 'Authorization: Bearer ' . $token;
        }
        $what = "{$op['op']} '{$op['name']}'";
        $ms = max(50, (int) ceil($timeout * 1000));
        $curl = curl_init($this->url);
        $options = [
            CURLOPT_POST => true,
            CURLOPT_POSTFIELDS => json_encode($body, JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE | JSON_THROW_ON_ERROR),
            CURLOPT_HTTPHEADER => $headers,
            CURLOPT_RETURNTRANSFER => true,
            CURLOPT_TIMEOUT_MS => $ms,
            CURLOPT_CONNECTTIMEOUT_MS => min($ms, 10000),
            // Timeouts under a second need this with the system resolver.
            CURLOPT_NOSIGNAL => true,
            CURLOPT_FOLLOWLOCATION => false,
            CURLOPT_PROTOCOLS => CURLPROTO_HTTP | CURLPROTO_HTTPS,
        ];
        if ($this->caFile !== null) {
            $options[CURLOPT_CAINFO] = $this->caFile;
        }
        curl_setopt_array($curl, $options);
        $raw = curl_exec($curl);
        $errno = curl_errno($curl);
        $status = (int) curl_getinfo($curl, CURLINFO_RESPONSE_CODE);
        $error = curl_error($curl);
        curl_close($curl);

        if ($errno !== 0 || !is_string($raw)) {
            if (in_array($errno, [CURLE_SSL_PEER_CERTIFICATE, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_CERTPROBLEM, CURLE_SSL_PINNEDPUBKEYNOTMATCH], true)) {
                // Asking again will not help: this is not a route we trust.
                throw new Exception("{$what}: {$this->url}: {$error}: the route's certificate is not trusted (pass caFile:)");
            }
            throw new Unavailable("{$what}: no answer from {$this->url}: {$error}");
        }
        if ($status !== 200) {
            throw $this->refusal($status, $raw);
        }
        $decoded = json_decode($raw, true);
        $results = is_array($decoded) ? ($decoded['results'] ?? null) : null;
        if (!is_array($results) || count($results) !== 1 || !is_array($results[0] ?? null)) {
            throw new Exception('the route answered something other than one result: ' . substr($raw, 0, 200));
        }
        return $results[0];
    }

    private function refusal(int $status, string $raw): Exception
    {
        $message = trim($raw);
        $field = $index = null;
        $decoded = json_decode($raw, true);
        if (is_array($decoded) && is_array($decoded['error'] ?? null)) {
            $err = $decoded['error'];
            $message = is_string($err['message'] ?? null) ? $err['message'] : $message;
            $field = is_string($err['field'] ?? null) ? $err['field'] : null;
            $index = is_int($err['index'] ?? null) ? $err['index'] : null;
        }
        if (in_array($status, self::ANSWERLESS, true)) {
            return new Unavailable("the route answered {$status}: {$message}", $status);
        }
        return new RouteError($status, $message, $field, $index);
    }

    /**
     * An acquire; with $waitSeconds > 0 the route waits for a slot to free.
     *
     * @return array{0: array<string, mixed>, 1: int} the result, and how long the route was asked to wait
     */
    public function acquire(string $name, string $owner, int $ttlSeconds, int $limit, int $waitSeconds): array
    {
        $op = ['op' => 'acquire', 'name' => $name, 'ttlSeconds' => $ttlSeconds, 'owner' => $owner, 'limit' => $limit];
        if ($waitSeconds > 0 && $this->takesWait) {
            $op['waitSeconds'] = $waitSeconds;
            try {
                return [$this->call($op, self::CALL_TIMEOUT + $waitSeconds), $waitSeconds];
            } catch (RouteError $e) {
                // A route from before waitSeconds refuses the field whole
                // (400, nothing applied): remember that, and poll instead.
                if ($e->status() !== 400 || $e->field() !== 'waitSeconds') {
                    throw $e;
                }
                $this->takesWait = false;
                unset($op['waitSeconds']);
            }
        }
        return [$this->call($op), 0];
    }

    /** @return array<string, mixed> */
    public function renew(string $name, int $slot, int $token, string $owner, int $ttlSeconds, float $timeout): array
    {
        return $this->call(['op' => 'renew', 'name' => $name, 'slot' => $slot, 'token' => $token,
            'owner' => $owner, 'ttlSeconds' => $ttlSeconds], $timeout);
    }

    /** @return array<string, mixed> */
    public function release(string $name, int $slot, int $token, string $owner, float $timeout = self::CALL_TIMEOUT): array
    {
        return $this->call(['op' => 'release', 'name' => $name, 'slot' => $slot, 'token' => $token, 'owner' => $owner], $timeout);
    }

    /** @return array<string, mixed> */
    public function get(string $name): array
    {
        return $this->call(['op' => 'get', 'name' => $name]);
    }

    /** @return array<string, mixed> */
    public function check(string $name, int $slot, int $expect): array
    {
        return $this->call(['op' => 'check', 'name' => $name, 'slot' => $slot, 'expect' => $expect]);
    }
}
