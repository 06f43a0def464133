// A Java workload for TestCapabilitiesJava: capBurnLeaf is named only if sonde can read
// the JVM's memory and libjvm.so through /proc/PID under the deployed capabilities.
public class CapBurn {
    static volatile long sink;

    static long capBurnLeaf(long n) {
        long c = sink;
        for (long i = 0; i < n; i++) {
            c = c * 31 + (i ^ (c >>> 7));
        }
        return c;
    }

    public static void main(String[] args) {
        long end = System.nanoTime() + 120_000_000_000L;
        while (System.nanoTime() < end) {
            sink = capBurnLeaf(1_000_000);
        }
    }
}
