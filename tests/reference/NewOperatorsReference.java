// Kafka Streams itself on the input the Python tests give it: the reference for the DSL's newer
// operators (flatMap, flatMapValues, cogroup, suppress(untilTimeLimit), stream-table joins on
// a versioned table with and without a grace period, table filters feeding groupBy,
// mapValues with the key, processValues). Run as a single-file program (java 17):
//
//   java -cp '.jvm/streams/*' tests/reference/NewOperatorsReference.java MODE STATE_DIR < input
//
// Input: one record per line, "topic<TAB>key<TAB>value<TAB>timestamp", topic "left" or
// "right", "\N" for a null key or value; values are integers. Output: after each input record,
// the records it made on topics "out" then "out2", one per line,
// "topic<TAB>key<TAB>value<TAB>timestamp" (a windowed key as "key@start/end"), then a line
// "--". The record cache is off (statestore.cache.max.bytes=0) and the driver commits after
// every record, so every update is forwarded.
//
// MODE (streams read "left", tables "right"):
//   flat_map_count            left.flatMap(words).groupByKey().count()
//   flat_map_values_count     left.flatMapValues(withKey).groupBy(value).count()
//   cogroup                   left and right grouped by key, cogrouped, aggregate()
//   cogroup_rekeyed           left grouped by its value's parity, right by key, cogrouped
//   cogroup_windowed          cogroup, windowedBy(TimeWindows size 10, grace 5), aggregate()
//   suppress_count            left.groupByKey().count().suppress(untilTimeLimit(5, unbounded))
//   suppress_table_count      table(left).groupBy(group).count().suppress(untilTimeLimit(5, ..))
//   versioned_join            left stream join right table (versioned, history 20), grace 5
//   versioned_left_join       the same, leftJoin
//   versioned_join_no_grace   the join, no grace period
//   versioned_left_join_no_grace  the left join, no grace period
//   table_join, table_left_join   left stream join/leftJoin right table (not versioned)
//   filter_to_stream          table(left).filter(kept): its updates (no old values asked)
//   filter_and_group_by       table(left).filterNot(div3): its updates on "out", and its
//                             groupBy(group).count() on "out2" (old values asked)
//   mapped_filter_group_by    table(left).mapValues(+1).filter(kept).groupBy(group).count()
//   map_values_with_key       left.mapValues((k, v) -> k + "=" + v).groupByKey().reduce(concat)
//   process_values            left.processValues(a fixed-key processor) on "out", and its
//                             groupByKey().count() on "out2"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.CogroupedKStream;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.test.TestRecord;

public class NewOperatorsReference {
    static final String NULL = "\\N";
    static final Duration LIMIT = Duration.ofMillis(5);
    static final Serde<String> STRING = Serdes.String();
    static final Produced<String, String> STRINGS = Produced.with(Serdes.String(), Serdes.String());
    static final Suppressed<Object> UNTIL =
            Suppressed.untilTimeLimit(LIMIT, Suppressed.BufferConfig.unbounded());

    static final ValueJoiner<String, String, String> JOINER = (l, r) -> l + "|" + r;

    // flatMap: n % 4 records for a value n, keyed "w" + (n + i) % 5 (no key for 4), valued
    // "key/i"; none for a null value.
    static List<KeyValue<String, String>> words(String key, String value) {
        List<KeyValue<String, String>> out = new ArrayList<>();
        if (value == null) {
            return out;
        }
        long n = Long.parseLong(value);
        for (int i = 0; i < n % 4; i++) {
            long word = (n + i) % 5;
            out.add(KeyValue.pair(word == 4 ? null : "w" + word, key + "/" + i));
        }
        return out;
    }

    // flatMapValues with the key: n % 3 values "key:" + (n + j) % 3; none for a null value.
    static List<String> keyed(String key, String value) {
        List<String> out = new ArrayList<>();
        if (value == null) {
            return out;
        }
        long n = Long.parseLong(value);
        for (int j = 0; j < n % 3; j++) {
            out.add(key + ":" + ((n + j) % 3));
        }
        return out;
    }

    // A table value's group, as TableReference's: "g" + n % 3, none for 6 mod 7.
    static KeyValue<String, String> group(String key, String value) {
        long number = Long.parseLong(value);
        return KeyValue.pair(number % 7 == 6 ? null : "g" + (number % 3), value);
    }

    static String windowed(Windowed<String> key) {
        return key.key() + "@" + key.window().start() + "/" + key.window().end();
    }

    static class Tagger implements FixedKeyProcessor<String, String, String> {
        FixedKeyProcessorContext<String, String> context;

        @Override
        public void init(FixedKeyProcessorContext<String, String> context) {
            this.context = context;
        }

