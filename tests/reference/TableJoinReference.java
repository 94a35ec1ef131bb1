// Kafka Streams itself on the input the Python tests give it: the reference for table-table
// joins of versioned tables (KIP-914) and of windowed tables. Run as a single-file program:
//
//   java -cp '.jvm/streams/*' tests/reference/TableJoinReference.java MODE STATE_DIR < input
//
// Input: one record per line, "topic<TAB>key<TAB>value<TAB>timestamp", topic "left" or
// "right", "\N" for a null value; values are integers. Output: the records of topic "out", one
// per line, "key<TAB>value<TAB>timestamp" (a windowed key printed "key@windowStart"). The
// record cache is off and the driver commits after every record.
//
// MODE: versioned_{inner,left,outer}_join (both tables in versioned stores of 20 ms history,
// so that late records are refused), versioned_filtered_left_join (the left one filtered, the
// right one mapped), versioned_join_of_joins (an inner join of both, outer-joined with a third
// versioned table, topic "third"), left_versioned_outer_join (the right one a plain table), windowed_{inner,left,
// outer}_join (each topic counted in tumbling windows of 10 ms, grace 5 ms, the counts joined),
// hopping_filtered_left_join (hopping windows of 10 ms by 5 ms, grace 3; the left counts
// filtered), sliding_outer_join (sliding windows of 10 ms, grace 5 ms).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.test.TestRecord;

public class TableJoinReference {
    static final String NULL = "\\N";

    static final ValueJoiner<Object, Object, String> JOINER =
            (left, right) -> (left == null ? "-" : left) + "+" + (right == null ? "-" : right);

    static KTable<String, String> versioned(StreamsBuilder builder, String topic) {
        Materialized<String, String, KeyValueStore<Bytes, byte[]>> store = Materialized
                .<String, String>as(Stores.persistentVersionedKeyValueStore(topic + "-store", Duration.ofMillis(20)))
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String());
        return builder.table(topic, Consumed.with(Serdes.String(), Serdes.String()), store);
    }

    static KStream<String, String> stream(StreamsBuilder builder, String topic) {
        return builder.stream(topic, Consumed.with(Serdes.String(), Serdes.String()));
    }

    static KStream<String, String> unwindowed(KTable<Windowed<String>, String> table) {
        return table.toStream().map((key, value) ->
                KeyValue.pair(key.key() + "@" + key.window().start(), value));
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> out;
        TimeWindows tumbling = TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(5));
        switch (mode) {
            case "versioned_inner_join":
                out = versioned(builder, "left").join(versioned(builder, "right"), JOINER).toStream();
                break;
            case "versioned_left_join":
                out = versioned(builder, "left").leftJoin(versioned(builder, "right"), JOINER).toStream();
                break;
            case "versioned_outer_join":
                out = versioned(builder, "left").outerJoin(versioned(builder, "right"), JOINER).toStream();
                break;
            case "versioned_filtered_left_join":
                out = versioned(builder, "left").filter((key, value) -> Integer.parseInt(value) % 4 != 0)
                        .leftJoin(versioned(builder, "right").mapValues(value -> "m" + value), JOINER)
                        .toStream();
                break;
            case "versioned_join_of_joins":
                out = versioned(builder, "left").join(versioned(builder, "right"), JOINER)
                        .outerJoin(versioned(builder, "third"), JOINER).toStream();
                break;
            case "left_versioned_outer_join":
                out = versioned(builder, "left").outerJoin(
                        builder.table("right", Consumed.with(Serdes.String(), Serdes.String())), JOINER)
                        .toStream();
                break;
            case "windowed_inner_join":
            case "windowed_left_join":
            case "windowed_outer_join": {
                KTable<Windowed<String>, Long> left = stream(builder, "left").groupByKey()
                        .windowedBy(tumbling).count();
                KTable<Windowed<String>, Long> right = stream(builder, "right").groupByKey()
                        .windowedBy(tumbling).count();
                KTable<Windowed<String>, String> joined = mode.equals("windowed_inner_join")
                        ? left.join(right, JOINER)
                        : mode.equals("windowed_left_join") ? left.leftJoin(right, JOINER) : left.outerJoin(right, JOINER);
                out = unwindowed(joined);
                break;
            }
            case "hopping_filtered_left_join": {
                TimeWindows hopping = TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), Duration.ofMillis(3))
                        .advanceBy(Duration.ofMillis(5));
                KTable<Windowed<String>, Long> left = stream(builder, "left").groupByKey()
                        .windowedBy(hopping).count().filter((key, count) -> count % 3 != 0);
                KTable<Windowed<String>, Long> right = stream(builder, "right").groupByKey()
                        .windowedBy(hopping).count();
                out = unwindowed(left.leftJoin(right, JOINER));
                break;
            }
            case "sliding_outer_join": {
                SlidingWindows sliding = SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(10), Duration.ofMillis(5));
                KTable<Windowed<String>, Long> left = stream(builder, "left").groupByKey()
                        .windowedBy(sliding).count();
                KTable<Windowed<String>, Long> right = stream(builder, "right").groupByKey()
                        .windowedBy(sliding).count();
                out = unwindowed(left.outerJoin(right, JOINER));
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
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            Map<String, TestInputTopic<String, String>> inputs = new HashMap<>();
            for (String topic : new String[] {"left", "right", "third"}) {
                inputs.put(topic, driver.createInputTopic(topic, new StringSerializer(), new StringSerializer()));
            }
            TestOutputTopic<String, String> output = driver.createOutputTopic(
                    "out", new StringDeserializer(), new StringDeserializer());
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                String key = fields[1].equals(NULL) ? null : fields[1];
                String value = fields[2].equals(NULL) ? null : fields[2];
                inputs.get(fields[0]).pipeInput(key, value, Long.parseLong(fields[3]));
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
