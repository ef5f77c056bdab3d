// A group member on the Java client, for the interoperability tests (protocol-tests/src/interop.rs
// runs it next to members on kafka-source).
//
// Usage: GroupConsumer <bootstrap> <group> <topic> <member-name> <classic:STRATEGY|consumer>
//                      [session-timeout-ms]
//
// STRATEGY is range, roundrobin, sticky or cooperative-sticky. With "consumer" the member uses
// the KIP-848 protocol (group.protocol=consumer) and sets no assignor, session or heartbeat
// settings: those belong to the broker then.
//
// It subscribes to the topic with a rebalance listener and prints one line per event to stdout,
// with wall-clock milliseconds (System.currentTimeMillis()):
//
//   STARTED <ms>
//   ASSIGNED <ms> <tp,tp,...|->      (a tp is topic:partition; "-" for none)
//   REVOKED <ms> <tp,...|->          (printed after the revoked partitions' commit)
//   LOST <ms> <tp,...|->
//   RECORDS <tp> <offset> <offset> ...   (what one poll handed out for one partition)
//   CLOSED <ms>
//
// Offsets are committed (commitSync) in onPartitionsRevoked and after every poll that returned
// records. It closes the consumer (leaving the group) when stdin has a STOP line or is closed.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class GroupConsumer {
    private GroupConsumer() {}

    private static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static String tps(Collection<TopicPartition> parts) {
        if (parts.isEmpty()) {
            return "-";
        }
        StringBuilder b = new StringBuilder();
        for (TopicPartition tp : parts) {
            if (b.length() > 0) {
                b.append(',');
            }
            b.append(tp.topic()).append(':').append(tp.partition());
        }
        return b.toString();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5 || args.length > 6) {
            System.err.println("usage: GroupConsumer <bootstrap> <group> <topic> <member-name> "
                    + "<classic:STRATEGY|consumer> [session-timeout-ms]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String group = args[1];
        String topic = args[2];
        String name = args[3];
        String mode = args[4];

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "200");
        if (mode.equals("consumer")) {
            props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        } else if (mode.startsWith("classic:")) {
            String strategy = mode.substring("classic:".length());
            String cls;
            switch (strategy) {
                case "range":
                    cls = "org.apache.kafka.clients.consumer.RangeAssignor";
                    break;
                case "roundrobin":
                    cls = "org.apache.kafka.clients.consumer.RoundRobinAssignor";
                    break;
                case "sticky":
                    cls = "org.apache.kafka.clients.consumer.StickyAssignor";
                    break;
                case "cooperative-sticky":
                    cls = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor";
                    break;
                default:
                    throw new IllegalArgumentException("unknown strategy " + strategy);
            }
            props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
            props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, cls);
            String session = args.length == 6 ? args[5] : "10000";
            props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, session);
            props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        } else {
            throw new IllegalArgumentException("unknown mode " + mode);
        }

        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    if (line.trim().equals("STOP")) {
                        break;
                    }
                }
            } catch (Exception e) {
                // A broken stdin means the test is gone: stop as well.
            }
            stop.set(true);
            consumer.wakeup();
        }, "stdin");
        stdin.setDaemon(true);

        ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                if (!partitions.isEmpty()) {
                    try {
                        consumer.commitSync();
                    } catch (Exception e) {
                        System.err.println(name + ": commit on revocation failed: " + e);
                    }
                }
                emit("REVOKED " + System.currentTimeMillis() + " " + tps(partitions));
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                emit("ASSIGNED " + System.currentTimeMillis() + " " + tps(partitions));
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> partitions) {
                emit("LOST " + System.currentTimeMillis() + " " + tps(partitions));
            }
        };
        consumer.subscribe(List.of(topic), listener);
        emit("STARTED " + System.currentTimeMillis());
        stdin.start();
        try {
            while (!stop.get()) {
                ConsumerRecords<byte[], byte[]> records;
                try {
                    records = consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                if (records.isEmpty()) {
                    continue;
                }
                Map<TopicPartition, List<Long>> offsets = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    offsets.computeIfAbsent(new TopicPartition(r.topic(), r.partition()),
                            k -> new ArrayList<>()).add(r.offset());
                }
                for (Map.Entry<TopicPartition, List<Long>> e : offsets.entrySet()) {
                    StringBuilder b = new StringBuilder("RECORDS ");
                    b.append(e.getKey().topic()).append(':').append(e.getKey().partition());
                    for (long o : e.getValue()) {
                        b.append(' ').append(o);
                    }
                    emit(b.toString());
                }
                try {
                    consumer.commitSync();
                } catch (WakeupException e) {
                    break;
                } catch (Exception e) {
                    // A rebalance in progress: the revocation commits.
                    System.err.println(name + ": commit failed: " + e);
                }
            }
        } finally {
            // A wakeup from the stdin thread may still be pending: it fires in the first try.
            for (int attempt = 0; attempt < 2; attempt++) {
                try {
                    consumer.commitSync();
                    break;
                } catch (WakeupException e) {
                    continue;
                } catch (Exception e) {
                    System.err.println(name + ": final commit failed: " + e);
                    break;
                }
            }
            consumer.close();
            emit("CLOSED " + System.currentTimeMillis());
        }
    }
}
