package trace

// BenchStacks lets the external benchmarks replay BenchmarkAggregate's stacks.
var BenchStacks = benchStacks
