// Kafka Streams itself on the input the Python tests give it: the reference for sliding windows
// and session windows. Run as a single-file program (java 17):
//
//   java -cp '.jvm/streams/*' tests/reference/WindowReference.java MODE STATE_DIR
//
// Input: one record per line, "key<TAB>value<TAB>timestamp", "\N" for a null key or value;
// values are integers. Output: the records of topic "out", one per line,
// "key<TAB>value<TAB>timestamp", a windowed key as "key@start/end"; after those each input
// record made, a line "--". The driver commits after
// every record; the record cache is off (statestore.cache.max.bytes=0), so every update is
// forwarded; the emit-final throttle is off.
//
// MODE: sliding_count | sliding_reduce | sliding_aggregate | sliding_suppress | sliding_final
//     | session_count | session_reduce | session_aggregate | session_suppress | session_final
// Sliding windows: time difference 10, grace 5. Sessions: inactivity gap 5, grace 3.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindowedKStream;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.test.TestRecord;

public class WindowReference {
    static final String NULL = "\\N";

    static String text(Object value) {
        return value == null ? null : String.valueOf(value);
    }

    static String windowed(Windowed<String> key) {
        return key.key() + "@" + key.window().start() + "/" + key.window().end();
    }

    // Null values are added as 0 (sessions aggregate them; sliding windows drop them).
    static String sum(String total, String value) {
        return value == null ? total : String.valueOf(Long.parseLong(total) + Long.parseLong(value));
    }

    static String appended(String aggregate, String value) {
        return aggregate + "," + value;
    }

    // The counts as text, their final results only when suppressed.
    static KTable<Windowed<String>, String> counts(KTable<Windowed<String>, Long> counts, String kind) {
        if (kind.equals("suppress")) {
            counts = counts.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()));
        }
        return counts.mapValues(WindowReference::text);
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String kind = mode.substring(mode.indexOf('_') + 1);
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> in = builder.stream("in", Consumed.with(Serdes.String(), Serdes.String()));
        KGroupedStream<String, String> byKey = in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
        KTable<Windowed<String>, String> table;
        if (mode.startsWith("sliding_")) {
            TimeWindowedKStream<String, String> windowed = byKey.windowedBy(
                    SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(10), Duration.ofMillis(5)));
            if (kind.equals("final")) {
                windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
            }
            switch (kind) {
                case "reduce":
                    table = windowed.reduce(WindowReference::sum);
                    break;
                case "aggregate":
                    table = windowed.aggregate(() -> "", (key, value, agg) -> appended(agg, value),
                            Materialized.with(Serdes.String(), Serdes.String()));
                    break;
                default:
                    table = counts(windowed.count(), kind);
            }
        } else if (mode.startsWith("session_")) {
            SessionWindowedKStream<String, String> windowed = byKey.windowedBy(
                    SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(5), Duration.ofMillis(3)));
            if (kind.equals("final")) {
                windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
            }
            switch (kind) {
                case "reduce":
                    table = windowed.reduce(WindowReference::sum);
                    break;
                case "aggregate":
                    table = windowed.aggregate(() -> "", (key, value, agg) -> appended(agg, value),
                            (key, one, two) -> one + "|" + two,
                            Materialized.with(Serdes.String(), Serdes.String()));
                    break;
                default:
                    table = counts(windowed.count(), kind);
            }
        } else {
            throw new IllegalArgumentException("unknown mode " + mode);
        }
        table.toStream()
                .map((key, value) -> KeyValue.pair(windowed(key), value))
                .to("out", Produced.with(Serdes.String(), Serdes.String()));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put("__emit.interval.ms.kstreams.windowed.aggregation__", 0);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            TestInputTopic<String, String> input = driver.createInputTopic(
                    "in", new StringSerializer(), new StringSerializer());
            TestOutputTopic<String, String> output = driver.createOutputTopic(
                    "out", new StringDeserializer(), new StringDeserializer());
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            StringBuilder printed = new StringBuilder();
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                String key = fields[0].equals(NULL) ? null : fields[0];
                String value = fields[1].equals(NULL) ? null : fields[1];
                input.pipeInput(key, value, Long.parseLong(fields[2]));
                for (TestRecord<String, String> record : output.readRecordsToList()) {
                    printed.append(record.key() == null ? NULL : record.key()).append('\t')
                            .append(record.value() == null ? NULL : record.value()).append('\t')
                            .append(record.timestamp()).append('\n');
                }
                printed.append("--\n");  // the end of what this input record made
            }
            System.out.print(printed);
        }
    }
}
