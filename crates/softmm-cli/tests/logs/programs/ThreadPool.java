// A JVM thread pool: 8 workers allocate and drop arrays of mixed sizes
// (young-generation churn, a few survivors), then the pool shuts down.
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class ThreadPool {
    public static void main(String[] args) throws Exception {
        int tasks = args.length > 0 ? Integer.parseInt(args[0]) : 64;
        ExecutorService pool = Executors.newFixedThreadPool(8);
        List<Future<Long>> results = new ArrayList<>();
        for (int t = 0; t < tasks; t++) {
            final int seed = t;
            results.add(pool.submit(() -> {
                List<byte[]> keep = new ArrayList<>();
                long sum = 0;
                for (int i = 0; i < 2000; i++) {
                    byte[] b = new byte[1024 + ((i * 7919 + seed) % 64) * 1024];
                    b[b.length - 1] = (byte) i;
                    sum += b[b.length - 1];
                    if (i % 50 == 0) keep.add(b);
                }
                return sum + keep.size();
            }));
        }
        long total = 0;
        for (Future<Long> f : results) total += f.get();
        pool.shutdown();
        System.out.println(total);
    }
}
