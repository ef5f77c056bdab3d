import java.time.Duration;
import java.util.Collections;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Checkpoint completion to broker acknowledgement with the Java consumer, driven the way a
 * consumer thread of Flink's legacy Kafka source does it: the checkpoint side stores the offsets
 * to commit in an atomic reference and calls {@code wakeup()}; the consumer thread, thrown out of
 * {@code poll} by the wakeup, takes the offsets and calls {@code commitAsync} before it polls
 * again. The only partition is empty and {@code fetch.max.wait.ms} is 5 s, so a fetch is parked
 * on the broker whenever a commit starts.
 *
 * <p>Arguments: BOOTSTRAP TOPIC GROUP COMMITS WARMUP. Prints one line
 * {@code RESULT parked_at_ack=-1 lat_us=a,b,...} (microseconds, warm-up commits left out), then
 * waits for stdin to close.
 */
public final class WakeupCommitLatency {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        String group = args[2];
        int commits = Integer.parseInt(args[3]);
        int warmup = Integer.parseInt(args[4]);

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "compare-java-wakeup");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "5000");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        TopicPartition tp = new TopicPartition(topic, 0);
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        consumer.assign(Collections.singletonList(tp));

        AtomicReference<Map<TopicPartition, OffsetAndMetadata>> next = new AtomicReference<>();
        BlockingQueue<Object> acks = new ArrayBlockingQueue<>(1);
        Thread consumerThread = new Thread(() -> {
            // Flink's default poll timeout (flink.poll-timeout) is 100 ms.
            Duration pollTimeout = Duration.ofMillis(100);
            boolean[] inProgress = {false};
            while (!Thread.currentThread().isInterrupted()) {
                if (!inProgress[0]) {
                    Map<TopicPartition, OffsetAndMetadata> offsets = next.getAndSet(null);
                    if (offsets != null) {
                        inProgress[0] = true;
                        consumer.commitAsync(offsets, (committed, error) -> {
                            inProgress[0] = false;
                            acks.offer(error == null ? Boolean.TRUE : error);
                        });
                    }
                }
                try {
                    consumer.poll(pollTimeout);
                } catch (WakeupException e) {
                    // A checkpoint completed: loop to commit.
                } catch (Exception e) {
                    acks.offer(e);
                    return;
                }
            }
        }, "kafka-consumer-thread");
        consumerThread.setDaemon(true);
        consumerThread.start();

        Map<TopicPartition, OffsetAndMetadata> offsets =
                Collections.singletonMap(tp, new OffsetAndMetadata(0L));
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < warmup + commits; i++) {
            Thread.sleep(20);
            long start = System.nanoTime();
            next.set(offsets);
            consumer.wakeup();
            Object ack = acks.poll(30, TimeUnit.SECONDS);
            long tookMicros = (System.nanoTime() - start) / 1000;
            if (ack == null) {
                System.err.println("no acknowledgement for commit " + i);
                System.exit(1);
            }
            if (ack != Boolean.TRUE) {
                System.err.println("commit " + i + " failed: " + ack);
                System.exit(1);
            }
            if (i >= warmup) {
                if (out.length() > 0) {
                    out.append(',');
                }
                out.append(tookMicros);
            }
        }
        System.out.println("RESULT parked_at_ack=-1 lat_us=" + out);
        System.out.flush();
        while (System.in.read() != -1) {
            // Wait for the driver to read /proc and close stdin.
        }
        consumerThread.interrupt();
        System.exit(0);
    }
}
