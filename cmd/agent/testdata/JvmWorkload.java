// The Java workload of cmd/agent's tests: java JvmWorkload MODE SECONDS.
//
//   chain   main -> walrusSettle -> walrusPost -> walrusChecksum, busy. C2 inlines the small
//           walrusPost into walrusSettle; -Xint interprets it all; C1 compiles it with
//           -XX:TieredStopAtLevel=1.
//   native  main -> narwhalLoop -> narwhalDeflate -> java.util.zip.Deflater (zlib, through
//           JNI), and narwhalLoop -> narwhalCopy -> System.arraycopy (a stub of the JVM's,
//           or its native code when interpreted).
//   churn   main -> ottersLoop loads a class in a new class loader each round, runs it until
//           compiled, and drops it; the collector unloads the classes and frees their code,
//           and each new class makes the call site in otterDrive deoptimize.
//
// Names that occur nowhere else tell a misnamed frame. The tests read each method's span
// of lines from this file: a method starts at its "    static" line and ends at the next
// line holding only "    }".
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.util.zip.Deflater;

public class JvmWorkload {
    static volatile long total;

    static long walrusChecksum(long n) {
        long c = total;
        for (long i = 0; i < n; i++) {
            c = c * 31 + (i ^ (c >>> 7));
        }
        return c;
    }

    static long walrusPost(long n) {
        long c = walrusChecksum(n);
        total = c;
        return c;
    }

    static long walrusSettle(long n) {
        long c = walrusPost(n);
        total = c ^ 5;
        return c;
    }

    static long narwhalDeflate(byte[] in, byte[] out) {
        Deflater d = new Deflater(6);
        d.setInput(in, 0, 1 << 18);
        d.finish();
        long n = 0;
        while (!d.finished()) {
            n += d.deflate(out);
        }
        d.end();
        return n;
    }

    static long narwhalCopy(byte[] a, byte[] b) {
        long n = 0;
        for (int i = 0; i < 4; i++) {
            System.arraycopy(a, 0, b, 0, a.length);
            n += b[i];
        }
        return n;
    }

    static long narwhalLoop(long end) {
        byte[] in = new byte[1 << 23];
        long x = 1;
        for (int i = 0; i < in.length; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            in[i] = (byte) ((x >>> 59) + 'a');
        }
        byte[] out = new byte[1 << 16];
        byte[] copy = new byte[in.length];
        long n = 0;
        while (System.nanoTime() < end) {
            n += narwhalDeflate(in, out);
            n += narwhalCopy(in, copy);
        }
        return n;
    }

    public interface Otter {
        long swim(long x);
    }

    // Churned is loaded anew by each round's class loader: a class of its own each time.
    public static class Churned implements Otter {
        public long swim(long x) {
            for (int i = 0; i < 64; i++) {
                x = x * 0x9E3779B97F4A7C15L + i;
            }
            return x;
        }
    }

    static long otterDrive(Otter o, long rounds) {
        long x = total;
        for (long i = 0; i < rounds; i++) {
            x += o.swim(x);
        }
        return x;
    }

    static long ottersLoop(long end) throws Exception {
        String name = Churned.class.getName();
        byte[] bytes;
        try (InputStream s = JvmWorkload.class.getResourceAsStream(name.substring(name.lastIndexOf('.') + 1) + ".class")) {
            ByteArrayOutputStream b = new ByteArrayOutputStream();
            s.transferTo(b);
            bytes = b.toByteArray();
        }
        long n = 0;
        for (int round = 0; System.nanoTime() < end; round++) {
            ClassLoader parent = JvmWorkload.class.getClassLoader();
            ClassLoader loader = new ClassLoader(parent) {
                protected Class<?> loadClass(String cn, boolean resolve) throws ClassNotFoundException {
                    if (cn.equals(name)) {
                        synchronized (getClassLoadingLock(cn)) {
                            Class<?> c = findLoadedClass(cn);
                            return c != null ? c : defineClass(cn, bytes, 0, bytes.length);
                        }
                    }
                    return super.loadClass(cn, resolve);
                }
            };
            Otter o = (Otter) loader.loadClass(name).getDeclaredConstructor().newInstance();
            n += otterDrive(o, 200_000);
            if (round % 16 == 15) {
                System.gc();
            }
        }
        return n;
    }

    public static void main(String[] args) throws Exception {
        String mode = args.length > 0 ? args[0] : "chain";
        long end = System.nanoTime() + (long) (Double.parseDouble(args.length > 1 ? args[1] : "10") * 1e9);
        System.out.println("ready");
        switch (mode) {
            case "chain":
                while (System.nanoTime() < end) {
                    walrusSettle(1_500_000);
                }
                break;
            case "native":
                total = narwhalLoop(end);
                break;
            case "churn":
                total = ottersLoop(end);
                break;
            default:
                throw new IllegalArgumentException("mode " + mode);
        }
    }
}
