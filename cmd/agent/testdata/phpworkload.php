<?php
// The PHP workload sonde's tests profile: php phpworkload.php MODE SECONDS [jit].
// It prints "ready" once it starts, then runs MODE for SECONDS; with "jit", it first
// checks that opcache's JIT is on, and exits with 3 if it is not.
//   pure:     harbor -> Dock::unload -> Dock::count_crates, arithmetic in PHP
//   internal: harbor_sorted -> usort (internal) -> compare_crates, a user callback
//   closure:  harbor_mapped -> array_map (internal) -> {closure}

class Dock
{
    public static function open(int $size): Dock
    {
        return new Dock($size);
    }

    public function __construct(private int $size)
    {
    }

    public function unload(int $round): int
    {
        $sum = 0;
        for ($i = 0; $i < 50; $i++) {
            $sum += $this->count_crates($round + $i);
        }
        return $sum;
    }

    public function count_crates(int $seed): int
    {
        $n = $seed;
        for ($i = 0; $i < $this->size; $i++) {
            $n = ($n * 1103515245 + 12345) & 0x7fffffff;
        }
        return $n & 0xff;
    }
}

function harbor(float $until): int
{
    $dock = Dock::open(2000);
    $total = 0;
    $round = 0;
    while (microtime(true) < $until) {
        $total += $dock->unload($round++);
    }
    return $total;
}

// The callbacks' loops are long enough that the internal function's own work between
// calls (zend_sort, array_map, range, shuffle: 1-5 % of samples under opcache's tracing
// JIT with 2000 and 600 turns) stays well under a twentieth of the time.
function compare_crates(int $a, int $b): int
{
    $x = 0;
    for ($i = 0; $i < 8000; $i++) {
        $x += ($a ^ $i) - ($b ^ $i);
    }
    return $x <=> 0;
}

function harbor_sorted(float $until): int
{
    $total = 0;
    while (microtime(true) < $until) {
        $crates = range(0, 300);
        shuffle($crates);
        usort($crates, 'compare_crates');
        $total += $crates[0];
    }
    return $total;
}

function harbor_mapped(float $until): int
{
    $total = 0;
    $weigh = function (int $c): int {
        $w = $c;
        for ($i = 0; $i < 2400; $i++) {
            $w = ($w * 31 + $i) % 1000003;
        }
        return $w;
    };
    while (microtime(true) < $until) {
        $total += array_sum(array_map($weigh, range(0, 300)));
    }
    return $total;
}

$mode = $argv[1] ?? 'pure';
$until = microtime(true) + (float)($argv[2] ?? 10);
if (($argv[3] ?? '') === 'jit') {
    $status = function_exists('opcache_get_status') ? opcache_get_status(false) : false;
    if (!$status || empty($status['jit']['on'])) {
        fwrite(STDERR, "opcache's JIT is off\n");
        exit(3);
    }
}
echo "ready\n";
flush();
switch ($mode) {
    case 'pure':
        harbor($until);
        break;
    case 'internal':
        harbor_sorted($until);
        break;
    case 'closure':
        harbor_mapped($until);
        break;
    default:
        fwrite(STDERR, "unknown mode $mode\n");
        exit(2);
}
