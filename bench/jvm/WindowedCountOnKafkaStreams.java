// Kafka Streams itself running bench/window_bench.py's topology on a real broker, for
// bench/kafka_streams_bench.py: views per key per 5-minute tumbling window (1-minute grace),
// final counts only (emitStrategy(onWindowClose())), into a Kafka topic, exactly_once_v2,
// num.stream.threads as given. Prints the seconds from the first RUNNING state (after the
// group's first rebalance: its start-up is not counted) until the application's committed
// offsets reach the input's end offsets, then the seconds start-up took.
//
//   javac -cp '.jvm/streams/*' -d OUT bench/jvm/WindowedCountOnKafkaStreams.java
//   java -cp 'OUT:.jvm/streams/*' WindowedCountOnKafkaStreams BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR THREADS
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;

public class WindowedCountOnKafkaStreams {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], input = args[1], output = args[2], app = args[3];
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .groupByKey()
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(5), Duration.ofMinutes(1)))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count()
                .toStream()
                .to(output, Produced.with(
                        WindowedSerdes.timeWindowedSerdeFrom(String.class, Duration.ofMinutes(5).toMillis()),
                        Serdes.Long()));
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[5]));
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);

        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            var partitions = admin.describeTopics(java.util.List.of(input)).allTopicNames().get()
                    .get(input).partitions().stream()
                    .map(p -> new TopicPartition(input, p.partition())).collect(Collectors.toList());
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            partitions.forEach(p -> latest.put(p, OffsetSpec.latest()));
            Map<TopicPartition, Long> ends = admin.listOffsets(latest).all().get().entrySet().stream()
                    .collect(Collectors.toMap(Map.Entry::getKey, e -> e.getValue().offset()));
            KafkaStreams streams = new KafkaStreams(builder.build(), props);
            long[] running = {0};
            streams.setStateListener((now, before) -> {
                if (now == KafkaStreams.State.RUNNING && running[0] == 0) {
                    running[0] = System.nanoTime();
                }
            });
            long created = System.nanoTime();
            streams.start();
            while (true) {
                Thread.sleep(100);
                Map<TopicPartition, OffsetAndMetadata> committed = admin
                        .listConsumerGroupOffsets(app).partitionsToOffsetAndMetadata().get();
                boolean done = ends.entrySet().stream().allMatch(e -> {
                    OffsetAndMetadata at = committed.get(e.getKey());
                    return at != null && at.offset() >= e.getValue();
                });
                if (done) {
                    break;
                }
            }
            long finished = System.nanoTime();
            long started = running[0] == 0 ? created : running[0];
            streams.close(Duration.ofSeconds(30));
            System.out.println((finished - started) / 1e9 + " " + (started - created) / 1e9);
        }
    }
}
