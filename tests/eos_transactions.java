// The transactions on a cluster, as kafka-transactions.sh (TransactionsCommand) shows them,
// for tests/test_eos_chaos.py. kresilient.testing resolves the broker jars, not the Kafka
// distribution, so neither bin/kafka-transactions.sh nor the kafka-tools jar is there; the
// kafka-clients Admin API it calls is. confluent-kafka's AdminClient has no ListTransactions,
// DescribeTransactions or DescribeProducers. Run in the JVM's source-file mode, on the
// broker jars' classpath:
//
//     java -cp '<kafka libs>/*' tests/eos_transactions.java BOOTSTRAP TID... -- TOPIC:PARTITIONS...
//
// Prints one line per fact:
//     LIST <transactional id> <state> <producer id>           every transaction of the cluster
//     DESCRIBE <transactional id> <state> <coordinator> <epoch> <partitions in the transaction>
//     PRODUCER <topic> <partition> <producer id> <epoch> <open transaction's first offset or -1>
// (the PRODUCER lines are what `kafka-transactions.sh find-hanging` reads: an active
// producer whose currentTransactionStartOffset is set holds a transaction open there).
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.common.TopicPartition;

public class EosTransactions {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("request.timeout.ms", "15000");
        props.put("default.api.timeout.ms", "60000");
        List<String> tids = new ArrayList<>();
        List<TopicPartition> partitions = new ArrayList<>();
        boolean topics = false;
        for (int i = 1; i < args.length; i++) {
            if (args[i].equals("--")) {
                topics = true;
            } else if (topics) {
                int colon = args[i].lastIndexOf(':');
                String topic = args[i].substring(0, colon);
                int count = Integer.parseInt(args[i].substring(colon + 1));
                for (int p = 0; p < count; p++) {
                    partitions.add(new TopicPartition(topic, p));
                }
            } else {
                tids.add(args[i]);
            }
        }
        try (Admin admin = Admin.create(props)) {
            for (TransactionListing t : admin.listTransactions().all().get(60, TimeUnit.SECONDS)) {
                System.out.println(
                        "LIST " + t.transactionalId() + " " + t.state() + " " + t.producerId());
            }
            if (!tids.isEmpty()) {
                Map<String, TransactionDescription> described =
                        admin.describeTransactions(tids).all().get(60, TimeUnit.SECONDS);
                for (Map.Entry<String, TransactionDescription> e : described.entrySet()) {
                    TransactionDescription d = e.getValue();
                    System.out.println("DESCRIBE " + e.getKey() + " " + d.state() + " "
                            + d.coordinatorId() + " " + d.producerEpoch() + " "
                            + d.topicPartitions().size());
                }
            }
            if (!partitions.isEmpty()) {
                Map<TopicPartition, PartitionProducerState> states =
                        admin.describeProducers(partitions).all().get(60, TimeUnit.SECONDS);
                for (Map.Entry<TopicPartition, PartitionProducerState> e : states.entrySet()) {
                    for (ProducerState s : e.getValue().activeProducers()) {
                        System.out.println("PRODUCER " + e.getKey().topic() + " "
                                + e.getKey().partition() + " " + s.producerId() + " "
                                + s.producerEpoch() + " "
                                + s.currentTransactionStartOffset().orElse(-1L));
                    }
                }
            }
        }
    }
}
