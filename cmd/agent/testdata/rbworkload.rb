# The Ruby workload sonde's tests profile: ruby rbworkload.rb MODE SECONDS.
# It prints "ready" once it starts, then runs MODE for SECONDS.
#   pure:    orchard -> Farm::Orchard.pick -> Farm::Orchard#pluck -> #sort_fruit -> #weigh
#   block:   harvest -> Array#each (C) -> block in harvest -> weigh_basket
#   threads: two threads, one in a_outer -> a_inner, the other in b_outer -> b_inner
#   times:   count -> tally -> Integer#times (C in 3.1) -> block in tally, a tiny block, so
#            that much of the time is in the VM entering it from C
#   fork:    two forked workers, each in orchard's chain, as a preforking server's
#   ext:     mill -> Spinner.grind, a C extension's method (the .so at ARGV[2]) that
#            grinds in C and yields to a block in mill -> sift, in Ruby

module Farm
class Orchard
  def initialize(size)
    @size = size
  end

  def self.pick(orchard, round)
    orchard.pluck(round)
  end

  def pluck(round)
    total = 0
    i = 0
    while i < 20
      total += sort_fruit(round + i)
      i += 1
    end
    total
  end

  def sort_fruit(seed)
    weigh(seed) & 0xff
  end

  def weigh(seed)
    n = seed
    i = 0
    while i < @size
      n = (n * 1103515245 + 12345) & 0x7fffffff
      i += 1
    end
    n
  end
end
end

def orchard(deadline)
  o = Farm::Orchard.new(3000)
  total = 0
  round = 0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    total += Farm::Orchard.pick(o, round)
    round += 1
  end
  total
end

def weigh_basket(seed)
  n = seed
  i = 0
  while i < 3000
    n = (n * 31 + i) % 1000003
    i += 1
  end
  n
end

def harvest(deadline)
  total = 0
  basket = (0...50).to_a
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    basket.each do |x|
      total += weigh_basket(x)
    end
  end
  total
end

def tally(n)
  t = 0
  n.times { |i| t = (t + i * 7) % 65_521 }
  t
end

def count(deadline)
  r = 0
  r ^= tally(30_000) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  r
end

def sift(v)
  n = v
  i = 0
  while i < 2000
    n = (n * 17 + i) % 65_521
    i += 1
  end
  n
end

def mill(deadline)
  t = 0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    Spinner.grind(20) { |v| t ^= sift(v) }
  end
  t
end

def a_inner(deadline)
  n = 0
  n += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  n
end

def a_outer(deadline)
  a_inner(deadline)
end

def b_inner(deadline)
  n = 0
  n += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  n
end

def b_outer(deadline)
  b_inner(deadline)
end

mode = ARGV[0] || "pure"
require ARGV[2] if mode == "ext"
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + (ARGV[1] || "10").to_f
$stdout.puts "ready"
$stdout.flush
case mode
when "pure"
  orchard(deadline)
when "block"
  harvest(deadline)
when "times"
  count(deadline)
when "threads"
  [Thread.new { a_outer(deadline) }, Thread.new { b_outer(deadline) }].each(&:join)
when "ext"
  mill(deadline)
when "fork"
  workers = Array.new(2) { fork { orchard(deadline) } }
  workers.each { |pid| Process.wait(pid) }
else
  warn "unknown mode #{mode}"
  exit 2
end
