// Kafka Streams itself on live traffic: the reference for event time across partitions, batch
// cuts and repartitions on Spark (test_event_time_vs_kafka_streams.py). Its TopologyTestDriver
// takes the records in the order they arrived, each through the whole topology (repartitions
// included) before the next: what a task merging its inputs by timestamp must give. Run as:
//
//   java -cp '.jvm/streams/*' tests/reference/EventTimeReference.java MODE STATE_DIR
//
// Input: one record per line, "topic<TAB>key<TAB>value<TAB>timestamp", in arrival order.
// Output: the records of topic "out", one per line, "key<TAB>value<TAB>timestamp".
//
// MODE:
//   pages  topic "clicks", value a page: re-keyed by page, counted per 1-minute tumbling
//          window with 1 minute of grace, final results only; out: "page@start", the count.
//   join   topics "clicks" and "impressions", value an id: each click with the impressions of
//          its key within the 10 minutes before it (no grace); out: key, "click|impression".
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
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.test.TestRecord;

public class EventTimeReference {
    public static void main(String[] args) throws Exception {
        String mode = args[0];
        StreamsBuilder builder = new StreamsBuilder();
        Consumed<String, String> strings = Consumed.with(Serdes.String(), Serdes.String());
        KStream<String, String> clicks = builder.stream("clicks", strings);
        if (mode.equals("pages")) {
            clicks.groupBy((user, page) -> page, Grouped.with(Serdes.String(), Serdes.String()))
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofMinutes(1)))
                    .emitStrategy(EmitStrategy.onWindowClose())
                    .count()
                    .toStream()
                    .map((window, count) -> KeyValue.pair(
                            window.key() + "@" + window.window().start(), String.valueOf(count)))
                    .to("out", Produced.with(Serdes.String(), Serdes.String()));
        } else if (mode.equals("join")) {
            KStream<String, String> impressions = builder.stream("impressions", strings);
            clicks.join(impressions, (click, impression) -> click + "|" + impression,
                            JoinWindows.ofTimeDifferenceWithNoGrace(Duration.ofMinutes(10)).after(Duration.ZERO),
                            StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String()))
                    .to("out", Produced.with(Serdes.String(), Serdes.String()));
        } else {
            throw new IllegalArgumentException("unknown mode " + mode);
        }

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put("__emit.interval.ms.kstreams.windowed.aggregation__", 0);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            Map<String, TestInputTopic<String, String>> inputs = new HashMap<>();
            TestOutputTopic<String, String> output = driver.createOutputTopic(
                    "out", new StringDeserializer(), new StringDeserializer());
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                TestInputTopic<String, String> input = inputs.computeIfAbsent(fields[0],
                        topic -> driver.createInputTopic(topic, new StringSerializer(), new StringSerializer()));
                input.pipeInput(fields[1], fields[2], Long.parseLong(fields[3]));
            }
            StringBuilder printed = new StringBuilder();
            for (TestRecord<String, String> record : output.readRecordsToList()) {
                printed.append(record.key()).append('\t').append(record.value()).append('\t')
                        .append(record.timestamp()).append('\n');
            }
            System.out.print(printed);
        }
    }
}
