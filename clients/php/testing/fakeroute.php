<?php

/*
 * A stand-in for the route, for the transport's tests: it answers every
 * call with STATUS and BODY, and prints each request it got as a JSON line
 * {"authorization", "body"}. Prints its URL first; ends when stdin closes.
 *
 *     php fakeroute.php STATUS BODY
 */

declare(strict_types=1);

[, $status, $answer] = $argv + [null, '200', ''];
$ln = stream_socket_server('tcp://127.0.0.1:0');
echo 'http://' . stream_socket_get_name($ln, false) . "\n";

while (true) {
    $r = [$ln, STDIN];
    $w = $e = null;
    stream_select($r, $w, $e, null);
    if (in_array(STDIN, $r, true) && fgets(STDIN) === false) {
        exit(0);
    }
    if (!in_array($ln, $r, true) || ($c = @stream_socket_accept($ln, 5)) === false) {
        continue;
    }
    $head = '';
    while (!str_contains($head, "\r\n\r\n") && ($line = fgets($c)) !== false) {
        $head .= $line;
    }
    $auth = preg_match('/^Authorization: (.*)\r$/mi', $head, $m) === 1 ? $m[1] : null;
    $length = preg_match('/^Content-Length: (\d+)\r$/mi', $head, $m) === 1 ? (int) $m[1] : 0;
    $body = $length > 0 ? stream_get_contents($c, $length) : '';
    echo json_encode(['authorization' => $auth, 'body' => json_decode($body, true)]), "\n";
    fwrite($c, "HTTP/1.1 {$status} X\r\nContent-Type: application/json\r\nContent-Length: " . strlen($answer)
        . "\r\nConnection: close\r\n\r\n{$answer}");
    fclose($c);
}
