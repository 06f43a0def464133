import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.stream.Collectors;

// Work that makes HotSpot compile much of the JDK: lambdas and method handles, streams,
// string concatenation (invokedynamic), collections, exceptions. interp/jvm's tests name
// every pc of every nmethod it leaves in the code cache.
public class SondeMix {
    static volatile Object sink;

    public static void main(String[] args) {
        System.out.println("ready");
        Function<Integer, String> f = i -> "v" + i + ":" + (i * 7);
        for (long round = 0; ; round++) {
            List<Integer> xs = new ArrayList<>();
            for (int i = 0; i < 200; i++) {
                xs.add((int) ((round * 31 + i) % 97));
            }
            Map<Integer, List<String>> groups = xs.stream().map(f).collect(Collectors.groupingBy(String::length));
            Map<String, Integer> counts = new HashMap<>();
            for (List<String> g : groups.values()) {
                for (String s : g) {
                    counts.merge(s, 1, Integer::sum);
                }
            }
            try {
                if (counts.size() > 1000) {
                    throw new IllegalStateException("too many " + counts.size());
                }
                Integer.parseInt("x" + round);
            } catch (NumberFormatException e) {
                sink = e.getMessage();
            }
            sink = counts;
        }
    }
}
