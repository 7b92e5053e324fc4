<?php

/*
 * PHPUnit's bootstrap: the handle from the checkout (no Composer needed)
 * and the tests' helpers.
 */

declare(strict_types=1);

require __DIR__ . '/../autoload.php';
require __DIR__ . '/Process.php';
require __DIR__ . '/Proxy.php';
require __DIR__ . '/Support.php';
