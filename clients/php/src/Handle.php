<?php

declare(strict_types=1);

namespace QueenLocks;

/**
 * One holder's view of a lock or of one permit of a semaphore.
 *
 * PHP has no background thread to renew from, so the holder renews at a
 * checkpoint: call keepAlive() inside the work loop. It renews once a third
 * of the lifetime has passed since the last renew was sent, and answers
 * false once the lock is lost. Between checkpoints nothing happens: a loop
 * that stops calling keepAlive() for a whole lifetime loses the lock.
 */
final class Handle
{
    /** The server answered that the permit is no longer ours. */
    public const LOST_RENEW = 'renew';
    /** check() found another token on the permit. */
    public const LOST_GUARD = 'guard';
    /** A whole lifetime passed on our clock, since the last successful renew was sent, without a renew getting through. */
    public const LOST_EXPIRED = 'expired';

    /** The label that opts a Kubernetes object in to fencing. */
    public const GUARDED_LABEL = 'locks.queen.dev/guarded';
    /** The annotation each write to a guarded object carries: "<lock>#<slot>=<token>". */
    public const GUARD_ANNOTATION = 'locks.queen.dev/guard';

    /** First pause between tries when the route cannot wait for us: doubling to POLL_MAX. */
    private const POLL_FIRST = 0.1;
    private const POLL_MAX = 1.0;
    /** A release that gets no answer is retried for at most this long. */
    private const RELEASE_RETRY = 10.0;
    /** How often acquire asks again when a permit the route said was ours is lost before it could be renewed. */
    private const ALREADY_TRIES = 3;

    private readonly string $name;
    private readonly int $limit;
    private readonly string $owner;
    /** The lifetime in nanoseconds, exact: our deadline is never later than the server's. */
    private readonly int $ttlNs;
    /** The lifetime the server counts, in whole seconds. */
    private readonly int $ttlSeconds;

    private ?Lease $lease = null;
    /** The last token we held, kept after a release or a loss for logs. */
    private ?int $token = null;
    private ?int $slot = null;
    private ?\DateTimeImmutable $expiresAt = null;
    /** @var array<string, mixed>|null */
    private ?array $guard = null;
    private ?string $lostReason = null;
    private ?string $reason = null;
    /** @var list<array<string, mixed>> */
    private array $holders = [];
    /** An acquire or release got no answer: the route may hold a permit of ours. */
    private bool $unsure = false;

    /** @internal made by Client::lock() and Client::semaphore() */
    public function __construct(private readonly Route $route, string $name, int $limit, int|float $ttl, ?string $owner)
    {
        $this->name = Limits::name($name);
        $this->limit = Limits::limit($limit);
        $seconds = Limits::ttl($ttl);
        $this->ttlNs = (int) round($seconds * 1e9);
        $this->ttlSeconds = (int) ceil($seconds);
        $this->owner = $owner === null ? Client::mintOwner() : Limits::owner($owner);
    }

    public function name(): string
    {
        return $this->name;
    }

    /** The semaphore's size; 1 for a lock. */
    public function limit(): int
    {
        return $this->limit;
    }

    /** host:pid:random, minted per handle unless given. */
    public function owner(): string
    {
        return $this->owner;
    }

    /** The fencing token of the last answer; null before the first acquire. Read it when you use it: every renew changes it. */
    public function token(): ?int
    {
        return $this->token;
    }

    /** Which permit of the semaphore we hold (0 for a lock); null before the first acquire. */
    public function slot(): ?int
    {
        return $this->slot;
    }

    /**
     * The guard of the last acquire or renew answer, the check that fences
     * a write with the current token: ['op' => 'check', 'key' => 'NAME#SLOT',
     * 'expect' => TOKEN, ...]. Null before the first acquire.
     *
     * @return array<string, mixed>|null
     */
    public function guard(): ?array
    {
        return $this->guard;
    }

    /**
     * The label and annotation that fence a Kubernetes write with the
     * current token, as metadata to merge into the object's:
     * ['labels' => ['locks.queen.dev/guarded' => 'true'],
     *  'annotations' => ['locks.queen.dev/guard' => 'NAME#SLOT=TOKEN']].
     * Null while nothing is held. Call it for each write, after the last
     * keepAlive() before it: a renew changes the token.
     *
     * @return array{labels: array<string, string>, annotations: array<string, string>}|null
     */
    public function guardMetadata(): ?array
    {
        if (!$this->held()) {
            return null;
        }
        return [
            'labels' => [self::GUARDED_LABEL => 'true'],
            'annotations' => [self::GUARD_ANNOTATION => "{$this->name}#{$this->slot}={$this->token}"],
        ];
    }

