// Kafka Streams itself on the input the Python tests give it: the reference for what a
// processor sees of its key-value store. Run as a single-file program (java 17):
//
//   java -cp '.jvm/streams/*' tests/reference/ProcessorStoreReference.java MODE STATE_DIR < input
//
// Input: one record per line, "key<TAB>value<TAB>timestamp". Output: the records of topic "out",
// one per line, "key<TAB>value". Topology: records whose value is "bot" are filtered out, then
// a processor with the key-value store "counts" (String -> Long):
//   count: forwards the key's running count (get, then put);
//   store: exercises putIfAbsent, delete, range, reverseRange, prefixScan and all, and forwards
//          what it saw as one line.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
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
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

public class ProcessorStoreReference {
    public static void main(String[] args) throws Exception {
        boolean count = args[0].equals("count");
        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore("counts"), Serdes.String(), Serdes.Long()));
        builder.stream("in", Consumed.with(Serdes.String(), Serdes.String()))
                .filter((key, value) -> !value.equals("bot"))
                .process(count ? Counter::new : StoreMethods::new, "counts")
                .to("out", Produced.with(Serdes.String(), Serdes.String()));
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "reference");
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[1]);
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            TestInputTopic<String, String> in = driver.createInputTopic(
                    "in", new StringSerializer(), new StringSerializer());
            TestOutputTopic<String, String> out = driver.createOutputTopic(
                    "out", new StringDeserializer(), new StringDeserializer());
            BufferedReader reader = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                in.pipeInput(fields[0], fields[1], Long.parseLong(fields[2]));
            }
            for (KeyValue<String, String> record : out.readKeyValuesToList()) {
                System.out.println(record.key + "\t" + record.value);
            }
        }
    }

    /** A processor with the store "counts". */
    abstract static class WithCounts implements Processor<String, String, String, String> {
        protected ProcessorContext<String, String> context;
        protected KeyValueStore<String, Long> store;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.store = context.getStateStore("counts");
        }
    }

    static class Counter extends WithCounts {
        @Override
        public void process(Record<String, String> record) {
            Long before = store.get(record.key());
            long count = (before == null ? 0 : before) + 1;
            store.put(record.key(), count);
            context.forward(record.withValue(Long.toString(count)));
        }
    }

    static class StoreMethods extends WithCounts {
        @Override
        public void process(Record<String, String> record) {
            String key = record.key();
            String seen;
            if (record.value().equals("delete")) {
                seen = "delete=" + store.delete(key);
            } else {
                seen = "put_if_absent=" + store.putIfAbsent(key, (long) record.value().length());
            }
            seen += ";range=" + keys(store.range("b", "d"))
                    + ";open_from=" + keys(store.range(null, "b"))
                    + ";reverse=" + keys(store.reverseRange("b", "d"))
                    + ";prefix=" + keys(store.prefixScan("a", new StringSerializer()))
                    + ";all=" + keys(store.all())
                    + ";get=" + store.get(key);
            context.forward(record.withValue(seen));
        }

        private static String keys(KeyValueIterator<String, Long> iterator) {
            List<String> entries = new ArrayList<>();
            try (iterator) {
                while (iterator.hasNext()) {
                    KeyValue<String, Long> entry = iterator.next();
                    entries.add(entry.key + ":" + entry.value);
                }
            }
            return String.join(",", entries);
        }
    }
}
