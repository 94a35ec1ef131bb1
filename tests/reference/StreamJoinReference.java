// Kafka Streams itself on the input the Python tests give it: the reference for the DSL's
// stream-stream joins. Run as a single-file program (java 17):
//
//   java -cp '.jvm/streams/*' tests/reference/StreamJoinReference.java MODE STATE_DIR < input
//
// Input: one record per line, "topic<TAB>key<TAB>value<TAB>timestamp" with topic "left" or
// "right", "\N" for a null key or value. Output: the records of topic "out", one per line,
// "key<TAB>value<TAB>timestamp"; a joined value is "left|right", a missing side "null".
// The wall-clock throttle on emitting left/outer results is off
// (__emit.interval.ms.kstreams.outer.join.spurious.results.fix__ = 0), so closed windows are
// looked at on every record, as the Python side does.
//
// MODE: inner | left | outer | asymmetric (an outer join with before 2, after 6, grace 3);
// the others join within 5 ms with a grace of 4 ms.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.ValueJoiner;
import org.apache.kafka.streams.test.TestRecord;

public class StreamJoinReference {
    static final String NULL = "\\N";

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> left = builder.stream("left", Consumed.with(Serdes.String(), Serdes.String()));
        KStream<String, String> right = builder.stream("right", Consumed.with(Serdes.String(), Serdes.String()));
        JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(5), Duration.ofMillis(4));
        if (mode.equals("asymmetric")) {
            windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(2), Duration.ofMillis(3))
                    .after(Duration.ofMillis(6));
        }
        ValueJoiner<String, String, String> joiner = (l, r) -> l + "|" + r;
        StreamJoined<String, String, String> joined = StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String());
        KStream<String, String> out;
        switch (mode) {
            case "inner":
                out = left.join(right, joiner, windows, joined);
                break;
            case "left":
                out = left.leftJoin(right, joiner, windows, joined);
                break;
            case "outer":
            case "asymmetric":
                out = left.outerJoin(right, joiner, windows, joined);
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        out.to("out", Produced.with(Serdes.String(), Serdes.String()));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put("__emit.interval.ms.kstreams.outer.join.spurious.results.fix__", 0L);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            TestInputTopic<String, String> leftInput = driver.createInputTopic(
                    "left", new StringSerializer(), new StringSerializer());
            TestInputTopic<String, String> rightInput = driver.createInputTopic(
                    "right", new StringSerializer(), new StringSerializer());
            TestOutputTopic<String, String> output = driver.createOutputTopic(
                    "out", new StringDeserializer(), new StringDeserializer());
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                String key = fields[1].equals(NULL) ? null : fields[1];
                String value = fields[2].equals(NULL) ? null : fields[2];
                TestInputTopic<String, String> input = fields[0].equals("left") ? leftInput : rightInput;
                input.pipeInput(key, value, Long.parseLong(fields[3]));
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
