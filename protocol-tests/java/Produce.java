// Deterministic producer for the live-broker tests (protocol-tests/src/tools.rs runs it).
//
// Usage: Produce <bootstrap> <topic> <partitions> <count> <value-size> <none|gzip|snappy|lz4|zstd>
//                [--transactional-id ID --txn-size N [--abort-every K]]
//                [--timestamp-base MS [--timestamp-step MS]]
//
// Record i (0-based) goes to partition i % partitions, with key = decimal i (UTF-8) and a value of
// value-size bytes where byte j = (i * 31 + j * 7) & 0xff. With a transactional id, records are sent
// in transactions of N records; every K-th transaction (the K-th, 2K-th, ...) is flushed and then
// aborted. With a timestamp base, record i has timestamp base + i * step.
//
// Output: "aborted=<m>" and then, as the last line, "produced=<n> checksum=<c>", where n counts the
// committed records and c is the wrapping 64-bit sum, over committed records, of the CRC32 (IEEE)
// of key bytes followed by value bytes.

import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import java.util.zip.CRC32;
import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class Produce {
    private Produce() {}

    private static void usage(String why) {
        System.err.println("Produce: " + why);
        System.err.println("usage: Produce <bootstrap> <topic> <partitions> <count> <value-size> "
                + "<none|gzip|snappy|lz4|zstd> [--transactional-id ID --txn-size N [--abort-every K]] "
                + "[--timestamp-base MS [--timestamp-step MS]]");
        System.exit(2);
    }

    static byte[] key(long i) {
        return Long.toString(i).getBytes(StandardCharsets.UTF_8);
    }

    static byte[] value(long i, int size) {
        byte[] v = new byte[size];
        for (int j = 0; j < size; j++) {
            v[j] = (byte) ((i * 31 + (long) j * 7) & 0xff);
        }
        return v;
    }

    static long checksum(byte[] key, byte[] value) {
        CRC32 crc = new CRC32();
        crc.update(key);
        crc.update(value);
        return crc.getValue();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 6) {
            usage("expected at least 6 arguments, got " + args.length);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        long count = Long.parseLong(args[3]);
        int valueSize = Integer.parseInt(args[4]);
        String compression = args[5];
        String transactionalId = null;
        long txnSize = 0;
        long abortEvery = 0;
        Long timestampBase = null;
        long timestampStep = 0;
        for (int k = 6; k < args.length; k++) {
            if (k + 1 >= args.length) {
                usage("missing value for " + args[k]);
            }
            switch (args[k]) {
                case "--transactional-id": transactionalId = args[++k]; break;
                case "--txn-size": txnSize = Long.parseLong(args[++k]); break;
                case "--abort-every": abortEvery = Long.parseLong(args[++k]); break;
                case "--timestamp-base": timestampBase = Long.parseLong(args[++k]); break;
                case "--timestamp-step": timestampStep = Long.parseLong(args[++k]); break;
                default: usage("unknown option " + args[k]);
            }
        }
        if (partitions < 1 || count < 0 || valueSize < 0) {
            usage("partitions must be >= 1, count and value-size >= 0");
        }
        if (transactionalId != null && txnSize < 1) {
            usage("--transactional-id needs --txn-size >= 1");
        }

        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "protocol-tests-produce");
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.put("batch.size", "262144");
        p.put("compression.type", compression);
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        if (transactionalId != null) {
            p.put("transactional.id", transactionalId);
        }

        AtomicReference<Exception> failure = new AtomicReference<>();
        Callback callback = (metadata, e) -> {
            if (e != null) {
                failure.compareAndSet(null, e);
            }
        };
        long committed = 0;
        long aborted = 0;
        long sum = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            if (transactionalId != null) {
                producer.initTransactions();
            }
            long i = 0;
            long txn = 0;
            while (i < count) {
                long end = transactionalId != null ? Math.min(count, i + txnSize) : count;
                txn++;
                boolean abort = transactionalId != null && abortEvery > 0 && txn % abortEvery == 0;
                if (transactionalId != null) {
                    producer.beginTransaction();
                }
                for (; i < end; i++) {
                    byte[] k = key(i);
                    byte[] v = value(i, valueSize);
                    Long ts = timestampBase == null ? null : timestampBase + i * timestampStep;
                    producer.send(new ProducerRecord<>(topic, (int) (i % partitions), ts, k, v), callback);
                    if (abort) {
                        aborted++;
                    } else {
                        committed++;
                        sum += checksum(k, v);
                    }
                }
                if (transactionalId == null) {
                    producer.flush();
                } else if (abort) {
                    // Flush first so the aborted records really are in the log.
                    producer.flush();
                    producer.abortTransaction();
                } else {
                    producer.commitTransaction();
                }
                if (failure.get() != null) {
                    throw failure.get();
                }
            }
            producer.flush();
            if (failure.get() != null) {
                throw failure.get();
            }
        }
        System.out.println("aborted=" + aborted);
        System.out.println("produced=" + committed + " checksum=" + Long.toUnsignedString(sum));
    }
}
