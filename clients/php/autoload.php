<?php

/*
 * Loads the QueenLocks classes without Composer: require this file.
 * With Composer, its own autoload (PSR-4, QueenLocks\ => src/) does the same.
 */

declare(strict_types=1);

spl_autoload_register(static function (string $class): void {
    $prefix = 'QueenLocks\\';
    if (strncmp($class, $prefix, strlen($prefix)) !== 0) {
        return;
    }
    $file = __DIR__ . '/src/' . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
    if (is_file($file)) {
        require $file;
    }
});
