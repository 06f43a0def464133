<?php
// A request php-fpm serves in sonde's tests: handle_request -> render_page -> tokenize,
// about 50 ms of arithmetic in PHP, then a line of output that says whether opcache's JIT
// ran it.

function tokenize(int $seed): int
{
    $n = $seed;
    for ($i = 0; $i < 5000; $i++) {
        $n = ($n * 1103515245 + 12345) & 0x7fffffff;
    }
    return $n & 0xff;
}

function render_page(int $rows): int
{
    $sum = 0;
    for ($r = 0; $r < $rows; $r++) {
        $sum += tokenize($r);
    }
    return $sum;
}

function handle_request(): string
{
    $until = microtime(true) + 0.05;
    $sum = 0;
    while (microtime(true) < $until) {
        $sum += render_page(20);
    }
    $status = function_exists('opcache_get_status') ? opcache_get_status(false) : false;
    $jit = $status && !empty($status['jit']['on']) ? 'on' : 'off';
    return "served $sum jit=$jit\n";
}

echo handle_request();