    /** The server's expiry of the permit (its clock) as of the last answer. */
    public function expiresAt(): ?\DateTimeImmutable
    {
        return $this->expiresAt;
    }

    /** Why the lock was lost: renew, guard or expired; null while held, after a release, or before any loss. */
    public function lostReason(): ?string
    {
        return $this->lostReason;
    }

    /** Why the last acquire did not win: held, contended or quota. */
    public function reason(): ?string
    {
        return $this->reason;
    }

    /**
     * Who held the lock when the last acquire did not win.
     *
     * @return list<array<string, mixed>>
     */
    public function holders(): array
    {
        return $this->holders;
    }

    /** Whether the lock is held, as far as this process knows; asks nobody, but counts a passed lifetime as lost. */
    public function held(): bool
    {
        $this->expireIfPast();
        return $this->lease !== null;
    }

    // Acquire and release.

    /**
     * Takes the lock, waiting up to $wait seconds (null or 0: one try).
     * Answers false when somebody else held it for the whole wait; reason()
     * and holders() say more.
     *
     * A call that got no answer is retried within the wait with the same
     * owner, so one that did land comes back as already ours; without a
     * wait it throws Unavailable, and calling acquire() again is safe.
     */
    public function acquire(?float $wait = null): bool
    {
        $wait = Limits::wait($wait);
        if ($this->held()) {
            return true;
        }
        $giveUp = hrtime(true) + (int) ($wait * 1e9);
        $poll = self::POLL_FIRST;
        while (true) {
            $failure = null;
            try {
                [$won, $waited] = $this->try($this->waitSeconds($giveUp));
                if ($won) {
                    return true;
                }
            } catch (Unavailable $e) {
                [$waited, $failure] = [false, $e];
            }
            $left = ($giveUp - hrtime(true)) / 1e9;
            if ($left <= 0) {
                if ($failure !== null) {
                    throw $failure;
                }
                return false;
            }
            if ($waited) {
                // The route waited for us and no slot freed (or another
                // waiter took it first): ask again at once.
                $poll = self::POLL_FIRST;
                continue;
            }
            self::sleep(self::jitter($poll, $left));
            $poll = min($poll * 2, self::POLL_MAX);
        }
    }

    /**
     * How long one acquire call may wait at the route: whole seconds, at
     * most 60 and at most a third of the lifetime, so that the lifetime we
     * count from when the call was sent still has two thirds left when the
     * answer comes; 0 polls.
     */
    private function waitSeconds(int $giveUp): int
    {
        if (!$this->route->takesWait()) {
            return 0;
        }
        $left = (int) (($giveUp - hrtime(true)) / 1e9);
        return max(0, min(Limits::MAX_WAIT_SECONDS, $left, intdiv($this->ttlNs, 3_000_000_000)));
    }

    /**
     * One acquire call.
     *
     * @return array{0: bool, 1: bool} won, and whether the call waited at the route
     */
    private function try(int $waitSeconds): array
    {
        for ($i = 0; $i < self::ALREADY_TRIES; $i++) {
            $sent = hrtime(true);
            try {
                [$r, $asked] = $this->route->acquire($this->name, $this->owner, $this->ttlSeconds, $this->limit, $waitSeconds);
            } catch (Unavailable $e) {
                $this->unsure = true;
                throw $e;
            }
            $took = (hrtime(true) - $sent) / 1e9;
            if (($r['acquired'] ?? false) !== true) {
                // The route answers "already", never "held", to an owner
                // that holds a permit: so this owner holds none.
                $this->reason = is_string($r['reason'] ?? null) ? $r['reason'] : null;
                $this->holders = $r['holders'] ?? [];
                $this->unsure = false;
                return [false, $asked > 0 && $took >= $asked];
            }
            $slot = (int) ($r['slot'] ?? 0);
            if (($r['already'] ?? false) !== true) {
                $this->start($slot, (int) $r['token'], $sent, $r);
                return [true, false];
            }
            // Already ours: an earlier acquire whose answer was lost, or a
            // release that did not get through. Its lifetime was counted
            // from a write we never saw the sending of, and expiresAt is the
            // server's wall clock, not comparable with ours: renew at once
            // and count from when that renew was sent.
            $sent = hrtime(true);
            try {
                $rn = $this->route->renew($this->name, $slot, (int) $r['token'], $this->owner, $this->ttlSeconds, Route::CALL_TIMEOUT);
            } catch (Unavailable $e) {
                $this->unsure = true;
                throw $e;
            }
            if (($rn['renewed'] ?? false) === true) {
                $this->start($slot, (int) $rn['token'], $sent, $rn);
                return [true, false];
            }
            // It expired or was deleted between the two answers: ask again.
        }
        throw new Exception("acquiring '{$this->name}': a permit the route said was ours was lost "
            . self::ALREADY_TRIES . ' times before it could be renewed');
    }

