// Dumps the broker, topic and Java client configuration definitions of the Apache Kafka jars
// on the classpath as JSON (stdout). Run by generate_catalog.py; see that file.
import java.util.*;
import org.apache.kafka.common.config.ConfigDef;

public class DumpKafkaConfigs {
    static String q(Object o) {
        if (o == null) return "null";
        String s = o.toString();
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static String keys(Map<String, ConfigDef.ConfigKey> m, Map<String, String> extra) {
        StringBuilder b = new StringBuilder("[");
        List<String> names = new ArrayList<>(m.keySet());
        Collections.sort(names);
        boolean first = true;
        for (String n : names) {
            ConfigDef.ConfigKey k = m.get(n);
            if (!first) b.append(",\n");
            first = false;
            String def = k.hasDefault() ? q(ConfigDef.convertToString(k.defaultValue, k.type)) : "null";
            b.append("{\"name\":").append(q(n))
             .append(",\"type\":").append(q(k.type.toString().toLowerCase(Locale.ROOT)))
             .append(",\"default\":").append(def)
             .append(",\"valid\":").append(k.validator == null ? "null" : q(k.validator.toString()))
             .append(",\"importance\":").append(q(k.importance.toString().toLowerCase(Locale.ROOT)))
             .append(",\"internal\":").append(k.internalConfig)
             .append(",\"extra\":").append(extra == null || !extra.containsKey(n) ? "null" : q(extra.get(n)))
             .append(",\"doc\":").append(q(k.documentation))
             .append('}');
        }
        return b.append(']').toString();
    }

    public static void main(String[] args) {
        Map<String, ConfigDef.ConfigKey> broker = new HashMap<>();
        for (Map.Entry<String, ConfigDef.ConfigKey> e :
                scala.jdk.javaapi.CollectionConverters.asJava(kafka.server.KafkaConfig$.MODULE$.configKeys()).entrySet()) {
            broker.put(e.getKey(), e.getValue());
        }
        Map<String, String> modes = kafka.server.DynamicBrokerConfig$.MODULE$.dynamicConfigUpdateModes();
        Map<String, String> synonyms = org.apache.kafka.server.config.ServerTopicConfigSynonyms.TOPIC_CONFIG_SYNONYMS;
        System.out.println("{\"kafka_version\":" + q(org.apache.kafka.common.utils.AppInfoParser.getVersion()) + ",");
        System.out.println("\"broker\":" + keys(broker, modes) + ",");
        System.out.println("\"topic\":" + keys(org.apache.kafka.storage.internals.log.LogConfig.configKeys(), synonyms) + ",");
        System.out.println("\"producer\":" + keys(org.apache.kafka.clients.producer.ProducerConfig.configDef().configKeys(), null) + ",");
        System.out.println("\"consumer\":" + keys(org.apache.kafka.clients.consumer.ConsumerConfig.configDef().configKeys(), null) + ",");
        System.out.println("\"admin\":" + keys(org.apache.kafka.clients.admin.AdminClientConfig.configDef().configKeys(), null));
        System.out.println("}");
    }
}
