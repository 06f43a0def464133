// A known chain of uniquely named static methods for interp/jvm's tests. The test keeps
// chainOuter and chainSink from being inlined (-XX:CompileCommand=dontinline), so that
// each is an nmethod of its own; chainMiddle and chainLeaf are small and inlined into
// chainOuter, and the call to chainSink from chainLeaf leaves a PcDesc whose scopes are
// chainLeaf, chainMiddle, chainOuter. The tests assert the line numbers below: keep
// every line where it is.
public class SondeChain {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        System.out.println("ready");
        while (true) {
            sink += chainOuter(sink, 512);
        }
    }

    static long chainOuter(long seed, int n) {
        long s = seed;
        for (int i = 0; i < n; i++) {
            s += chainMiddle(s, i);
        }
        return s;
    }

    static long chainMiddle(long s, int i) {
        return chainLeaf(s ^ i) * 31 + i;
    }

    static long chainLeaf(long x) {
        return chainSink((x >>> 7) ^ (x << 3));
    }

    static long chainSink(long x) {
        return x ^ 0x5bd1e995L;
    }
}