    /** Records a won permit, its deadline counted from when the winning call was sent. */
    private function start(int $slot, int $token, int $sent, array $answer): void
    {
        $this->lease = new Lease($slot, $token, $sent + $this->ttlNs, $sent + intdiv($this->ttlNs, 3), $answer);
        [$this->slot, $this->token] = [$slot, $token];
        [$this->expiresAt, $this->guard] = [$this->lease->expiresAt, $this->lease->guard];
        [$this->lostReason, $this->reason, $this->holders, $this->unsure] = [null, null, [], false];
    }

    /**
     * Releases the permit. A no-op when nothing is held (after a loss too,
     * a passed lifetime included). Throws LockLost when the server says it
     * was no longer ours, Unavailable when the route did not answer for a
     * while (the permit then ends with its lifetime).
     */
    public function release(): void
    {
        $this->expireIfPast();
        $lease = $this->lease;
        if ($lease === null) {
            if ($this->unsure) {
                $this->releaseUnsure();
            }
            return;
        }
        $this->lease = null;
        $giveUp = min($lease->deadline, hrtime(true) + (int) (self::RELEASE_RETRY * 1e9));
        [$poll, $unanswered] = [self::POLL_FIRST, false];
        while (true) {
            $left = ($giveUp - hrtime(true)) / 1e9;
            try {
                $r = $this->route->release($this->name, $lease->slot, $lease->token, $this->owner, max(0.1, min(Route::CALL_TIMEOUT, $left)));
                break;
            } catch (Unavailable $e) {
                $left = ($giveUp - hrtime(true)) / 1e9;
                if ($left <= 0) {
                    $this->unsure = true;
                    throw $e;
                }
                $unanswered = true;
                self::sleep(self::jitter($poll, $left));
                $poll = min($poll * 2, self::POLL_MAX);
            }
        }
        // After a release whose answer was lost, "lost" may mean that one landed.
        if (($r['released'] ?? false) !== true && !$unanswered) {
            throw new LockLost($this->name, is_string($r['reason'] ?? null) ? $r['reason'] : 'lost');
        }
    }

    /**
     * Releases the permits of our owner that an unanswered call may have
     * left: we never learnt their slot and token, so ask the route.
     */
    private function releaseUnsure(): void
    {
        foreach ($this->route->get($this->name)['holders'] ?? [] as $h) {
            if (($h['owner'] ?? null) === $this->owner) {
                // Lost meanwhile is as good as released here.
                $this->route->release($this->name, (int) $h['slot'], (int) $h['token'], $this->owner);
            }
        }
        $this->unsure = false;
    }

    // The checkpoint.

    /**
     * The work loop's checkpoint. Renews when a third of the lifetime has
     * passed since the last renew (or the acquire) was sent, and answers
     * whether the lock is still held: false once the server said it is not
     * ours (lostReason() 'renew') or once a whole lifetime has passed on
     * this process's monotonic clock since the last successful renew was
     * sent ('expired'). Before a third of the lifetime it sends nothing, so
     * it is cheap to call often. False when nothing is held.
     *
     * A renew that gets no answer is sent again, with the same token, at a
     * checkpoint a tenth of the lifetime (at least 100 ms) later.
     */
    public function keepAlive(): bool
    {
        if (!$this->held()) {
            return false;
        }
        if (hrtime(true) >= $this->lease->nextRenewAt) {
            $this->renew($this->lease);
        }
        return $this->lease !== null;
    }

