// Kafka Streams itself on the input the Python tests give it: the reference for table-table
// joins and for grouping and aggregating a table. Run as a single-file program (java 17):
//
//   java -cp '.jvm/streams/*' tests/reference/TableReference.java MODE STATE_DIR < input
//
// Input: one record per line, "topic<TAB>key<TAB>value<TAB>timestamp", topic "left" or
// "right" (two tables of string keys and values), "\N" for a null value (a tombstone); values
// are integers. Output: the records of topic "out", one per line, "key<TAB>value<TAB>timestamp".
// The record cache is off (statestore.cache.max.bytes=0) and the driver commits after every
// record, so every update is forwarded.
//
// MODE: inner_join | left_join | outer_join | filtered_left_join (the left table filtered, the
// right one mapped, then joined) | group_by_count | group_by_aggregate | group_by_reduce |
// filtered_group_by_count | joined_group_by_count (an outer join's result grouped and counted)
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
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
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedTable;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.test.TestRecord;

public class TableReference {
    static final String NULL = "\\N";

    // The joiner: both values, "-" for a missing one.
    static final ValueJoiner<String, String, String> JOINER =
            (left, right) -> (left == null ? "-" : left) + "+" + (right == null ? "-" : right);

    // The grouping: a value's group is "g" + (the value's first number mod 3); none (a null
    // key) for a number that is 6 mod 7. The grouped value is the number.
    static KeyValue<String, String> group(String key, String value) {
        long number = Long.parseLong(value.split("\\+")[0].replace("-", "0"));
        return KeyValue.pair(number % 7 == 6 ? null : "g" + (number % 3), String.valueOf(number));
    }

    static KGroupedTable<String, String> grouped(KTable<String, String> table) {
        return table.groupBy(TableReference::group, Grouped.with(Serdes.String(), Serdes.String()));
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        StreamsBuilder builder = new StreamsBuilder();
        Consumed<String, String> strings = Consumed.with(Serdes.String(), Serdes.String());
        KTable<String, String> left = builder.table("left", strings);
        boolean joins = mode.endsWith("join") || mode.equals("joined_group_by_count");
        KTable<String, String> right = joins ? builder.table("right", strings) : null;
        KTable<String, String> out;
        switch (mode) {
            case "inner_join":
                out = left.join(right, JOINER);
                break;
            case "left_join":
                out = left.leftJoin(right, JOINER);
                break;
            case "outer_join":
                out = left.outerJoin(right, JOINER);
                break;
            case "filtered_left_join":
                out = left.filter((key, value) -> Long.parseLong(value) % 4 != 0)
                        .leftJoin(right.mapValues(value -> "m" + value), JOINER);
                break;
            case "group_by_count":
                out = grouped(left).count().mapValues(String::valueOf);
                break;
            case "group_by_aggregate":
                out = grouped(left).aggregate(() -> "", (key, value, agg) -> agg + "+" + value,
                        (key, value, agg) -> agg + "-" + value,
                        Materialized.with(Serdes.String(), Serdes.String()));
                break;
            case "group_by_reduce":
                out = grouped(left).reduce(
                        (agg, value) -> String.valueOf(Long.parseLong(agg) + Long.parseLong(value)),
                        (agg, value) -> String.valueOf(Long.parseLong(agg) - Long.parseLong(value)));
                break;
            case "filtered_group_by_count":
                out = grouped(left.filter((key, value) -> Long.parseLong(value) % 4 != 0))
                        .count().mapValues(String::valueOf);
                break;
            case "joined_group_by_count":
                out = grouped(left.outerJoin(right, JOINER)).count().mapValues(String::valueOf);
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        out.toStream().to("out", Produced.with(Serdes.String(), Serdes.String()));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            Map<String, TestInputTopic<String, String>> inputs = new HashMap<>();
            inputs.put("left", driver.createInputTopic("left", new StringSerializer(), new StringSerializer()));
            if (joins) {
                inputs.put("right", driver.createInputTopic("right", new StringSerializer(), new StringSerializer()));
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