        // Each record valued "key=value"; an even value forwarded again as "even".
        @Override
        public void process(FixedKeyRecord<String, String> record) {
            context.forward(record.withValue(record.key() + "=" + record.value()));
            if (record.value() != null && Long.parseLong(record.value()) % 2 == 0) {
                context.forward(record.withValue("even"));
            }
        }
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        StreamsBuilder builder = new StreamsBuilder();
        Consumed<String, String> strings = Consumed.with(Serdes.String(), Serdes.String());
        Grouped<String, String> grouped = Grouped.with(Serdes.String(), Serdes.String());
        boolean both = mode.startsWith("cogroup") || mode.startsWith("versioned")
                || mode.startsWith("table_");
        switch (mode) {
            case "flat_map_count":
                builder.stream("left", strings).flatMap(NewOperatorsReference::words)
                        .groupByKey(grouped).count().mapValues(String::valueOf)
                        .toStream().to("out", STRINGS);
                break;
            case "flat_map_values_count":
                builder.stream("left", strings).flatMapValues(NewOperatorsReference::keyed)
                        .groupBy((key, value) -> value, grouped).count().mapValues(String::valueOf)
                        .toStream().to("out", STRINGS);
                break;
            case "cogroup":
            case "cogroup_rekeyed":
            case "cogroup_windowed": {
                KStream<String, String> left = builder.stream("left", strings);
                KGroupedStream<String, String> one = mode.equals("cogroup_rekeyed")
                        ? left.groupBy((key, value) -> value == null ? null
                                : "p" + Long.parseLong(value) % 2, grouped)
                        : left.groupByKey(grouped);
                KGroupedStream<String, String> two =
                        builder.stream("right", strings).groupByKey(grouped);
                CogroupedKStream<String, String> cogrouped =
                        one.cogroup((String key, String value, String agg) -> agg + "+" + value)
                                .cogroup(two, (key, value, agg) -> agg + "-" + value);
                if (mode.equals("cogroup_windowed")) {
                    cogrouped.windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(10), LIMIT))
                            .aggregate(() -> "", Materialized.with(STRING, STRING))
                            .toStream().map((key, value) -> KeyValue.pair(windowed(key), value))
                            .to("out", STRINGS);
                } else {
                    cogrouped.aggregate(() -> "", Materialized.with(STRING, STRING))
                            .toStream().to("out", STRINGS);
                }
                break;
            }
            case "suppress_count":
                builder.stream("left", strings).groupByKey(grouped).count().suppress(UNTIL)
                        .mapValues(String::valueOf).toStream().to("out", STRINGS);
                break;
            case "suppress_table_count":
                builder.table("left", strings).groupBy(NewOperatorsReference::group, grouped)
                        .count().suppress(UNTIL)
                        .mapValues(String::valueOf).toStream().to("out", STRINGS);
                break;
            case "versioned_join":
            case "versioned_left_join":
            case "versioned_join_no_grace":
            case "versioned_left_join_no_grace":
            case "table_join":
            case "table_left_join": {
                KTable<String, String> table = mode.startsWith("table_")
                        ? builder.table("right", strings)
                        : builder.table("right", strings, Materialized.<String, String>as(
                                Stores.persistentVersionedKeyValueStore(
                                        "right-store", Duration.ofMillis(20)))
                                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()));
                Joined<String, String, String> joined =
                        Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
                if (mode.startsWith("versioned") && !mode.endsWith("no_grace")) {
                    joined = joined.withGracePeriod(LIMIT);
                }
                KStream<String, String> left = builder.stream("left", strings);
                KStream<String, String> out = mode.contains("left_join")
                        ? left.leftJoin(table, JOINER, joined) : left.join(table, JOINER, joined);
                out.to("out", STRINGS);
                break;
            }
            case "filter_to_stream":
                builder.table("left", strings)
                        .filter((key, value) -> Long.parseLong(value) % 4 != 0)
                        .toStream().to("out", STRINGS);
                break;
            case "filter_and_group_by": {
                KTable<String, String> kept = builder.table("left", strings)
                        .filterNot((key, value) -> Long.parseLong(value) % 3 == 0);
                kept.toStream().to("out", STRINGS);
                kept.groupBy(NewOperatorsReference::group, grouped).count()
                        .mapValues(String::valueOf).toStream().to("out2", STRINGS);
                break;
            }
            case "mapped_filter_group_by":
                builder.table("left", strings)
                        .mapValues(value -> String.valueOf(Long.parseLong(value) + 1))
                        .filter((key, value) -> Long.parseLong(value) % 4 != 0)
                        .groupBy(NewOperatorsReference::group, grouped).count()
                        .mapValues(String::valueOf).toStream().to("out", STRINGS);
                break;
            case "map_values_with_key":
                builder.stream("left", strings).mapValues((key, value) -> key + "=" + value)
                        .groupByKey(grouped).reduce((agg, value) -> agg + "," + value)
                        .toStream().to("out", STRINGS);
                break;
            case "process_values": {
                KStream<String, String> tagged =
                        builder.stream("left", strings).processValues(Tagger::new);
                tagged.to("out", STRINGS);
                tagged.groupByKey(grouped).count().mapValues(String::valueOf)
                        .toStream().to("out2", STRINGS);
                break;
            }
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            Map<String, TestInputTopic<String, String>> inputs = new HashMap<>();
            StringSerializer serializer = new StringSerializer();
            inputs.put("left", driver.createInputTopic("left", serializer, serializer));
            if (both) {
                inputs.put("right", driver.createInputTopic("right", serializer, serializer));
            }
            List<TestOutputTopic<String, String>> outputs = new ArrayList<>();
            List<String> names = List.of("out", "out2");
            for (String name : names) {
                StringDeserializer deserializer = new StringDeserializer();
                outputs.add(driver.createOutputTopic(name, deserializer, deserializer));
            }
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            StringBuilder printed = new StringBuilder();
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                String key = fields[1].equals(NULL) ? null : fields[1];
                String value = fields[2].equals(NULL) ? null : fields[2];
                inputs.get(fields[0]).pipeInput(key, value, Long.parseLong(fields[3]));
                for (int i = 0; i < names.size(); i++) {
                    for (TestRecord<String, String> record : outputs.get(i).readRecordsToList()) {
                        printed.append(names.get(i)).append('\t')
                                .append(record.key() == null ? NULL : record.key()).append('\t')
                                .append(record.value() == null ? NULL : record.value()).append('\t')
                                .append(record.timestamp()).append('\n');
                    }
                }
                printed.append("--\n");  // the end of what this input record made
            }
            System.out.print(printed);
        }
    }
}