    /** Sends one renew with the token of the last answer, and records its answer. */
    private function renew(Lease $lease): void
    {
        $sent = hrtime(true);
        try {
            $r = $this->route->renew($this->name, $lease->slot, $lease->token, $this->owner, $this->ttlSeconds,
                max(0.05, ($lease->deadline - $sent) / 1e9));
        } catch (Exception $e) {
            // No answer, or none we can act on (a token being rotated, a
            // right being restored): try again soon, with the same token,
            // until the deadline.
            $lease->nextRenewAt = min($lease->deadline, hrtime(true) + max(intdiv($this->ttlNs, 10), 100_000_000));
            return;
        }
        if (($r['renewed'] ?? false) !== true) {
            $this->lose(self::LOST_RENEW);
            return;
        }
        if (hrtime(true) >= $lease->deadline) {
            // It landed, but we learnt it only after our deadline: by then
            // we had to count the lock as over, and we keep to that.
            $this->lose(self::LOST_EXPIRED);
            return;
        }
        $token = (int) $r['token'];
        // Never step back to an older token than the last answer's.
        if ($token >= $lease->token) {
            $lease->token = $token;
            $lease->guard = is_array($r['guard'] ?? null) ? $r['guard'] : $lease->guard;
            $lease->expiresAt = Lease::time($r['expiresAt'] ?? null) ?? $lease->expiresAt;
        }
        $lease->deadline = max($lease->deadline, $sent + $this->ttlNs);
        $lease->nextRenewAt = $sent + intdiv($this->ttlNs, 3);
        [$this->token, $this->guard, $this->expiresAt] = [$lease->token, $lease->guard, $lease->expiresAt];
    }

    /**
     * Asks the server whether our token is still the permit's. When it is
     * not, the lock counts as lost with reason 'guard'. False when nothing
     * is held. A check guards nothing by itself: the lock can move between
     * its answer and your write; fence the write with the token.
     *
     * @throws Unavailable when the route does not answer (nothing is decided then)
     */
    public function check(): bool
    {
        if (!$this->held()) {
            return false;
        }
        $lease = $this->lease;
        if (($this->route->check($this->name, $lease->slot, $lease->token)['ok'] ?? false) === true) {
            return true;
        }
        $this->lose(self::LOST_GUARD);
        return false;
    }

    /** Counts the lock lost when its lifetime has passed on our clock. */
    private function expireIfPast(): void
    {
        if ($this->lease !== null && hrtime(true) >= $this->lease->deadline) {
            $this->lose(self::LOST_EXPIRED);
        }
    }

    private function lose(string $reason): void
    {
        $this->lease = null;
        $this->lostReason = $reason;
    }

    // Running something under the lock.

    /**
     * Acquires (waiting up to $wait seconds), calls $fn($this), and releases
     * afterwards whatever $fn did; $fn's exception propagates after the
     * release. Answers false, without calling $fn, when the lock could not
     * be had in time. $fn should call keepAlive() in its loop, stop when it
     * answers false, and fence what it commits with token().
     */
    public function run(callable $fn, ?float $wait = null): bool
    {
        Limits::wait($wait);
        try {
            if (!$this->acquire($wait)) {
                return false;
            }
        } catch (Unavailable $e) {
            // An acquire that got no answer may have landed: free it.
            try {
                $this->release();
            } catch (Exception) {
                // The unanswered acquire is the error to report.
            }
            throw $e;
        }
        try {
            $fn($this);
        } catch (\Throwable $e) {
            // $fn's exception is the one to see, whatever the release meets.
            try {
                $this->release();
            } catch (Exception) {
            }
            throw $e;
        }
        try {
            $this->release();
        } catch (LockLost) {
            // The work has ended; keepAlive() told $fn, if it asked.
        }
        return true;
    }

    private static function jitter(float $poll, float $left): float
    {
        // Jitter spreads waiters out, so they do not all ask at once.
        return min($poll / 2 + $poll * mt_rand() / mt_getrandmax(), $left);
    }

    private static function sleep(float $seconds): void
    {
        if ($seconds > 0) {
            usleep((int) ($seconds * 1e6));
        }
    }
}
