// Kafka Streams itself: the names, groups and tags of the metrics a task with a RocksDB store
// publishes, as the reference for streamplatform's metrics (streamplatform/metrics.py). Run as
//
//   java -cp '.jvm/streams/*' tests/reference/MetricsReference.java MODE STATE_DIR < input
//
// Input: one record per line, "key<TAB>value<TAB>timestamp". Topology: a count per key (a
// persistent key-value store, "counts") to topic "out". Output: one line per metric,
// "group<TAB>name<TAB>tag,tag,...", sorted, after the records went through; at the DEBUG
// recording level when MODE is "debug", else INFO.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.TreeSet;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public class MetricsReference {
    public static void main(String[] args) throws Exception {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream("in", Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey()
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts"))
                .toStream()
                .to("out", Produced.with(Serdes.String(), Serdes.Long()));
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        props.put(StreamsConfig.METRICS_RECORDING_LEVEL_CONFIG,
                args[0].equals("debug") ? "DEBUG" : "INFO");
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            TestInputTopic<String, String> in = driver.createInputTopic(
                    "in", new StringSerializer(), new StringSerializer());
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                in.pipeInput(fields[0], fields[1], Long.parseLong(fields[2]));
            }
            TreeSet<String> seen = new TreeSet<>();
            for (MetricName metric : driver.metrics().keySet()) {
                seen.add(metric.group() + "\t" + metric.name() + "\t"
                        + String.join(",", new TreeSet<>(metric.tags().keySet())));
            }
            seen.forEach(System.out::println);
        }
    }
}
