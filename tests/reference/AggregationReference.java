// Kafka Streams itself on the input the Python tests give it: the reference for the DSL's
// grouping, aggregations and windows. Run as a single-file program (java 17):
//
//   java -cp '.jvm/streams/*' tests/reference/AggregationReference.java MODE STATE_DIR < input
//
// Input: one record per line, "key<TAB>value<TAB>timestamp", "\N" for a null key or value;
// values are integers. Output: the records of topic "out", one per line,
// "key<TAB>value<TAB>timestamp", a windowed key as "key@start/end". The record cache is off
// (statestore.cache.max.bytes=0) and the driver commits after every record, so every update
// is forwarded; the emit-final throttle is off so that on_window_close is checked per record.
//
// MODE: count | reduce | aggregate | group_by | tumbling | hopping | tumbling_final | suppress
// (tumbling_final forwards nothing in Kafka Streams 4.4.0's driver: the Python test compares
// our on_window_close with suppress instead.)
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
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.test.TestRecord;

public class AggregationReference {
    static final String NULL = "\\N";

    static String text(Object value) {
        return value == null ? null : String.valueOf(value);
    }

    static String windowed(Windowed<String> key) {
        return key.key() + "@" + key.window().start() + "/" + key.window().end();
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> in = builder.stream("in", Consumed.with(Serdes.String(), Serdes.String()));
        KGroupedStream<String, String> byKey = in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
        TimeWindows tumbling = TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5));
        KStream<String, String> out;
        switch (mode) {
            case "count":
                out = byKey.count().toStream().mapValues(AggregationReference::text);
                break;
            case "reduce":
                out = byKey.reduce((a, b) -> String.valueOf(Long.parseLong(a) + Long.parseLong(b)))
                        .toStream();
                break;
            case "aggregate":
                out = byKey.aggregate(() -> "", (key, value, agg) -> agg + "," + value,
                                Materialized.with(Serdes.String(), Serdes.String()))
                        .toStream();
                break;
            case "group_by":
                out = in.groupBy((key, value) -> value == null ? null : "m" + (Long.parseLong(value) % 3),
                                Grouped.with(Serdes.String(), Serdes.String()))
                        .count().toStream().mapValues(AggregationReference::text);
                break;
            case "tumbling":
            case "hopping":
            case "tumbling_final":
            case "suppress": {
                TimeWindows windows = mode.equals("hopping") ? tumbling.advanceBy(Duration.ofMillis(3)) : tumbling;
                var windowedStream = byKey.windowedBy(windows);
                if (mode.equals("tumbling_final")) {
                    windowedStream = windowedStream.emitStrategy(EmitStrategy.onWindowClose());
                }
                KTable<Windowed<String>, Long> counts = windowedStream.count();
                if (mode.equals("suppress")) {
                    counts = counts.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()));
                }
                out = counts.toStream()
                        .map((key, value) -> KeyValue.pair(windowed(key), text(value)));
                break;
            }
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        out.to("out", Produced.with(Serdes.String(), Serdes.String()));

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
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                String key = fields[0].equals(NULL) ? null : fields[0];
                String value = fields[1].equals(NULL) ? null : fields[1];
                input.pipeInput(key, value, Long.parseLong(fields[2]));
            }
            StringBuilder printed = new StringBuilder();
            for (TestRecord<String, String> record : output.readRecordsToList()) {
                printed.append(record.key() == null ? NULL : record.key()).append('\t')
                        .append(record.value() == null ? NULL : record.value()).append('\t')
                        .append(record.timestamp()).append('\n');
            }
            System.out.print(printed);
        }
    }
}
